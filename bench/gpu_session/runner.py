"""Runs a step table under its plan: each step a process under its cap (and
what the budget has left), its output in its log; lanes in threads side by
side. After every step (and as one starts: RUNNING) the summary and the logs
tarball in $OUT are replaced whole (written aside, then renamed), so a call
killed at any moment leaves a readable summary and never more than the
summary, the tarball and the result files in $OUT.

A step's status: PASS; FAIL (fails the command); SKIP (a tool or file this
machine or tree lacks); NOT-RUN (a step it needs failed, which already fails
the command); DROPPED (left out to fit the budget); DRY (a dry run); RUNNING
(started, no result yet); PENDING (not started).
"""
from __future__ import annotations

import dataclasses
import glob
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time

from . import results
from .plan import Plan, Step

SANITIZER_ERROR_RC = 86
KILL_GRACE_S = 5


@dataclasses.dataclass
class Config:
    mode: str            # session, selftest or selftest-pass
    root: str            # the repository
    out: str             # $OUT
    work: str            # outside $OUT: logs, helpers
    prefix: str          # the summary's and the tarball's file name, less the suffix
    title: str           # "MODE on GPU (MACHINE), DAY"
    budget: int
    dryrun: bool = False
    snapshots: str = ""  # self-tests: a copy of $OUT after each step
    kill_after: str = ""  # self-tests: SIGKILL the runner's process group after this step
    test_timeout_grace: int = 10
    pytest_extra: tuple = ()  # every pytest step's own options (the session's --tier all -n 0)
    python: str = "python3"


_PRINT = threading.Lock()


def say(lines) -> None:
    """Whole lines, one writer at a time: lanes print from threads, and print() writes a line and its
    newline separately, so two lanes' lines could run together."""
    with _PRINT:
        sys.stdout.write("".join(f"{line}\n" for line in lines))
        sys.stdout.flush()


def log(text: str) -> None:
    say([f"== {time.strftime('%H:%M:%S')} {text}"])


def indented(lines) -> None:
    say([f"   | {line}" for line in lines])


def tail(path: str, n: int) -> list[str]:
    if n <= 0 or not os.path.exists(path):
        return []
    with open(path, errors="replace") as f:
        return f.read().splitlines()[-n:]


def find_sanitizer() -> str | None:
    for c in (shutil.which("compute-sanitizer"),
              os.path.join(os.environ["CUDA_HOME"], "bin", "compute-sanitizer") if os.environ.get("CUDA_HOME") else None,
              os.path.join(os.environ["CUDA_PATH"], "bin", "compute-sanitizer") if os.environ.get("CUDA_PATH") else None,
              "/usr/local/cuda/bin/compute-sanitizer"):
        if c and os.access(c, os.X_OK):
            return c
    return None


def sanitizer_errors(report: str) -> list[str]:
    """The errors in a compute-sanitizer report: its headline lines, not their
    stack frames (indented) nor its banner and summaries."""
    skip = re.compile(r"COMPUTE-SANITIZER|ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY|Target application returned|"
                      r"[Nn]ot supported")
    return [ln for ln in tail(report, 1 << 30) if re.match(r"^=+ [^ ]", ln) and not skip.search(ln)]


