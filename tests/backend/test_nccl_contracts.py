"""ProcessGroupNCCL's contracts, proven on the CPU. fp8ncclsim runs fp8nccl's
exact algorithm path (NCCL's transport traits) over a gloo transport that
returns no Work for synchronous calls, as ProcessGroupNCCL does; fp8gloo runs
beside it. Each test says which contract it holds the backend to."""
import datetime
import time

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

import fp8comm
from tests.support.harness import PoolSpec
from tests.support.inputs import same_bits
from tests.support.scenarios import nccl as ns
from tests.support.torch_features import work_exception_converts

BACKENDS = ["fp8gloo", "fp8ncclsim"]
NCCL_TRAITS = {"segment_headers": False, "gather_by_all_to_all": False, "reduces_avg_and_premul": True,
               "chunk_numel": 1 << 24}
GLOO_TRAITS = {"segment_headers": True, "gather_by_all_to_all": True, "reduces_avg_and_premul": False,
               "chunk_numel": 1 << 20}


POOLS = PoolSpec.grid(BACKENDS, (2, 3), pg_options={"min_numel": 1024, "compress": "all"})


def test_traits_and_null_works(pool):
    """fp8ncclsim's transport has NCCL's traits and returns no Work for a
    synchronous call; ProcessGroupFp8 itself always returns one. Segments in
    host memory carry a 16-byte header (segment_header.h); NCCL's none."""
    for traits, inner_returned_none, outer_returned_none, segment in pool.run(ns.transport_facts):
        nccl = pool.backend == "fp8ncclsim"
        assert traits == (NCCL_TRAITS if nccl else GLOO_TRAITS)
        assert inner_returned_none == nccl
        assert not outer_returned_none
        assert segment == (0 if nccl else 16) + fp8comm.segment_bytes(5000, 32)


@pytest.mark.parametrize("kind", ["reduce_scatter", "all_gather"])
def test_coalesced_mix_of_compressed_and_passthrough_pairs(pool, kind):
    """The coalesced forms must not wait on the Work of a passthrough pair:
    ProcessGroupNCCL returns none for synchronous calls. Results equal the same
    pairs called one at a time, bit for bit."""
    results = pool.run(ns.coalesced_mix, kind)
    for outs, singles, stats in results:
        assert all(same_bits(a, b) for a, b in zip(outs, singles))
        assert stats["calls_compressed"] == 2 and stats["calls_passthrough"] == 1, stats


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("kind", ["reduce_scatter", "all_gather"])
def test_coalesced_entry_points_on_the_backend(pool, kind, async_op):
    for outs, singles in pool.run(ns.coalesced_mix_direct, kind, async_op):
        assert all(same_bits(a, b) for a, b in zip(outs, singles))


def test_premul_factor_on_the_host(pool):
    """A CPU-resident PREMUL_SUM factor is read on the host (a device copy
    would sync the host on CUDA); the result equals the double factor's."""
    for a, b, stats in pool.run(ns.premul_factor_on_the_host):
        assert same_bits(a, b)
        assert stats["calls_compressed"] == 2, stats


def test_threads_share_a_group(pool):
    """The group runs one compressed call at a time on every device."""
    for errors, hung in pool.run(ns.threads_share_a_group, timeout=200):
        assert not hung
        assert errors == []


# ------------------------------------------------------------ Fp8Work
def failed_future(message="peer died"):
    fut = torch.futures.Future()
    failed = fut.then(lambda f: (_ for _ in ()).throw(RuntimeError(message)))
    return fut, failed


def test_work_reports_an_inner_error_to_wait_success_exception_and_future():
    """An inner Work's error reaches is_completed, is_success, exception,
    wait() and the future of the Fp8Work over it."""
    trigger, failed = failed_future()
    work = fp8comm._C._work_over("all_reduce", [_create_work_from_future(trigger.then(lambda f: None)),
                                                _create_work_from_future(failed)])
    assert not work.is_completed()
    trigger.set_result(None)
    assert work.is_completed()
    assert not work.is_success()
    if work_exception_converts():  # else this torch's binding cannot return it, for any Work
        assert "peer died" in str(work.exception())
    with pytest.raises(dist.DistBackendError, match="fp8comm all_reduce: an inner collective failed.*peer died"):
        work.wait()
    with pytest.raises(dist.DistBackendError, match="peer died"):
        work.get_future().wait()


def test_work_wait_raises_when_one_phase_failed_and_another_never_ends():
    trigger, failed = failed_future()
    work = fp8comm._C._work_over("all_gather", [_create_work_from_future(failed),
                                                _create_work_from_future(torch.futures.Future())])
    trigger.set_result(None)
    with pytest.raises(dist.DistBackendError, match="fp8comm all_gather: an inner collective failed.*peer died"):
        work.wait()


def test_work_wait_honours_its_timeout():
    """wait(timeout) honours the timeout (with blocking wait, a dead peer
    would otherwise hang the caller): past it, it raises, naming the op."""
    pending = torch.futures.Future()
    work = fp8comm._C._work_over("reduce_scatter", [_create_work_from_future(pending)])
    t0 = time.monotonic()
    with pytest.raises(dist.DistBackendError, match="fp8comm reduce_scatter: not done after 300 ms"):
        work.wait(datetime.timedelta(milliseconds=300))
    assert 0.25 < time.monotonic() - t0 < 5
    assert not work.is_completed()
    pending.set_result(None)
    assert work.is_completed() and work.is_success()
    assert work.wait(datetime.timedelta(milliseconds=300))
    assert work.get_future().wait() == []


def test_work_of_done_inner_works_is_done():
    done = torch.futures.Future()
    done.set_result([torch.ones(2)])
    work = fp8comm._C._work_over("all_gather", [_create_work_from_future(done)])
    assert work.is_completed() and work.is_success()
    if work_exception_converts():  # else this torch's binding cannot return it, for any Work
        assert work.exception() is None
    assert work.wait()
