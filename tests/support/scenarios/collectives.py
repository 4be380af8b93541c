"""Scenarios of the compressed collectives (run on every rank of a DistPool):
every form against an FP64 reference each rank computes from every rank's
seeded input. Each returns the group's stats for the call (reset before it),
so a test can tell a compressed call from one that passed through.

Shared: tests/backend/test_backend_collectives.py and test_backend_semantics.py
run them, scenarios/chunk_plan.py counts their inner calls, and test modules'
own scenarios use premul_factors, make_op and reference_sum, and return Exact
(a call on the fp8 group beside its exact reference)."""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

import fp8comm
from tests.support.groups import fp8_group
from tests.support.harness import ctx
from tests.support.inputs import neighbours_intact, rank_input, strided_view
from tests.support.ops import Call, reduce_op, run
from tests.support.reference import sqnr_db


class Outcome(NamedTuple):
    out: torch.Tensor  # this rank's result (contiguous)
    sqnr_db: float  # against the FP64 reference
    stats: dict


class Outcomes(NamedTuple):
    outs: list  # one result per tensor of the call
    sqnrs_db: list
    stats: dict


class Exact(NamedTuple):
    got: torch.Tensor  # on the fp8 group
    expected: torch.Tensor  # on plain gloo (or the exact reference)
    stats: dict  # the fp8 group's, for the call


def premul_factors(world: int, kind: str) -> list[float]:
    """PREMUL_SUM factors by rank: 0.5 as a double, or a different tensor
    factor per rank, as NCCL allows."""
    if kind == "double":
        return [0.5] * world
    if kind == "tensor":
        return [0.25 * (r + 1) for r in range(world)]
    return [1.0] * world


def make_op(op: str, factor_kind: str, rank: int, world: int):
    return reduce_op(op, premul_factors(world, factor_kind)[rank], factor_kind)


def reference_sum(n: int, dtype, op: str, factor_kind: str, world: int, seed: int = 0) -> torch.Tensor:
    factors = premul_factors(world, factor_kind) if op == "premul_sum" else [1.0] * world
    total = sum(rank_input(r, n, dtype, seed).double() * factors[r] for r in range(world))
    return total / world if op == "avg" else total


def all_reduce(n, dtype, op="sum", factor_kind="", seed=0, non_contiguous=False):
    c = ctx()
    x = rank_input(c.rank, n, dtype, seed)
    base = None
    if non_contiguous:
        x, base = strided_view(x)
    fp8comm.reset_stats(c.group)
    run("all_reduce", Call(c.group, c.rank, c.world, make_op(op, factor_kind, c.rank, c.world)), [x])
    stats = fp8comm.get_stats(c.group)
    ref = reference_sum(n, dtype, op, factor_kind, c.world, seed)
    assert base is None or neighbours_intact(base)
    return Outcome(x.contiguous(), sqnr_db(ref, x), stats)


def all_reduce_coalesced(sizes, dtype, op="sum"):
    c = ctx()
    xs = [rank_input(c.rank, n, dtype, seed=i) for i, n in enumerate(sizes)]
    fp8comm.reset_stats(c.group)
    run("all_reduce_coalesced", Call(c.group, c.rank, c.world, make_op(op, "", c.rank, c.world)), xs)
    stats = fp8comm.get_stats(c.group)
    refs = [reference_sum(n, dtype, op, "", c.world, seed=i) for i, n in enumerate(sizes)]
    return Outcomes(xs, [sqnr_db(r, x) for r, x in zip(refs, xs)], stats)


def reduce_scatter(k, dtype, op="sum", factor_kind="", form="tensor", seed=0, non_contiguous=False):
    """form: tensor, list, or coalesced (two reduce_scatters in one call, the
    second of twice the input). non_contiguous: the input and the output are
    stride-2 views; the call must write the output view and nothing next to
    it, and leave the input as it was."""
    c = ctx()
    x = rank_input(c.rank, k * c.world, dtype, seed)
    out = torch.empty(k, dtype=dtype)
    bases = []
    if non_contiguous:
        x, in_base = strided_view(x)
        out, out_base = strided_view(out)
        bases = [in_base, out_base]
    xs, outs = [x], [out]
    if form == "coalesced":
        xs, outs = [x, x * 2], [out, torch.empty(k, dtype=dtype)]
    fp8comm.reset_stats(c.group)
    run(f"reduce_scatter_{form}", Call(c.group, c.rank, c.world, make_op(op, factor_kind, c.rank, c.world)), xs,
        outs)
    stats = fp8comm.get_stats(c.group)
    ref = reference_sum(k * c.world, dtype, op, factor_kind, c.world, seed)[c.rank * k: (c.rank + 1) * k]
    if form == "coalesced":
        assert sqnr_db(2 * ref, outs[1]) >= 30
    assert all(neighbours_intact(b) for b in bases)
    assert not non_contiguous or torch.equal(x, rank_input(c.rank, k * c.world, dtype, seed))  # input unchanged
    return Outcome(out.contiguous(), sqnr_db(ref, out), stats)