class Runner:
    def __init__(self, steps: tuple[Step, ...], plan: Plan, config: Config):
        self.steps = steps
        self.by_name = {s.name: s for s in steps}
        self.plan = plan
        self.c = config
        self.logs = os.path.join(config.work, "logs")
        os.makedirs(self.logs, exist_ok=True)
        os.makedirs(config.out, exist_ok=True)
        self.start = time.time()
        self.deadline = self.start + config.budget
        self.status: dict = {}   # name -> (STATUS, seconds, detail)
        self.shown: set = set()  # steps the summary lists
        self.lock = threading.RLock()
        self.procs: set = set()
        self.stopped_by: str | None = None  # the step whose failure stops the rest
        self.signaled = ""
        self.closed = False
        self.final_rc = 0
        self.env = dict(os.environ)
        self.pythonpath: list[str] = []
        self.plan_line = ""             # the summary's "== plan:" line
        self.result_files: tuple = ()   # the files in $OUT the summary lists

    # ------------------------------------------------------------ status
    def record(self, name: str, status: str, secs: float, detail: str = "") -> None:
        with self.lock:
            if self.closed:  # a lane still winding down after a signal: the final summary is written
                return
            self.shown.add(name)
            self.status[name] = (status, int(secs), detail)
        if status in ("PASS", "DRY"):
            log(f"{status} {name} ({int(secs)} s) {detail}".rstrip())
        elif status != "RUNNING":
            log(f"{status} {name} ({int(secs)} s): {detail}")
        self.write_outputs(final=False, tag=f"{name}-{status}")
        if status != "RUNNING" and name == self.c.kill_after:
            log(f"FP8COMM_GPU_SESSION_KILL_AFTER={name}: killing the runner's process group")
            for p in list(self.procs):
                _kill_group(p, signal.SIGKILL)
            os.killpg(os.getpgid(0), signal.SIGKILL)

    def status_of(self, name: str) -> str:
        return self.status.get(name, ("PENDING",))[0]

    def passed(self, name: str) -> bool:
        return self.status_of(name) in ("PASS", "DRY")

    def left(self) -> float:
        return self.deadline - time.time() - self.plan.reserve

    def limit_of(self, name: str) -> int:
        left = int(self.left())
        return 0 if left < 5 else min(self.plan.caps[name], left)

    # ------------------------------------------------------------ outputs
    def summary_text(self, final: bool) -> str:
        now = int(time.time() - self.start)
        lines = [f"== summary: {self.c.title}, {now} s of a {self.c.budget} s budget"]
        if not final:
            lines.append("== not final: rewritten after each step; if nothing follows, the command was stopped in the "
                         "step marked RUNNING, and the PENDING steps never started")
        failed, skipped, dropped = [], [], []
        with self.lock:
            status = dict(self.status)
            shown = set(self.shown)
        for s in self.steps:
            if s.name not in shown:
                continue
            st, secs, detail = status.get(s.name, ("PENDING", 0, ""))
            if final and st in ("PENDING", "RUNNING"):
                st, secs, detail = "FAIL", 0, "no result recorded (the runner stopped before it finished)"
            lines.append(f"{st:<8s} {s.name:<20s} {secs:5d} s  {detail}".rstrip())
            {"FAIL": failed, "SKIP": skipped, "DROPPED": dropped}.get(st, []).append(s.name)
        lines.append(f"== plan: {self.plan_line}")
        if final and self.final_rc:
            lines.append(f"== the runner itself stopped with exit {self.final_rc}"
                         f"{f' ({self.signaled})' if self.signaled else ''} (see the line reported above)")
        if failed:
            lines.append(f"== FAILED: {' '.join(failed)}")
        elif final and not self.final_rc:
            lines.append("== no step failed")
        if skipped:
            lines.append(f"== SKIPPED, for a tool or file this machine or tree lacks: {' '.join(skipped)}")
        if dropped:
            lines.append(f"== DROPPED to fit the {self.c.budget} s budget: {' '.join(dropped)}")
        for name in self.result_files:
            if os.path.exists(os.path.join(self.c.out, name)):
                lines.append(f"== result: {os.path.join(self.c.out, name)}")
        lines.append(f"== logs, junit XML, per-test results, sanitizer reports: "
                     f"{os.path.join(self.c.out, self.c.prefix + '-logs.tar.gz')}")
        return "\n".join(lines) + "\n"

    def write_outputs(self, final: bool, tag: str = "") -> None:
        """The summary and the logs tarball, each replaced whole, one writer at a time."""
        with self.lock:
            try:
                summary = os.path.join(self.c.out, self.c.prefix + ".txt")
                aside = os.path.join(self.c.work, "summary.txt.aside")
                with open(aside, "w") as f:
                    f.write(self.summary_text(final))
                os.replace(aside, summary)
                aside = os.path.join(self.c.work, "logs.tar.gz.aside")
                with tarfile.open(aside, "w:gz") as tar:
                    tar.add(self.logs, arcname="logs")
                os.replace(aside, os.path.join(self.c.out, self.c.prefix + "-logs.tar.gz"))
                if self.c.snapshots and tag:
                    os.makedirs(self.c.snapshots, exist_ok=True)
                    snap = os.path.join(self.c.snapshots, f"{len(os.listdir(self.c.snapshots)):03d}-{tag}")
                    os.makedirs(snap)
                    for f in os.listdir(self.c.out):
                        shutil.copy2(os.path.join(self.c.out, f), snap)
            except OSError as e:
                log(f"could not write the summary or the logs tarball: {e}")

    # ------------------------------------------------------------ processes
    def fill(self, text: str) -> str:
        return (text.replace("{out}", self.c.out).replace("{work}", self.c.work).replace("{logs}", self.logs)
                .replace("{cores}", str(os.cpu_count() or 1)))

    def step_env(self, step: Step) -> dict:
        env = dict(self.env)
        if self.pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(self.pythonpath + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        for k, v in step.env:
            env[k] = self.fill(v)
        return env

    def execute(self, step: Step, argv: list[str]) -> tuple[object, int, int]:
        """(rc, limit, seconds): rc the command's status, 124 / 137 past its
        limit (TERM, then KILL), "no-time" if the budget is spent, "dry"."""
        limit = self.limit_of(step.name)
        if limit == 0:
            return "no-time", 0, 0
        env_text = " ".join(f"{k}={self.fill(v)}" for k, v in step.env)
        log(f"{step.name} (limit {limit} s): {env_text + ' ' if env_text else ''}{shlex.join(argv)}")
        if self.c.dryrun:
            return "dry", limit, 0
        self.record(step.name, "RUNNING", 0,
                    f"started at {int(time.time() - self.start)} s, limit {limit} s: no result yet")
        t0 = time.time()
        with open(os.path.join(self.logs, f"{step.name}.log"), "w") as out:
            # its own process group: a timeout signals pytest's spawned ranks and torchrun's workers too
            p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 cwd=self.c.root, env=self.step_env(step), start_new_session=True)
            self.procs.add(p)
            try:
                rc = p.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                _kill_group(p, signal.SIGTERM)
                try:
                    p.wait(timeout=KILL_GRACE_S)
                    rc = 124
                except subprocess.TimeoutExpired:
                    _kill_group(p, signal.SIGKILL)
                    p.wait()
                    rc = 137
            finally:
                self.procs.discard(p)
        return rc, limit, int(time.time() - t0)

    def unfinished(self, step: Step, rc, limit: int, secs: int) -> bool:
        """Records a step that was not run to its end; True if it was one."""
        if rc == "no-time":
            self.record(step.name, "FAIL", 0, f"not run: the session's {self.c.budget} s budget is spent")
        elif rc == "dry":
            self.record(step.name, "DRY", 0)
        elif rc in (124, 137):
            self.record(step.name, "FAIL", secs, f"timed out after {limit} s")
        else:
            return False
        return True

    def log_path(self, step: Step, suffix: str = ".log") -> str:
        return os.path.join(self.logs, step.name + suffix)

    # ------------------------------------------------------------ kinds of step
    def run_cmd(self, step: Step, argv: list[str]) -> None:
        rc, limit, secs = self.execute(step, argv)
        if self.unfinished(step, rc, limit, secs):
            if rc != "dry":
                indented(tail(self.log_path(step), 30))
        elif rc == 0:
            self.record(step.name, "PASS", secs)
        else:
            indented(tail(self.log_path(step), 30))
            self.record(step.name, "FAIL", secs, f"exit {rc}")

    def run_env(self, step: Step, argv: list[str]) -> None:
        rc, limit, secs = self.execute(step, argv)
        if self.unfinished(step, rc, limit, secs):
            if rc != "dry":
                indented(tail(self.log_path(step), 40))
            return
        lines = tail(self.log_path(step), 40)
        indented(lines)
        if rc == 0:
            self.record(step.name, "PASS", secs)
        else:
            missing = [ln[len("env: "):] for ln in lines if ln.startswith("env: missing:")]
            self.record(step.name, "FAIL", secs, missing[0] if missing else f"exit {rc}")
        extra = os.path.join(self.c.work, "path_extra")
        if os.path.exists(extra) and os.path.getsize(extra):
            with open(extra) as f:
                self.env["PATH"] = f.readline().strip() + os.pathsep + self.env.get("PATH", "")

    def run_build(self, step: Step, argv: list[str]) -> None:
        full = [self.c.python, os.path.join(self.c.root, "bench", "gpu_session", "build_check.py"), *argv]
        rc, limit, secs = self.execute(step, full)
        errors = re.compile(r"error:|error [A-Z]+[0-9]+|FAILED:")
        log_lines = tail(self.log_path(step), 1 << 30)
        first_errors = [ln for ln in log_lines if errors.search(ln)][:20]
        if self.unfinished(step, rc, limit, secs):
            if rc != "dry":
                indented(first_errors)
            return
        indented(ln for ln in log_lines if "fp8comm setup:" in ln)  # setup.py's plan, and its warning without CUDA
        verdicts = [ln[len("== build: "):] for ln in log_lines if ln.startswith("== build: ")]
        verdict = verdicts[-1] if verdicts else ""
        if rc == 0:
            indented(log_lines[-1:])
            self.record(step.name, "PASS", secs, verdict if verdict.startswith("counted as built") else "")
        else:
            indented(first_errors or log_lines[-30:])  # the first compiler errors, not the build's tail
            self.record(step.name, "FAIL", secs, f"exit {rc}: {verdict}")

    def pytest_argv(self, step: Step, sanitizer: str | None = None) -> list[str]:
        limit = self.limit_of(step.name)
        per_test = step.test_timeout or max(10, limit // 2)
        argv = [self.c.python, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "gpu_session_guard",
                f"--results-log={self.log_path(step, '.results')}", f"--test-timeout={per_test}",
                f"--test-timeout-grace={self.c.test_timeout_grace}", "--durations=10", "-rfEs",
                f"--junitxml={self.log_path(step, '.xml')}", *self.c.pytest_extra,
                *(self.fill(a) for a in step.command)]
        if sanitizer:
            # No caching allocator under memcheck, so an access past a tensor's end is
            # outside any allocation rather than inside a cached block.
            argv = ["env", "PYTORCH_NO_CUDA_MEMORY_CACHING=1", sanitizer, "--tool", step.name, "--error-exitcode",
                    str(SANITIZER_ERROR_RC), "--kernel-name", "kns=fp8comm", "--log-file",
                    self.log_path(step, "-report.log"), *argv]
        return argv

    def record_pytest(self, step: Step, rc, limit: int, secs: int) -> None:
        """A run in which no test ran (all skipped, none collected) fails: on a
        GPU machine that means the CUDA tests did not run at all."""
        xml, res = self.log_path(step, ".xml"), self.log_path(step, ".results")
        counts, slowest = results.outcome(xml, res, finished=rc not in (124, 137))
        summary = str(counts or results.Counts())
        slow = f"; slowest {slowest[0]:.1f} s" if slowest and slowest[0] >= 1 else ""
        running = results.log_running(res)
        if rc in (124, 137):
            indented(results.log_failures(res))
            indented(tail(self.log_path(step), 15))
            self.record(step.name, "FAIL", secs, f"timed out after {limit} s: {summary}"
                        f"{f'; running: {running}' if running else ''}{slow}")
        elif rc == 0:
            if counts is None:
                indented(tail(self.log_path(step), 20))
                self.record(step.name, "FAIL", secs, "no junit XML or results log written")
            elif counts.ran <= 0:
                indented(tail(self.log_path(step), 20))
                self.record(step.name, "FAIL", secs, f"no test ran ({summary})")
            else:
                self.record(step.name, "PASS", secs, summary + slow)
        else:
            indented(results.log_failures(res))
            indented(tail(self.log_path(step), 15))
            self.record(step.name, "FAIL", secs, f"exit {rc}: {summary}"
                        f"{f'; ended during: {running}' if running else ''}{slow}")

    def run_pytest(self, step: Step) -> None:
        rc, limit, secs = self.execute(step, self.pytest_argv(step))
        if rc in ("dry", "no-time"):
            self.unfinished(step, rc, limit, secs)
        else:
            self.record_pytest(step, rc, limit, secs)

    def run_sanitizer(self, step: Step) -> None:
        san = find_sanitizer()
        if not san:
            self.record(step.name, "SKIP", 0, "compute-sanitizer not found (PATH, $CUDA_HOME/bin, $CUDA_PATH/bin, "
                        f"/usr/local/cuda/bin): {step.name} not run")
            return
        rc, limit, secs = self.execute(step, self.pytest_argv(step, san))
        if rc in ("dry", "no-time"):
            self.unfinished(step, rc, limit, secs)
            return
        report = self.log_path(step, "-report.log")
        errors = sanitizer_errors(report)
        unsupported = [ln for ln in tail(report, 1 << 30) + tail(self.log_path(step), 1 << 30)
                       if re.match(r"^=+ .*[Nn]ot supported", ln)]
        summary_line = [ln for ln in tail(report, 1 << 30) if "ERROR SUMMARY" in ln]
        if rc != 0 and unsupported:
            self.record(step.name, "SKIP", secs, f"compute-sanitizer cannot run on this machine: {unsupported[0]}")
        elif rc == SANITIZER_ERROR_RC or (errors and rc in (124, 137)):
            # also after a timeout: the errors found before it are kept
            indented(errors[:40])
            found = summary_line[0] if summary_line else errors[0]
            if rc != SANITIZER_ERROR_RC:
                self.record(step.name, "FAIL", secs, f"timed out after {limit} s; compute-sanitizer had found "
                            f"{len(errors)} errors: {found}")
            else:
                self.record(step.name, "FAIL", secs, f"compute-sanitizer found errors: {found}")
        else:
            self.record_pytest(step, rc, limit, secs)
            if self.status_of(step.name) == "PASS":
                log(f"   {step.name}: {summary_line[0] if summary_line else 'no ERROR SUMMARY line'}")

    # ------------------------------------------------------------ the table
    def run_step(self, step: Step) -> None:
        if self.signaled:
            return
        if step.on_failure_of:
            if self.status_of(step.on_failure_of) != "FAIL":
                return
        elif not self.plan.kept(step.name):
            return
        elif self.stopped_by:
            self.record(step.name, "NOT-RUN", 0, f"needs {self.stopped_by}, which failed")
            return
        with self.lock:
            self.shown.add(step.name)
        unmet = [n for n in step.needs if not self.passed(n)]
        if unmet:
            self.record(step.name, "NOT-RUN", 0, f"needs {', '.join(unmet)}, which did not pass")
            return
        if step.requires and not os.path.exists(os.path.join(self.c.root, step.requires)):
            self.record(step.name, "SKIP", 0, f"{step.requires} is not in this tree")
            return
        if step.tool and not shutil.which(step.tool, path=self.env.get("PATH")):
            self.record(step.name, "SKIP", 0, f"{step.tool} not found: {step.what or step.name} not run")
            return
        argv = [self.fill(a) for a in step.command]
        if step.kind == "env":
            self.run_env(step, argv)
        elif step.kind == "build":
            self.run_build(step, argv)
        elif step.kind == "pytest":
            self.run_pytest(step)
        elif step.kind == "sanitizer":
            self.run_sanitizer(step)
        else:
            self.run_cmd(step, argv)
        if step.pythonpath and self.passed(step.name):
            self.pythonpath.insert(0, self.fill(step.pythonpath))
        if step.stops_on_failure and not self.passed(step.name):
            self.stopped_by = step.name

    def run_lane(self, names: list[str]) -> None:
        for name in names:
            self.run_step(self.by_name[name])

    def run(self) -> None:
        """Every stage in order; a stage's lanes side by side, each in a thread."""
        for name in self.plan.dropped:
            self.record(name, "DROPPED", 0, f"left out to fit the {self.c.budget} s budget (drop rank)")
        order = [s.name for s in self.steps]
        for stage in self.plan.stages:
            lanes = [[n for n in order if n in names or self.by_name[n].on_failure_of in names]
                     for _, names in stage.lanes]
            if len(lanes) == 1 and stage.lanes[0][0] is None:
                self.run_lane(lanes[0])  # a step run only after this one's failure comes right after it
                continue
            threads = [threading.Thread(target=self._lane_thread, args=(names,), daemon=True) for names in lanes]
            log(f"lanes side by side: {', '.join(f'{lane} ({chr(32).join(n)})' for (lane, n) in stage.lanes)}")
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(0.2)

    def _lane_thread(self, names: list[str]) -> None:
        try:
            self.run_lane(names)
        except Exception as e:  # noqa: BLE001 (a lane's crash fails the command, never hangs it)
            log(f"a lane stopped: {type(e).__name__}: {e}")
            self.final_rc = self.final_rc or 1

    def stop(self, why: str) -> None:
        """A signal: the running steps' process groups are ended."""
        self.signaled = why
        for p in list(self.procs):
            _kill_group(p, signal.SIGTERM)

    def print_tables(self) -> None:
        for s in self.steps:
            if s.table and self.status_of(s.name) == "PASS" and os.path.exists(self.log_path(s)):
                lines, regex = s.table
                say([f"== table: {s.name}"] + [ln for ln in tail(self.log_path(s), lines) if re.search(regex, ln)])

    def finish(self) -> int:
        self.print_tables()
        with self.lock:
            self.write_outputs(final=True)
            self.closed = True
        with open(os.path.join(self.c.out, self.c.prefix + ".txt")) as f:
            text = f.read()
        say(text.splitlines())
        if self.final_rc:
            return self.final_rc
        return 1 if any(ln.startswith("FAIL ") for ln in text.splitlines()) else 0


def _kill_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def copy_selftest_fixtures(root: str, work: str) -> None:
    """The self-tests' pytest files, into {work}/selftest; and an empty PATH folder."""
    src = os.path.join(root, "tests", "tools", "gpu_session_selftest")
    dst = os.path.join(work, "selftest")
    os.makedirs(dst, exist_ok=True)
    for f in glob.glob(os.path.join(src, "*")):
        if os.path.isfile(f):
            shutil.copy(f, dst)
    os.makedirs(os.path.join(work, "empty-path"), exist_ok=True)
