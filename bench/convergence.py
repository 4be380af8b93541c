"""Convergence of FP8 training against the FP32 baseline (issue 15, item 3).

    OMP_NUM_THREADS=1 nice -n 10 python bench/convergence.py \\
        --json bench/results/cpu-epyc-avx2/convergence.json --plot bench/results/cpu-epyc-avx2/convergence.png
    python bench/convergence.py --replot bench/results/cpu-epyc-avx2/convergence.json --plot out.png
    OMP_NUM_THREADS=1 nice -n 10 python bench/convergence.py --lr-schedule cosine --warmup-steps 25 \
        --json bench/results/cpu-epyc-avx2/convergence-cosine.json --plot bench/results/cpu-epyc-avx2/convergence-cosine.png
    OMP_NUM_THREADS=1 nice -n 10 python bench/convergence.py --suite moe --lr-schedule cosine --warmup-steps 25 \
        --seeds 0,1,2,3,4,5 --json bench/results/<machine>/convergence-moe.json --plot bench/results/<machine>/convergence-moe.png

Trains examples/train_fsdp.py (the Llama-style model on the standard
library's source text, FSDP2) on --nproc ranks under torchrun, once per
configuration and seed:

    fp32 baseline                    nn.Linear, plain gloo / nccl
    fp8 comm                         nn.Linear, fp8gloo / fp8nccl
    fp8 comm + Fp8Linear tensorwise  Fp8Linear in the decoder blocks (weights all-gathered in FP8), fp8 backend
    fp8 comm + Fp8Linear rowwise     Fp8Linear in the decoder blocks, rowwise recipe, fp8 backend

--suite moe trains examples/train_moe.py instead (a top-2 mixture of experts,
expert-parallel over the ranks, DDP for the rest; issue 38) in its own
configurations, against its own baseline:

    moe exact                        dispatch and combine through torch's all_to_all
    moe dispatch e4m3                the dispatch's all_to_all in E4M3 (fp8comm.functional), the rest exact
    moe dispatch mxfp4               the dispatch's all_to_all in MXFP4
    moe dispatch + combine e4m3      both all_to_alls' forward in E4M3 (their gradients exact)

The loop is seed-major (every configuration of seed 0, then of seed 1, ...),
so a drift in the machine's load touches every configuration alike. Each run's
eval loss is the example's --eval-batches mean over the held-out tail of the
text, measured after the last step; with --lr-schedule cosine the last steps
run at a small learning rate instead of wherever a constant rate leaves the
model. The JSON is rewritten after every run (--resume skips the runs it
already holds); the table compares each configuration's final eval loss,
mean over seeds, with the baseline's: the goal is within 1% of the baseline's
mean and inside the baseline's seed range (min..max). --replot redraws the
plot and reprints the table from a saved JSON without training.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "train_fsdp.py")
MOE_EXAMPLE = os.path.join(ROOT, "examples", "train_moe.py")

CONFIGS = [
    {"name": "fp32 baseline", "baseline": True, "flags": ["--no-fp8-compute", "--no-fp8-comm"]},
    {"name": "fp8 comm", "flags": ["--no-fp8-compute", "--fp8-comm"]},
    {"name": "fp8 comm + Fp8Linear tensorwise", "flags": ["--fp8-compute", "--fp8-comm", "--recipe", "tensorwise"]},
    {"name": "fp8 comm + Fp8Linear rowwise", "flags": ["--fp8-compute", "--fp8-comm", "--recipe", "rowwise"]},
    # Where the tensorwise gap comes from: the same GEMMs with exact communication,
    # and with the weights all-gathered in FP32 instead of as FP8.
    {"name": "Fp8Linear tensorwise + fp32 comm", "flags": ["--fp8-compute", "--no-fp8-comm", "--recipe", "tensorwise"]},
    {"name": "fp8 comm + Fp8Linear tensorwise (fp32 all-gather)",
     "flags": ["--fp8-compute", "--fp8-comm", "--recipe", "tensorwise", "--no-fp8-all-gather"]},
    # Delayed scaling (scales from an amax history) on all three operands: the
    # weights gathered in FP32 (under the FP8 all-gather the gathered weight
    # keeps current scaling); against tensorwise with --baseline.
    {"name": "fp8 comm + Fp8Linear delayed (fp32 all-gather)",
     "flags": ["--fp8-compute", "--fp8-comm", "--recipe", "delayed", "--no-fp8-all-gather"]},
    {"name": "fp8 comm + Fp8Linear delayed", "flags": ["--fp8-compute", "--fp8-comm", "--recipe", "delayed"]},
    # Where 8-bit round-to-nearest has less to spare (E5M2: 2 mantissa bits; one
    # scale per 512 elements), and what error feedback and stochastic rounding
    # buy there (the gradients' reduce-scatter through fp8comm.fsdp on the
    # plain group).
    {"name": "e5m2/512 comm", "flags": ["--no-fp8-compute", "--fp8-comm", "--wire", "e5m2", "--comm-block-size", "512"]},
    {"name": "e5m2/512 comm + error feedback",
     "flags": ["--no-fp8-compute", "--fp8-comm", "--wire", "e5m2", "--comm-block-size", "512", "--error-feedback", "fp32"]},
    {"name": "e5m2/512 comm + stochastic rounding",
     "flags": ["--no-fp8-compute", "--fp8-comm", "--wire", "e5m2", "--comm-block-size", "512", "--rounding", "stochastic"]},
    # Four bits (MXFP4: E2M1 codes, one E8M0 scale per 32) on the gradients'
    # reduce-scatter, alone and with error feedback and stochastic rounding.
    {"name": "mxfp4 comm", "flags": ["--no-fp8-compute", "--fp8-comm", "--wire", "mxfp4"]},
    {"name": "nvfp4 comm", "flags": ["--no-fp8-compute", "--fp8-comm", "--wire", "nvfp4"]},
    {"name": "nvfp4 comm + stochastic rounding",
     "flags": ["--no-fp8-compute", "--fp8-comm", "--wire", "nvfp4", "--rounding", "stochastic"]},
    {"name": "mxfp4 comm + error feedback",
     "flags": ["--no-fp8-compute", "--fp8-comm", "--wire", "mxfp4", "--error-feedback", "fp32"]},
    {"name": "mxfp4 comm + stochastic rounding",
     "flags": ["--no-fp8-compute", "--fp8-comm", "--wire", "mxfp4", "--rounding", "stochastic"]},
    {"name": "mxfp4 comm + error feedback + stochastic rounding",
     "flags": ["--no-fp8-compute", "--fp8-comm", "--wire", "mxfp4", "--error-feedback", "fp32", "--rounding",
               "stochastic"]},
]
# The MoE example's all_to_alls (--suite moe): the dispatch compressed in 8
# and 4 bits, then the combine too, each against torch's exact all_to_all.
MOE_CONFIGS = [
    {"name": "moe exact", "baseline": True, "flags": ["--wire", "exact", "--combine", "exact"]},
    {"name": "moe dispatch e4m3", "flags": ["--wire", "e4m3", "--combine", "exact"]},
    {"name": "moe dispatch mxfp4", "flags": ["--wire", "mxfp4", "--combine", "exact"]},
    {"name": "moe dispatch + combine e4m3", "flags": ["--wire", "e4m3", "--combine", "e4m3"]},
]
# Each suite: the example it trains, its configurations (one baseline each), and the plot's title.
SUITES = {
    "fsdp": {"example": EXAMPLE, "configs": CONFIGS, "model": "tiny Llama", "parallel": "FSDP2"},
    "moe": {"example": MOE_EXAMPLE, "configs": MOE_CONFIGS, "model": "tiny MoE, top-2 of 8 experts",
            "parallel": "expert-parallel + DDP"},
}
GOAL_REL = 0.01  # within 1% of the baseline's mean eval loss
# What results saved before the schedule options existed trained with.
LR_DEFAULTS = {"lr_schedule": "constant", "warmup_steps": 0, "min_lr_ratio": 0.1}
# ... and before suites existed: the FSDP2 example.
SETTINGS_DEFAULTS = {**LR_DEFAULTS, "suite": "fsdp"}


def lr_settings(args) -> dict:
    return {"lr_schedule": args.lr_schedule, "warmup_steps": args.warmup_steps, "min_lr_ratio": args.min_lr_ratio}


def schedule_label(settings: dict) -> str:
    """"lr constant" or "lr cosine to 0.1x, warmup 25" for a result's settings."""
    s = {**LR_DEFAULTS, **settings}
    label = "lr constant" if s["lr_schedule"] == "constant" else f"lr cosine to {s['min_lr_ratio']:g}x"
    return label + (f", warmup {s['warmup_steps']}" if s["warmup_steps"] else "")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", default="fsdp", choices=list(SUITES),
                   help="fsdp: examples/train_fsdp.py's configurations; moe: examples/train_moe.py's")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--lr-schedule", default="constant", choices=["constant", "cosine"],
                   help="the example's --lr-schedule (cosine: decay to --min-lr-ratio of the peak at the last step)")
    p.add_argument("--warmup-steps", type=int, default=0, help="the example's --warmup-steps")
    p.add_argument("--min-lr-ratio", type=float, default=0.1, help="the example's --min-lr-ratio")
    p.add_argument("--eval-batches", type=int, default=0, help="the example's --eval-batches (0: the whole held-out tail)")
    p.add_argument("--configs", default=None,
                   help="comma list of the suite's configuration names to run (default all): "
                        + "; ".join(f"{suite}: " + ", ".join(c["name"] for c in s["configs"]) for suite, s in SUITES.items()))
    p.add_argument("--baseline", default=None,
                   help="the configuration the others are compared with (default: the suite's own baseline, "
                        "which then need not run), e.g. 'fp8 comm + Fp8Linear tensorwise'")
    p.add_argument("--json", help="write every run and the summary here (rewritten after each run)")
    p.add_argument("--plot", metavar="PNG", help="draw the loss curves and final eval losses")
    p.add_argument("--machine", help="the bench/results folder the result belongs in (default: the --json path's folder)")
    p.add_argument("--resume", action="store_true",
                   help="keep the runs the --json file already holds, run the rest (new --seeds and --configs join)")
    p.add_argument("--replot", metavar="JSON", help="print the table and draw --plot from a saved result; no training")
    p.add_argument("--smooth", type=int, default=25, help="moving-average window (steps) of the plotted training loss")
    p.add_argument("--tail", type=int, default=50, help="steps at the end whose training losses the table averages")
    return p.parse_args(argv)


