"""bench/train_gpu.py (the one-GPU training run of bench/gpu_session) in its
CPU smoke mode, so a broken script shows here and not in a lent GPU's time."""
import json
import subprocess
import sys

from tests.support import REPO_ROOT


def test_train_gpu_smoke_trains_each_variant_and_names_what_it_skips(tmp_path):
    path = tmp_path / "train.json"
    out = subprocess.run([sys.executable, "bench/train_gpu.py", "--smoke", "--variants", "bf16,fp8comm,fp8comm-nope",
                          "--json", str(path)], capture_output=True, text=True, timeout=300, cwd=str(REPO_ROOT))
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(path.read_text())
    assert set(result["runs"]) == {"bf16", "fp8comm"} and "nope" in result["skipped"]["fp8comm-nope"]
    for run in result["runs"].values():
        assert len(run["losses"]) == result["steps"] and run["tokens_per_s"] > 0
        assert run["losses"][-1] < run["losses"][0]  # it trains
    assert result["runs"]["bf16"]["speedup_vs_bf16"] == 1.0
