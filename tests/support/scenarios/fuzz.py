"""Fuzz scenarios (run on every rank of a DistPool): compressed collectives of
adversarial values checked against the error-bound oracle, the same values
passed through exactly, and the min_numel boundary."""
from __future__ import annotations

from typing import NamedTuple

import torch

import fp8comm
from tests.support.bounds import NONE, Violations, bound_violations
from tests.support.groups import fp8_group
from tests.support.harness import ctx
from tests.support.inputs import PREMUL_FACTORS, adversarial_input, rank_input
from tests.support.ops import Call, reduce_op, run
from tests.support.scenarios.collectives import Exact

FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


class FuzzOutcome(NamedTuple):
    outs: list  # the call's outputs on this rank
    violations: Violations  # summed over the outputs
    calls_compressed: int


def op_name(op: str, form: str) -> str:
    """The ops-table name of collective `op` in `form` (tensor, list, coalesced)."""
    if op == "all_reduce":
        if form == "list":
            raise ValueError("all_reduce has no list form")
        return "all_reduce" if form == "tensor" else "all_reduce_coalesced"
    return f"{op}_{form}"


def fuzz_case(op: str, form: str, reduce: str, fmt: str, n: int, pattern: str, dtype_name: str, block: int,
              factor_kind: str, seed: int):
    """One fuzzed collective (op in form `form`, reduce kind `reduce`) on an
    extra fp8gloo group that compresses everything (min_numel 1) in `fmt` with
    `block`-element blocks. Each output is checked element by element against
    the exact FP64 result with the documented bound (docs/reliability.md)."""
    c = ctx()
    P = c.world
    pg = fp8_group(f"compress=all;min_numel=1;block_size={block};fp8_dtype={fmt}")
    fp8_dtype = FP8[fmt]
    dtype = getattr(torch, dtype_name)
    factors = PREMUL_FACTORS[:P] if reduce == "premul_sum" else [1.0] * P
    div = P if reduce == "avg" else 1
    name = op_name(op, form)
    # Coalesced and list forms move two tensors (of n and n // 3 + 1 elements).
    sizes = [n, n // 3 + 1] if form != "tensor" else [n]
    per_rank = [[adversarial_input(r, m * (P if op == "reduce_scatter" else 1), pattern, dtype, seed + i)
                 for r in range(P)] for i, m in enumerate(sizes)]
    mine = [inputs[c.rank].clone() for inputs in per_rank]
    fp8comm.reset_stats(pg)
    rop = reduce_op(reduce if op != "all_gather" else "sum", PREMUL_FACTORS[c.rank], factor_kind)
    outs = run(name, Call(pg, c.rank, P, rop), mine)
    stats = fp8comm.get_stats(pg)

    # What each rank put on the wire: its input times its factor, in FP32.
    scaled = [[(t.float() * factors[r]) for r, t in enumerate(inputs)] for inputs in per_rank]
    if op == "all_reduce":  # a coalesced all_reduce is one all_reduce of the concatenation
        scaled = [[torch.cat([s[r] for s in scaled]) for r in range(P)]]
        outs_checked = [torch.cat([o.reshape(-1) for o in outs])]
    else:
        outs_checked = outs
    violations = NONE
    for ys, out in zip(scaled, outs_checked):
        violations = violations + bound_violations(op, ys, out, div, block, fp8_dtype, c.rank)
    return FuzzOutcome(outs, violations, stats["calls_compressed"])


def fuzz_passthrough(n: int, kind: str, dtype_name: str, seed: int):
    """all_reduce and all_gather of adversarial values on a group with
    compression off, and on plain gloo."""
    c = ctx()
    pg = fp8_group("compress=none")
    dtype = getattr(torch, dtype_name)
    results = []
    fp8comm.reset_stats(pg)
    for group in (pg, c.gloo):
        call = Call(group, c.rank, c.world)
        x = run("all_reduce", call, [adversarial_input(c.rank, n, kind, dtype, seed)])[0]
        out = run("all_gather_tensor", call, [adversarial_input(c.rank, n, kind, dtype, seed)])[0]
        results.append(torch.cat([x, out]))
    return Exact(results[0], results[1], fp8comm.get_stats(pg))


MIN_NUMEL_OPS = {"all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce_coalesced",
                 "reduce_scatter": "reduce_scatter_tensor", "all_gather": "all_gather_tensor"}


def min_numel_boundary(op: str, min_numel: int, numel: int):
    """One collective of `numel` elements per rank (all_reduce_coalesced: in
    two tensors) on a group that compresses everything from `min_numel`, and
    the same on plain gloo."""
    c = ctx()
    P = c.world
    pg = fp8_group(f"compress=all;min_numel={min_numel}")
    x = rank_input(c.rank, numel * (P if op == "reduce_scatter" else 1), torch.float32, seed=11)
    fp8comm.reset_stats(pg)
    results = []
    for group in (pg, c.gloo):
        xs = [x[: numel // 2].clone(), x[numel // 2:].clone()] if op == "all_reduce_coalesced" else [x.clone()]
        results.append(torch.cat(run(MIN_NUMEL_OPS[op], Call(group, c.rank, P), xs)))
    return Exact(results[0], results[1], fp8comm.get_stats(pg))
