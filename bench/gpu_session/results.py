"""A pytest step's results: from its junit XML when the run finished (pytest
writes it at the end), else from the results log gpu_session_guard writes
test by test (a run cut at its cap, or killed, has only that). Pure reads
of files; tested on fixtures (tests/tools/test_gpu_session_plan.py)."""
from __future__ import annotations

import dataclasses
import os
import xml.etree.ElementTree as ET


@dataclasses.dataclass(frozen=True)
class Counts:
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    source: str = ""  # "junit" or "results log"

    @property
    def ran(self) -> int:
        return self.passed + self.failed + self.errors

    def __str__(self) -> str:
        return f"{self.passed} passed, {self.failed} failed, {self.errors} errors, {self.skipped} skipped"


def _suites(path: str):
    root = ET.parse(path).getroot()
    return [root] if root.tag == "testsuite" else root.findall("testsuite")


def junit_counts(path: str) -> Counts | None:
    """The counts of a junit XML file, or None if there is none or it does not parse."""
    if not os.path.exists(path):
        return None
    try:
        suites = _suites(path)
    except ET.ParseError:
        return None
    tests = failed = errors = skipped = 0
    for s in suites:
        tests += int(s.get("tests", 0))
        failed += int(s.get("failures", 0))
        errors += int(s.get("errors", 0))
        skipped += int(s.get("skipped", 0))
    return Counts(max(0, tests - failed - errors - skipped), failed, errors, skipped, "junit")


def junit_slowest(path: str) -> tuple[float, str] | None:
    """(seconds, classname::name) of the slowest test case in a junit XML file."""
    try:
        suites = _suites(path)
    except (OSError, ET.ParseError):
        return None
    best = None
    for s in suites:
        for case in s.iter("testcase"):
            t = float(case.get("time", 0) or 0)
            if best is None or t > best[0]:
                best = (t, f"{case.get('classname', '')}::{case.get('name', '')}")
    return best


def _log_lines(path: str) -> list[list[str]]:
    if not os.path.exists(path):
        return []
    with open(path, errors="replace") as f:
        return [line.rstrip("\n").split("\t") for line in f if "\t" in line]


def log_counts(path: str) -> Counts | None:
    """The counts of a gpu_session_guard results log, or None if there is none."""
    if not os.path.exists(path):
        return None
    n = {"PASSED": 0, "FAILED": 0, "ERROR": 0, "SKIPPED": 0, "XFAIL": 0}
    for fields in _log_lines(path):
        if fields[0] in n and len(fields) >= 3:
            n[fields[0]] += 1
    return Counts(n["PASSED"], n["FAILED"], n["ERROR"], n["SKIPPED"] + n["XFAIL"], "results log")


def log_running(path: str) -> str | None:
    """The test a results log says had started and not ended (a run cut short)."""
    open_tests: dict = {}
    last = None
    for i, fields in enumerate(_log_lines(path)):
        if fields[0] == "START":
            open_tests[fields[1]] = i
            last = fields[1]
        elif len(fields) >= 3:
            open_tests.pop(fields[2], None)
    return last if last in open_tests else None


def log_slowest(path: str) -> tuple[float, str] | None:
    best = None
    for fields in _log_lines(path):
        if fields[0] != "START" and len(fields) >= 3:
            try:
                t = float(fields[1])
            except ValueError:
                continue
            if best is None or t >= best[0]:
                best = (t, fields[2])
    return best


def log_failures(path: str, limit: int = 15) -> list[str]:
    """The FAILED and ERROR lines of a results log."""
    return ["\t".join(f) for f in _log_lines(path) if f[0] in ("FAILED", "ERROR")][:limit]


def outcome(xml: str, log: str, finished: bool) -> tuple[Counts | None, tuple[float, str] | None]:
    """(counts, slowest) of a pytest step: from the junit XML if the run
    finished and wrote one, else from the results log."""
    if finished:
        counts = junit_counts(xml)
        if counts is not None:
            return counts, junit_slowest(xml)
    return log_counts(log), log_slowest(log)
