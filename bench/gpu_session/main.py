"""The GPU session, in ONE device call (README, "On a lent GPU"):

    run(command="bash bench/gpu_session.sh", timeout_s=600)
    run(command="FP8COMM_GPU_SESSION_BUDGET_S=B bash bench/gpu_session.sh", timeout_s=B+30)

the second with less device time left, B = budget_left_s less the machine's
start when none is warm, at most 560. The steps and their caps: steps.py;
the plan that fits them to the budget: plan.py; running them: runner.py.

    bash bench/gpu_session.sh [selftest | selftest-pass]

selftest, selftest-pass: no GPU needed; deliberately failing / passing steps
through the same runner (tests/tools/test_gpu_session_script.py).
FP8COMM_GPU_SESSION_DRYRUN=1 prints the plan and each step's command instead
of running it. FP8COMM_GPU_SESSION_BUDGET_S (default 560) is the runner's own
clock: each step's cap is also cut to what is left, so the summary always
comes back. FP8COMM_GPU_SESSION_CAPS="STEP=S,..." sets steps' caps (before the
budget is fitted). For the self-tests only: FP8COMM_GPU_SESSION_SNAPSHOTS=DIR
copies $OUT there after each step; FP8COMM_GPU_SESSION_KILL_AFTER=STEP kills
the runner's process group (SIGKILL) right after STEP, as a device call's
limit would.

Results come back flat in $OUT (the device tool returns at most 8 files, at
most two folders down): the summary, one tarball of logs, and one JSON per
benchmark. Copy the JSONs to bench/results/$MACHINE/ (model.json to
bench/results/modeled/model-$MACHINE.json) and commit them.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

from . import plan as plan_mod
from . import runner as runner_mod
from . import steps as steps_mod

DEFAULT_BUDGET_S = 560
MODES = ("session", "selftest", "selftest-pass")


def usage(text: str) -> int:
    print(f"usage: {text}", file=sys.stderr)
    return 2


def gpu_name() -> str:
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                           timeout=30)
        name = p.stdout.strip().splitlines()[0] if p.returncode == 0 and p.stdout.strip() else ""
    except (OSError, subprocess.SubprocessError):
        name = ""
    name = re.sub(r"[^A-Za-z0-9.-]", "", name.replace(" ", "-"))
    return name or "unknown-gpu"


def machine_of(gpu: str) -> str:
    if gpu == "unknown-gpu":
        return "gpu-unknown"
    return "gpu-" + re.sub(r"^nvidia-", "", gpu.lower())


def parse_caps(text: str, steps) -> dict | None:
    names = {s.name for s in steps}
    caps = {}
    for entry in filter(None, text.split(",")):
        m = re.fullmatch(r"([A-Za-z0-9-]+)=([0-9]+)", entry.strip())
        if not m or m.group(1) not in names:
            return None
        caps[m.group(1)] = int(m.group(2))
    return caps


def main(argv: list[str]) -> int:
    mode = argv[0] if argv else "session"
    if mode not in MODES or len(argv) > 1:
        return usage("bash bench/gpu_session.sh [selftest|selftest-pass]")
    budget_text = os.environ.get("FP8COMM_GPU_SESSION_BUDGET_S", str(DEFAULT_BUDGET_S))
    if not re.fullmatch(r"[0-9]+", budget_text):
        return usage(f"FP8COMM_GPU_SESSION_BUDGET_S is whole seconds, not '{budget_text}'")
    budget = int(budget_text)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.chdir(root)
    python = sys.executable if mode != "session" else "python3"
    steps = steps_mod.SESSION if mode == "session" else steps_mod.selftest(mode, python)
    caps_text = os.environ.get("FP8COMM_GPU_SESSION_CAPS", "")
    overrides = parse_caps(caps_text, steps)
    if overrides is None:
        return usage(f"FP8COMM_GPU_SESSION_CAPS is STEP=SECONDS,... of known steps, not '{caps_text}'")

    out = os.environ.get("OUT") or "/tmp/fp8comm-gpu"
    os.makedirs(out, exist_ok=True)
    shutil.rmtree(os.path.join(out, "logs"), ignore_errors=True)  # an older layout's
    work = tempfile.mkdtemp(prefix="fp8comm-gpu-session-")
    gpu = "selftest" if mode != "session" else gpu_name()
    machine = machine_of(gpu)
    day = time.strftime("%Y-%m-%d")
    prefix = f"{day}-gpu-session-{gpu}" if mode == "session" else f"{day}-gpu-session-{mode}-{gpu}"
    # No package index on the device machine, and nothing that pip would wait for; the
    # in-tree package (bench/*.py puts bench/ first on sys.path) and the pytest plugin.
    os.environ.update(PYTHONUNBUFFERED="1", PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    extra = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([root, os.path.join(root, "bench", "gpu_session")] +
                                               ([extra] if extra else []))
    config = runner_mod.Config(
        mode=mode, root=root, out=out, work=work, prefix=prefix, title=f"{mode} on {gpu} ({machine}), {day}",
        budget=budget, dryrun=os.environ.get("FP8COMM_GPU_SESSION_DRYRUN", "0") == "1",
        snapshots=os.environ.get("FP8COMM_GPU_SESSION_SNAPSHOTS", ""),
        kill_after=os.environ.get("FP8COMM_GPU_SESSION_KILL_AFTER", ""),
        test_timeout_grace=10 if mode == "session" else 2,
        pytest_extra=("--tier", "all", "-n", "0") if mode == "session" else (),
        python=python)
    if mode == "session":
        the_plan = plan_mod.plan(budget, steps, overrides)
    else:
        # a quick pytest start: only the plugins named with -p (gpu_session_guard)
        os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        runner_mod.copy_selftest_fixtures(root, work)
        the_plan = plan_mod.plan(1 << 30, steps, overrides)
        the_plan = plan_mod.Plan(budget, the_plan.caps, (), 100, the_plan.stages)
    run = runner_mod.Runner(steps, the_plan, config)
    run.result_files = tuple(steps_mod.results(steps))
    runner_mod.log(f"{mode} on {gpu} ({machine}); results in {out}")
    if mode == "session":
        run.plan_line = the_plan.describe()
        runner_mod.log(f"plan: {run.plan_line}")
        if the_plan.dropped:
            runner_mod.log(f"plan: dropped to fit the {budget} s budget, lowest drop rank first: "
                           f"{' '.join(the_plan.dropped)}")
        if the_plan.scale < 100:
            runner_mod.log(f"plan: the caps after the build scaled to {the_plan.scale} % to fit the {budget} s budget")
        if the_plan.scale < plan_mod.SCALE_MIN:
            runner_mod.log(f"plan: WARNING: {budget} s is less than env, the build and the codec tests need; "
                           "they may not finish")
        runner_mod.log(f"results: {' '.join(run.result_files)} (+ the summary and the logs tarball)")
    else:
        run.plan_line = "selftest: no plan"

    def on_signal(signum, frame):
        name = "SIGTERM" if signum == signal.SIGTERM else "SIGINT"
        run.stop(f"stopped by {name}")
        raise SystemExit(143 if signum == signal.SIGTERM else 130)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        for s in steps:  # the whole plan in the summary from the start: a kill leaves its PENDING steps listed
            if s.on_failure_of is None:
                run.shown.add(s.name)
        run.run()
    except SystemExit as e:
        run.final_rc = int(e.code or 0)
    except Exception:  # noqa: BLE001 (the summary still comes back)
        traceback.print_exc()
        run.final_rc = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    rc = run.finish()
    shutil.rmtree(work, ignore_errors=True)
    return rc
