"""The one-GPU benchmarks that predict a cluster (bench/collective_time.py,
interference.py, overlap.py, enqueue.py; issue 44, 4) cannot run here: their
smoke modes run on the CPU, all four in one process, and these tests check
that they plan the calls a collective makes, write their part of the
session's JSON with every field labelled measured / modeled / counted, and
say why a field a CPU cannot give is empty. The chunk plan they time is
chunk_plan.cpp's, checked here against the C++ constants and by hand. And
the side-by-side runner runs a benchmark once per CUDA codec kernel set."""
import contextlib
import json
import re
import os
import subprocess
import sys
import time

import pytest
from tests.support import REPO_ROOT

BENCH = str(REPO_ROOT / "bench")
SMOKE = """
import sys
import time
sys.argv = ["smoke"]
import collective_time, enqueue, interference, overlap
path = sys.argv_path = {path!r}
collective_time.main(["--smoke", "--ranks", "2,16", "--json", path, "--part", "collective_time"])
interference.main(["--smoke", "--json", path, "--part", "interference"])
overlap.main(["--smoke", "--json", path, "--part", "overlap"])
enqueue.main(["--smoke", "--json", path])
"""


def bench_module(name):
    sys.path.insert(0, BENCH)
    try:
        return __import__(name)
    finally:
        sys.path.remove(BENCH)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    path = tmp_path_factory.mktemp("cluster") / "cluster-1gpu.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), BENCH]), "FP8COMM_CUDA_CODEC": "legacy"}
    out = subprocess.run([sys.executable, "-c", SMOKE.format(path=str(path))], capture_output=True, text=True,
                         timeout=300, cwd=str(REPO_ROOT), env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(path.read_text()), out.stdout


def test_every_part_is_written_labelled_and_marked_as_a_smoke_run(smoke):
    doc, _ = smoke
    assert doc["benchmark"] == "cluster-1gpu"
    assert set(doc["parts"]) == {"collective_time", "interference", "overlap", "enqueue"}
    for name, part in doc["parts"].items():
        assert part["smoke"] is True and part["benchmark"] == name and part["rows"], name
        assert part["FP8COMM_CUDA_CODEC"] == "legacy"  # which kernel set the process ran, as it saw it
        assert part["labels"] and all(isinstance(v, str) and v for v in part["labels"].values()), name
        assert re.search(r"[Mm]easured|MEASURED", part["notes"]), name  # what is measured, in words


def test_collective_time_runs_every_op_dtype_and_format_at_its_chunk_plan(smoke):
    part = smoke[0]["parts"]["collective_time"]
    rows = part["rows"]
    import fp8comm

    assert {(r["op"], r["ranks"], r["dtype"], r["wire_format"]) for r in rows} == {
        (op, P, dt, wf) for op in ("all_reduce", "reduce_scatter", "all_gather") for P in (2, 16)
        for dt in ("float32", "bfloat16") for wf in fp8comm.codec.WIRE_FORMATS}
    assert part["chunk_numel"] == 1 << 14  # the smoke's, so that its 64K elements make several chunks
    for r in rows:
        assert r["seconds"] > 0 and r["codec_bytes"] > 0 and r["launches"] >= 2 and r["chunks"] >= 1
    assert max(r["chunks"] for r in rows if r["op"] == "all_reduce") == 4


def test_the_cpu_says_why_it_has_no_streams(smoke):
    parts = smoke[0]["parts"]
    for name, field in (("interference", "slowdown"), ("overlap", "overlap")):
        for r in parts[name]["rows"]:
            assert r[field] is None and "no streams on the CPU" in r["why_none"]
    assert {r["tokens"] for r in parts["interference"]["rows"]} == {64}
    for r in parts["enqueue"]["rows"]:
        assert r["calls_compressed"] == r["calls"] and r["host_s"] > 0 and r["gpu_s"] is None
        assert r["graph"].startswith("not attempted")
    assert parts["overlap"]["labels"]["wire_s"].startswith("MODELED")


def test_the_chunk_plan_is_chunk_plan_cpps():
    ct = bench_module("collective_time")
    traits = (REPO_ROOT / "csrc" / "algorithms" / "transport_traits.h").read_text()
    assert "t.chunk_numel = int64_t{1} << 24;" in traits and ct.NCCL_CHUNK_NUMEL == 1 << 24
    # all_reduce over 40M elements on 4 ranks, block 32: chunks of 4 x 4M
    chunks = ct.chunk_plan(4, 32, True, 40 << 20)
    assert [(c.begin, c.numel, c.m) for c in chunks] == [(0, 16 << 20, 4 << 20), (16 << 20, 16 << 20, 4 << 20),
                                                         (32 << 20, 8 << 20, 2 << 20)]
    # each rank's segment (reduce_scatter, all_gather): chunks of ceil(16M / P) rounded to blocks
    chunks = ct.chunk_plan(3, 32, False, 10 << 20)
    per = -(-(-(-(16 << 20) // 3)) // 32) * 32
    assert [c.numel for c in chunks] == [per, (10 << 20) - per] and all(c.m == c.numel for c in chunks)
    assert len(ct.chunk_plan(8, 32, True, 0)) == 1  # at least one chunk


def test_the_launches_are_the_algorithms():
    ct = bench_module("collective_time")
    L = ct.Launch
    # all_reduce, one chunk, rank 1 of 4: the peers' segments before and after its own, the sum with its own
    # segment as the addend, then the P segments decoded in one launch
    m = 1024
    assert ct.launches("all_reduce", 4, 32, 4 * m) == [
        L("quantize", 1, m, m), L("quantize", 2, m, 2 * m, src_at=2 * m, slot=1),
        L("sum_requantize", 3, m, m, src_at=m), L("dequantize", 4, m, 4 * m)]
    # two chunks: the second's elements and bytes are its own
    two = ct.launches("all_reduce", 4, 32, 8 * m, chunk_numel=4 * m)
    assert [(x.kind, x.chunk, x.src_at, x.dst_at) for x in two] == [
        ("quantize", 0, 0, 0), ("quantize", 0, 2 * m, 0), ("quantize", 1, 4 * m, 0), ("quantize", 1, 6 * m, 0),
        ("sum_requantize", 0, m, 0), ("sum_requantize", 1, 5 * m, 0), ("dequantize", 0, 0, 0),
        ("dequantize", 1, 0, 4 * m)]
    # reduce_scatter: one quantize per peer from its segment of the input, then the sum with this rank's own
    assert ct.launches("reduce_scatter", 4, 32, 4 * m) == [
        L("quantize", 1, m, m, src_at=q * m, slot=j) for j, q in enumerate((0, 2, 3))] + [
        L("sum", 3, m, m, src_at=m)]
    # all_gather: its own segment, then all P decoded at once into the flat output, or by chunk and rank
    assert ct.launches("all_gather", 4, 32, 4 * m) == [L("quantize", 1, m, m), L("dequantize", 4, m, 4 * m)]
    two = ct.launches("all_gather", 4, 32, 8 * m, chunk_numel=4 * m)
    assert [(x.kind, x.chunk, x.slot, x.dst_at) for x in two if x.kind == "dequantize"] == [
        ("dequantize", i, q, q * 2 * m + i * m) for i in range(2) for q in range(4)]
    with pytest.raises(ValueError, match="not one of"):
        ct.launches("broadcast", 4, 32, m)
    assert ct.launch_bytes(L("quantize", 2, m, 2 * m), 4, 1000) == 8 * m + 2000
    assert ct.launch_bytes(L("sum", 3, m, m), 2, 1000) == 3000 + 4 * m


def test_side_by_side_runs_a_bench_once_per_kernel_set(tmp_path):
    fake = ("import json, os, sys; json.dump({'benchmark': 'fake', 'rows': [{'set': "
            "os.environ['FP8COMM_CUDA_CODEC']}]}, open(sys.argv[1], 'w'))")
    out = tmp_path / "both.json"
    (tmp_path / "each").mkdir()
    p = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "gpu_session" / "side_by_side.py"), "--sets",
                        "legacy,tiled", "--json", str(out), "--each", str(tmp_path / "each"), "--part", "fake",
                        "--", sys.executable, "-c", fake, "{json}"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(out.read_text())["parts"]["fake"]
    assert doc["kernel_sets"] == ["legacy", "tiled"]
    assert [(r["set"], r["cuda_codec"]) for r in doc["rows"]] == [("legacy", "legacy"), ("tiled", "tiled")]
    assert sorted(os.listdir(tmp_path / "each")) == ["fake-legacy.json", "fake-tiled.json"]
    assert "== FP8COMM_CUDA_CODEC=legacy" in p.stdout and "== FP8COMM_CUDA_CODEC=tiled" in p.stdout
    # a set that fails fails the command, after the others ran
    p = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "gpu_session" / "side_by_side.py"), "--sets",
                        "legacy,tiled", "--json", str(out), "--", sys.executable, "-c",
                        "import os, sys; sys.exit(os.environ['FP8COMM_CUDA_CODEC'] == 'legacy')", "{json}"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "failed kernel sets: legacy, tiled" in p.stdout  # tiled wrote no JSON either


class FakeEvent:
    """torch.cuda.Event on the CPU: the host's clock at record()."""

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


class FakeStream:
    def __init__(self):
        self.waited = 0

    def wait_event(self, event):
        assert event.t is not None  # an event is waited for only after it was recorded
        self.waited += 1

    def wait_stream(self, stream):
        pass


@pytest.fixture
def fake_cuda(monkeypatch):
    """The CUDA-only control flow (streams, events, the spin) runs on CPU tensors."""
    import torch

    current = FakeStream()
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: current)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None)
    return current


