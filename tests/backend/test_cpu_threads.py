"""The CPU codec's threads (DESIGN.md, "CPU threads"): its own pool, sized
per process to the process's share of the host's cores whatever
OMP_NUM_THREADS / torch's thread count say, overridden by
Options(cpu_threads=) and FP8COMM_CPU_THREADS; the same bytes for any count;
idle threads sleep."""
from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

import fp8comm
from fp8comm import _C
from tests.support.harness import DistPool


# ---------------------------------------------------------------- scenarios
# Run on every rank of the pool: module-level, the ranks import this module.

def codec_threads(pg_options: dict | None = None) -> int:
    """The CPU codec's thread count after creating one more fp8gloo group."""
    opts = fp8comm.Options(**pg_options) if pg_options else None
    dist.new_group(backend="fp8gloo", pg_options=opts)
    return _C.cpu_threads()


def threads_now() -> dict:
    return {"threads": _C.cpu_threads(), "cores": _C.available_cores()}


# -------------------------------------------------------------------- tests


@pytest.fixture
def restore_threads():
    before = _C.cpu_threads()
    yield
    _C.set_cpu_threads(before)


def test_same_bytes_for_any_thread_count(restore_threads):
    x = torch.randn(3 * 1024 * 1024 + 17)
    own = torch.randn(3 * 1024 * 1024 + 17)
    results = []
    for n in (1, 2, 3, 8):
        _C.set_cpu_threads(n)
        codes, scales = fp8comm.quantize(x)
        back = fp8comm.dequantize(codes, scales, dtype=torch.float32)[: x.numel()]
        results.append((codes.view(torch.uint8), scales.view(torch.uint8), back.view(torch.int32)))
    for r in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(r, results[0]))


def test_idle_threads_sleep(restore_threads):
    """A spinning idle thread would burn CPU time while this one sleeps."""
    _C.set_cpu_threads(4)
    x = torch.randn(8 * 1024 * 1024)
    time.sleep(0.1)  # torch's own OpenMP threads (randn) stop spinning
    for _ in range(3):
        fp8comm.quantize(x)
    start = time.process_time()
    time.sleep(0.3)
    assert time.process_time() - start < 0.05


def test_set_cpu_threads_checks_its_argument(restore_threads):
    with pytest.raises(ValueError, match="at least 1 thread"):
        _C.set_cpu_threads(0)
    assert _C.set_cpu_threads(2) >= 1 and _C.cpu_threads() == 2


@pytest.mark.parametrize("world", [2, 3])
def test_default_is_the_share_of_the_hosts_cores(world):
    """No LOCAL_WORLD_SIZE (a torch.multiprocessing launch): the ranks with
    this host name share its cores, whatever OMP_NUM_THREADS says."""
    pool = DistPool(world, env={"OMP_NUM_THREADS": "8"})
    try:
        for r in pool.run(threads_now):
            assert r["threads"] == max(1, r["cores"] // world)
    finally:
        pool.close()


def test_local_world_size_and_overrides():
    pool = DistPool(2, env={"LOCAL_WORLD_SIZE": "1"})
    try:
        cores = pool.run(threads_now)[0]["cores"]
        assert all(r["threads"] == cores for r in pool.run(threads_now))  # one rank per host: every core
        assert pool.run(codec_threads, {"cpu_threads": cores + 1}) == [cores + 1] * 2  # taken as it is
        assert pool.run(codec_threads) == [cores] * 2  # a group with the default lowers it to the share
        assert pool.run(codec_threads, {"cpu_threads": 1}) == [1, 1]
        assert pool.run(codec_threads) == [1, 1]  # and never raises it
    finally:
        pool.close()


def test_environment_variable_sets_it_and_is_checked():
    pool = DistPool(2, env={"FP8COMM_CPU_THREADS": "1"})
    try:
        assert [r["threads"] for r in pool.run(threads_now)] == [1, 1]
    finally:
        pool.close()
    with pytest.raises(ValueError, match="FP8COMM_CPU_THREADS"):
        with pytest.MonkeyPatch.context() as m:
            m.setenv("FP8COMM_CPU_THREADS", "0")
            fp8comm.Options().resolved()
