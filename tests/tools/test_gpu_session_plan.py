"""The GPU session's step table and plan (bench/gpu_session/plan.py, steps.py)
and its reading of pytest's results (results.py), without starting a process:
the default plan fits one device call; a short budget drops steps by drop
rank, lowest value first, never the env check, the build or the codec tests,
then scales the other caps, never the fixed ones; lanes count by their
longest; every CUDA test file runs in exactly one test step; the results fit
what the device tool brings back; junit XML is read when the run finished,
the guard's results log when it was cut."""
import re

import pytest
from tests.support import REPO_ROOT
from tests.tools.gpu_session_table import SESSION, load

plan_mod = load("plan")
results = load("results")
steps_mod = load("steps")
Step, plan = plan_mod.Step, plan_mod.plan

NEVER_DROPPED = {"env", "build", "codec-cast-tests"}


def test_the_default_plan_fits_one_call_with_nothing_dropped():
    p = plan(560, SESSION)
    assert p.total <= 560 and not p.dropped and p.scale == 100, p.describe()
    assert 560 <= 600 - 30  # the device call's 600 s, less the machine's start of the command and the transfers
    assert p.describe().endswith("of a 560 s budget")


def test_the_table_names_each_step_once_with_a_reason_to_be_there():
    names = [s.name for s in SESSION]
    assert len(names) == len(set(names))
    for s in SESSION:
        assert s.what or s.kind in ("pytest", "sanitizer"), s.name
        if s.name in NEVER_DROPPED:
            assert s.drop is None, s.name
    ranks = [s.drop for s in SESSION if s.drop is not None]
    assert len(ranks) == len(set(ranks))  # one order, no ties


@pytest.mark.parametrize("budget", [560, 500, 450, 400, 350, 300, 280])
def test_a_short_budget_drops_by_rank_then_scales_the_rest(budget):
    p = plan(budget, SESSION)
    assert p.total <= budget, p.describe()
    order = [s.name for s in sorted((s for s in SESSION if s.drop), key=lambda s: s.drop)]
    assert list(p.dropped) == order[:len(p.dropped)]  # lowest value first, in the table's order
    assert not NEVER_DROPPED & set(p.dropped)
    fixed = [s for s in SESSION if s.fixed]
    assert fixed and all(p.caps[s.name] == s.cap for s in fixed)  # a compile takes what it takes
    if p.scale < 100:
        assert p.scale >= plan_mod.SCALE_MIN or len(p.dropped) == len(order)
        assert all(p.caps[s.name] < s.cap or s.fixed or p.caps[s.name] == plan_mod.MIN_CAP
                   for s in SESSION if s.on_failure_of is None and not s.fixed and s.cap > plan_mod.MIN_CAP)


def test_dropping_stops_as_soon_as_scaling_is_enough():
    # each drop is needed: without the last one, the caps would need scaling below SCALE_MIN
    for budget in (400, 350, 300):
        p = plan(budget, SESSION)
        if p.dropped:
            fewer = plan(10**6, SESSION)
            kept_one_more = plan_mod.Plan(budget, fewer.caps, p.dropped[:-1], 100, p.stages)
            fixed = sum(s.cap for s in SESSION if s.fixed)
            scale = (budget - p.reserve - fixed) * 100 // (kept_one_more.total - p.reserve - fixed)
            assert scale < plan_mod.SCALE_MIN, (budget, p.dropped)


def toy():
    return (Step("a", 10, fixed=True), Step("b", 20), Step("x1", 30, lane="x", drop=2), Step("x2", 40, lane="x"),
            Step("y", 50, lane="y", drop=1), Step("c", 5, drop=3), Step("after-b", 7, on_failure_of="b"))


def test_lanes_side_by_side_count_by_their_longest_and_a_lane_less_step_ends_a_stage():
    p = plan(1000, toy())
    assert [tuple(lane for lane, _ in s.lanes) for s in p.stages] == [(None,), (None,), ("x", "y"), (None,)]
    assert p.total == 10 + 20 + max(30 + 40, 50) + 5 + plan_mod.RESERVE_S  # after-b: not in the plan
    assert "lanes max(x 70 s, y 50 s)" in p.describe()


def test_the_toy_plan_scales_when_a_little_short_and_drops_when_far_short():
    p = plan(10 + 20 + 70 + 5 + 10 - 1, toy())  # one second short: scaled, nothing dropped
    assert not p.dropped and 75 <= p.scale < 100 and p.total <= p.budget
    # far short: y goes first (which frees nothing, x is the longer lane), then x1; then 65 s of the
    # 95 s after the fixed step and the reserve need scaling to 76 %, enough
    p = plan(70, toy())
    assert p.dropped == ("y", "x1") and p.scale == 76 and p.total <= 70, p.describe()
    assert p.caps["a"] == 10 and p.caps["b"] == 15 and p.caps["c"] == plan_mod.MIN_CAP