def test_the_streamed_paths_run_their_schedules(fake_cuda):
    """What only a GPU runs, on stand-in streams and events: the GEMM and the
    codec interleaved on two streams; the overlap schedule's two streams, each
    chunk's sum waiting for its exchange and the decodes for the last gather."""
    import torch

    interference, overlap = bench_module("interference"), bench_module("overlap")
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    codec, moved = interference.codec_job("e4m3", 1 << 14, 1 << 12, "cpu")
    assert moved > 0
    g, c = interference.side_by_side(lambda: a @ b, 2, codec, 5, trials=2)
    assert len(g["trials_s"]) == 2 and g["median_s"] > 0 and c["median_s"] > 0
    s = overlap.Schedule("mxfp4", torch.bfloat16, 1 << 16, 1 << 14, "cpu", 1e9, 1e9)
    s.wire_stream = FakeStream()
    s.calibrate()
    assert set(s.pad) == set(s.exchange_bytes + s.gather_bytes) and all(v >= 0 for v in s.pad.values())
    assert len(s.chunks) == 4 and len(s.quantizes) == 4 and all(len(q) == 2 for q in s.quantizes)
    s.pipelined()
    assert s.wire_stream.waited == 2 * len(s.chunks)  # each exchange after its quantize, each gather after its sum
    assert fake_cuda.waited == len(s.chunks) + 1  # each sum after its exchange, the decodes after the last gather
    s.serial()


def test_an_unclear_capture_error_fails_the_enqueue_bench():
    enqueue = bench_module("enqueue")
    try:
        raise RuntimeError("fp8comm: all_reduce cannot be captured in a CUDA graph")
    except RuntimeError as e:
        assert "cannot be captured" in enqueue.refusal("all_reduce", e)
    with pytest.raises(SystemExit, match="does not name fp8comm"):
        enqueue.refusal("all_reduce", RuntimeError("operation not permitted when stream is capturing"))
