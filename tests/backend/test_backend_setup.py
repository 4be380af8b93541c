"""Registration, init forms, options, stats and bad input of fp8gloo."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
from typing import NamedTuple

import pytest
import torch
import torch.distributed as dist

import fp8comm
from tests.support import REPO_ROOT, harness
from tests.support.groups import fp8_group
from tests.support.harness import DistPool, PoolSpec, ctx
from tests.support.inputs import rank_input
from tests.support.reference import sqnr_db
from tests.support.scenarios.collectives import reference_sum
from tests.support.stats import calls as stats_calls


# ---------------------------------------------------------------- scenarios
# Run on every rank of the pool: module-level, the ranks import this module.
# Scenarios of setting a group up and using it wrongly (run on every rank of
# a DistPool): options, stats, subgroups, re-initialization, bad input.

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
        "wire_format": be.wire_format,
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


# -------------------------------------------------------------------- tests

ROOT = str(REPO_ROOT)


POOLS = [PoolSpec(3, "fp8gloo")]


def test_backends_are_registered():
    assert dist.Backend.FP8GLOO == "fp8gloo" and dist.Backend.FP8NCCL == "fp8nccl"
    assert dist.Backend.backend_capability["fp8gloo"] == ["cpu"]
    assert dist.Backend.backend_capability["fp8nccl"] == ["cuda"]
    fp8comm.backend.register()  # idempotent


@pytest.mark.parametrize("dtype,bound", [(torch.float32, 0.26), (torch.bfloat16, 0.52)])
def test_bytes_ratio_at_1m_elements(pool, dtype, bound):
    for stats in pool.run(stats_after_all_reduce, 1 << 20, dtype):
        assert stats["calls_compressed"] == 1
        assert stats["per_op"]["all_reduce"]["compressed"] == 1
        ratio = stats["bytes_sent"] / stats["bytes_sent_uncompressed"]
        assert ratio <= bound
        # 2(P-1)/P * n * elem uncompressed, for P = 3
        assert stats["bytes_sent_uncompressed"] == 2 * 2 * (1 << 20) * torch.tensor([], dtype=dtype).element_size() // 3


@pytest.mark.parametrize("kind", ["reduce_scatter", "all_gather", "all_reduce"])
def test_coalesced_calls_are_counted_under_their_own_name(pool, kind):
    """_coalescing_manager issues one *_coalesced call: per_op names that entry
    point. The tensor forms count one collective per tensor (each compressed or
    passed through as it would be alone); all_reduce_coalesced is one
    compressed all_reduce of the concatenation."""
    P = pool.world
    seg = fp8comm.segment_bytes  # a CPU wire segment: a 16-byte header, then the codec's
    for stats in pool.run(stats_of_coalesced, kind):
        if kind == "all_reduce":
            assert stats_calls(stats) == {"all_reduce_coalesced": {"compressed": 1, "passthrough": 0}}
            assert stats["bytes_sent_uncompressed"] == 2 * (P - 1) * 5100 * 4 // P
            continue
        name = {"reduce_scatter": "reduce_scatter_tensor_coalesced", "all_gather": "all_gather_into_tensor_coalesced"}
        assert stats_calls(stats) == {name[kind]: {"compressed": 1, "passthrough": 1}}
        assert stats["per_op"][name[kind]]["passthrough_reasons"] == {"below min_numel": 1}
        assert stats["calls_compressed"] == 1 and stats["calls_passthrough"] == 1
        assert stats["bytes_sent"] == (P - 1) * (16 + seg(5000, 32) + 100 * 4)
        assert stats["bytes_sent_uncompressed"] == (P - 1) * 5100 * 4


def test_default_options(pool):
    props = pool.run(backend_properties)[0]
    assert props == {
        "name": "fp8gloo",
        "block_size": 32,
        "wire_format": "e4m3",
        "min_numel": fp8comm.options.DEFAULT_MIN_NUMEL,
        "compressed_ops": ["all_reduce", "reduce_scatter"],
    }


def test_pg_options_reach_the_backend(pool):
    props = pool.run(backend_properties, "block_size=64;wire_format=mxfp4;min_numel=7;compress=all")[0]
    assert props["block_size"] == 64 and props["wire_format"] == "mxfp4" and props["min_numel"] == 7
    assert props["compressed_ops"] == ["all_reduce", "reduce_scatter", "all_gather"]


def test_environment_gives_the_defaults():
    env = {"FP8COMM_BLOCK_SIZE": "128", "FP8COMM_WIRE_FORMAT": "e5m2", "FP8COMM_MIN_NUMEL": "9", "FP8COMM_COMPRESS": "all_gather"}
    p = DistPool(2, backend="fp8gloo", env=env)
    try:
        props = p.run(backend_properties)[0]
    finally:
        p.close()
    assert props["block_size"] == 128 and props["wire_format"] == "e5m2" and props["min_numel"] == 9
    assert props["compressed_ops"] == ["all_gather"]


def test_compress_none_is_exact(pool):
    for r in pool.run(compress_none_passes_everything_through):
        assert r.equal_to_gloo
        assert r.stats["calls_compressed"] == 0 and r.stats["calls_passthrough"] == 2


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"block_size": 8}, "block_size must be a multiple of 16"),
        ({"block_size": 4112}, "block_size must be a multiple of 16"),
        ({"fp8_dtype": "e3m4"}, "fp8_dtype must be"),
        ({"wire_format": "e3m4"}, "wire_format must be"),
        ({"fp8_dtype": torch.float16}, "fp8_dtype must be"),
        ({"min_numel": -1}, "min_numel must be an int >= 0"),
        ({"compress": "all_reduce,broadcast"}, r"compress must be .*, got 'all_reduce,broadcast'"),
    ],
)
def test_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fp8comm.Options(**kwargs).resolved()


def test_bad_environment(monkeypatch):
    monkeypatch.setenv("FP8COMM_BLOCK_SIZE", "big")
    with pytest.raises(ValueError, match="block_size must be .*, got 'big' \\(from FP8COMM_BLOCK_SIZE\\)"):
        fp8comm.Options().resolved()
    monkeypatch.setenv("FP8COMM_BLOCK_SIZE", "32")
    monkeypatch.setenv("FP8COMM_COMPRESS", "everything")
    with pytest.raises(ValueError, match="compress must be .*, got 'everything' \\(from FP8COMM_COMPRESS\\)"):
        fp8comm.Options().resolved()


def test_options_resolution_keeps_explicit_values(monkeypatch):
    monkeypatch.setenv("FP8COMM_BLOCK_SIZE", "64")
    opts = fp8comm.Options(block_size=16, compress=["all_gather", "all_reduce"]).resolved()
    assert opts.block_size == 16 and opts.compress == ("all_reduce", "all_gather")
    assert fp8comm.Options().resolved().block_size == 64


def test_wrong_pg_options_type_is_refused():
    with tempfile.TemporaryDirectory() as d:
        with pytest.raises(TypeError, match="pg_options must be fp8comm.Options"):
            dist.init_process_group(
                "fp8gloo", init_method=f"file://{d}/s", rank=0, world_size=1, pg_options={"block_size": 64}
            )
    if dist.is_initialized():
        dist.destroy_process_group()


def test_group_name_and_description_reach_the_inner_backend(pool):
    for r in pool.run(group_identity):
        assert r.transport_uid == r.group_name and r.transport_desc == "fp8-test-group"
        assert torch.equal(r.result, torch.full((10,), 3.0))


def test_subgroups(pool):
    results = pool.run(subgroup_of_first_two, 3)
    assert results[0] == results[1] == [3.0, 5.0, 7.0]
    assert results[2] == []


BAD_INPUT_MESSAGES = {
    "rs_size": r"reduce_scatter_tensor: input has 301 elements but must have group size \(3\) x output numel \(100\) = 300",
    "rs_dtype": r"reduce_scatter_tensor: output has dtype BFloat16 but the input has dtype Float",
    "ag_size": r"all_gather_into_tensor: output has 303 elements but must have group size \(3\)",
    "ag_dtype": r"all_gather_into_tensor: output has dtype Half but the input has dtype Float",
    "ag_list_len": r"all_gather: the output list has 4 tensors but the group has 3 ranks",
    "ag_list_size": r"all_gather: every output must have the input's 100 elements, got 101",
    "ag_list_dtype": r"all_gather: an output has dtype BFloat16 but the input has dtype Float",
    "rs_list_size": r"reduce_scatter: every input must have the output's 5000 elements, got 5001",
    "rs_list_dtype": r"reduce_scatter: an input has dtype BFloat16 but the output has dtype Float",
    "fp8_reduce": r"all_reduce: cannot reduce Float8_e4m3fn tensors",
    "fp8_reduce_premul": r"all_reduce: cannot reduce Float8_e4m3fn tensors",
    "fp8_all_reduce_coalesced": r"all_reduce_coalesced: cannot reduce Float8_e4m3fn tensors",
    "fp8_rs_list": r"fp8comm reduce_scatter: cannot reduce Float8_e4m3fn tensors",
    "fp8_rs_coalesced": r"reduce_scatter_tensor_coalesced: cannot reduce Float8_e4m3fn tensors",
    "fp8_reduce_op": r"fp8comm reduce: cannot reduce Float8_e4m3fn tensors",
    "rs_coalesced_second_bad": r"reduce_scatter_tensor_coalesced: input has 301 elements but must have",
    "ag_coalesced_second_bad": r"all_gather_into_tensor_coalesced: output has dtype BFloat16 but the input",
    "ar_expanded": r"all_reduce: the tensor has elements that share memory",
    "ar_expanded_small": r"all_reduce: the tensor has elements that share memory",
    "ag_expanded_output": r"all_gather_into_tensor: the output has elements that share memory",
    "device_ag": r"all_gather_into_tensor: output is on meta but the input is on cpu",
    "device_rs": r"reduce_scatter_tensor: output is on cpu but the input is on meta",
    "device_ar": r"all_reduce: got meta tensors, but this process group has no transport for meta",
    "premul_int_gloo": r"all_reduce: PREMUL_SUM of Long tensors: the gloo transport has neither AVG nor PREMUL_SUM",
}


def test_bad_input_raises_on_the_calling_rank_before_sending(pool):
    """A clear error on the calling rank, no tensor written (not even the
    first pair of a coalesced call whose second pair is bad), nothing counted,
    and the next collective is right (nothing stray was sent)."""
    for r in pool.run(bad_inputs):
        assert set(r.calls) == set(BAD_INPUT_MESSAGES)
        for name, pattern in BAD_INPUT_MESSAGES.items():
            call = r.calls[name]
            assert call.error is not None, f"{name} did not raise"
            assert re.search(pattern, call.error), (name, call.error)
            assert call.untouched, f"{name} wrote into a tensor before raising"
        assert r.stats["calls_compressed"] == 0 and r.stats["calls_passthrough"] == 0, r.stats
        assert r.next_sqnr_db >= 27.0


def test_destroy_and_init_again_in_the_same_process():
    p = DistPool(2, backend="fp8gloo")
    try:
        with tempfile.TemporaryDirectory() as d:
            for r in p.run(reinit_in_same_process, os.path.join(d, "again")):
                assert r.sqnr_db >= 27.0 and r.stats["calls_compressed"] == 1
    finally:
        p.close()


def test_torchrun_env_rendezvous_runs_the_minimal_example():
    with socket.socket() as sock:  # a free port for the static rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
           os.path.join(ROOT, "examples", "all_reduce_minimal.py")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    sqnr = float(re.search(r"SQNR vs exact FP64 sum: ([\d.]+) dB", out.stdout).group(1))
    ratio = float(re.search(r"ratio ([\d.]+)\)", out.stdout).group(1))
    assert sqnr >= 27.0 and ratio <= 0.26


def test_init_without_nccl_says_why():
    if dist.is_nccl_available():
        pytest.skip("this torch has NCCL")
    with tempfile.TemporaryDirectory() as d:
        with pytest.raises(RuntimeError, match="fp8nccl needs torch.distributed with NCCL"):
            dist.init_process_group("cpu:gloo,cuda:fp8nccl", init_method=f"file://{d}/s", rank=0, world_size=1)
    if dist.is_initialized():
        dist.destroy_process_group()