def all_gather(k, dtype, form="tensor", group="group", seed=0, non_contiguous=False, round_trip=False):
    """form: tensor, list, or coalesced (two all_gathers in one call, the
    second of four times the input). group: "group" (the pool's) or an
    fp8_group spec. non_contiguous: the input and the outputs are stride-2
    views. round_trip: also compare the output with every rank's input
    through fp8comm.quantize / dequantize (RoundTrip)."""
    c = ctx()
    pg = c.group if group == "group" else fp8_group(group)
    x = rank_input(c.rank, k, dtype, seed)
    bases = []

    def output():
        out = torch.empty(k * c.world, dtype=dtype)
        if non_contiguous:
            out, base = strided_view(out)
            bases.append(base)
        return out

    if non_contiguous:
        x, in_base = strided_view(x)
        bases.append(in_base)
    xs, outs = ([x, x * 4], [output(), output()]) if form == "coalesced" else ([x], [output()])
    fp8comm.reset_stats(pg)
    run(f"all_gather_{form}", Call(pg, c.rank, c.world), xs, outs)
    stats = fp8comm.get_stats(pg)
    if form == "coalesced":
        assert torch.equal(outs[1], outs[0] * 4)  # power-of-two scaling commutes exactly with the codec
    assert all(neighbours_intact(b) for b in bases)
    ref = torch.cat([rank_input(r, k, dtype, seed).double() for r in range(c.world)])
    if round_trip:
        options = pg._get_backend(torch.device("cpu")).options
        block, fmt = options.block_size, options.wire_format
        codec = torch.cat([fp8comm.dequantize(*fp8comm.quantize(rank_input(r, k, dtype, seed), block_size=block,
                                                                wire_format=fmt), block_size=block, dtype=dtype,
                                              numel=k, wire_format=fmt)
                           for r in range(c.world)])
        return RoundTrip(outs[0].contiguous(), sqnr_db(ref, outs[0]), stats, torch.equal(outs[0], codec))
    return Outcome(outs[0].contiguous(), sqnr_db(ref, outs[0]), stats)


class RoundTrip(NamedTuple):
    out: torch.Tensor
    sqnr_db: float
    stats: dict
    round_trip_equal: bool


class NonFinite(NamedTuple):
    mask: torch.Tensor  # where the result is not finite
    stats: dict


def non_finite(kind: str, n: int = 8192):
    """NaN and Inf in the inputs of rank 0 and of the last rank, compressed
    (min_numel 1024); returns where the result is not finite."""
    c = ctx()
    pg = fp8_group("compress=all;min_numel=1024")
    x = rank_input(c.rank, n * c.world, torch.float32)
    bad = {0: float("nan"), 1: float("inf"), 2: float("-inf")}
    if c.rank == 0:  # one rank's input carries the bad values
        x[[5, n + 9, 2 * n - 1]] = torch.tensor([bad[0], bad[1], bad[0]])
    if c.rank == c.world - 1:
        x[[17]] = bad[2]
    fp8comm.reset_stats(pg)
    name = {"all_reduce": "all_reduce", "reduce_scatter": "reduce_scatter_tensor", "all_gather": "all_gather_tensor"}
    out = run(name[kind], Call(pg, c.rank, c.world), [x])[0]
    return NonFinite(~torch.isfinite(out), fp8comm.get_stats(pg))


class AsyncOutcome(NamedTuple):
    sqnrs_db: list
    stats: dict


def async_in_flight(n: int = 20_000):
    """Four async compressed calls in flight, then Work and future checks, a
    chained future."""
    c = ctx()
    xs = [rank_input(c.rank, n, torch.float32, seed=s) for s in range(4)]
    outs = [torch.empty(n // c.world * c.world // c.world) for _ in range(2)]
    fp8comm.reset_stats(c.group)
    works = [dist.all_reduce(x, group=c.group, async_op=True) for x in xs[:2]]
    rs_in = [rank_input(c.rank, len(outs[0]) * c.world, torch.float32, seed=10 + i) for i in range(2)]
    works += [dist.reduce_scatter_tensor(o, i, group=c.group, async_op=True) for o, i in zip(outs, rs_in)]
    futs = [w.get_future() for w in works]
    for w in works:
        w.wait()
        assert w.is_completed() and w.is_success()
    for f in futs:
        assert f.done()
    values = futs[0].wait()
    assert isinstance(values, list) and values[0] is xs[0]
    chained = dist.all_reduce(xs[2], group=c.group, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    doubled = chained.wait()
    sq = [sqnr_db(reference_sum(n, torch.float32, "sum", "", c.world, seed=s), xs[s]) for s in range(3)]
    sq.append(sqnr_db(2 * reference_sum(n, torch.float32, "sum", "", c.world, seed=2), doubled))
    return AsyncOutcome(sq, fp8comm.get_stats(c.group))
