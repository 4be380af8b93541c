"""bench/convergence.py's summary, table and --replot on synthetic results (the
study itself trains for half an hour: docs/performance.md), and the held-out
windows the example's --eval-batches evaluates."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from tests.support import REPO_ROOT

ROOT = str(REPO_ROOT)


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


convergence = load("fp8comm_bench_convergence", "bench/convergence.py")

EVALS = {
    "fp32 baseline": [2.00, 2.02, 1.98],
    "fp8 comm": [2.005, 2.01, 2.00],  # +0.25%, inside the baseline's range
    "fp8 comm + Fp8Linear tensorwise": [2.03, 2.04, 2.05],  # +2%, above the range
    "fp8 comm + Fp8Linear rowwise": [1.97, 1.99, 2.00],  # -0.67%, inside
}


def synthetic(steps=40):
    runs = []
    for seed in range(3):
        for name, evals in EVALS.items():
            end = evals[seed]
            losses = [end + 3.0 * 0.9 ** i + 0.01 * ((i * 7 + seed) % 5) for i in range(steps)]
            runs.append({"config": name, "seed": seed, "eval_loss": end, "losses": losses, "tokens_per_s": 1000.0,
                         **({} if name == "fp32 baseline" else {"bytes_sent": 26, "bytes_sent_uncompressed": 100})})
    return {"benchmark": "convergence", "device": "test CPU", "configs": convergence.CONFIGS, "runs": runs,
            "settings": {"seeds": [0, 1, 2], "steps": steps, "nproc": 2, "dim": 32, "layers": 1, "heads": 2,
                         "seq": 16, "batch": 2, "eval_batches": 0}}


def test_summary_against_the_baseline():
    rows = convergence.summarize(synthetic(), tail=5)
    by = {r["config"]: r for r in rows}
    assert [r["config"] for r in rows] == list(EVALS)
    base = by["fp32 baseline"]
    assert abs(base["eval_mean"] - 2.0) < 1e-12 and abs(base["eval_std"] - 0.02) < 1e-12
    assert (base["eval_min"], base["eval_max"]) == (1.98, 2.02) and base["rel_to_baseline"] == 0
    assert by["fp8 comm"]["meets_goal"] and abs(by["fp8 comm"]["rel_to_baseline"] - 0.0025) < 1e-12
    tw = by["fp8 comm + Fp8Linear tensorwise"]
    assert not tw["within_1pct"] and not tw["within_baseline_range"] and not tw["meets_goal"]
    assert by["fp8 comm + Fp8Linear rowwise"]["meets_goal"]
    assert by["fp8 comm"]["bytes_sent_ratio"] == 0.26 and "bytes_sent_ratio" not in base

    table = convergence.format_table(rows, tail=5)
    assert table.count("\n") == 1 + len(EVALS)
    assert "| fp8 comm + Fp8Linear tensorwise | 3 | 2.0400 |" in table and "+2.00% | **no** | **no** |" in table
    verdict = convergence.verdict(rows)
    assert "fp8 comm: goal met" in verdict
    assert "tensorwise: goal missed (1.00 points beyond 1%; mean +0.0200 outside the baseline's range" in verdict


def test_a_mean_at_1pct_but_outside_the_range_misses():
    result = synthetic()
    for run in result["runs"]:
        if run["config"] == "fp8 comm":
            run["eval_loss"] = 2.025  # +1.25%
        elif run["config"] == "fp32 baseline":
            run["eval_loss"] = 2.0  # no spread at all
    by = {r["config"]: r for r in convergence.summarize(result, tail=5)}
    assert not by["fp8 comm"]["within_1pct"] and not by["fp8 comm"]["within_baseline_range"]


def test_replot_draws_and_prints_the_table(tmp_path):
    path = tmp_path / "convergence.json"
    path.write_text(json.dumps(synthetic()))
    png = tmp_path / "convergence.png"
    out = subprocess.run([sys.executable, "bench/convergence.py", "--replot", str(path), "--plot", str(png),
                          "--smooth", "5", "--tail", "5"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "| configuration | seeds | final eval loss, mean |" in out.stdout and "goal missed" in out.stdout
    assert png.stat().st_size > 10_000


def test_eval_batches_cover_the_held_out_tail_once():
    tiny_llama = load("fp8comm_example_tiny_llama", "examples/tiny_llama.py")
    text = torch.arange(100_000, dtype=torch.int64)  # each token is its position: windows show where they start
    seq, batch, world = 16, 4, 2
    data = [tiny_llama.ByteBatches(text, seq, batch, rank) for rank in range(world)]
    held_out = len(data[0].held_out)
    starts = []
    for rank in range(world):
        batches = data[rank].eval_batches(0, rank, world)
        assert len(batches) == (held_out - 1) // (seq + 1) // (batch * world)
        for x, y in batches:
            assert x.shape == y.shape == (batch, seq) and torch.equal(x[:, 1:], y[:, :-1])
            starts += [int(t) for t in x[:, 0]]
    starts.sort()
    assert all(b - a >= seq + 1 for a, b in zip(starts, starts[1:]))  # no window overlaps another, on any rank
    assert starts[0] == len(text) - held_out and starts[-1] == len(text) - seq - 2  # the whole tail
    assert len(data[0].eval_batches(3, 0, world)) == 3
    assert torch.equal(data[0].eval_batches(1, 0, 1)[0][0], data[0].eval_batch()[0])


def test_resume_keeps_the_saved_configurations_and_adds_the_new_ones(tmp_path):
    """--resume --configs NEW runs only what the file lacks; the saved
    configurations stay in the summary and NEW joins them."""
    new = "Fp8Linear tensorwise + fp32 comm"
    result = synthetic()
    result["configs"] = [c for c in convergence.CONFIGS if c["name"] in EVALS]
    result["command"] = "python bench/convergence.py --json first.json"
    result["runs"] += [{**r, "config": new} for r in result["runs"] if r["config"] == "fp8 comm"]
    path = tmp_path / "convergence.json"
    path.write_text(json.dumps(result))
    s = result["settings"]
    convergence.main(["--resume", "--configs", new, "--json", str(path), "--seeds", "0,1,2", "--steps", str(s["steps"]),
                      "--nproc", "2", "--dim", "32", "--layers", "1", "--heads", "2", "--seq", "16", "--batch", "2",
                      "--eval-batches", "0", "--tail", "5"])  # every run is saved: nothing trains
    saved = json.loads(path.read_text())
    assert [c["name"] for c in saved["configs"]] == list(EVALS) + [new]
    assert [r["config"] for r in saved["summary"]] == list(EVALS) + [new]
    assert saved["earlier_commands"] == ["python bench/convergence.py --json first.json"]
    assert len(saved["runs"]) == len(result["runs"])


def test_resume_adds_seeds_and_refuses_other_settings(tmp_path):
    """--resume --seeds NEW keeps the saved seeds and adds NEW to the
    settings; any other setting that differs from the file's is refused."""
    result = synthetic()
    result["configs"] = [c for c in convergence.CONFIGS if c["name"] in EVALS]
    result["command"] = "python bench/convergence.py --json first.json"
    result["runs"] += [{**r, "seed": 3} for r in result["runs"] if r["seed"] == 0]  # seed 3 already ran
    path = tmp_path / "convergence.json"
    path.write_text(json.dumps(result))
    s = result["settings"]
    args = ["--resume", "--json", str(path), "--steps", str(s["steps"]), "--nproc", "2", "--dim", "32",
            "--layers", "1", "--heads", "2", "--seq", "16", "--batch", "2", "--eval-batches", "0", "--tail", "5",
            "--configs", ",".join(EVALS)]
    convergence.main(args + ["--seeds", "3"])  # every run is saved: nothing trains
    saved = json.loads(path.read_text())
    assert saved["settings"]["seeds"] == sorted(set(s["seeds"]) | {3})
    assert {r["config"]: len(r["seeds"]) for r in saved["summary"]} == {c: len(s["seeds"]) + 1 for c in EVALS}
    with pytest.raises(SystemExit, match="different settings"):
        convergence.main([a if a != "32" else "64" for a in args] + ["--seeds", "3"])


