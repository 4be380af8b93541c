"""The benchmarks run in a seconds-long smoke mode so they cannot rot; these
tests check the fields they report, never times."""
import json
import os
import shutil
import subprocess
import sys

import pytest

import fp8comm
from tests.support import REPO_ROOT
from tests.tools.test_convergence import load

# One of the longest modules: it starts first (tests/conftest.py).
STARTS_FIRST = True

ROOT = str(REPO_ROOT)


def run_script(*args, timeout=300, cwd=ROOT, env=None):
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_codec_bench_quick(tmp_path):
    """Every format, both dtypes, the collectives' own-addend sums and
    stochastic rounding; each row a median of 5 trials with its spread,
    its floor at the copy of its own dtype."""
    path = tmp_path / "codec.json"
    run_script("bench/codec.py", "--quick", "--device", "cpu", "--json", str(path))
    result = json.loads(path.read_text())
    assert result["benchmark"] == "codec" and result["torch"] and result["device"] and result["command"]
    assert result["trials"] == 5 and result["ranks"] == 4
    rows = result["rows"]
    assert {r["wire_format"] for r in rows} == set(fp8comm.codec.WIRE_FORMATS)
    assert {r["dtype"] for r in rows} == {"float32", "bfloat16"}
    ops = {r["op"] for r in rows}
    assert {"copy", "copy_fp32", "quantize", "dequantize", "dequant_sum_own", "dequant_sum_requantize_own",
            "dequant_sum", "dequant_sum_requantize", "quantize_stochastic",
            "dequant_sum_requantize_own_stochastic", "quantize_1_thread"} == ops
    for r in rows:
        assert r["trials"] == 5 and r["seconds_min"] <= r["seconds_q1"] <= r["seconds"] <= r["seconds_q3"]
        assert r["seconds_q3"] <= r["seconds_max"] and r["gb_per_s"] > 0
        assert r["fraction_of_copy"] == pytest.approx(r["floor_seconds"] / r["seconds"])
        assert r["rounding"] == ("stochastic" if r["op"].endswith("_stochastic") else "nearest")
    groups = {(r["wire_format"], r["dtype"], r["numel"]) for r in rows}
    for fmt, dtype, n in groups:
        group = {r["op"]: r for r in rows if (r["wire_format"], r["dtype"], r["numel"]) == (fmt, dtype, n)}
        copy = group["copy"]
        es = 4 if dtype == "float32" else 2
        assert copy["bytes_moved"] == 2 * es * n and copy["fraction_of_copy"] == pytest.approx(1.0)
        assert ("copy_fp32" in group) == (dtype == "bfloat16")
        own = group["dequant_sum_requantize_own"]
        m = own["segment_numel"]
        assert (own["pieces"], own["own_addend"], m) == (3, True, -(-n // 4))
        segment = fp8comm.segment_bytes(m, wire_format=fmt)
        assert own["bytes_moved"] == 3 * segment + es * m + segment
        assert group["dequant_sum_own"]["bytes_moved"] == 3 * segment + 2 * es * m
        assert group["dequant_sum_requantize"]["pieces"] == 4


def test_codec_bench_kernel_sets_need_cuda_and_keep_the_other_arguments(capsys):
    codec = load("fp8comm_bench_codec", "bench/codec.py")
    with pytest.raises(SystemExit, match="CPU codec has one set"):
        codec.check_kernels("cpu", ["legacy", "tiled"])
    assert codec.child_argv(["--device", "cuda", "--kernels", "legacy,tiled", "--sizes", "64M", "--json", "x.json",
                             "--kernels=a", "--json=y"]) == ["--device", "cuda", "--sizes", "64M"]
    rows = [{"kernels": ks, "wire_format": "e4m3", "dtype": "bfloat16", "numel": 64, "op": "quantize",
             "fraction_of_copy": f} for ks, f in (("legacy", 0.5), ("tiled", 0.9))]
    codec.print_side_by_side(rows, ["legacy", "tiled"])
    line = capsys.readouterr().out.splitlines()[-1]  # one line, both sets
    assert line.split()[0] == "quantize" and line.split()[-2:] == ["0.50", "0.90"]


def test_comm_bench_quick(tmp_path):
    """Run as from an installed package: only the fp8comm package importable,
    outside the source tree."""
    shutil.copytree(os.path.dirname(fp8comm.__file__), tmp_path / "pkg" / "fp8comm",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "pkg")}
    path = tmp_path / "comm.json"
    png = tmp_path / "comm.png"
    out = run_script("-m", "fp8comm.bench", "comm", "--nproc", "2", "--quick", "--json", str(path), "--plot", str(png),
                     cwd=tmp_path, env=env)
    result = json.loads(path.read_text())
    assert result["benchmark"] == "comm" and result["world_size"] == 2 and result["baseline"] == "gloo"
    assert png.stat().st_size > 10_000
    run_script("-m", "fp8comm.bench", "comm", "--replot", str(path), "--plot", str(tmp_path / "re.png"),
               cwd=tmp_path, env=env)
    assert (tmp_path / "re.png").stat().st_size > 10_000
    ops = {(r["op"], r["dtype"]) for r in result["rows"]}
    assert len(ops) == 10  # 5 op forms x 2 dtypes
    for r in result["rows"]:
        assert r["calls_compressed"] == 1
        # the format's 0.258 / 0.516, plus the 16-byte header of each CPU wire segment (two phases at most)
        bound = (0.26 if r["dtype"] == "float32" else 0.52) * r["bytes_sent_uncompressed"] + 2 * 16
        assert r["bytes_sent"] <= bound
        assert r["sqnr_db"] >= (27.0 if r["op"] == "all_reduce" else 30.0)
        for side in ("fp8", "plain"):
            assert r[side]["p10_s"] <= r[side]["median_s"] <= r[side]["p90_s"]
            assert r[side]["busbw_gbps"] > 0
    assert result["complete"] is True
    # every row was printed as it finished
    table = [ln for ln in out.stdout.splitlines() if ln.split()[:1] and ln.split()[0] in {o for o, _ in ops}]
    assert len(table) == len(result["rows"])


def test_comm_bench_quick_all_to_all(tmp_path):
    """all_to_all_single, equal and skewed splits, float32 only: the fp8
    group names all_to_all in compress only when these ops are asked for."""
    path = tmp_path / "comm.json"
    run_script("-m", "fp8comm.bench", "comm", "--nproc", "2", "--quick", "--ops", "all_to_all,all_to_all_skewed",
               "--dtypes", "float32", "--json", str(path))
    result = json.loads(path.read_text())
    assert "all_to_all" in result["compress"].split(",") and result["wire_format"] == "e4m3"
    assert {r["op"] for r in result["rows"]} == {"all_to_all", "all_to_all_skewed"}
    for r in result["rows"]:
        assert r["calls_compressed"] == 1 and r["sqnr_db"] >= 30.0
        splits = r["splits"]
        assert all(sum(row) == r["numel"] for row in splits)  # every rank sends the same volume
        if r["op"] == "all_to_all_skewed":
            assert len({n for row in splits for n in row}) > 1
        # the slices to peers only: 0.258 of FP32's in E4M3 (a skewed slice's last block is partial),
        # plus the split sizes' all_gather and headers
        assert r["peer_bytes_ratio"] <= (0.26 if r["op"] == "all_to_all" else 0.28)
        assert r["bytes_sent"] <= 0.26 * r["bytes_sent_uncompressed"] + 256
        assert r["plain"]["busbw_gbps"] == pytest.approx(r["plain"]["algbw_gbps"] / 2)


def test_comm_bench_keeps_all_to_all_out_of_its_default_ops():
    from fp8comm.bench import comm

    assert not any(op.startswith("all_to_all") for op in comm.OPS)
    splits = comm.skewed_splits(1000, 4)
    assert splits == comm.skewed_splits(1000, 4) and all(sum(row) == 1000 for row in splits)


def test_linear_bench_quick_times_every_variant_interleaved(tmp_path):
    path = tmp_path / "linear.json"
    out = run_script("bench/linear.py", "--quick", "--json", str(path))
    result = json.loads(path.read_text())
    assert result["benchmark"] == "linear" and result["baseline"] == "nn.Linear float32"
    assert {r["recipe"] for r in result["rows"]} == {"tensorwise", "rowwise"}
    for r in result["rows"]:
        # on the CPU the casts always take the fused twin: one FP8 variant per recipe
        assert set(r["fp8comm_s"]) == {"fused"} and r["baseline_s"] > 0 and r["fp8comm_s"]["fused"] > 0
        assert r["speedup_vs_baseline"]["fused"] == r["baseline_s"] / r["fp8comm_s"]["fused"]
    assert len([ln for ln in out.stdout.splitlines() if ln[:1].isdigit() and " -> " in ln]) == len(result["rows"])


def test_model_labels_everything_modeled(tmp_path):
    path = tmp_path / "model.json"
    out = run_script("bench/model.py", "--nodes", "1,4", "--sizes-mib", "64", "--json", str(path))
    assert out.stdout.startswith("MODELED, not measured")
    result = json.loads(path.read_text())
    assert result["modeled"] is True and "ASSUMED" in result["codec"]["source"]
    assert "ASSUMED" in result["cluster"]["sources"]["overlap"] and result["cluster"]["overlap"] == 0.0
    assert {(r["nodes"], r["scope"]) for r in result["rows"]} == {(1, "all"), (4, "all"), (4, "inter_node")}
    for r in result["rows"]:
        assert r["modeled"] is True
        assert all(k.startswith("modeled") for k in r if k.endswith("_ms") or "speedup" in k)
        assert 0.0 < r["modeled_speedup"] <= r["modeled_speedup_full_overlap"]


def test_cpu_breakdown_quick():
    out = run_script("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "bench/cpu_breakdown.py",
                     "--mib", "1", "--reps", "2")
    text = out.stdout
    assert "codec, one thread: quantize" in text and "transport, one all_to_all" in text
    assert "gloo all_reduce: wall" in text and "fp8gloo all_reduce: wall" in text
    assert "fp8gloo / gloo wall time:" in text