# ---------------------------------------------------------------- summary

def _mean(xs):
    return sum(xs) / len(xs)


def _std(xs):
    """Sample standard deviation (n - 1); 0 for a single value."""
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def config_names(result) -> list:
    """The configurations of a result, in the order it ran them, the baseline first."""
    names = [c["name"] for c in result["configs"]]
    base = baseline_name(result)
    return [base] + [n for n in names if n != base]


def baseline_name(result) -> str:
    return next(c["name"] for c in result["configs"] if c.get("baseline"))


def summarize(result, tail: int = 50) -> list:
    """One row per configuration: its final eval losses by seed, their mean,
    sample std, min and max, the mean of the last `tail` training losses, and,
    against the baseline, the relative difference of the means and whether it
    meets the goal (|difference| <= 1% and the mean inside the baseline's
    min..max over seeds)."""
    by_config = {}
    for run in result["runs"]:
        by_config.setdefault(run["config"], []).append(run)
    base = baseline_name(result)
    if base not in by_config:
        raise ValueError(f"no run of the baseline ({base!r}) in the result")
    b_evals = [r["eval_loss"] for r in by_config[base]]
    b_mean, b_min, b_max = _mean(b_evals), min(b_evals), max(b_evals)
    rows = []
    for name in config_names(result):
        runs = sorted(by_config.get(name, []), key=lambda r: r["seed"])
        if not runs:
            continue
        evals = [r["eval_loss"] for r in runs]
        mean = _mean(evals)
        rel = (mean - b_mean) / b_mean
        row = {
            "config": name, "baseline": name == base, "seeds": [r["seed"] for r in runs], "eval_losses": evals,
            "eval_mean": mean, "eval_std": _std(evals), "eval_min": min(evals), "eval_max": max(evals),
            "train_tail_mean": _mean([_mean(r["losses"][-tail:]) for r in runs]),
            "rel_to_baseline": rel,
            "within_1pct": abs(rel) <= GOAL_REL,
            "within_baseline_range": b_min <= mean <= b_max,
            "tokens_per_s": _mean([r["tokens_per_s"] for r in runs]),
        }
        if all("bytes_sent" in r for r in runs):
            row["bytes_sent_ratio"] = _mean([r["bytes_sent"] / r["bytes_sent_uncompressed"] for r in runs])
        if all("eval_loss_wire" in r for r in runs):  # the MoE example: the same weights through the run's wire
            deltas = [(r["eval_loss_wire"] - r["eval_loss"]) / r["eval_loss"] for r in runs]
            row["wire_eval_rel"], row["wire_eval_rel_std"] = _mean(deltas), _std(deltas)
        row["meets_goal"] = row["within_1pct"] and row["within_baseline_range"]
        rows.append(row)
    return rows


