"""Nothing lost: every op fp8gloo accepts, in every dtype
gloo moves (float8 as bytes), against plain gloo on the same inputs, at a size
under min_numel and one above it. Exact paths must give plain gloo's bytes;
compressed paths (float32 / bfloat16 / float16 all_reduce, reduce_scatter and
all_gather above min_numel) every element within the documented bound of the
exact result; where plain gloo cannot do the op (float8 reductions,
PREMUL_SUM of integers), fp8gloo must refuse too, with its own clear error.
AVG of integers, which plain gloo lacks, is checked against its sum divided
by the group size, truncated toward zero (NCCL's integer average)."""
from __future__ import annotations

from typing import NamedTuple

import pytest
import torch
import torch.distributed as dist

import fp8comm
from tests.support.bounds import bound_violations
from tests.support.groups import fp8_group, plain_gloo_group
from tests.support.harness import PoolSpec, ctx
from tests.support.inputs import any_dtype_input
from tests.support.ops import Call, flat, reduce_op, run, uneven_splits
from tests.support.torch_features import gloo_has_list_all_to_all


# ---------------------------------------------------------------- scenarios
# Run on every rank of the pool: module-level, the ranks import this module.
# Scenarios of the "nothing lost" test: every op fp8gloo accepts, in every
# dtype gloo moves, on fp8gloo and on plain gloo with the same inputs. They run
# on every rank of a DistPool.

DTYPES = ["bool", "uint8", "int8", "int32", "int64", "float16", "bfloat16", "float32", "float64", "complex64",
          "float8_e4m3fn", "float8_e5m2"]
REDUCING = {"all_reduce_sum", "all_reduce_max", "all_reduce_avg", "all_reduce_premul", "all_reduce_coalesced",
            "reduce_scatter_tensor", "reduce_scatter_list", "reduce_scatter_coalesced", "reduce"}
OPS = sorted(REDUCING) + ["all_gather_tensor", "all_gather_list", "all_gather_coalesced", "all_gather_coalesced_lists",
                          "broadcast", "gather", "scatter", "all_to_all_single", "all_to_all_single_uneven",
                          "all_to_all", "send_recv", "batch_isend_irecv"]
# Compressed when the dtype is float32 / bfloat16 / float16 and the per-rank numel >= MIN_NUMEL.
COMPRESSED_OPS = {"all_reduce_sum", "all_reduce_avg", "all_reduce_premul", "all_reduce_coalesced",
                  "reduce_scatter_tensor", "reduce_scatter_list", "reduce_scatter_coalesced", "all_gather_tensor",
                  "all_gather_list", "all_gather_coalesced"}
MIN_NUMEL = 4096
SPEC = f"compress=all;min_numel={MIN_NUMEL}"
FLOAT8 = ("float8_e4m3fn", "float8_e5m2")


ROOTS = {"broadcast": "last", "reduce": "last", "gather": 0, "scatter": 0}
REDUCE_KINDS = {"all_reduce_sum": "sum", "all_reduce_max": "max", "all_reduce_avg": "avg",
                "all_reduce_premul": "premul_sum"}


def premul_factor(rank: int) -> float:
    return 0.1 + rank