def test_cap_overrides_and_bad_tables_are_refused():
    assert plan(1000, toy(), {"b": 3}).caps["b"] == 3
    with pytest.raises(ValueError, match="name no step"):
        plan(1000, toy(), {"nope": 3})
    with pytest.raises(ValueError, match="appears twice"):
        plan(1000, (Step("a", 1), Step("a", 2)))
    with pytest.raises(ValueError, match="not an earlier step"):
        plan(1000, (Step("a", 1, needs=("b",)), Step("b", 2)))
    with pytest.raises(ValueError, match="runs alone"):
        Step("a", 1, fixed=True, lane="x")
    with pytest.raises(ValueError, match="kind"):
        Step("a", 1, kind="shell")
    with pytest.raises(ValueError, match="positive"):
        Step("a", 0)


def test_every_cuda_test_file_is_run_by_exactly_one_test_step():
    # a module marked cuda, or a test in it: `-m cuda` would have found them, the named files must
    cuda_files = sorted(str(f.relative_to(REPO_ROOT)) for f in (REPO_ROOT / "tests").rglob("test_*.py")
                        if re.search(r"^(pytestmark = )?@?pytest\.mark\.cuda$", f.read_text(), re.M))
    assert "tests/codec/test_codec_cuda.py" in cuda_files  # the marker this test looks for is the one in use
    # the legacy kernels' rerun of the codec tests aside
    test_steps = [s for s in SESSION if s.kind == "pytest" and dict(s.env).get(steps_mod.CODEC_ENV) != "legacy"]
    for f in cuda_files:
        running = [s.name for s in test_steps if f in s.command]
        assert len(running) == 1, (f, running)


def test_results_fit_the_device_tools_return_limits():
    names = steps_mod.results(SESSION)
    assert len(names) + 2 <= 8  # + the summary and the logs tarball
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", n) for n in names)


def test_hooks_for_other_changes_are_skipped_not_failed_when_their_script_is_absent():
    hooks = [s for s in SESSION if s.requires]
    assert "wheels" in {s.name for s in hooks}
    for s in hooks:
        assert s.drop is not None or s.name == "wheels", s.name  # a hook never costs a step that is there


# ---------------------------------------------------------------- results
JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1" failures="2"
skipped="3" tests="10" time="4.0"><testcase classname="m" name="slow" time="3.5"/><testcase classname="m"
name="quick" time="0.1"/></testsuite></testsuites>"""
LOG = ("START\tm.py::a\nPASSED\t0.50\tm.py::a\t\nSTART\tm.py::b\nFAILED\t2.00\tm.py::b\tassert 1 == 2\n"
       "START\tm.py::c\nSKIPPED\t0.00\tm.py::c\tneeds a GPU\nSTART\tm.py::d\n")


def test_junit_xml_gives_the_counts_of_a_finished_run(tmp_path):
    xml, log = tmp_path / "s.xml", tmp_path / "s.results"
    xml.write_text(JUNIT)
    log.write_text(LOG)
    counts, slowest = results.outcome(str(xml), str(log), finished=True)
    assert (counts.passed, counts.failed, counts.errors, counts.skipped) == (4, 2, 1, 3)
    assert counts.source == "junit" and str(counts) == "4 passed, 2 failed, 1 errors, 3 skipped"
    assert slowest == (3.5, "m::slow")


def test_the_results_log_gives_the_counts_and_the_running_test_of_a_cut_run(tmp_path):
    xml, log = tmp_path / "s.xml", tmp_path / "s.results"
    log.write_text(LOG)
    for finished in (True, False):  # no XML, or a cut run's (ignored)
        counts, slowest = results.outcome(str(xml), str(log), finished=finished)
        assert (counts.passed, counts.failed, counts.errors, counts.skipped) == (1, 1, 0, 1)
        assert counts.source == "results log" and slowest == (2.0, "m.py::b")
    assert results.log_running(str(log)) == "m.py::d"
    assert results.log_failures(str(log)) == ["FAILED\t2.00\tm.py::b\tassert 1 == 2"]
    xml.write_text("<testsuites><testsuite")  # half-written
    assert results.junit_counts(str(xml)) is None
    assert results.outcome(str(xml), str(log), finished=True)[0].source == "results log"
    assert results.outcome(str(tmp_path / "none.xml"), str(tmp_path / "none.results"), True) == (None, None)