def test_resume_refuses_another_lr_schedule(tmp_path):
    """A result saved without the schedule settings trained at a constant rate:
    resuming it with --lr-schedule cosine would mix two studies."""
    result = synthetic()
    result["configs"] = [c for c in convergence.CONFIGS if c["name"] in EVALS]
    result["command"] = "python bench/convergence.py --json first.json"
    path = tmp_path / "convergence.json"
    path.write_text(json.dumps(result))
    args = ["--resume", "--json", str(path), "--steps", "40", "--nproc", "2", "--dim", "32", "--layers", "1",
            "--heads", "2", "--seq", "16", "--batch", "2", "--eval-batches", "0", "--configs", ",".join(EVALS)]
    convergence.main(args)  # the defaults are the constant schedule: nothing trains
    with pytest.raises(SystemExit, match="different settings"):
        convergence.main(args + ["--lr-schedule", "cosine", "--warmup-steps", "5"])
    assert convergence.schedule_label(result["settings"]) == "lr constant"
    assert convergence.schedule_label({"lr_schedule": "cosine", "warmup_steps": 25, "min_lr_ratio": 0.1}) \
        == "lr cosine to 0.1x, warmup 25"


def test_the_wire_eval_is_summarized_where_every_run_has_it():
    """The MoE example's second eval (its trained weights through its own
    wire): its mean relative difference from the exact eval, in the row and
    the verdict; a configuration without it in every run gets neither."""
    result = synthetic()
    for run in result["runs"]:
        if run["config"] == "fp8 comm":
            run["eval_loss_wire"] = run["eval_loss"] * 1.002
        elif run["config"] == "fp8 comm + Fp8Linear rowwise" and run["seed"] == 0:
            run["eval_loss_wire"] = run["eval_loss"]
    by = {r["config"]: r for r in convergence.summarize(result, tail=5)}
    assert abs(by["fp8 comm"]["wire_eval_rel"] - 0.002) < 1e-12 and by["fp8 comm"]["wire_eval_rel_std"] < 1e-12
    assert "wire_eval_rel" not in by["fp8 comm + Fp8Linear rowwise"]
    verdict = convergence.verdict(list(by.values()))
    assert "fp8 comm: goal met, +0.25% vs baseline mean; its trained weights through its own wire: eval loss " \
           "+0.200%" in verdict
    assert verdict.count("through its own wire") == 1


