"""Options(track_error=True) / FP8COMM_TRACK_ERROR=1 (DESIGN.md, "Stats"):
each compressed call measures on this rank the quantization error of every
value it put on the wire, and get_stats reports it per op as SQNR. The sums
each rank reports equal an FP64 reference computed from every rank's input
with the independent reference codec; the wire is the same with tracking
on or off; calls that pass through measure nothing; off, get_stats has no
error keys; a group with a CUDA transport refuses it at creation."""
from __future__ import annotations

import copy
import datetime
import math
import os
import pickle
from typing import NamedTuple

import pytest
import torch
import torch.distributed as dist

import fp8comm
from fp8comm import _C
from tests.support import reference
from tests.support.harness import PoolSpec, ctx
from tests.support.inputs import adversarial_input, rank_input, same_bits
from tests.support.ops import Call, flat, run
from tests.support.scenarios.collectives import make_op, premul_factors
from tests.support.stats import calls as stats_calls


# ---------------------------------------------------------------- scenarios
# Run on every rank of the pool: module-level, the ranks import this module.
# Scenarios of Options.track_error (run on every rank of a DistPool whose
# default group tracks the error): what each rank measures against an FP64
# reference that every rank computes from every rank's seeded input with the
# independent reference codec (tests/support/reference.py).

BLOCK = 32
E4M3 = torch.float8_e4m3fn
# op form in the ops table -> (the name stats count it under, the algorithm)
FORMS = {
    "all_reduce": ("all_reduce", "all_reduce"),
    "all_reduce_coalesced": ("all_reduce_coalesced", "all_reduce"),
    "reduce_scatter_tensor": ("reduce_scatter_tensor", "reduce_scatter"),
    "reduce_scatter_list": ("reduce_scatter", "reduce_scatter"),
    "all_gather_tensor": ("all_gather_into_tensor", "all_gather"),
    "all_gather_list": ("all_gather", "all_gather"),
}


def _inputs(rank: int, sizes: list, dtype, pattern: str) -> list:
    if pattern == "randn":
        return [rank_input(rank, n, dtype, seed=i) for i, n in enumerate(sizes)]
    return [adversarial_input(rank, n, pattern, dtype, seed=i) for i, n in enumerate(sizes)]


def _decoded(y: torch.Tensor) -> torch.Tensor:
    """y (float32) through the reference codec, blocks from its first element."""
    codes, scales = reference.quantize(y, BLOCK, E4M3)
    return reference.dequantize(codes, scales, BLOCK, E4M3)


def _energies(y: torch.Tensor) -> torch.Tensor:
    """(signal, noise, values) of quantizing y, finite values only, in FP64."""
    finite = torch.isfinite(y)
    v = torch.where(finite, y, 0.0).double()
    d = torch.where(finite, _decoded(y), 0.0).double()
    return torch.tensor([v.square().sum().item(), (v - d).square().sum().item(), finite.sum().item()],
                        dtype=torch.float64)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _segment(y: torch.Tensor, s: int, m: int) -> torch.Tensor:
    return y[min(s * m, y.numel()): min((s + 1) * m, y.numel())]


def expected_error(algorithm: str, ys: list, rank: int, avg: bool) -> torch.Tensor:
    """What `rank` quantizes, given every rank's input times its factor (ys,
    float32 products as the codec forms them): the segments it sends, and
    for all_reduce the FP32 sum of its own segment (own first, then the
    others' decoded pieces in rank order) that it re-quantizes."""
    world, n = len(ys), ys[0].numel()
    if algorithm == "all_gather":
        return _energies(ys[rank])
    m = n // world if algorithm == "reduce_scatter" else _ceil_div(_ceil_div(n, world), BLOCK) * BLOCK
    total = sum(_energies(_segment(ys[rank], s, m)) for s in range(world) if s != rank)
    if algorithm == "all_reduce":
        acc = _segment(ys[rank], rank, m).clone()
        for s in range(world):
            if s != rank:
                acc = acc + _decoded(_segment(ys[s], rank, m))
        total = total + _energies(acc / world if avg else acc)
    return total


class Measured(NamedTuple):
    stats: dict
    expected: list  # (signal, noise, values) from the reference


def measured_against_reference(form: str, dtype, reduce: str = "sum", factor_kind: str = "",
                               pattern: str = "randn", sizes: tuple = (10_001,)) -> Measured:
    """One call of `form` on the pool's tracking group; sizes are per rank
    (reduce_scatter: its output's)."""
    c = ctx()
    name, algorithm = FORMS[form]
    per_rank = [k * c.world for k in sizes] if algorithm == "reduce_scatter" else list(sizes)
    factors = premul_factors(c.world, factor_kind) if reduce == "premul_sum" else [1.0] * c.world
    fp8comm.reset_stats(c.group)
    run(form, Call(c.group, c.rank, c.world, make_op(reduce, factor_kind, c.rank, c.world)),
        _inputs(c.rank, per_rank, dtype, pattern))
    # What each rank put on the wire: its input (one flat tensor for an
    # all_reduce_coalesced), times its factor in FP32.
    ys = [torch.cat([x.reshape(-1) for x in _inputs(r, per_rank, dtype, pattern)]).float() * factors[r]
          for r in range(c.world)]
    expected = expected_error(algorithm, ys, c.rank, avg=reduce == "avg")
    return Measured(fp8comm.get_stats(c.group), expected.tolist())


