"""The examples, run as users run them: torchrun with 2 processes on the CPU."""
import json
import math
import os
import re
import socket
import subprocess
import sys
from tests.support import REPO_ROOT

ROOT = str(REPO_ROOT)


def torchrun(script, *args, timeout=600):
    with socket.socket() as sock:  # a free port for the static rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
           os.path.join(ROOT, "examples", script), *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out.stdout


def test_fsdp2_fp8_compute_and_comm_tracks_the_baseline(tmp_path):
    """Issue 4's bar: 50 steps of FSDP2 on real text, Fp8Linear + fp8gloo vs
    nn.Linear + gloo, final loss within 2%."""
    png = tmp_path / "losses.png"
    out = torchrun("train_fsdp.py", "--compare", str(png), "--steps", "50", "--eval-batches", "2",
                   "--json", str(tmp_path / "runs.json"))
    m = re.search(r"final loss \(mean of last \d+ steps\): baseline ([\d.]+), fp8 ([\d.]+)", out)
    base, fp8 = float(m.group(1)), float(m.group(2))
    assert abs(fp8 - base) <= 0.02 * base, out
    assert base < 3.2  # it learned (from 5.6)
    assert png.stat().st_size > 10_000
    saved = re.search(r"comm bytes sent ([\d.]+) MiB of ([\d.]+) MiB", out)
    assert float(saved.group(1)) < 0.8 * float(saved.group(2))
    written = json.loads((tmp_path / "runs.json").read_text())  # what bench/convergence.py reads
    base_run, fp8_run = written["runs"]
    assert (base_run["fp8_comm"], fp8_run["fp8_comm"], fp8_run["fp8_compute"]) == (False, True, True)
    assert len(fp8_run["losses"]) == 50 and math.isfinite(fp8_run["eval_loss"])
    assert fp8_run["eval_tokens"] == 2 * 8 * 128 * 2  # 2 batches of 8 windows of 128 bytes, on each of 2 ranks
    assert fp8_run["linear_stats"]["fp8_calls"] > 0 and fp8_run["bytes_sent"] < fp8_run["bytes_sent_uncompressed"]


def test_ddp_replicas_stay_identical():
    out = torchrun("train_ddp.py", "--steps", "12", "--fp8-compute")
    assert "replicas bitwise identical: True" in out


def test_fsdp2_reports_the_sqnr_of_its_fp8_traffic():
    """--track-error: the reduce-scatters of the gradients report their SQNR
    (E4M3 on gradients: about 31 dB); the final evaluation runs exact."""
    out = torchrun("train_fsdp.py", "--steps", "3", "--track-error")
    m = re.search(r"SQNR of what rank 0 put on the wire: .*reduce_scatter_tensor ([\d.]+) dB over (\d+) calls", out)
    assert m, out
    assert 25.0 < float(m.group(1)) < 40.0 and int(m.group(2)) >= 3, out
