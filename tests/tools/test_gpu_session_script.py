"""bench/gpu_session.sh, the one command of a GPU session, without a GPU: it
parses, shellcheck (where installed) finds nothing, and its `selftest` stages
push deliberately failing and passing steps through the same step runner as the
GPU stages. A failing pytest run, a run in which every test skipped, a timeout,
a failing background step and a compute-sanitizer error must each fail the
command (nonzero exit, FAIL in the summary) while the later steps still run; an
all-passing run must exit 0. The `tests` and `bench` stages are dry-run
(FP8COMM_GPU_SESSION_DRYRUN=1) to check the steps they would run."""
import os
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
    full_env.update(OUT=str(out), FP8COMM_GPU_SESSION_BUDGET_S="300", **env)
    if sanitizer is not None:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        fake = bin_dir / "compute-sanitizer"
        fake.write_text(FAKE_SANITIZER)
        fake.chmod(0o755)
        full_env["PATH"] = f"{bin_dir}{os.pathsep}{full_env['PATH']}"
        full_env["FAKE_SANITIZER"] = sanitizer
    p = subprocess.run(["bash", SCRIPT, stage], capture_output=True, text=True, env=full_env, timeout=600)
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


def test_unknown_stage_is_refused(tmp_path):
    p, _ = run_script(tmp_path, "no-such-stage")
    assert p.returncode == 2 and "usage" in p.stderr


def test_tests_stage_runs_every_gpu_check(tmp_path):
    p, out = run_script(tmp_path, "tests", sanitizer="ok", FP8COMM_GPU_SESSION_DRYRUN="1")
    assert p.returncode == 0, p.stdout + p.stderr
    rows, text = summary_of(out)
    assert list(rows) == ["env", "build", "has-cuda", "memcheck", "racecheck", "cuda-tests", "cuda-streams",
                          "cuda-multirank", "cuda-eager-init"], text
    commands = {line.split(" (limit")[0].split()[-1]: line for line in p.stdout.splitlines() if " (limit " in line}
    assert "--no-build-isolation" in commands["build"]
    assert "has_cuda.py" in commands["has-cuda"]
    with open(SCRIPT) as f:
        assert "assert fp8comm._C.has_cuda" in f.read()  # what has_cuda.py checks
    assert "-m cuda tests " in commands["cuda-tests"] and "--junitxml=" in commands["cuda-tests"]
    assert "tests/backend/test_cuda_streams.py" in commands["cuda-streams"]
    assert "tests/backend/test_cuda_multirank.py" in commands["cuda-multirank"]
    eager = "tests/backend/test_eager_init_cuda.py"
    assert eager in commands["cuda-eager-init"] and "-m cuda" in commands["cuda-eager-init"]
    assert f"--ignore={eager}" in commands["cuda-tests"]  # run once, in its own process
    for tool in ("memcheck", "racecheck"):
        assert f"--tool {tool}" in commands[tool] and "--junitxml=" in commands[tool]
        assert "tests/codec/test_codec_cuda.py tests/nn/test_fused_cast_cuda.py" in commands[tool]


def test_bench_stage_writes_device_named_results(tmp_path):
    p, out = run_script(tmp_path, "bench", FP8COMM_GPU_SESSION_DRYRUN="1")
    assert p.returncode == 0, p.stdout + p.stderr
    rows, text = summary_of(out)
    assert list(rows) == ["env", "build", "has-cuda", "codec-bench", "comm-bench-ws1", "linear-bench",
                          "linear-fused-cast-bench", "model"], text
    # bench/results/<machine>/<bench>.json; no nvidia-smi here: the machine is named gpu-unknown
    for name in ("codec", "comm-1rank", "linear", "linear-fused-cast"):
        assert f"--json bench/results/gpu-unknown/{name}.json" in p.stdout, name
    assert "--json bench/results/modeled/model-gpu-unknown.json" in p.stdout