class SameBytes(NamedTuple):
    same: dict  # form -> whether the results on both groups are bitwise equal
    stats: dict  # of the group that tracks on rank 0 only


_HALF_TRACKING = {}


def tracking_changes_no_byte() -> SameBytes:
    """The pool's group (every rank tracks) against a group where only rank 0
    tracks: created without complaint (the option is per process), and
    every compressed result bitwise equal."""
    c = ctx()
    if "group" not in _HALF_TRACKING:
        backend = dist.get_backend(c.group)
        _HALF_TRACKING["group"] = dist.new_group(backend=backend, pg_options=fp8comm.Options(
            compress="all", min_numel=1024, track_error=c.rank == 0))
    half = _HALF_TRACKING["group"]
    fp8comm.reset_stats(half)
    same = {}
    for form, sizes in [("all_reduce", [10_001]), ("reduce_scatter_tensor", [4096 * c.world]),
                        ("all_gather_tensor", [5000])]:
        outs = [flat(run(form, Call(pg, c.rank, c.world, dist.ReduceOp.AVG if "reduce" in form else
                                    dist.ReduceOp.SUM), _inputs(c.rank, sizes, torch.bfloat16, "randn")),
                     torch.empty(0)) for pg in (c.group, half)]
        same[form] = same_bits(*outs)
    return SameBytes(same, fp8comm.get_stats(half))


def passthrough_measures_nothing() -> dict:
    """Calls that pass through quantize nothing: a small all_reduce and one
    inside an uncompressed block."""
    c = ctx()
    fp8comm.reset_stats(c.group)
    dist.all_reduce(rank_input(c.rank, 100), group=c.group)
    with fp8comm.uncompressed(c.group):
        dist.all_reduce(rank_input(c.rank, 10_000), group=c.group)
    return fp8comm.get_stats(c.group)


def stats_of_a_new_group(track_error_env: str | None) -> dict:
    """get_stats after one compressed all_reduce on a new group created with
    Options() (track_error unset) and FP8COMM_TRACK_ERROR as given."""
    c = ctx()
    saved = os.environ.pop("FP8COMM_TRACK_ERROR", None)
    if track_error_env is not None:
        os.environ["FP8COMM_TRACK_ERROR"] = track_error_env
    try:
        backend = dist.get_backend(c.group)
        group = dist.new_group(backend=backend, pg_options=fp8comm.Options(min_numel=1024))
    finally:
        os.environ.pop("FP8COMM_TRACK_ERROR", None)
        if saved is not None:
            os.environ["FP8COMM_TRACK_ERROR"] = saved
    dist.all_reduce(rank_input(c.rank, 10_000), group=group)
    return fp8comm.get_stats(group)


# -------------------------------------------------------------------- tests

ERROR_KEYS = {"sqnr_db", "signal_energy", "noise_energy", "quantized_values"}


POOLS = [PoolSpec(world, backend, pg_options={"compress": "all", "min_numel": 1024, "track_error": True},
                  id=f"{backend}-{world}")
         for backend, world in [("fp8gloo", 2), ("fp8gloo", 3), ("fp8ncclsim", 3)]]


CASES = [
    ("all_reduce", torch.float32, "sum", "", "randn", (10_001,)),
    ("all_reduce", torch.bfloat16, "avg", "", "randn", (10_001,)),
    ("all_reduce", torch.float32, "premul_sum", "tensor", "randn", (10_001,)),
    ("all_reduce", torch.float32, "sum", "", "nonfinite", (10_001,)),
    ("all_reduce", torch.float16, "sum", "", "wide", (4096,)),
    ("all_reduce_coalesced", torch.float32, "sum", "", "randn", (3000, 2001)),
    ("reduce_scatter_tensor", torch.float32, "sum", "", "randn", (3001,)),
    ("reduce_scatter_tensor", torch.bfloat16, "premul_sum", "double", "randn", (4096,)),
    ("reduce_scatter_list", torch.float32, "avg", "", "randn", (3001,)),
    ("all_gather_tensor", torch.float32, "sum", "", "randn", (5000,)),
    ("all_gather_list", torch.bfloat16, "sum", "", "nonfinite", (5000,)),
]


@pytest.mark.parametrize("form,dtype,reduce,factor_kind,pattern,sizes", CASES,
                         ids=["-".join(map(str, c[:5])).replace("torch.", "") for c in CASES])
