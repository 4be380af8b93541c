"""Scenarios of setting a group up and using it wrongly (run on every rank of
a DistPool): options, stats, subgroups, re-initialization, bad input."""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

import fp8comm
from tests.support import harness
from tests.support.groups import fp8_group
from tests.support.harness import ctx
from tests.support.inputs import rank_input
from tests.support.reference import sqnr_db
from tests.support.scenarios.collectives import reference_sum


class Identity(NamedTuple):
    transport_uid: str  # the inner backend's group uid
    transport_desc: str
    group_name: str
    result: torch.Tensor  # of an all_reduce of ones


class CompressNone(NamedTuple):
    equal_to_gloo: bool
    stats: dict


class BadCall(NamedTuple):
    error: str | None  # what the call raised
    untouched: bool  # every tensor the call could write is as it was


class BadInputs(NamedTuple):
    calls: dict  # name -> BadCall
    stats: dict  # after the bad calls
    next_sqnr_db: float  # of a correct collective after them


class SqnrStats(NamedTuple):
    sqnr_db: float
    stats: dict


def stats_after_all_reduce(n: int, dtype):
    c = ctx()
    fp8comm.reset_stats(c.group)
    x = rank_input(c.rank, n, dtype)
    dist.all_reduce(x, group=c.group)
    return fp8comm.get_stats(c.group)


def backend_properties(spec: str | None = None):
    c = ctx()
    pg = fp8_group(spec) if spec else c.group
    be = pg._get_backend(torch.device("cpu"))
    return {
        "name": be.name(),
        "block_size": be.block_size,
        "fp8_dtype": be.fp8_dtype,
        "min_numel": be.min_numel,
        "compressed_ops": be.compressed_ops,
    }


def compress_none_passes_everything_through():
    c = ctx()
    pg = fp8_group("compress=none")
    fp8comm.reset_stats(pg)
    x = rank_input(c.rank, 100_000, torch.float32)
    ref = x.clone()
    dist.all_reduce(x, group=pg)
    dist.all_reduce(ref, group=c.gloo)
    out = torch.empty(50_000)
    dist.reduce_scatter_tensor(out, rank_input(c.rank, 50_000 * c.world, torch.float32), group=pg)
    return CompressNone(torch.equal(x, ref), fp8comm.get_stats(pg))


def group_identity():
    c = ctx()
    g = dist.new_group(backend="fp8gloo", group_desc="fp8-test-group")
    x = torch.ones(10)
    dist.all_reduce(x, group=g)
    be = g._get_backend(torch.device("cpu"))
    uid, desc = be.transport_identity("cpu")
    name = g.group_name
    dist.destroy_process_group(g)
    return Identity(uid, desc, name, x)


def subgroup_of_first_two(repeats: int = 1):
    """new_group over ranks [0, 1], created and destroyed `repeats` times."""
    c = ctx()
    out = []
    for i in range(repeats):
        g = dist.new_group(ranks=[0, 1], backend="fp8gloo", pg_options=fp8comm.Options(min_numel=1))
        if c.rank < 2:
            x = torch.full((5000,), float(c.rank + 1 + i))
            dist.all_reduce(x, group=g)
            out.append(x[0].item())
            dist.destroy_process_group(g)
    return out