def format_table(rows, tail: int = 50) -> str:
    """The summary as a Markdown table (docs/performance.md takes it as is)."""
    lines = [
        f"| configuration | seeds | final eval loss, mean | std | min | max | vs baseline mean | within 1% "
        f"| inside baseline min..max | train loss, last {tail} steps | tokens/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        vs = "—" if r["baseline"] else f"{100 * r['rel_to_baseline']:+.2f}%"
        w1 = "—" if r["baseline"] else ("yes" if r["within_1pct"] else "**no**")
        wr = "—" if r["baseline"] else ("yes" if r["within_baseline_range"] else "**no**")
        lines.append(f"| {r['config']} | {len(r['seeds'])} | {r['eval_mean']:.4f} | {r['eval_std']:.4f} "
                     f"| {r['eval_min']:.4f} | {r['eval_max']:.4f} | {vs} | {w1} | {wr} "
                     f"| {r['train_tail_mean']:.4f} | {r['tokens_per_s']:.0f} |")
    return "\n".join(lines)


def verdict(rows) -> str:
    """One line per FP8 configuration: goal met, or by how much it misses."""
    base = next(r for r in rows if r["baseline"])
    out = []
    for r in rows:
        if r["baseline"]:
            continue
        parts = []
        if not r["within_1pct"]:
            parts.append(f"{100 * (abs(r['rel_to_baseline']) - GOAL_REL):.2f} points beyond 1%")
        if not r["within_baseline_range"]:
            edge = base["eval_max"] if r["eval_mean"] > base["eval_max"] else base["eval_min"]
            parts.append(f"mean {r['eval_mean'] - edge:+.4f} outside the baseline's range "
                         f"{base['eval_min']:.4f}..{base['eval_max']:.4f}")
        out.append(f"{r['config']}: " + ("goal met" if not parts else "goal missed (" + "; ".join(parts) + ")")
                   + f", {100 * r['rel_to_baseline']:+.2f}% vs baseline mean"
                   + (f"; its trained weights through its own wire: eval loss {100 * r['wire_eval_rel']:+.3f}% "
                      f"(std {100 * r['wire_eval_rel_std']:.3f}%) of the exact eval" if "wire_eval_rel" in r else ""))
    return "\n".join(out)


# ---------------------------------------------------------------- plot

def _smooth(values, window):
    """Trailing moving average; the first window-1 steps average what exists so far."""
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def _seed_ranges(result: dict) -> str:
    """The seeds each configuration ran, grouped: "0-5" or "0-5 (rowwise: 0-2)"."""
    def span(seeds):
        return f"{seeds[0]}-{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) else str(seeds)

    per = {}
    for r in result["runs"]:
        per.setdefault(r["config"], set()).add(r["seed"])
    every = sorted(set(result["settings"]["seeds"]))
    fewer = [f"{name}: {span(sorted(seeds))}" for name, seeds in per.items() if sorted(seeds) != every]
    return span(every) + (f"\n(fewer seeds: {'; '.join(fewer)})" if fewer else "")


def plot(result, path, smooth: int = 25, tail: int = 50):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summarize(result, tail)
    names = [r["config"] for r in rows]
    base = baseline_name(result)
    colors = dict(zip(names, ["black", "tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"]))
    curves = {}  # config -> (mean, min, max) of the seeds' smoothed training losses, per step
    for name in names:
        seeds = [_smooth(r["losses"], smooth) for r in result["runs"] if r["config"] == name]
        n = min(len(s) for s in seeds)
        cols = [[s[i] for s in seeds] for i in range(n)]
        curves[name] = ([_mean(c) for c in cols], [min(c) for c in cols], [max(c) for c in cols])

    fig, (ax_loss, ax_rel, ax_eval) = plt.subplots(1, 3, figsize=(16, 4.8), gridspec_kw={"width_ratios": [1.2, 1.2, 1]})
    start = min(len(curves[base][0]) - 1, max(smooth, len(curves[base][0]) // 10))
    for name in names:
        mean, lo, hi = curves[name]
        steps = range(len(mean))
        ax_loss.plot(steps, mean, color=colors[name], lw=1.2, label=name)
        ax_loss.fill_between(steps, lo, hi, color=colors[name], alpha=0.15, lw=0)
    top = max(curves[n][2][start] for n in names)
    bottom = min(min(curves[n][1]) for n in names)
    ax_loss.set_ylim(bottom - 0.02 * (top - bottom), top)
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel(f"training loss, {smooth}-step moving average")
    ax_loss.set_title("training loss: mean of seeds, band min..max")
    ax_loss.legend(fontsize=8)

    b_mean, b_lo, b_hi = curves[base]
    n = len(b_mean)
    steps = range(start, n)
    ax_rel.fill_between(steps, [100 * (b_lo[i] - b_mean[i]) / b_mean[i] for i in steps],
                        [100 * (b_hi[i] - b_mean[i]) / b_mean[i] for i in steps],
                        color="black", alpha=0.12, lw=0, label=f"{base}: seeds min..max")
    for name in names:
        if name == base:
            continue
        mean = curves[name][0]
        ax_rel.plot(steps, [100 * (mean[i] - b_mean[i]) / b_mean[i] for i in steps], color=colors[name], lw=1.2,
                    label=name)
    for y in (-100 * GOAL_REL, 100 * GOAL_REL):
        ax_rel.axhline(y, color="gray", ls="--", lw=0.8)
    ax_rel.axhline(0, color="black", lw=0.6)
    ax_rel.set_xlabel("step")
    ax_rel.set_ylabel("% vs baseline's mean (smoothed training loss)")
    ax_rel.set_title("mean training loss relative to the baseline's")
    ax_rel.legend(fontsize=8)

    b = rows[0]
    ax_eval.axhspan(b["eval_mean"] * (1 - GOAL_REL), b["eval_mean"] * (1 + GOAL_REL), color="gray", alpha=0.12,
                    label="baseline mean ±1%")
    ax_eval.axhspan(b["eval_min"], b["eval_max"], color="black", alpha=0.15, label="baseline min..max")
    for i, r in enumerate(rows):
        ax_eval.scatter([i] * len(r["eval_losses"]), r["eval_losses"], color=colors[r["config"]], s=18, zorder=3)
        ax_eval.scatter([i], [r["eval_mean"]], color=colors[r["config"]], marker="_", s=400, zorder=3)
    ax_eval.set_xticks(range(len(rows)))
    ax_eval.set_xticklabels([r["config"].replace(" + ", "\n+ ") for r in rows], fontsize=6, rotation=25, ha="right")
    ax_eval.set_ylabel("final eval loss (held-out text)")
    ax_eval.set_title("final eval loss per seed (bar: mean)")
    ax_eval.legend(fontsize=8)

    s = result["settings"]
    suite = SUITES[s.get("suite", "fsdp")]
    fig.suptitle(f"{suite['model']} (dim {s['dim']}, {s['layers']} layers, seq {s['seq']}, batch {s['batch']}/rank), "
                 f"{suite['parallel']} on {s['nproc']} ranks, {s['steps']} steps, {schedule_label(s)}, seeds {_seed_ranges(result)}; "
                 f"{result.get('device', '')}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------- runs

def command(args, config, seed, path) -> list:
    """The torchrun command of one run of the suite's example, writing its JSON to `path`."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
            SUITES[args.suite]["example"],
            "--steps", str(args.steps), "--seed", str(seed), "--dim", str(args.dim), "--layers", str(args.layers),
            "--heads", str(args.heads), "--seq", str(args.seq), "--batch", str(args.batch),
            "--eval-batches", str(args.eval_batches), "--lr-schedule", args.lr_schedule,
            "--warmup-steps", str(args.warmup_steps), "--min-lr-ratio", str(args.min_lr_ratio),
            "--log-every", str(max(1, args.steps // 5)),
            "--json", path, *config["flags"]]


def run_one(args, config, seed, tmp):
    number = [c["name"] for c in SUITES[args.suite]["configs"]].index(config["name"])
    path = os.path.join(tmp, f"run-{seed}-{number}.json")
    cmd = command(args, config, seed, path)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        sys.stderr.write(out.stdout[-3000:] + out.stderr[-5000:])
        raise SystemExit(f"convergence: {config['name']} seed {seed} failed (exit {out.returncode})")
    with open(path) as f:
        written = json.load(f)
    run = {"config": config["name"], "seed": seed, "wall_s": wall, "example_command": written["command"],
           "lr": written["args"]["lr"], **written["runs"][0]}
    run.pop("label", None)
    return run


def main(argv=None):
    args = parse_args(argv)
    if args.replot:
        with open(args.replot) as f:
            result = json.load(f)
        rows = summarize(result, args.tail)
        print(format_table(rows, args.tail))
        print(verdict(rows))
        if args.plot:
            plot(result, args.plot, args.smooth, args.tail)
            print(f"wrote {args.plot}")
        return 0

    from fp8comm.bench import device_label  # imports the extension; --replot needs neither

    seeds = [int(s) for s in args.seeds.split(",")]
    configs = SUITES[args.suite]["configs"]
    if args.configs:
        wanted = [n.strip() for n in args.configs.split(",")]
        unknown = set(wanted) - {c["name"] for c in configs}
        if unknown:
            raise SystemExit(f"convergence: unknown configurations {sorted(unknown)} in --suite {args.suite}")
        configs = [c for c in configs if c["name"] in wanted or (c.get("baseline") and not args.baseline)]
    if args.baseline:
        if args.baseline not in {c["name"] for c in configs}:
            raise SystemExit(f"convergence: --baseline {args.baseline!r} is not among the configurations to run")
        configs = [{**c, "baseline": c["name"] == args.baseline} for c in configs]
    settings = {"suite": args.suite, "seeds": seeds, "steps": args.steps, "nproc": args.nproc, "dim": args.dim, "layers": args.layers,
                "heads": args.heads, "seq": args.seq, "batch": args.batch, "eval_batches": args.eval_batches,
                **lr_settings(args)}
    machine = args.machine or (os.path.basename(os.path.dirname(os.path.abspath(args.json))) if args.json else None)
    result = {
        "benchmark": "convergence", "date": datetime.date.today().isoformat(),
        "command": shlex.join(["python", "bench/convergence.py", *(sys.argv[1:] if argv is None else argv)]),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "1"), "nice": os.nice(0),
        "machine": machine, "device": device_label(False), "torch": __import__("torch").__version__,
        "settings": settings, "configs": configs, "runs": [],
    }
    if args.resume and args.json and os.path.exists(args.json):
        with open(args.json) as f:
            old = json.load(f)
        if {**SETTINGS_DEFAULTS, **old["settings"], "seeds": None} != {**settings, "seeds": None}:
            raise SystemExit("convergence: --resume with different settings than the saved result's "
                             "(only --seeds and --configs may differ; --suite neither)")
        settings["seeds"] = sorted(set(old["settings"]["seeds"]) | set(seeds))  # more seeds join the saved ones
        result["runs"] = old["runs"]
        result["earlier_commands"] = old.get("earlier_commands", []) + [old["command"]]
        known = {c["name"] for c in old["configs"]}
        result["configs"] = old["configs"] + [c for c in configs if c["name"] not in known]

    def save():
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            rows = summarize(result, args.tail) if any(
                r["config"] == baseline_name(result) for r in result["runs"]) else []
            with open(args.json, "w") as f:
                json.dump({**result, "summary": rows}, f, indent=1)

    todo = [(s, c) for s in seeds for c in configs  # seed-major
            if not any(r["seed"] == s and r["config"] == c["name"] for r in result["runs"])]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for i, (seed, config) in enumerate(todo):
            run = run_one(args, config, seed, tmp)
            result["runs"].append(run)
            save()
            elapsed = time.perf_counter() - started
            print(f"convergence: [{i + 1}/{len(todo)}] seed {seed} {config['name']}: eval loss {run['eval_loss']:.4f}, "
                  f"{run['wall_s']:.0f} s (about {elapsed / (i + 1) * (len(todo) - i - 1) / 60:.0f} min left)",
                  file=sys.stderr, flush=True)
    rows = summarize(result, args.tail)
    print(format_table(rows, args.tail))
    print(verdict(rows))
    save()
    if args.plot:
        plot(result, args.plot, args.smooth, args.tail)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