def _inputs(op: str, inp, rank: int, n: int, world: int) -> list:
    """This rank's inputs of `op` for n elements per rank, from inp(rank, numel, seed)."""
    if op == "all_reduce_coalesced":
        x = inp(rank, n)
        return [x[: n // 3].clone(), x[n // 3:].clone()]
    if op.startswith("reduce_scatter") or op in ("all_to_all_single", "all_to_all"):
        return [inp(rank, n * world)]
    if op == "all_to_all_single_uneven":
        return [inp(rank, sum(uneven_splits(rank, world)[0]))]
    if op == "all_gather_coalesced_lists":
        return [inp(rank, n), inp(rank, 7, seed=1)]
    if op == "scatter":
        return [inp(r, n, seed=2) for r in range(world)]
    return [inp(rank, n)]


def run_op(op: str, dtype, n: int, pg, rank: int, world: int, reference_factor: float | None = None,
           as_bytes: bool = False, integer_avg: bool = False):
    """Runs `op` on `pg` with this rank's inputs through the ops table;
    returns what the op wrote on this rank, flat. reference_factor: the
    reference of PREMUL_SUM (inputs multiplied by it, then summed). as_bytes:
    move the same data as uint8 (plain gloo's only way to move float8).
    integer_avg: the reference of AVG of integers (summed, then divided by
    the group size, truncated toward zero, as NCCL computes it)."""
    def inp(r, m, seed=0):
        t = any_dtype_input(r, m, dtype, seed)
        return t.view(torch.uint8) if as_bytes else t

    xs = _inputs(op, inp, rank, n, world)
    reduce = REDUCE_KINDS.get(op, "sum")
    if reference_factor is not None:
        xs, reduce = [x * reference_factor for x in xs], "sum"
    if integer_avg:
        reduce = "sum"
    root = ROOTS.get(op, 0)
    call = Call(pg, rank, world, reduce_op(reduce, premul_factor(rank)),
                root=world - 1 if root == "last" else root)
    out = flat(run(TABLE_NAMES.get(op, op), call, xs), xs[0])
    return out.div(world, rounding_mode="trunc") if integer_avg else out


TABLE_NAMES = {name: "all_reduce" for name in REDUCE_KINDS}  # the other ops have the table's names


class Verdict(NamedTuple):
    kind: str  # "bitwise", "bound", "both refuse", or "LOST"
    detail: str = ""  # fp8gloo's error where both refuse; what differs where LOST


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype != torch.bool else t


def nothing_lost(cases):
    """For each (op, dtype name, n): the op on fp8gloo and on plain gloo.
    Returns {"op:dtype:n": Verdict}: bitwise (exact path, same bytes as plain
    gloo), bound (compressed, every element within the documented bound of the
    exact result), both refuse (plain gloo cannot either; fp8gloo says why),
    or LOST, with what differs."""
    c = ctx()
    P = c.world
    pg = fp8_group(SPEC)
    verdicts = {}
    for op, dtype_name, n in cases:
        dtype = getattr(torch, dtype_name)
        fp8comm.reset_stats(pg)
        try:
            got = run_op(op, dtype, n, pg, c.rank, P)
            fp8_error = None
        except (RuntimeError, ValueError, TypeError) as e:
            got, fp8_error = None, str(e).splitlines()[0]
        stats = fp8comm.get_stats(pg)
        compressed = stats["calls_compressed"] > 0
        # The reference: plain gloo, moving float8 as bytes (it has no float8
        # types), summing inputs times the factor for PREMUL_SUM (it has none).
        as_bytes = dtype_name in FLOAT8 and op not in REDUCING
        emulated = op == "all_reduce_premul" and (dtype.is_floating_point or dtype.is_complex) and not as_bytes
        integer_avg = op == "all_reduce_avg" and not (dtype.is_floating_point or dtype.is_complex) and dtype != torch.bool
        try:
            ref = run_op(op, dtype, n, c.gloo, c.rank, P, reference_factor=premul_factor(c.rank) if emulated else None,
                         as_bytes=as_bytes, integer_avg=integer_avg)
            ref = ref.view(dtype) if as_bytes else ref
            gloo_error = None
        except (RuntimeError, ValueError, TypeError) as e:
            ref, gloo_error = None, str(e).splitlines()[0]
        dist.barrier(group=plain_gloo_group())  # in step before the next case
        case = f"{op}:{dtype_name}:{n}"
        if fp8_error is not None or gloo_error is not None:
            if fp8_error is not None and gloo_error is not None:
                verdicts[case] = Verdict("both refuse", fp8_error)
            else:
                verdicts[case] = Verdict("LOST", f"fp8gloo error {fp8_error!r}, plain gloo error {gloo_error!r}")
            continue
        if compressed:
            verdicts[case] = _within_bound(op, dtype, n, got, c.rank, P)
        elif torch.equal(_as_bytes(got), _as_bytes(ref)):
            verdicts[case] = Verdict("bitwise")
        else:
            verdicts[case] = Verdict("LOST", "differs from plain gloo")
    return verdicts


def _real(t: torch.Tensor) -> torch.Tensor:
    """torch.distributed hands complex tensors to the backend as
    view_as_real float views, which fp8gloo compresses like any float32."""
    return torch.view_as_real(t).reshape(-1) if t.is_complex() else t


def _within_bound(op, dtype, n, got, rank, P) -> Verdict:
    block, fp8 = 32, torch.float8_e4m3fn
    got = _real(got)
    if op.startswith("all_gather"):
        ys = [_real(any_dtype_input(r, n, dtype)).float() for r in range(P)]
        v = bound_violations("all_gather", ys, got, 1, block, fp8, rank)
    elif op.startswith("reduce_scatter"):
        ys = [_real(any_dtype_input(r, n * P, dtype)).float() for r in range(P)]
        v = bound_violations("reduce_scatter", ys, got, 1, block, fp8, rank)
    else:
        factors = [premul_factor(r) for r in range(P)] if op == "all_reduce_premul" else [1.0] * P
        ys = [_real(any_dtype_input(r, n, dtype)).float() * factors[r] for r in range(P)]
        v = bound_violations("all_reduce", ys, got, P if op == "all_reduce_avg" else 1, block, fp8, rank)
    if v.ok:
        return Verdict("bound")
    return Verdict("LOST", f"{v.outside_bound} elements outside the bound, {v.nonfinite_mismatch} non-finite mismatches")


# -------------------------------------------------------------------- tests

SIZES = [300, MIN_NUMEL + 904]
CASES = [(op, dtype, n) for op in OPS for dtype in DTYPES for n in SIZES]
CODEC_DTYPES = {"float32", "bfloat16", "float16"}


POOLS = [PoolSpec(world, "fp8gloo", id=str(world)) for world in (2, 3)]


@pytest.fixture(scope="module")
def verdicts(pool):
    return pool.run(nothing_lost, CASES, timeout=300)


def expected_verdict(op, dtype, n):
    if dtype in FLOAT8 and op in REDUCING:
        return "both refuse"  # gloo has no float8 arithmetic; fp8gloo says so where the call enters
    if op == "all_reduce_avg" and dtype == "bool":
        return "both refuse"  # no average of booleans; fp8gloo refuses before writing
    if op == "all_reduce_premul" and dtype not in CODEC_DTYPES | {"float64", "complex64"}:
        return "both refuse"  # gloo cannot pre-multiply integers; fp8gloo refuses before writing
    if op == "all_reduce_max" and dtype == "complex64":
        return "both refuse"  # torch itself refuses MAX of complex
    if op == "gather" and dtype == "complex64":
        return "both refuse"  # gloo's gather has no complex type
    if op == "all_to_all" and not gloo_has_list_all_to_all():
        return "both refuse"  # this torch's gloo has no list form; fp8gloo passes it through
    if op in COMPRESSED_OPS and dtype in CODEC_DTYPES and n >= MIN_NUMEL:
        return "bound"
    if op in COMPRESSED_OPS and not op.startswith("reduce_scatter") and dtype == "complex64" and n >= MIN_NUMEL:
        # torch.distributed hands complex tensors of all_reduce / all_gather to the
        # backend as view_as_real float32 views: compressed like float32 (of 2n numbers)
        return "bound"
    return "bitwise"


def test_every_op_and_dtype_against_plain_gloo(verdicts):
    lost = {}
    for rank, per_case in enumerate(verdicts):
        for case, verdict in per_case.items():
            op, dtype, n = case.split(":")
            if verdict.kind != expected_verdict(op, dtype, int(n)):
                lost[f"rank {rank} {case}"] = verdict
    assert not lost, lost
