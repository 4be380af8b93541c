"""bench/gpu_session.sh, the one command of a GPU session, without a GPU: it
parses, shellcheck (where installed) finds nothing, and its `selftest` modes
push deliberately failing and passing steps through the same step runner as the
session. A failing pytest run, a run in which every test skipped, a timeout,
a failing background lane and a compute-sanitizer error must each fail the
command (nonzero exit, FAIL in the summary) while the later steps still run; an
all-passing run must exit 0. The session itself is dry-run
(FP8COMM_GPU_SESSION_DRYRUN=1): its steps and their order, every CUDA test file
run once, the caps within the budget of one device call, and results that the
device tool can bring back (flat in $OUT, at most 8 files)."""
import os
import re
import shutil
import subprocess
import tarfile
import textwrap
import xml.etree.ElementTree as ET

import pytest
from tests.support import REPO_ROOT

ROOT = str(REPO_ROOT)
SCRIPT = os.path.join(ROOT, "bench", "gpu_session.sh")

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
          "========= ERROR SUMMARY: 1 error" >"$report"
        exit 86 ;;
      *)
        "$@"; rc=$?
        echo "========= ERROR SUMMARY: 0 errors" >"$report"
        exit $rc ;;
    esac
    """)


def run_script(tmp_path, stage, sanitizer=None, **env):
    out = tmp_path / "out"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FP8COMM_GPU_SESSION")}
    full_env.update(OUT=str(out), **env)
    if sanitizer is not None:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        fake = bin_dir / "compute-sanitizer"
        fake.write_text(FAKE_SANITIZER)
        fake.chmod(0o755)
        full_env["PATH"] = f"{bin_dir}{os.pathsep}{full_env['PATH']}"
        full_env["FAKE_SANITIZER"] = sanitizer
    p = subprocess.run(["bash", SCRIPT] + ([stage] if stage else []), capture_output=True, text=True, env=full_env,
                       timeout=600)
    return p, out


def summary_of(out):
    (txt,) = out.glob("*-gpu-session-*.txt")
    rows = {}
    for line in txt.read_text().splitlines():
        parts = line.split(None, 2)
        if len(parts) >= 2 and parts[0] in ("PASS", "FAIL", "SKIP", "NOT-RUN", "DRY"):
            rows[parts[1]] = (parts[0], line)
    return rows, txt.read_text()


def archived(out):
    """{name: bytes} of the files in the logs archive."""
    (archive,) = out.glob("*-gpu-session-*-logs.tar.gz")
    with tarfile.open(archive) as tar:
        return {os.path.basename(m.name): tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def junit_failures(data):
    root = ET.fromstring(data)
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    return sum(int(s.get("failures", 0)) for s in suites)


def test_script_parses():
    p = subprocess.run(["bash", "-n", SCRIPT], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_shellcheck_is_clean():
    p = subprocess.run(["shellcheck", SCRIPT], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_failures_propagate_and_later_steps_still_run(tmp_path):
    p, out = run_script(tmp_path, "selftest")
    assert p.returncode != 0, p.stdout + p.stderr
    rows, text = summary_of(out)
    expect = {
        "selftest-background": "FAIL",   # a failing pytest run in the background
        "selftest-pass": "PASS",
        "selftest-fail": "FAIL",          # a failing pytest run
        "selftest-all-skipped": "FAIL",   # every test skipped: nothing was checked
        "selftest-timeout": "FAIL",       # ran past its timeout
        "memcheck": "SKIP",               # no compute-sanitizer here
        "selftest-after": "PASS",         # still ran after the failures
    }
    assert {name: status for name, (status, _) in rows.items()} == expect, text
    assert "timed out" in rows["selftest-timeout"][1]
    assert "no test ran" in rows["selftest-all-skipped"][1]
    assert "compute-sanitizer not found" in rows["memcheck"][1]
    assert "FAILED: selftest-background selftest-fail selftest-all-skipped selftest-timeout" in text
    assert text.strip() in p.stdout  # the summary is printed last
    files = archived(out)
    assert junit_failures(files["selftest-fail.xml"]) == 1
    assert junit_failures(files["selftest-background.xml"]) == 1
    assert junit_failures(files["selftest-pass.xml"]) == 0
    assert "selftest-after.log" in files
    assert not (out / "logs").exists()  # archived, so that few files come back from the device


def test_an_all_passing_run_exits_zero(tmp_path):
    p, out = run_script(tmp_path, "selftest-pass")
    assert p.returncode == 0, p.stdout + p.stderr
    rows, text = summary_of(out)
    assert {name: status for name, (status, _) in rows.items()} == {
        "selftest-background": "PASS", "selftest-pass": "PASS", "memcheck": "SKIP", "selftest-after": "PASS"}, text


@pytest.mark.parametrize("mode,status,exit_zero", [("ok", "PASS", True), ("errors", "FAIL", False),
                                                    ("unsupported", "SKIP", True)])
def test_compute_sanitizer_outcomes(tmp_path, mode, status, exit_zero):
    p, out = run_script(tmp_path, "selftest-pass", sanitizer=mode)
    rows, text = summary_of(out)
    assert rows["memcheck"][0] == status, text
    assert (p.returncode == 0) == exit_zero, p.stdout + p.stderr
    files = archived(out)
    args = files["memcheck-report.log.args"].decode()
    assert "--tool memcheck" in args and "--error-exitcode 86" in args and "--kernel-name kns=fp8comm" in args
    if mode == "errors":
        assert "ERROR SUMMARY: 1 error" in rows["memcheck"][1]
        assert "Invalid __global__ write" in p.stdout
    if mode == "unsupported":
        assert "Device not supported" in rows["memcheck"][1]
    if mode == "ok":
        assert junit_failures(files["memcheck.xml"]) == 0


def test_unknown_mode_is_refused(tmp_path):
    p, _ = run_script(tmp_path, "no-such-mode")
    assert p.returncode == 2 and "usage" in p.stderr


def dry_session(tmp_path, **env):
    """The whole session, dry-run: each step's command is printed, nothing runs."""
    p, out = run_script(tmp_path, None, sanitizer="ok", FP8COMM_GPU_SESSION_DRYRUN="1", **env)
    commands = {line.split(" (limit")[0].split()[-1]: line for line in p.stdout.splitlines() if " (limit " in line}
    return p, out, commands


