"""Scenarios for tests/backend/test_nccl_contracts.py (run on every rank of a DistPool)."""
from __future__ import annotations

import os
import threading
import time

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions

import fp8comm
from tests.support.harness import ctx
from tests.support.inputs import rank_input


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


def options_disagree(backend: str, option: str, env_rank0: dict | None = None):
    """Rank 0 creates a group with a different option (or environment) than
    the others. Returns (error text or None, seconds)."""
    c = ctx()
    differs = c.rank == 0
    kw = {"min_numel": 1024, "compress": "all_reduce,reduce_scatter", "block_size": 32, "fp8_dtype": "e4m3"}
    if differs and option:
        kw[option] = {"min_numel": 2048, "compress": "all", "block_size": 64, "fp8_dtype": "e5m2",
                      "scope": "inter_node"}[option]
    for name in env_rank0 or {}:  # an option the environment sets is left unset on every rank
        kw.pop(name.removeprefix("FP8COMM_").lower(), None)
    saved = dict(os.environ)
    if differs and env_rank0:
        os.environ.update(env_rank0)
    t0 = time.monotonic()
    try:
        group = dist.new_group(backend=backend, pg_options=fp8comm.Options(**kw))
        dist.all_reduce(torch.ones(100_000), group=group)
        return None, time.monotonic() - t0
    except ValueError as e:
        return str(e), time.monotonic() - t0
    finally:
        os.environ.clear()
        os.environ.update(saved)
