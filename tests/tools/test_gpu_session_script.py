"""bench/gpu_session.sh, the one command of a GPU session (a thin wrapper of the
runner in bench/gpu_session/), without a GPU: it parses, shellcheck (where
installed) finds nothing, and its `selftest` modes push deliberately failing
and passing steps through the same runner as the session (the fixtures:
tests/tools/gpu_session_selftest/). A failing pytest run, a run in which every test skipped, a hung test,
a run cut at its cap, a failing background lane, a failed env check, a failed
build and a compute-sanitizer error must each fail the command (nonzero exit,
FAIL in the summary, saying why) while the later steps still run; an
all-passing run, in which the build command fails after writing an extension
that imports, must exit 0. The summary is rewritten after every step (a kill
at any moment leaves one). The session itself is dry-run
(FP8COMM_GPU_SESSION_DRYRUN=1): its steps and their order, every CUDA test file
run once, a plan that fits the default budget and a short one, and results
that the device tool can bring back (flat in $OUT, at most 8 files). The
plan's rules without a process: test_gpu_session_plan.py.

The script's runs start together, once per module (RUNS), and the tests read
their results: the runs mostly wait on caps and timeouts, so the file stays
fast."""
import os
import re
import shutil
import signal
import subprocess
import tarfile
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from tests.support import REPO_ROOT
from tests.tools.gpu_session_table import SESSION

ROOT = str(REPO_ROOT)
SCRIPT = os.path.join(ROOT, "bench", "gpu_session.sh")
RUNNER = REPO_ROOT / "bench" / "gpu_session"

# A compute-sanitizer stand-in: takes the options the script passes, writes a
# report to --log-file, and runs the command after them (or not), as FAKE_SANITIZER says.
FAKE_SANITIZER = textwrap.dedent("""\
    #!/usr/bin/env bash
    report=/dev/null
    options=""
    while [ $# -gt 0 ] && [ "${1#--}" != "$1" ]; do
      if [ "$1" = --log-file ]; then report=$2; fi
      options="$options$1 $2
    "
      shift 2
    done
    printf '%s' "$options" >"$report.args"
    case "$FAKE_SANITIZER" in
      unsupported)
        echo "========= Error: Device not supported" >"$report"
        exit 1 ;;
      errors)
        "$@"
        printf '%s\\n' "========= Invalid __global__ write of size 4 bytes" \\
          "=========     at 0x70 in quantize_kernel" "========= ERROR SUMMARY: 1 error" >"$report"
        exit 86 ;;
      errors-hang)
        printf '%s\\n' "========= COMPUTE-SANITIZER" "========= Invalid __global__ read of size 16 bytes" \\
          "=========     at 0x80 in dequant_kernel" >"$report"
        sleep 30
        exit 0 ;;
      *)
        "$@"; rc=$?
        echo "========= ERROR SUMMARY: 0 errors" >"$report"
        exit $rc ;;
    esac
    """)


def script_env(out, sanitizer=None, bin_dir=None, **env):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FP8COMM_GPU_SESSION")}
    full_env.update(OUT=str(out), **env)
    if sanitizer is not None:
        bin_dir.mkdir(parents=True, exist_ok=True)
        fake = bin_dir / "compute-sanitizer"
        fake.write_text(FAKE_SANITIZER)
        fake.chmod(0o755)
        full_env["PATH"] = f"{bin_dir}{os.pathsep}{full_env['PATH']}"
        full_env["FAKE_SANITIZER"] = sanitizer
    return full_env


class Run:
    """One run of the script, started at once and read when needed: stdout,
    stderr, returncode, and its $OUT (plus `snapshots`, where asked for)."""

    def __init__(self, root, stage, sanitizer=None, snapshots=False, new_session=False, **env):
        root.mkdir(parents=True)
        self.out = root / "out"
        self.snapshots = root / "snapshots" if snapshots else None
        if snapshots:
            env["FP8COMM_GPU_SESSION_SNAPSHOTS"] = str(self.snapshots)
        self.proc = subprocess.Popen(["bash", SCRIPT] + ([stage] if stage else []), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=new_session,
                                     env=script_env(self.out, sanitizer, root / "bin", **env))
        self._done = None

    def wait(self):
        if self._done is None:
            stdout, stderr = self.proc.communicate(timeout=300)
            self._done = (stdout, stderr, self.proc.returncode)
        return self

    @property
    def stdout(self):
        return self.wait()._done[0]

    @property
    def stderr(self):
        return self.wait()._done[1]

    @property
    def returncode(self):
        return self.wait()._done[2]