SERIAL = ["env", "build", "has-cuda", "codec-cast-tests", "codec-bench", "linear-bench", "comm-bench", "model"]
TESTS_LANE = ["cuda-streams", "cuda-backend", "cuda-eager-init", "cuda-multirank"]
SANITIZER_LANE = ["memcheck", "racecheck"]


def test_one_call_runs_every_step_in_order_of_evidence_per_second(tmp_path):
    p, out, commands = dry_session(tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    rows, text = summary_of(out)
    assert list(rows) == SERIAL + TESTS_LANE + SANITIZER_LANE, text
    assert all(status == "DRY" for status, _ in rows.values()), text
    build = commands["build"]
    assert "--no-build-isolation" in build and "TORCH_CUDA_ARCH_LIST=9.0 " in build and "MAX_JOBS=" in build
    assert "has_cuda.py" in commands["has-cuda"]
    with open(SCRIPT) as f:
        assert "assert fp8comm._C.has_cuda" in f.read()  # what has_cuda.py checks
    for name in SERIAL[3:] + TESTS_LANE + SANITIZER_LANE:
        assert " -m cuda " not in commands[name], name  # named files: one import error cannot hide the rest
    assert "comm.py" not in commands["comm-bench"] and "--max-bytes 256M" in commands["comm-bench"]
    assert "--codec-json" in commands["model"] and "codec.json" in commands["model"]


def test_every_cuda_test_file_is_run_by_exactly_one_test_step(tmp_path):
    _, _, commands = dry_session(tmp_path)
    # a module marked cuda, or a test in it: `-m cuda` would have found them, the named files must
    cuda_files = sorted(str(f.relative_to(REPO_ROOT)) for f in (REPO_ROOT / "tests").rglob("test_*.py")
                        if re.search(r"^(pytestmark = )?@?pytest\.mark\.cuda$", f.read_text(), re.M))
    assert "tests/codec/test_codec_cuda.py" in cuda_files  # the marker this test looks for is the one in use
    test_steps = ["codec-cast-tests"] + TESTS_LANE
    for f in cuda_files:
        runs = [name for name in test_steps if f" {f}" in commands[name]]
        assert len(runs) == 1, (f, runs)


def test_sanitizers_cover_the_codec_and_cast_kernels_and_racecheck_only_shared_memory(tmp_path):
    _, _, commands = dry_session(tmp_path)
    for tool in SANITIZER_LANE:
        assert f"--tool {tool}" in commands[tool] and "--junitxml=" in commands[tool]
        assert "--kernel-name kns=fp8comm" in commands[tool]
    assert "tests/codec/test_codec_cuda.py tests/nn/test_fused_cast_cuda.py" in commands["memcheck"]
    assert "tests/nn/test_fused_cast_cuda.py" in commands["racecheck"]
    assert "test_codec_cuda.py" not in commands["racecheck"]
    # racecheck checks shared memory only: the codec kernels must have none for that to cover them
    with_shared = sorted(str(f.relative_to(REPO_ROOT)) for f in (REPO_ROOT / "csrc").rglob("*.cu*")
                         if "__shared__" in f.read_text())
    assert with_shared == ["csrc/linear/cast_cuda.cu"], with_shared


def test_the_caps_fit_the_budget_and_one_call(tmp_path):
    p, _, _ = dry_session(tmp_path)
    (line,) = [ln for ln in p.stdout.splitlines() if " plan: " in ln]
    m = re.search(r"= (\d+) s of a (\d+) s budget", line)
    total, budget = int(m.group(1)), int(m.group(2))
    assert total <= budget == 560, line
    assert budget <= 600 - 30  # the device call's 600 s, less the start of the command and the transfers
    for name, cap in re.findall(r"== \S+ (\S+) \(limit (\d+) s\)", p.stdout):
        assert int(cap) > 0, name


def test_a_plan_longer_than_the_budget_is_refused_before_anything_runs(tmp_path):
    p, out, commands = dry_session(tmp_path, FP8COMM_GPU_SESSION_BUDGET_S="300")
    assert p.returncode == 2 and "more than the 300 s budget" in p.stderr
    assert commands == {}


def test_results_come_back_flat_and_within_the_return_limits(tmp_path):
    p, out, commands = dry_session(tmp_path)
    (line,) = [ln for ln in p.stdout.splitlines() if " results: " in ln]
    results = line.split(" results: ")[1].split(" (+")[0].split()
    assert len(results) + 2 <= 8  # + the summary and the logs tarball
    for name in results:
        assert re.fullmatch(r"[A-Za-z0-9._-]+", name), name
        assert any(f"--json {out}/{name}" in c for c in commands.values()), name
    assert sorted(f.name for f in out.iterdir()) == sorted(
        [f.name for f in out.glob("*-gpu-session-*.txt")] + [f.name for f in out.glob("*-gpu-session-*-logs.tar.gz")])
    names = {f.name for f in out.iterdir()}
    assert len(names) == 2 and all(re.fullmatch(r"[A-Za-z0-9._-]+", n) for n in names), names


def test_selftest_results_are_flat(tmp_path):
    _, out = run_script(tmp_path, "selftest")
    assert all(f.is_file() for f in out.iterdir()) and len(list(out.iterdir())) <= 8