def _bad_calls(c):
    """name -> (the tensors the call could write, the call). Every call is
    wrong on this rank in a way this rank can see."""
    w, g = c.world, c.group
    be = g._get_backend(torch.device("cpu"))

    def S(n, dtype=torch.float32):  # a sentinel-filled tensor the call must leave alone
        return torch.full((n,), 7.0).to(dtype)

    def f8(n):
        return torch.full((n,), 3.0).to(torch.float8_e4m3fn)

    def coalesced(pairs, kind, op=dist.ReduceOp.SUM):
        with dist._coalescing_manager(group=g):
            for out, inp in pairs:
                if kind == "rs":
                    dist.reduce_scatter_tensor(out, inp, op=op, group=g)
                else:
                    dist.all_gather_into_tensor(out, inp, group=g)

    premul = dist._make_nccl_premul_sum(0.5)
    calls = {}
    o = S(100)
    calls["rs_size"] = ([o], lambda: dist.reduce_scatter_tensor(o, torch.randn(100 * w + 1), group=g))
    o1 = S(10_000, torch.bfloat16)
    calls["rs_dtype"] = ([o1], lambda: dist.reduce_scatter_tensor(o1, torch.randn(10_000 * w), group=g))
    o2 = S(100 * w + 3)
    calls["ag_size"] = ([o2], lambda: dist.all_gather_into_tensor(o2, torch.randn(100), group=g))
    o3 = S(100 * w, torch.float16)
    calls["ag_dtype"] = ([o3], lambda: dist.all_gather_into_tensor(o3, torch.randn(100), group=g))
    l1 = [S(100) for _ in range(w + 1)]
    calls["ag_list_len"] = (l1, lambda: dist.all_gather(l1, torch.randn(100), group=g))
    l2 = [S(101) for _ in range(w)]
    calls["ag_list_size"] = (l2, lambda: dist.all_gather(l2, torch.randn(100), group=g))
    # (dist.all_gather / dist.reduce_scatter refuse mixed dtypes in Python
    # already; the backend's own check is reached by calling it directly)
    l3 = [S(100, torch.bfloat16) for _ in range(w)]
    calls["ag_list_dtype"] = (l3, lambda: be.allgather([l3], [torch.randn(100)]))
    o4 = S(5000)
    calls["rs_list_size"] = ([o4], lambda: dist.reduce_scatter(o4, [torch.randn(5001)] * w, group=g))
    o5 = S(5000)
    calls["rs_list_dtype"] = ([o5], lambda: be.reduce_scatter([o5], [[torch.randn(5000).bfloat16()] * w]))
    # float8 reductions, in every form that reduces
    t1 = f8(10)
    calls["fp8_reduce"] = ([t1], lambda: dist.all_reduce(t1, group=g))
    t2 = f8(10)
    calls["fp8_reduce_premul"] = ([t2], lambda: dist.all_reduce(t2, op=premul, group=g))
    t3 = [f8(10), f8(30)]
    calls["fp8_all_reduce_coalesced"] = (t3, lambda: dist.all_reduce_coalesced(t3, op=premul, group=g))
    o6 = f8(100)
    calls["fp8_rs_list"] = ([o6], lambda: dist.reduce_scatter(o6, [f8(100)] * w, group=g))
    o7 = f8(100)
    calls["fp8_rs_coalesced"] = ([o7], lambda: coalesced([(o7, f8(100 * w))], "rs", dist.ReduceOp.AVG))
    t4 = f8(100)
    calls["fp8_reduce_op"] = ([t4], lambda: dist.reduce(t4, dst=0, group=g))
    # a coalesced call whose second pair is bad: the first (compressible) one is not issued either
    o8, o9 = S(20_000), S(100)
    calls["rs_coalesced_second_bad"] = (
        [o8, o9], lambda: coalesced([(o8, torch.randn(20_000 * w)), (o9, torch.randn(100 * w + 1))], "rs"))
    o10, o11 = S(20_000 * w), S(100 * w, torch.bfloat16)
    calls["ag_coalesced_second_bad"] = (
        [o10, o11], lambda: coalesced([(o10, torch.randn(20_000)), (o11, torch.randn(100))], "ag"))
    # tensors whose elements share memory (plain gloo crashes the process on them)
    base1, base2, base3 = S(1), S(1), S(1)
    calls["ar_expanded"] = ([base1], lambda: dist.all_reduce(base1.expand(20_000), group=g))
    calls["ar_expanded_small"] = ([base2], lambda: dist.all_reduce(base2.expand(100), group=g))
    calls["ag_expanded_output"] = (
        [base3], lambda: dist.all_gather_into_tensor(base3.expand(100 * w), torch.randn(100), group=g))
    # wrong devices. torch's dispatcher sends meta tensors given to dist.* to its own
    # meta kernels, so the backend is called directly here.
    o12 = S(100)
    calls["device_ag"] = ([], lambda: be._allgather_base(torch.empty(100 * w, device="meta"), torch.randn(100)))
    calls["device_rs"] = ([o12], lambda: be._reduce_scatter_base(o12, torch.empty(100 * w, device="meta")))
    calls["device_ar"] = ([], lambda: be.allreduce([torch.empty(100, device="meta")]))
    # neither reduced by gloo nor emulated
    t5 = torch.full((100,), 7, dtype=torch.int64)
    calls["premul_int_gloo"] = ([t5], lambda: dist.all_reduce(t5, op=dist._make_nccl_premul_sum(2.0), group=g))
    return calls


def bad_inputs():
    """Each bad call must raise on this rank before anything is sent, without
    writing any tensor (never a partial write) and without being counted in
    the stats; afterwards a correct collective still works."""
    c = ctx()
    fp8comm.reset_stats(c.group)
    results = {}
    for name, (watched, call) in _bad_calls(c).items():
        before = [t.clone() for t in watched]
        try:
            call()
            error = None
        except (RuntimeError, ValueError) as e:
            error = str(e)
        untouched = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(watched, before))
        results[name] = BadCall(error, untouched)
    stats = fp8comm.get_stats(c.group)
    x = rank_input(c.rank, 20_000, torch.float32)
    dist.all_reduce(x, group=c.group)
    return BadInputs(results, stats, sqnr_db(reference_sum(20_000, torch.float32, "sum", "", c.world), x))


def reinit_in_same_process(init_file: str):
    """destroy_process_group(), then init_process_group again, then work."""
    c = ctx()
    dist.destroy_process_group()
    dist.init_process_group("fp8gloo", init_method=f"file://{init_file}", rank=c.rank, world_size=c.world)
    gloo = dist.new_group(backend="gloo")
    harness._CTX = harness.Context(c.rank, c.world, dist.group.WORLD, gloo)
    x = rank_input(c.rank, 50_000, torch.float32)
    dist.all_reduce(x)
    return SqnrStats(sqnr_db(reference_sum(50_000, torch.float32, "sum", "", c.world), x), fp8comm.get_stats())


def stats_of_coalesced(kind: str):
    """Stats of one coalesced call (two tensors: one compressible, one under
    min_numel) on a group that compresses everything from 1024 elements."""
    c = ctx()
    pg = fp8_group("compress=all;min_numel=1024")
    w = c.world
    fp8comm.reset_stats(pg)
    with dist._coalescing_manager(group=pg):
        for k in (5000, 100):
            if kind == "reduce_scatter":
                dist.reduce_scatter_tensor(torch.empty(k), torch.randn(k * w), group=pg)
            elif kind == "all_gather":
                dist.all_gather_into_tensor(torch.empty(k * w), torch.randn(k), group=pg)
            else:
                dist.all_reduce(torch.randn(k), group=pg)
    return fp8comm.get_stats(pg)