def dry(root, **env):
    return Run(root, None, sanitizer="ok", FP8COMM_GPU_SESSION_DRYRUN="1", **env)


# Every run the tests read, started together on first use.
RUN_SPECS = {
    "selftest": lambda r: Run(r, "selftest", snapshots=True),
    "pass": lambda r: Run(r, "selftest-pass", sanitizer="ok"),
    "sanitizer-errors": lambda r: Run(r, "selftest-pass", sanitizer="errors"),
    "sanitizer-unsupported": lambda r: Run(r, "selftest-pass", sanitizer="unsupported"),
    "sanitizer-errors-hang": lambda r: Run(r, "selftest-pass", sanitizer="errors-hang",
                                           FP8COMM_GPU_SESSION_CAPS="memcheck=3"),
    "killed": lambda r: Run(r, "selftest-pass", new_session=True, FP8COMM_GPU_SESSION_KILL_AFTER="selftest-build"),
    "dry": lambda r: dry(r),
    "dry-400": lambda r: dry(r, FP8COMM_GPU_SESSION_BUDGET_S="400"),
    "dry-300": lambda r: dry(r, FP8COMM_GPU_SESSION_BUDGET_S="300"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu_session")
    started = {name: spec(root / name) for name, spec in RUN_SPECS.items()}
    yield started
    for run in started.values():
        if run.proc.poll() is None:
            run.proc.kill()
        run.wait()


def summary_of(out):
    (txt,) = Path(out).glob("*-gpu-session-*.txt")
    rows = {}
    for line in txt.read_text().splitlines():
        parts = line.split(None, 2)
        if len(parts) >= 2 and parts[0] in ("PASS", "FAIL", "SKIP", "NOT-RUN", "DRY", "DROPPED", "RUNNING", "PENDING"):
            rows[parts[1]] = (parts[0], line)
    return rows, txt.read_text()


def statuses(rows):
    return {name: status for name, (status, _) in rows.items()}


def archived(out):
    """{name: bytes} of the files in the logs archive."""
    (archive,) = Path(out).glob("*-gpu-session-*-logs.tar.gz")
    with tarfile.open(archive) as tar:
        return {os.path.basename(m.name): tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def junit_failures(data):
    root = ET.fromstring(data)
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    return sum(int(s.get("failures", 0)) for s in suites)


def results_log(data):
    """[(outcome, seconds, node id, detail)] of a gpu_session_guard results log; START lines as (START, node id)."""
    return [tuple(line.split("\t")) for line in data.decode().splitlines() if "\t" in line]


def assert_returnable(out):
    """What the device tool brings back: at most 8 plain files, flat, with plain names; no logs folder."""
    entries = list(Path(out).iterdir())
    assert len(entries) <= 8 and all(f.is_file() for f in entries), entries
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", f.name) for f in entries), entries
    assert not (Path(out) / "logs").exists()


def test_script_parses():
    p = subprocess.run(["bash", "-n", SCRIPT], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_shellcheck_is_clean():
    p = subprocess.run(["shellcheck", SCRIPT], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


SELFTEST_EXPECT = {
    "selftest-background": "FAIL",   # a failing pytest run in the background
    "selftest-env": "FAIL",          # the env check with nothing on PATH
    "selftest-build": "FAIL",        # the build command and the import check both fail
    "selftest-nvcc-check": "PASS",   # the kernels compiled without torch, after the failed build
    "selftest-pass": "PASS",
    "selftest-fail": "FAIL",         # a failing pytest run
    "selftest-all-skipped": "FAIL",  # every test skipped: nothing was checked
    "selftest-hang": "FAIL",         # a hung test, failed by its per-test timeout
    "selftest-cut": "FAIL",          # ran past its step's cap
    "memcheck": "SKIP",              # no compute-sanitizer here
    "selftest-after": "PASS",        # still ran after the failures
}


def test_failures_propagate_and_later_steps_still_run(runs):
    run = runs["selftest"]
    assert run.returncode == 1, run.stdout + run.stderr
    rows, text = summary_of(run.out)
    assert statuses(rows) == SELFTEST_EXPECT, text
    assert list(rows) == list(SELFTEST_EXPECT), text  # the kernels' compile right after the build
    assert "no test ran" in rows["selftest-all-skipped"][1]
    assert "compute-sanitizer not found" in rows["memcheck"][1]
    assert ("FAILED: selftest-background selftest-env selftest-build selftest-fail selftest-all-skipped "
            "selftest-hang selftest-cut") in text
    assert "not final" not in text
    assert text.strip() in run.stdout  # the summary is printed last
    files = archived(run.out)
    assert junit_failures(files["selftest-fail.xml"]) == 1
    assert junit_failures(files["selftest-background.xml"]) == 1
    assert junit_failures(files["selftest-pass.xml"]) == 0
    assert "selftest-after.log" in files
    assert_returnable(run.out)  # logs archived, so that few files come back from the device


def test_an_env_check_that_fails_names_what_is_missing(runs):
    run = runs["selftest"]
    rows, text = summary_of(run.out)
    detail = rows["selftest-env"][1]
    assert "missing:" in detail and "nvcc" in detail and "c++" in detail and "nvidia-smi" in detail, detail
    assert "MISSING  nvcc: not on PATH" in run.stdout  # every finding is printed
    assert "ok       Python.h" in run.stdout or "MISSING  Python.h" in run.stdout


def test_a_failed_build_shows_its_compiler_errors_then_compiles_the_kernels_without_torch(runs):
    run = runs["selftest"]
    rows, text = summary_of(run.out)
    assert "the build command exited 1 and the import check failed" in rows["selftest-build"][1], text
    assert "   | csrc/stand-in.cpp:1:1: error: a stand-in compile error" in run.stdout
    assert "nvcc -c csrc/stand-in.cu" in archived(run.out)["selftest-nvcc-check.log"].decode()


def test_a_hung_test_fails_alone_and_the_run_goes_on(runs):
    run = runs["selftest"]
    rows, text = summary_of(run.out)
    assert "2 passed, 1 failed" in rows["selftest-hang"][1], text
    results = results_log(archived(run.out)["selftest-hang.results"])
    outcomes = {r[2]: r for r in results if r[0] != "START"}
    assert outcomes["selftest_hang.py::test_hangs"][0] == "FAILED"
    assert "timed out" in outcomes["selftest_hang.py::test_hangs"][3]
    assert outcomes["selftest_hang.py::test_after_the_hang"][0] == "PASSED"


def test_a_step_cut_at_its_cap_still_reports_its_tests(runs):
    run = runs["selftest"]
    rows, text = summary_of(run.out)
    detail = rows["selftest-cut"][1]
    assert "timed out after 6 s: 1 passed, 0 failed" in detail, text
    assert "running: selftest_hang.py::test_hangs" in detail, text
    log = archived(run.out)["selftest-cut.results"].decode()
    assert "PASSED\t" in log and 'in test_hangs' in log  # the traceback of the test it was in (SIGTERM)
    assert "selftest_hang.py::test_hangs PASSED" not in archived(run.out)["selftest-cut.log"].decode()
    assert "selftest_hang.py::test_passes PASSED" in archived(run.out)["selftest-cut.log"].decode()  # verbose
    assert "selftest-cut.xml" not in archived(run.out)  # cut before pytest wrote it: the counts are the log's


def test_the_summary_is_rewritten_after_every_step(runs):
    """Each snapshot is $OUT as a kill at that moment would leave it: when a step
    starts (RUNNING) and after its result."""
    run = runs["selftest"]
    run.wait()
    final_rows, _ = summary_of(run.out)
    snapshots = sorted(run.snapshots.iterdir())
    seen = set()
    for snap in snapshots:
        name, status = snap.name[4:].rsplit("-", 1)
        if name.endswith("-NOT"):  # NOT-RUN
            name, status = name[:-4], "NOT-RUN"
        assert_returnable(snap)
        rows, text = summary_of(snap)
        assert "not final" in text, text
        assert rows[name][0] == status, (snap.name, text)
        assert set(rows) <= set(final_rows)
        archived(snap)  # a whole archive
        if status != "RUNNING":
            seen.add(name)
    assert seen == set(final_rows)  # a summary after every step
    assert any(snap.name.endswith("-RUNNING") for snap in snapshots)


def test_a_kill_leaves_a_readable_summary(runs):
    run = runs["killed"]
    assert run.returncode == -signal.SIGKILL, run.stdout + run.stderr
    rows, text = summary_of(run.out)
    assert rows["selftest-build"][0] == "PASS", text
    assert "not final" in text and "== plan:" in text
    assert "selftest-after" not in rows or rows["selftest-after"][0] == "PENDING"
    assert_returnable(run.out)
    assert "selftest-build.log" in archived(run.out)


def test_an_all_passing_run_exits_zero(runs):
    run = runs["pass"]
    assert run.returncode == 0, run.stdout + run.stderr
    rows, text = summary_of(run.out)
    assert statuses(rows) == {"selftest-background": "PASS", "selftest-build": "PASS", "selftest-pass": "PASS",
                              "memcheck": "PASS", "selftest-after": "PASS"}, text
    assert "no step failed" in text


def test_a_build_whose_command_fails_but_whose_extension_imports_counts_as_built(runs):
    run = runs["pass"]
    rows, text = summary_of(run.out)
    assert rows["selftest-build"][0] == "PASS", text
    assert "counted as built: the build command exited 1" in rows["selftest-build"][1]
    log = archived(run.out)["selftest-build.log"].decode()
    assert "could not write to site-packages" in log


@pytest.mark.parametrize("mode,status,exit_zero", [("ok", "PASS", True), ("errors", "FAIL", False),
                                                    ("unsupported", "SKIP", True), ("errors-hang", "FAIL", False)])
def test_compute_sanitizer_outcomes(runs, mode, status, exit_zero):
    run = runs["pass" if mode == "ok" else f"sanitizer-{mode}"]
    rows, text = summary_of(run.out)
    assert rows["memcheck"][0] == status, text
    assert (run.returncode == 0) == exit_zero, run.stdout + run.stderr
    files = archived(run.out)
    args = files["memcheck-report.log.args"].decode()
    assert "--tool memcheck" in args and "--error-exitcode 86" in args and "--kernel-name kns=fp8comm" in args
    if mode == "errors":
        assert "ERROR SUMMARY: 1 error" in rows["memcheck"][1]
        assert "Invalid __global__ write" in run.stdout
    if mode == "errors-hang":  # the errors found before the cap are kept
        assert "timed out after 3 s; compute-sanitizer had found 1 errors" in rows["memcheck"][1], text
        assert "Invalid __global__ read of size 16 bytes" in rows["memcheck"][1]
        assert "   | ========= Invalid __global__ read" in run.stdout
    if mode == "unsupported":
        assert "Device not supported" in rows["memcheck"][1]
    if mode == "ok":
        assert junit_failures(files["memcheck.xml"]) == 0


def test_unknown_mode_and_bad_budget_are_refused(tmp_path):
    p = subprocess.run(["bash", SCRIPT, "no-such-mode"], capture_output=True, text=True,
                       env=script_env(tmp_path / "out"))
    assert p.returncode == 2 and "usage" in p.stderr
    p = subprocess.run(["bash", SCRIPT], capture_output=True, text=True,
                       env=script_env(tmp_path / "out", FP8COMM_GPU_SESSION_BUDGET_S="soon"))
    assert p.returncode == 2 and "whole seconds" in p.stderr


def commands_of(run):
    """Each step's printed command, by step name."""
    return {line.split(" (limit")[0].split()[-1]: line for line in run.stdout.splitlines() if " (limit " in line}


def plan_of(run):
    (line,) = [ln for ln in run.stdout.splitlines() if re.match(r"== [\d:]+ plan: serial", ln)]
    m = re.search(r"= (\d+) s of a (\d+) s budget", line)
    return int(m.group(1)), int(m.group(2)), line


ALL_STEPS = [s.name for s in SESSION if s.on_failure_of is None]
PYTEST_STEPS = [s.name for s in SESSION if s.kind == "pytest"]
SANITIZER_STEPS = [s.name for s in SESSION if s.kind == "sanitizer"]
BENCH_STEPS = [s.name for s in SESSION if s.kind == "bench"]
# run only where a file of the tree is there (the wheels, a hook's script): a SKIP in this tree
OPTIONAL = {s.name for s in SESSION if s.requires and not (REPO_ROOT / s.requires).exists()}


def test_one_call_runs_every_step_in_order_of_evidence_per_second(runs):
    run = runs["dry"]
    assert run.returncode == 0, run.stdout + run.stderr
    commands = commands_of(run)
    rows, text = summary_of(run.out)
    assert list(rows) == ALL_STEPS, text
    # whole lines, though lanes print from threads side by side
    assert all(re.fullmatch(r"== [\d:]+ \S+ \(limit \d+ s\): [^\n]*", ln) and ln.count(" (limit ") == 1
               for ln in run.stdout.splitlines() if " (limit " in ln), run.stdout
    assert all(status == "DRY" for name, (status, _) in rows.items() if name not in OPTIONAL), text
    assert all(rows[name][0] == "SKIP" for name in OPTIONAL), text
    build = commands["build"]
    assert "setup.py build_ext --inplace" in build and "pip" not in build
    assert "TORCH_CUDA_ARCH_LIST=9.0 " in build and "MAX_JOBS=" in build and "has_cuda.py" in build
    assert "assert fp8comm._C.has_cuda" in (RUNNER / "has_cuda.py").read_text()  # what the import check checks
    main = (RUNNER / "main.py").read_text()
    for var in ('PIP_NO_INDEX="1"', 'PIP_DISABLE_PIP_VERSION_CHECK="1"', "PYTHONPATH"):
        assert var in main, var
    assert "env_check.py" in commands["env"]
    for name in PYTEST_STEPS + SANITIZER_STEPS:
        assert " -m cuda " not in commands[name], name  # named files: one import error cannot hide the rest
        assert "--tier all -n 0" in commands[name], name  # every case, in this process (one GPU)
    assert "comm.py" not in commands["comm-bench"] and "--max-bytes 256M" in commands["comm-bench"]
    assert "--codec-json" in commands["model"] and "codec-tiled.json" in commands["model"]


def test_the_codec_steps_run_both_kernel_sets(runs):
    commands = commands_of(runs["dry"])
    for name in ("codec-bench", "collective-time", "interference", "overlap"):
        assert "side_by_side.py --sets legacy,tiled " in commands[name], commands[name]
    assert "FP8COMM_CUDA_CODEC=tiled python3 -m pytest" in commands["codec-cast-tests"]
    assert "FP8COMM_CUDA_CODEC=legacy python3 -m pytest" in commands["codec-tests-legacy"]


def test_pytest_steps_are_verbose_with_a_per_test_timeout_and_a_results_log(runs):
    commands = commands_of(runs["dry"])
    for name in PYTEST_STEPS + SANITIZER_STEPS:
        c = commands[name]
        assert " -v " in c and " -q " not in c and "-p gpu_session_guard" in c, c
        assert re.search(r"--test-timeout=\d+ ", c) and "--results-log=" in c and "--durations=" in c, c
        assert "--junitxml=" in c, c  # the counts are read from it


def test_sanitizers_cover_the_codec_and_cast_kernels_and_racecheck_only_shared_memory(runs):
    commands = commands_of(runs["dry"])
    for tool in SANITIZER_STEPS:
        assert f"--tool {tool}" in commands[tool] and "--junitxml=" in commands[tool]
        assert "--kernel-name kns=fp8comm" in commands[tool]
        assert " -k 'not compile and " in commands[tool]  # a stated subset
    assert "tests/codec/test_codec_cuda.py tests/nn/test_fused_cast_cuda.py" in commands["memcheck"]
    assert "tests/nn/test_fused_cast_cuda.py" in commands["racecheck"]
    # racecheck checks shared memory only: it covers the files that have any,
    # of the codec the tiled NVFP4 kernels alone (the legacy codec has none)
    assert "tests/codec/test_codec_cuda.py" in commands["racecheck"]
    assert "(nvfp4 and tiled and " in commands["racecheck"]
    with_shared = sorted(str(f.relative_to(REPO_ROOT)) for f in (REPO_ROOT / "csrc").rglob("*.cu*")
                         if "__shared__" in f.read_text())
    assert with_shared == ["csrc/codec/codec_cuda_tiled.cu", "csrc/linear/cast_cuda.cu",
                           "csrc/linear/cast_cuda_tiled.cu"], with_shared
    # (test_fused_cast_cuda.py runs every test on both cast kernel sets: racecheck sees both files' kernels)


def test_the_caps_fit_the_budget_and_one_call(runs):
    run = runs["dry"]
    total, budget, line = plan_of(run)
    assert total <= budget == 560, line
    assert budget <= 600 - 30  # the device call's 600 s, less the start of the command and the transfers
    for name, cap in re.findall(r"== \S+ (\S+) \(limit (\d+) s\)", run.stdout):
        assert int(cap) > 0, name
    assert "DROPPED" not in run.stdout and "scaled" not in run.stdout


@pytest.mark.parametrize("budget", [400, 300])
def test_a_short_budget_drops_the_lowest_value_steps_and_scales_the_rest(runs, budget):
    run = runs[f"dry-{budget}"]
    assert run.returncode == 0, run.stdout + run.stderr
    total, got, line = plan_of(run)
    assert got == budget and total <= budget, line
    commands = commands_of(run)
    rows, text = summary_of(run.out)
    dropped = [name for name in ALL_STEPS if rows[name][0] == "DROPPED"]
    assert dropped and not any(name in commands for name in dropped), text
    (order_line,) = [ln for ln in run.stdout.splitlines() if "lowest drop rank first:" in ln]
    order = order_line.split("lowest drop rank first: ")[1].split()
    assert sorted(order) == sorted(dropped)
    drop_order = [s.name for s in sorted((s for s in SESSION if s.drop), key=lambda s: s.drop)]
    assert order == drop_order[:len(order)]  # lowest value first, in the stated order
    for name in ("env", "build", "codec-cast-tests"):
        assert rows[name][0] == "DRY", text  # never dropped
    assert f"== DROPPED to fit the {budget} s budget:" in text
    # the steps kept run under caps that add up to the plan
    serial = sum(int(re.search(r"\(limit (\d+) s\)", commands[s.name]).group(1)) for s in SESSION
                 if s.lane is None and s.name in commands)
    assert serial <= total


def test_results_come_back_flat_and_within_the_return_limits(runs):
    run = runs["dry"]
    commands = commands_of(run)
    (line,) = [ln for ln in run.stdout.splitlines() if " results: " in ln]
    results = line.split(" results: ")[1].split(" (+")[0].split()
    assert len(results) + 2 <= 8  # + the summary and the logs tarball
    for name in results:
        assert re.fullmatch(r"[A-Za-z0-9._-]+", name), name
        writers = [s for s in SESSION if name in s.results]
        assert writers and all(f"--json {{out}}/{name}" in " ".join(s.command) for s in writers), name
        assert any(f"--json {run.out}/{name}" in c for c in commands.values()) or all(
            s.name in OPTIONAL for s in writers), name
    names = {f.name for f in run.out.iterdir()}
    assert len(names) == 2, names
    assert_returnable(run.out)


def test_the_replayed_codec_table_is_the_rows_the_model_reads():
    (step,) = [s for s in SESSION if s.name == "codec-bench"]
    regex = step.table[1]
    header = f"{'op':36s} {'format':6s} {'dtype':9s} {'numel':>11s} {'GB/s':>9s} {'of copy':>8s}"
    e4m3 = f"{'quantize':36s} {'e4m3':6s} {'float32':9s} {1 << 20:11d} {1.0:9.2f} {0.5:8.2f}"
    mxfp4 = f"{'quantize':36s} {'mxfp4':6s} {'float32':9s} {1 << 20:11d} {1.0:9.2f} {0.5:8.2f}"
    assert re.search(regex, header) and re.search(regex, e4m3) and not re.search(regex, mxfp4)
    assert re.search(regex, "== FP8COMM_CUDA_CODEC=legacy: python3 bench/codec.py")  # which set each table is


def test_a_sigterm_ends_the_running_steps_and_leaves_a_final_summary(tmp_path):
    """As a device call's limit or an operator's stop would: the runner ends the
    running step's process group and writes a final summary that says so."""
    run = Run(tmp_path / "term", "selftest-pass", new_session=True, FP8COMM_GPU_SESSION_CAPS="selftest-after=60")
    for _ in range(600):  # up to 60 s for a step to be running
        txts = list(run.out.glob("*-gpu-session-*.txt")) if run.out.exists() else []
        if txts and "RUNNING " in txts[0].read_text():
            break
        assert run.proc.poll() is None, run.stdout + run.stderr
        time.sleep(0.1)
    run.proc.send_signal(signal.SIGTERM)
    assert run.returncode == 143, run.stdout + run.stderr
    rows, text = summary_of(run.out)
    assert "stopped with exit 143 (stopped by SIGTERM)" in text and "not final" not in text, text
    assert "RUNNING" not in statuses(rows).values() and "PENDING" not in statuses(rows).values(), text
    assert_returnable(run.out)
