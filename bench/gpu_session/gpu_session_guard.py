"""A pytest plugin for bench/gpu_session.sh (loaded with `-p gpu_session_guard`
from a folder on PYTHONPATH; no conftest, no pytest-timeout needed):

--results-log PATH   one line per test, written and flushed as each ends
                     (tab-separated: PASSED|FAILED|ERROR|SKIPPED|XFAIL, seconds,
                     node id, detail), after a "START<tab>NODEID" line as it
                     begins: a run killed at its step's cap still says what
                     passed, what failed and which test was running.
--test-timeout S     a test (setup, call and teardown together) that runs past
                     S seconds fails with a timeout and the run goes on; one
                     stuck in C code past S + --test-timeout-grace has every
                     thread's traceback written to the results log and ends
                     the run (faulthandler), so the step's other results stay.
A SIGTERM (the step's cap) writes every thread's traceback to the results log.
"""
import faulthandler
import signal
import time

import pytest

_OUTCOMES = {"passed": "PASSED", "failed": "FAILED", "skipped": "SKIPPED"}


def pytest_addoption(parser):
    group = parser.getgroup("gpu_session_guard")
    group.addoption("--results-log", default=None, help="per-test results, written as each test ends")
    group.addoption("--test-timeout", type=float, default=0.0, help="seconds a test may take (0: no limit)")
    group.addoption("--test-timeout-grace", type=float, default=10.0,
                    help="seconds past --test-timeout before a test stuck in C code ends the run")


class Guard:
    def __init__(self, log, timeout, grace):
        self.log = log
        self.timeout = timeout
        self.grace = grace
        self.deadline = None
        self.outcome = {}  # nodeid -> [OUTCOME, seconds, detail]

    def write(self, line):
        if self.log is not None:
            self.log.write(line + "\n")
            self.log.flush()

    # -- the per-test deadline: armed in each phase for the time the test has left
    def _expired(self, signum, frame):
        pytest.fail(f"timed out: the test ran past its {self.timeout:g} s (gpu_session_guard)", pytrace=True)

    def _arm(self, when):
        left = self.deadline - time.monotonic()
        if left <= 0:
            if when != "teardown":
                pytest.fail(f"timed out: the test ran past its {self.timeout:g} s (gpu_session_guard)", pytrace=False)
            left = self.grace  # a teardown always runs, or the next test's setup fails
        signal.signal(signal.SIGALRM, self._expired)
        signal.setitimer(signal.ITIMER_REAL, left)

    @staticmethod
    def _disarm():
        signal.setitimer(signal.ITIMER_REAL, 0)

    def _phase(self, when):
        if not self.timeout:
            yield
            return
        self._arm(when)
        try:
            yield
        finally:
            self._disarm()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item):
        yield from self._phase("setup")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        yield from self._phase("call")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item):
        yield from self._phase("teardown")

    # -- the results log
    def pytest_runtest_logstart(self, nodeid, location):
        self.write(f"START\t{nodeid}")
        self.outcome[nodeid] = ["PASSED", 0.0, ""]
        if self.timeout:
            self.deadline = time.monotonic() + self.timeout
            if self.log is not None:
                faulthandler.dump_traceback_later(self.timeout + self.grace, exit=True, file=self.log)

    def pytest_runtest_logreport(self, report):
        entry = self.outcome.setdefault(report.nodeid, ["PASSED", 0.0, ""])
        entry[1] += report.duration
        if report.failed:
            entry[0] = "FAILED" if report.when == "call" else "ERROR"
            entry[2] = entry[2] or f"({report.when}) {_first_line(report)}"
        elif report.skipped and entry[0] == "PASSED":
            entry[0] = "XFAIL" if hasattr(report, "wasxfail") else "SKIPPED"
            entry[2] = _first_line(report)

    def pytest_collectreport(self, report):
        # a module skipped or broken as a whole never reaches the tests' hooks
        if report.failed:
            self.write(f"ERROR\t0.00\t{report.nodeid}\t(collect) {_first_line(report)}")
        elif report.skipped:
            self.write(f"SKIPPED\t0.00\t{report.nodeid}\t{_first_line(report)}")

    def pytest_runtest_logfinish(self, nodeid, location):
        if self.timeout and self.log is not None:
            faulthandler.cancel_dump_traceback_later()
        outcome, seconds, detail = self.outcome.pop(nodeid, ["PASSED", 0.0, ""])
        self.write(f"{outcome}\t{seconds:.2f}\t{nodeid}\t{detail}")


def _first_line(report):
    if report.skipped and isinstance(report.longrepr, tuple):
        text = str(report.longrepr[2])
    else:
        text = getattr(report, "longreprtext", "") or ""
        # the exception's own line ("E   ...") says more than the traceback's first
        lines = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("E ")]
        text = lines[0] if lines else text
    return " ".join(text.split())[:200]  # one line, no tabs


def pytest_configure(config):
    path = config.getoption("results_log")
    log = open(path, "a", buffering=1) if path else None  # noqa: SIM115 (open for the whole run)
    if log is not None:
        faulthandler.register(signal.SIGTERM, file=log, all_threads=True, chain=True)
    config.pluginmanager.register(
        Guard(log, config.getoption("test_timeout"), config.getoption("test_timeout_grace")), "gpu_session_guard_impl")
