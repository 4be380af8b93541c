"""ProcessGroupNCCL's contracts, proven on the CPU. fp8ncclsim runs fp8nccl's
exact algorithm path (NCCL's transport traits) over a gloo transport that
returns no Work for synchronous calls, as ProcessGroupNCCL does; fp8gloo runs
beside it. Each test says which contract it holds the backend to."""
from __future__ import annotations

import datetime
import threading
import time

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions, _create_work_from_future

import fp8comm
from tests.support.harness import PoolSpec, ctx
from tests.support.inputs import rank_input, same_bits
from tests.support.torch_features import work_exception_converts


# ---------------------------------------------------------------- scenarios
# Run on every rank of the pool: module-level, the ranks import this module.

def _backend(c):
    return c.group._get_backend(torch.device("cpu"))


def transport_facts():
    """(the transport's traits, what its synchronous all_reduce returned, what
    ProcessGroupFp8's synchronous passthrough all_reduce returned, the wire
    bytes of a 5000-element segment over it)."""
    c = ctx()
    be = _backend(c)
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    inner_work = be.transport("cpu").allreduce([torch.ones(4, dtype=torch.int64)], opts)
    outer_work = be.allreduce([torch.ones(4, dtype=torch.int64)], opts)
    outer_work.wait()
    return be.transport_traits("cpu"), inner_work is None, outer_work is None, be.wire_segment_bytes(5000, "cpu")


def one_at_a_time(group, kind: str, outs, xs):
    """The pairs (outs[i], xs[i]) as separate calls, into new outputs."""
    singles = [torch.empty_like(o) for o in outs]
    for out, x in zip(singles, xs):
        if kind == "reduce_scatter":
            dist.reduce_scatter_tensor(out, x, group=group)
        else:
            dist.all_gather_into_tensor(out, x, group=group)
    return singles


def coalesced_mix(kind: str):
    """A coalesced reduce_scatter or all_gather whose pairs are compressed,
    passed through (under min_numel) and compressed again. Returns (the
    coalesced results, the same pairs called one at a time, stats)."""
    c = ctx()
    w = c.world
    sizes = [50_000, 100, 30_000]  # per rank; min_numel is 1024
    xs = [rank_input(c.rank, k * w if kind == "reduce_scatter" else k, seed=i) for i, k in enumerate(sizes)]
    outs = [torch.empty(k if kind == "reduce_scatter" else k * w) for k in sizes]
    fp8comm.reset_stats(c.group)
    with dist._coalescing_manager(group=c.group):
        for out, x in zip(outs, xs):
            if kind == "reduce_scatter":
                dist.reduce_scatter_tensor(out, x, group=c.group)
            else:
                dist.all_gather_into_tensor(out, x, group=c.group)
    stats = fp8comm.get_stats(c.group)
    singles = one_at_a_time(c.group, kind, outs, xs)
    return outs, singles, stats


def coalesced_mix_direct(kind: str, async_op: bool):
    """The coalesced entry points called on the process group, as FSDP2 does
    (reduce_scatter_tensor_coalesced / allgather_into_tensor_coalesced), with
    asyncOp as given. Returns (results, one-at-a-time results)."""
    c = ctx()
    w = c.world
    be = c.group
    sizes = [50_000, 100, 30_000]
    xs = [rank_input(c.rank, k * w if kind == "reduce_scatter" else k, seed=10 + i) for i, k in enumerate(sizes)]
    outs = [torch.empty(k if kind == "reduce_scatter" else k * w) for k in sizes]
    if kind == "reduce_scatter":
        opts = dist.ReduceScatterOptions()
        opts.asyncOp = async_op
        work = be.reduce_scatter_tensor_coalesced(outs, xs, opts)
    else:
        opts = AllgatherOptions()
        opts.asyncOp = async_op
        work = be.allgather_into_tensor_coalesced(outs, xs, opts)
    assert work is not None, "ProcessGroupFp8 returned no Work"
    work.wait()
    singles = one_at_a_time(c.group, kind, outs, xs)
    return outs, singles


def premul_factor_on_the_host(n: int = 40_000):
    """PREMUL_SUM with a CPU factor tensor and with the same factor as a
    double: compressed, both results bitwise equal (a CPU factor is read on
    the host and applied as a float, never copied to the device)."""
    c = ctx()
    factor = 0.25 * (c.rank + 1)
    x = rank_input(c.rank, n)
    a, b = x.clone(), x.clone()
    fp8comm.reset_stats(c.group)
    dist.all_reduce(a, op=dist._make_nccl_premul_sum(torch.tensor(factor, dtype=torch.float64)), group=c.group)
    dist.all_reduce(b, op=dist._make_nccl_premul_sum(factor), group=c.group)
    return a, b, fp8comm.get_stats(c.group)


def threads_share_a_group(calls: int = 20, n: int = 30_000):
    """Two host threads issue compressed all_reduces on one group at once.
    Every call must come back with the right result: the group runs one
    compressed call at a time, so the phases of two calls never interleave
    (thread A's exchange never meets thread B's all_gather on another rank).
    Both threads issue identical calls, so which thread's call a rank runs
    first does not matter. Returns (errors, whether a thread hung)."""
    c = ctx()
    expected = torch.full((n,), float(c.world))
    errors: list[str] = []

    def worker():
        try:
            for _ in range(calls):
                t = torch.ones(n)
                dist.all_reduce(t, group=c.group)
                assert torch.equal(t, expected), "wrong all_reduce result"
        except Exception as e:  # noqa: BLE001  (reported to the test)
            errors.append(str(e))

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return errors, any(t.is_alive() for t in threads)


# -------------------------------------------------------------------- tests

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
    for traits, inner_returned_none, outer_returned_none, segment in pool.run(transport_facts):
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
    results = pool.run(coalesced_mix, kind)
    for outs, singles, stats in results:
        assert all(same_bits(a, b) for a, b in zip(outs, singles))
        assert stats["calls_compressed"] == 2 and stats["calls_passthrough"] == 1, stats


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("kind", ["reduce_scatter", "all_gather"])
def test_coalesced_entry_points_on_the_backend(pool, kind, async_op):
    for outs, singles in pool.run(coalesced_mix_direct, kind, async_op):
        assert all(same_bits(a, b) for a, b in zip(outs, singles))


def test_premul_factor_on_the_host(pool):
    """A CPU-resident PREMUL_SUM factor is read on the host (a device copy
    would sync the host on CUDA); the result equals the double factor's."""
    for a, b, stats in pool.run(premul_factor_on_the_host):
        assert same_bits(a, b)
        assert stats["calls_compressed"] == 2, stats


def test_threads_share_a_group(pool):
    """The group runs one compressed call at a time on every device."""
    for errors, hung in pool.run(threads_share_a_group, timeout=200):
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
