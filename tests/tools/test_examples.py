"""The examples, run as users run them: torchrun with 2 processes on the CPU."""
import importlib.util
import json
import math
import os
import re
import socket
import subprocess
import sys

import pytest

from tests.support import REPO_ROOT

ROOT = str(REPO_ROOT)

# One of the longest modules: it starts first (tests/conftest.py).
STARTS_FIRST = True


def torchrun(script, *args, timeout=600):
    with socket.socket() as sock:  # a free port for the static rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
           os.path.join(ROOT, "examples", script), *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out.stdout


@pytest.mark.full
def test_fsdp2_fp8_compute_and_comm_tracks_the_baseline(tmp_path):
    """FP8 compute and communication train as well as the plain baseline:
    50 steps of FSDP2 on real text, Fp8Linear + fp8gloo vs nn.Linear + gloo,
    final loss within 2%."""
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


def test_fsdp2_main_job_compares_and_writes_what_the_study_reads(tmp_path):
    """The main job's --compare path, short: both runs, the plot, the bytes
    saved, and the JSON bench/convergence.py reads (how well it trains is the
    full tier's test above)."""
    png = tmp_path / "losses.png"
    out = torchrun("train_fsdp.py", "--compare", str(png), "--steps", "4", "--eval-batches", "1",
                   "--json", str(tmp_path / "runs.json"))
    assert re.search(r"final loss \(mean of last \d+ steps\): baseline ([\d.]+), fp8 ([\d.]+)", out), out
    assert png.stat().st_size > 10_000
    saved = re.search(r"comm bytes sent ([\d.]+) MiB of ([\d.]+) MiB", out)
    assert float(saved.group(1)) < 0.8 * float(saved.group(2))
    base_run, fp8_run = json.loads((tmp_path / "runs.json").read_text())["runs"]
    assert (base_run["fp8_comm"], fp8_run["fp8_comm"], fp8_run["fp8_compute"]) == (False, True, True)
    assert len(fp8_run["losses"]) == 4 and all(math.isfinite(x) for x in fp8_run["losses"])
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


def test_fsdp2_follows_the_lr_schedule(tmp_path):
    """--lr-schedule cosine --warmup-steps: linear warmup to --lr, then a cosine
    down to --min-lr-ratio x --lr at the last step; the JSON holds each step's rate."""
    path = tmp_path / "run.json"
    torchrun("train_fsdp.py", "--steps", "6", "--lr", "0.01", "--lr-schedule", "cosine", "--warmup-steps", "2",
             "--min-lr-ratio", "0.2", "--no-fp8-compute", "--dim", "32", "--layers", "1", "--heads", "2",
             "--json", str(path))
    lrs = json.loads(path.read_text())["runs"][0]["lrs"]
    # warmup 1/2, 2/2 of the peak; then 0.2 + 0.8 * (1 + cos(pi * k / 3)) / 2 for k = 0..3
    expected = [0.005, 0.01, 0.01, 0.008, 0.004, 0.002]
    assert len(lrs) == 6 and all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(lrs, expected)), lrs


def test_fsdp2_refuses_a_warmup_as_long_as_the_run():
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    try:
        spec = importlib.util.spec_from_file_location("fp8comm_example_train_fsdp",
                                                      os.path.join(ROOT, "examples", "train_fsdp.py"))
        example = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(example)
    finally:
        sys.path.remove(os.path.join(ROOT, "examples"))
    assert example.parse_args(["--steps", "10", "--warmup-steps", "9"]).warmup_steps == 9
    for bad in (["--steps", "10", "--warmup-steps", "10"], ["--min-lr-ratio", "1.5"]):
        out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "train_fsdp.py"), *bad],
                             capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert out.returncode == 2 and ("--warmup-steps 10: expected" in out.stderr
                                        or "--min-lr-ratio 1.5: expected" in out.stderr), out.stderr[-2000:]


def load_example(name):
    """An example as a module (its neighbours importable, as under torchrun)."""
    examples = os.path.join(ROOT, "examples")
    sys.path.insert(0, examples)
    try:
        spec = importlib.util.spec_from_file_location(f"fp8comm_example_{name}", os.path.join(examples, f"{name}.py"))
        example = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(example)
    finally:
        sys.path.remove(examples)
    return example


MOE_TINY = ("--steps", "8", "--dim", "32", "--layers", "1", "--heads", "2", "--experts", "4", "--seq", "32",
            "--batch", "4", "--log-every", "4")


def train_moe(tmp_path, *flags):
    path = tmp_path / ("moe" + "".join(flags).replace("-", "_") + ".json")
    torchrun("train_moe.py", *MOE_TINY, "--json", str(path), *flags)
    return json.loads(path.read_text())["runs"][0]


@pytest.fixture(scope="module")
def moe_exact(tmp_path_factory):
    return train_moe(tmp_path_factory.mktemp("moe"), "--wire", "exact", "--combine", "exact")


def test_moe_exact_trains_through_torchs_all_to_all(moe_exact):
    """--wire exact --combine exact: dispatch and combine are torch's own
    all_to_all_single_autograd (the baseline), uneven splits every step, and
    the loss falls."""
    from torch.distributed import _functional_collectives as funcol

    assert load_example("train_moe").all_to_all("exact", "exact") is funcol.all_to_all_single_autograd
    losses = moe_exact["losses"]
    assert len(losses) == 8 and all(math.isfinite(x) for x in losses) and math.isfinite(moe_exact["eval_loss"])
    assert losses[-1] < 0.9 * losses[0], losses  # from ln(256) = 5.55
    assert "bytes_sent" not in moe_exact  # nothing went through fp8comm


def test_moe_e4m3_dispatch_tracks_the_exact_run(tmp_path, moe_exact):
    """--wire e4m3: the dispatch's all_to_all goes through fp8comm in E4M3
    (about a quarter of FP32's bytes), and the losses of the same seed stay
    within 1% of the exact run's at every step."""
    run = train_moe(tmp_path, "--wire", "e4m3", "--combine", "exact")
    exact = moe_exact["losses"]
    assert len(run["losses"]) == len(exact) and run["losses"] != exact  # the wire rounded something
    assert all(abs(a - b) <= 0.01 * b for a, b in zip(run["losses"], exact)), (run["losses"], exact)
    assert abs(run["eval_loss"] - moe_exact["eval_loss"]) <= 0.01 * moe_exact["eval_loss"]
    # the same weights evaluated through the E4M3 dispatch: close, not equal
    assert run["eval_loss_wire"] != run["eval_loss"]
    assert abs(run["eval_loss_wire"] - run["eval_loss"]) <= 0.005 * run["eval_loss"], run
    assert "eval_loss_wire" not in moe_exact
    assert 0 < run["bytes_sent"] < 0.5 * run["bytes_sent_uncompressed"], run
