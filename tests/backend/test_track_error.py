"""Options(track_error=True) / FP8COMM_TRACK_ERROR=1 (DESIGN.md, "Stats"):
each compressed call measures on this rank the quantization error of every
value it put on the wire, and get_stats reports it per op as SQNR. The sums
each rank reports equal an FP64 reference computed from every rank's input
with the independent reference codec; the wire is the same with tracking
on or off; calls that pass through measure nothing; off, get_stats has no
error keys; a group with a CUDA transport refuses it at creation."""
import copy
import datetime
import math
import pickle

import pytest
import torch
import torch.distributed as dist

import fp8comm
from fp8comm import _C
from tests.support.harness import PoolSpec
from tests.support.scenarios import track_error as ts

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
    name = ts.FORMS[form][0]
    for m in pool.run(ts.measured_against_reference, form, dtype, reduce, factor_kind, pattern, sizes):
        signal, noise, values = m.expected
        entry = m.stats["per_op"][name]
        assert set(entry) == {"compressed", "passthrough"} | ERROR_KEYS, entry
        assert entry["quantized_values"] == values > 0
        assert entry["signal_energy"] == pytest.approx(signal, rel=1e-9)
        assert entry["noise_energy"] == pytest.approx(noise, rel=1e-9)
        expected_db = 10 * math.log10(signal / noise)
        assert entry["sqnr_db"] == pytest.approx(expected_db, abs=1e-6)
        assert m.stats["sqnr_db"] == entry["sqnr_db"]
        if pattern == "randn":
            assert 25.0 < expected_db < 40.0  # E4M3 on Gaussian data: about 31 dB per quantization


def test_tracking_changes_no_byte_and_is_per_process(pool):
    for rank, r in enumerate(pool.run(ts.tracking_changes_no_byte)):
        assert r.same == {"all_reduce": True, "reduce_scatter_tensor": True, "all_gather_tensor": True}
        assert ("sqnr_db" in r.stats) == (rank == 0)  # only rank 0 of that group tracks
        if rank == 0:
            assert 25.0 < r.stats["sqnr_db"] < 40.0


def test_calls_that_pass_through_measure_nothing(pool):
    for stats in pool.run(ts.passthrough_measures_nothing):
        assert stats["per_op"] == {"all_reduce": {"compressed": 0, "passthrough": 2, "sqnr_db": None,
                                                  "signal_energy": 0.0, "noise_energy": 0.0, "quantized_values": 0}}
        assert stats["sqnr_db"] is None


@pytest.mark.parametrize("env", [None, "0", "1"])
def test_off_by_default_and_on_from_the_environment(pool, env):
    for stats in pool.run(ts.stats_of_a_new_group, env):
        assert stats["calls_compressed"] == 1
        if env == "1":
            assert 25.0 < stats["sqnr_db"] < 40.0 and ERROR_KEYS <= set(stats["per_op"]["all_reduce"])
        else:
            assert "sqnr_db" not in stats and stats["per_op"] == {"all_reduce": {"compressed": 1, "passthrough": 0}}


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
    with pytest.raises(ValueError, match=r"FP8COMM_TRACK_ERROR must be 0 \(off\) or 1 \(on\), got 'yes'"):
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