def test_moe_suite_trains_the_moe_example_against_its_own_baseline(tmp_path):
    """--suite moe: examples/train_moe.py in its own configurations (one
    baseline: torch's exact all_to_all), each command one the example parses;
    a saved result of the other suite is not resumed."""
    configs = convergence.SUITES["moe"]["configs"]
    assert [c["name"] for c in configs if c.get("baseline")] == ["moe exact"]
    assert {c["name"] for c in configs} >= {"moe dispatch e4m3", "moe dispatch mxfp4", "moe dispatch + combine e4m3"}
    args = convergence.parse_args(["--suite", "moe", "--steps", "5", "--dim", "32"])
    cmd = convergence.command(args, configs[0], 3, "run.json")
    script = next(i for i, a in enumerate(cmd) if a.endswith(".py"))
    assert cmd[script] == os.path.join(ROOT, "examples", "train_moe.py")
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    try:
        moe = load("fp8comm_example_train_moe", "examples/train_moe.py")
    finally:
        sys.path.remove(os.path.join(ROOT, "examples"))
    parsed = moe.parse_args(cmd[script + 1:])
    assert (parsed.wire, parsed.combine, parsed.seed, parsed.steps, parsed.dim) == ("exact", "exact", 3, 5, 32)

    path = tmp_path / "convergence.json"
    path.write_text(json.dumps({**synthetic(), "command": "python bench/convergence.py --json first.json"}))
    s = synthetic()["settings"]
    with pytest.raises(SystemExit, match="different settings"):
        convergence.main(["--suite", "moe", "--resume", "--json", str(path), "--steps", str(s["steps"]), "--dim", "32",
                          "--layers", "1", "--heads", "2", "--seq", "16", "--batch", "2", "--eval-batches", "0"])


def test_baseline_can_be_another_configuration(tmp_path, monkeypatch):
    """--baseline 'fp8 comm + Fp8Linear tensorwise': the delayed recipe is
    compared with tensorwise, the FP32 baseline does not run, and the
    delayed configuration's command is one the example parses."""
    tw, dl = "fp8 comm + Fp8Linear tensorwise", "fp8 comm + Fp8Linear delayed (fp32 all-gather)"
    evals = {(tw, 0): 2.00, (tw, 1): 2.04, (dl, 0): 2.01, (dl, 1): 2.05}

    def fake_run(args, config, seed, tmp):
        return {"config": config["name"], "seed": seed, "wall_s": 1.0, "example_command": "", "lr": 3e-3,
                "losses": [3.0, 2.5], "eval_loss": evals[(config["name"], seed)], "tokens_per_s": 1.0}

    monkeypatch.setattr(convergence, "run_one", fake_run)
    path = tmp_path / "delayed.json"
    convergence.main(["--seeds", "0,1", "--configs", f"{tw},{dl}", "--baseline", tw, "--json", str(path)])
    result = json.loads(path.read_text())
    assert {r["config"] for r in result["runs"]} == {tw, dl}
    rows = {r["config"]: r for r in result["summary"]}
    assert rows[tw]["baseline"] and not rows[dl]["baseline"]
    assert abs(rows[dl]["rel_to_baseline"] - 0.01 / 2.02) < 1e-12 and rows[dl]["meets_goal"]
    with pytest.raises(SystemExit, match="not among the configurations"):
        convergence.main(["--configs", dl, "--baseline", tw, "--json", str(tmp_path / "x.json")])

    args = convergence.parse_args(["--steps", "5"])
    config = next(c for c in convergence.CONFIGS if c["name"] == dl)
    cmd = convergence.command(args, config, 0, "run.json")
    script = next(i for i, a in enumerate(cmd) if a.endswith(".py"))
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    try:
        example = load("fp8comm_example_train_fsdp_delayed", "examples/train_fsdp.py")
    finally:
        sys.path.remove(os.path.join(ROOT, "examples"))
    parsed = example.parse_args(cmd[script + 1:])
    assert (parsed.recipe, parsed.fp8_all_gather, parsed.fp8_compute) == ("delayed", False, True)