def test_measured_error_equals_the_fp64_reference(pool, form, dtype, reduce, factor_kind, pattern, sizes):
    name = FORMS[form][0]
    for m in pool.run(measured_against_reference, form, dtype, reduce, factor_kind, pattern, sizes):
        signal, noise, values = m.expected
        entry = m.stats["per_op"][name]
        assert ERROR_KEYS <= set(entry), entry
        assert entry["quantized_values"] == values > 0
        assert entry["signal_energy"] == pytest.approx(signal, rel=1e-9)
        assert entry["noise_energy"] == pytest.approx(noise, rel=1e-9)
        expected_db = 10 * math.log10(signal / noise)
        assert entry["sqnr_db"] == pytest.approx(expected_db, abs=1e-6)
        assert m.stats["sqnr_db"] == entry["sqnr_db"]
        if pattern == "randn":
            assert 25.0 < expected_db < 40.0  # E4M3 on Gaussian data: about 31 dB per quantization


def test_tracking_changes_no_byte_and_is_per_process(pool):
    for rank, r in enumerate(pool.run(tracking_changes_no_byte)):
        assert r.same == {"all_reduce": True, "reduce_scatter_tensor": True, "all_gather_tensor": True}
        assert ("sqnr_db" in r.stats) == (rank == 0)  # only rank 0 of that group tracks
        if rank == 0:
            assert 25.0 < r.stats["sqnr_db"] < 40.0


def test_calls_that_pass_through_measure_nothing(pool):
    for stats in pool.run(passthrough_measures_nothing):
        assert stats_calls(stats) == {"all_reduce": {"compressed": 0, "passthrough": 2}}
        assert {k: stats["per_op"]["all_reduce"][k] for k in ERROR_KEYS} == {
            "sqnr_db": None, "signal_energy": 0.0, "noise_energy": 0.0, "quantized_values": 0}
        assert stats["sqnr_db"] is None


@pytest.mark.parametrize("env", [None, "0", "1"])
def test_off_by_default_and_on_from_the_environment(pool, env):
    for stats in pool.run(stats_of_a_new_group, env):
        assert stats["calls_compressed"] == 1
        if env == "1":
            assert 25.0 < stats["sqnr_db"] < 40.0 and ERROR_KEYS <= set(stats["per_op"]["all_reduce"])
        else:
            assert "sqnr_db" not in stats and stats_calls(stats) == {"all_reduce": {"compressed": 1, "passthrough": 0}}
            assert not ERROR_KEYS & set(stats["per_op"]["all_reduce"])


# ---- the option itself (no processes)
def test_the_option_and_its_variable(monkeypatch):
    assert fp8comm.Options().track_error is None
    assert fp8comm.Options(track_error=True).track_error is True
    monkeypatch.delenv("FP8COMM_TRACK_ERROR", raising=False)
    assert fp8comm.Options().resolved().track_error is False
    monkeypatch.setenv("FP8COMM_TRACK_ERROR", "1")
    assert fp8comm.Options().resolved().track_error is True
    assert fp8comm.Options(track_error=False).resolved().track_error is False  # the field wins
    assert "track_error" not in fp8comm.Options(track_error=True).resolved().fingerprint()  # changes no wire byte
    opts = fp8comm.Options(track_error=True, min_numel=7)
    for clone in (copy.deepcopy(opts), pickle.loads(pickle.dumps(opts))):
        assert clone == opts and clone.track_error is True
    assert fp8comm.Options(track_error=True) != fp8comm.Options(track_error=False)
    assert "track_error=True" in repr(opts)


@pytest.mark.parametrize("value", [1, "yes", 0.0])
def test_the_option_must_be_a_bool(value):
    with pytest.raises(ValueError, match="track_error must be True or False"):
        fp8comm.Options(track_error=value)


def test_a_bad_variable_names_itself(monkeypatch):
    monkeypatch.setenv("FP8COMM_TRACK_ERROR", "yes")
    with pytest.raises(ValueError, match=r"track_error must be 0 \(off\) or 1 \(on\), got 'yes' \(from FP8COMM_TRACK_ERROR\)"):
        fp8comm.Options().resolved()


def test_a_cuda_transport_refuses_it_at_creation():
    """The measurement reads sums on the host; on a device that would sync
    every call, so a group with a CUDA transport refuses the option instead
    of reporting nothing (shown here with a gloo backend filed as the CUDA
    transport: the check comes before the transport is used)."""
    store = dist.HashStore()
    inner = dist.ProcessGroupGloo(store, 0, 1, datetime.timedelta(seconds=10))
    options = fp8comm.Options(track_error=True).resolved()
    with pytest.raises(ValueError, match="track_error=True measures the quantization error on CPU transports only"):
        _C.attach_or_create(store, 0, 1, "refuses-track-error", "cuda", inner, options)
    backend = _C.attach_or_create(store, 0, 1, "tracks-on-cpu", "cpu", inner, options)
    assert backend.track_error
