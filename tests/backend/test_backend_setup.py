"""Registration, init forms, options, stats and bad input of fp8gloo."""
import os
import re
import socket
import subprocess
import sys
import tempfile

import pytest
import torch
import torch.distributed as dist

import fp8comm
from tests.support import REPO_ROOT
from tests.support.harness import DistPool, PoolSpec
from tests.support.scenarios import setup

ROOT = str(REPO_ROOT)


POOLS = [PoolSpec(3, "fp8gloo")]


def test_backends_are_registered():
    assert dist.Backend.FP8GLOO == "fp8gloo" and dist.Backend.FP8NCCL == "fp8nccl"
    assert dist.Backend.backend_capability["fp8gloo"] == ["cpu"]
    assert dist.Backend.backend_capability["fp8nccl"] == ["cuda"]
    fp8comm.backend.register()  # idempotent


@pytest.mark.parametrize("dtype,bound", [(torch.float32, 0.26), (torch.bfloat16, 0.52)])
def test_bytes_ratio_at_1m_elements(pool, dtype, bound):
    for stats in pool.run(setup.stats_after_all_reduce, 1 << 20, dtype):
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
    for stats in pool.run(setup.stats_of_coalesced, kind):
        if kind == "all_reduce":
            assert stats["per_op"] == {"all_reduce_coalesced": {"compressed": 1, "passthrough": 0}}
            assert stats["bytes_sent_uncompressed"] == 2 * (P - 1) * 5100 * 4 // P
            continue
        name = {"reduce_scatter": "reduce_scatter_tensor_coalesced", "all_gather": "all_gather_into_tensor_coalesced"}
        assert stats["per_op"] == {name[kind]: {"compressed": 1, "passthrough": 1}}
        assert stats["calls_compressed"] == 1 and stats["calls_passthrough"] == 1
        assert stats["bytes_sent"] == (P - 1) * (16 + seg(5000, 32) + 100 * 4)
        assert stats["bytes_sent_uncompressed"] == (P - 1) * 5100 * 4


def test_default_options(pool):
    props = pool.run(setup.backend_properties)[0]
    assert props == {
        "name": "fp8gloo",
        "block_size": 32,
        "fp8_dtype": "e4m3",
        "min_numel": fp8comm.options.DEFAULT_MIN_NUMEL,
        "compressed_ops": ["all_reduce", "reduce_scatter"],
    }


def test_pg_options_reach_the_backend(pool):
    props = pool.run(setup.backend_properties, "block_size=64;fp8_dtype=e5m2;min_numel=7;compress=all")[0]
    assert props["block_size"] == 64 and props["fp8_dtype"] == "e5m2" and props["min_numel"] == 7
    assert props["compressed_ops"] == ["all_reduce", "reduce_scatter", "all_gather"]


def test_environment_gives_the_defaults():
    env = {"FP8COMM_BLOCK_SIZE": "128", "FP8COMM_FP8_DTYPE": "e5m2", "FP8COMM_MIN_NUMEL": "9", "FP8COMM_COMPRESS": "all_gather"}
    p = DistPool(2, backend="fp8gloo", env=env)
    try:
        props = p.run(setup.backend_properties)[0]
    finally:
        p.close()
    assert props["block_size"] == 128 and props["fp8_dtype"] == "e5m2" and props["min_numel"] == 9
    assert props["compressed_ops"] == ["all_gather"]


def test_compress_none_is_exact(pool):
    for r in pool.run(setup.compress_none_passes_everything_through):
        assert r.equal_to_gloo
        assert r.stats["calls_compressed"] == 0 and r.stats["calls_passthrough"] == 2


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"block_size": 8}, "block_size must be a multiple of 16"),
        ({"block_size": 4112}, "block_size must be a multiple of 16"),
        ({"fp8_dtype": "e3m4"}, "fp8_dtype must be"),
        ({"fp8_dtype": torch.float16}, "fp8_dtype must be"),
        ({"min_numel": -1}, "min_numel must be an int >= 0"),
        ({"compress": "all_reduce,broadcast"}, r"unknown op\(s\) \['broadcast'\]"),
    ],
)
def test_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fp8comm.Options(**kwargs).resolved()


def test_bad_environment(monkeypatch):
    monkeypatch.setenv("FP8COMM_BLOCK_SIZE", "big")
    with pytest.raises(ValueError, match="FP8COMM_BLOCK_SIZE must be an integer"):
        fp8comm.Options().resolved()
    monkeypatch.setenv("FP8COMM_BLOCK_SIZE", "32")
    monkeypatch.setenv("FP8COMM_COMPRESS", "everything")
    with pytest.raises(ValueError, match="FP8COMM_COMPRESS: unknown op"):
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
    for r in pool.run(setup.group_identity):
        assert r.transport_uid == r.group_name and r.transport_desc == "fp8-test-group"
        assert torch.equal(r.result, torch.full((10,), 3.0))


def test_subgroups(pool):
    results = pool.run(setup.subgroup_of_first_two, 3)
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
    for r in pool.run(setup.bad_inputs):
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
            for r in p.run(setup.reinit_in_same_process, os.path.join(d, "again")):
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
