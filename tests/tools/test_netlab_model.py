"""bench/model.py's shaped-link model and bench/netlab.py's --remodel, on a
committed netlab result (netlab itself needs root and network namespaces:
docs/performance.md, "Shaped links")."""
import json
import shutil
import subprocess
import sys

import pytest

from tests.support import REPO_ROOT
from tests.tools.test_convergence import load

ROOT = str(REPO_ROOT)
model = load("fp8comm_bench_model", "bench/model.py")
RESULT = REPO_ROOT / "bench" / "results" / "cpu-epyc-avx2" / "netlab-2nodes-1rank.json"


def test_pipelined_time_is_the_slower_side_plus_one_chunk_of_the_faster():
    assert model.pipelined_seconds(0.050, 0.010, chunks=16) == pytest.approx(0.050 + 0.010 / 16)
    assert model.pipelined_seconds(0.010, 0.050, chunks=16) == pytest.approx(0.050 + 0.010 / 16)
    assert model.pipelined_seconds(0.010, 0.050, chunks=1) == pytest.approx(0.060)  # nothing overlaps
    assert model.pipelined_seconds(0.010, 0.050, chunks=None) == pytest.approx(0.050)


def test_shaped_link_time_turns_bytes_into_wire_seconds():
    # 125 MB at 1 Gbit/s is one second of wire; a CPU cost of 0.2 s hides under it.
    assert model.shaped_link_seconds(0.2, 125e6, 1.0, chunks=None) == pytest.approx(1.0)
    assert model.shaped_link_seconds(0.2, 125e6, 10.0, chunks=None) == pytest.approx(0.2)


def test_remodel_keeps_the_measurements_and_recomputes_the_model(tmp_path):
    path = tmp_path / "netlab.json"
    shutil.copy(RESULT, path)
    before = json.loads(path.read_text())
    out = subprocess.run([sys.executable, "bench/netlab.py", "--remodel", str(path)], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    after = json.loads(path.read_text())
    assert after["raw"] == before["raw"]
    assert "shaped_link_seconds" in after["modeled_columns"]
    shaped = [r for r in after["rows"] if r["rate_gbit"] != "unshaped"]
    assert shaped and len(after["rows"]) == len(before["rows"])
    for old, new in zip(before["rows"], after["rows"]):
        assert (old["plain_ms"], old["fp8_ms"], old["ratio"]) == (new["plain_ms"], new["fp8_ms"], new["ratio"])
    for r in shaped:
        assert r["modeled_ratio"] == pytest.approx(r["modeled_fp8_ms"] / r["modeled_plain_ms"])
        assert r["model_error"] == pytest.approx(r["modeled_ratio"] / r["ratio"] - 1)
        # Never faster than the unshaped link, never faster than the wire.
        base = next(b for b in after["rows"] if b["rate_gbit"] == "unshaped" and b["op"] == r["op"])
        assert r["modeled_fp8_ms"] >= base["fp8_ms"] and r["modeled_plain_ms"] >= base["plain_ms"]
    assert f"{shaped[0]['op']}" in out.stdout
