"""The benchmarks run in a seconds-long smoke mode so they cannot rot; these
tests check the fields they report, never times."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_script(*args, timeout=300):
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_codec_bench_quick(tmp_path):
    path = tmp_path / "codec.json"
    run_script("bench/codec.py", "--quick", "--device", "cpu", "--json", str(path))
    result = json.loads(path.read_text())
    assert result["benchmark"] == "codec" and result["torch"] and result["device"] and result["command"]
    ops = {r["op"] for r in result["rows"]}
    assert {"copy_fp32", "quantize", "dequantize", "dequant_sum_4", "dequant_sum_requantize_4", "quantize_1_thread"} <= ops
    assert {r["dtype"] for r in result["rows"]} == {"float32", "bfloat16"}
    for r in result["rows"]:
        assert r["gb_per_s"] > 0 and r["seconds"] > 0
