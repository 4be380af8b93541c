"""A GPU session's steps and the plan that fits them to a budget, with no
process started: `plan(budget, steps)` is pure, so its rules are unit-tested
on the CPU (tests/tools/test_gpu_session_plan.py).

A step is one row of a table (steps.py): its name, its cap in seconds, its
lane, its drop rank and its command. The table runs in its order: a step
with no lane runs alone; consecutive steps with lanes form a stage in which
the lanes run side by side, each lane's steps one after another. The plan's
length is the serial steps' caps, plus each stage's longest lane, plus a
reserve for the summary and the log archive.

A budget below that drops steps by drop rank, lowest first (rank 1 is the
first to go; a step without one is never dropped), until the caps left
need scaling by no less than `scale_min` percent; then every cap but the
fixed steps' (a cold start and a compile take what they take) is scaled to
fit, never below `MIN_CAP` seconds.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

RESERVE_S = 10   # kept back for the tables, the summary and the log archive
SCALE_MIN = 75   # percent: below it, drop another step rather than scale
MIN_CAP = 5      # seconds: no kept step is scaled below this


@dataclasses.dataclass(frozen=True)
class Step:
    """One row of the step table.

    kind: how the runner judges the command's outcome: "env" (the env check),
    "build" (built if the import check passes), "pytest", "sanitizer" (pytest
    under compute-sanitizer), "bench" (its table printed again before the
    summary), "cmd" (exit status only).
    command: argv; "{out}", "{work}", "{logs}" and "{cores}" are filled in at
    run time; for pytest and sanitizer steps, pytest's own arguments.
    lane: None runs alone; else the lane it runs in beside the stage's others.
    drop: the drop rank (1 goes first); None: never dropped.
    fixed: never scaled. on_failure_of: runs only after that step failed,
    outside the plan (the kernels compiled without torch after a failed build).
    needs: steps that must have passed (else NOT-RUN). requires: a file of the
    tree the command needs (a hook for a script another change provides):
    without it the step is a SKIP. env: extra environment variables.
    results: the files in $OUT the step writes. table: (lines, regex) of its
    log printed again before the summary. test_timeout: a pytest step's
    per-test timeout, else half its limit. tool: a program the command needs
    on PATH (else a SKIP). stops_on_failure: after its failure every later
    step is NOT-RUN (the build). pythonpath: put on the later steps'
    PYTHONPATH once it passed (wheels installed outside the tree). what: the
    summary's one-line description.
    """

    name: str
    cap: int
    command: tuple[str, ...] = ()
    kind: str = "cmd"
    lane: str | None = None
    drop: int | None = None
    fixed: bool = False
    on_failure_of: str | None = None
    needs: tuple[str, ...] = ()
    requires: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    results: tuple[str, ...] = ()
    table: tuple[int, str] | None = None
    test_timeout: int | None = None
    tool: str | None = None
    stops_on_failure: bool = False
    pythonpath: str | None = None
    what: str = ""

    def __post_init__(self):
        if self.kind not in ("env", "build", "pytest", "sanitizer", "bench", "cmd"):
            raise ValueError(f"step {self.name}: kind {self.kind!r} is not one of env, build, pytest, sanitizer, "
                             "bench, cmd")
        if self.cap <= 0:
            raise ValueError(f"step {self.name}: cap {self.cap} s: a cap is a positive number of seconds")
        if self.fixed and self.lane is not None:
            raise ValueError(f"step {self.name}: a fixed step runs alone (no lane): the plan scales around it")
        if self.drop is not None and self.drop < 1:
            raise ValueError(f"step {self.name}: drop rank {self.drop}: ranks start at 1 (None: never dropped)")


@dataclasses.dataclass(frozen=True)
class Stage:
    """Serial (one step, lane None) or side by side: {lane: [step names]}."""

    lanes: tuple[tuple[str | None, tuple[str, ...]], ...]


@dataclasses.dataclass(frozen=True)
class Plan:
    budget: int
    caps: dict            # name -> seconds, for every step in the plan (the dropped included)
    dropped: tuple        # in the order they were dropped
    scale: int            # percent the scalable caps were scaled to (100: not scaled)
    stages: tuple         # Stage, in run order, over the planned steps
    reserve: int = RESERVE_S

    def kept(self, name: str) -> bool:
        return name not in self.dropped

    def stage_seconds(self, stage: Stage) -> int:
        return max(sum(self.caps[n] for n in names if self.kept(n)) for _, names in stage.lanes)

    @property
    def total(self) -> int:
        return sum(self.stage_seconds(s) for s in self.stages) + self.reserve

    def describe(self) -> str:
        serial = sum(self.stage_seconds(s) for s in self.stages if s.lanes[0][0] is None)
        parts = [f"serial {serial} s"]
        for s in self.stages:
            if s.lanes[0][0] is not None:
                lanes = ", ".join(f"{lane} {sum(self.caps[n] for n in names if self.kept(n))} s"
                                  for lane, names in s.lanes)
                parts.append(f"lanes max({lanes})")
        parts.append(f"reserve {self.reserve} s")
        return " + ".join(parts) + f" = {self.total} s of a {self.budget} s budget"


def planned(steps: Sequence[Step]) -> list[Step]:
    """The steps the plan counts: all but those run only after another's failure."""
    return [s for s in steps if s.on_failure_of is None]


def stages_of(steps: Sequence[Step]) -> tuple[Stage, ...]:
    """The table cut into stages: each lane-less step alone; each run of
    consecutive laned steps one stage, its lanes in order of first appearance."""
    stages: list[Stage] = []
    group: dict = {}
    for s in planned(steps):
        if s.lane is None:
            if group:
                stages.append(Stage(tuple((k, tuple(v)) for k, v in group.items())))
                group = {}
            stages.append(Stage(((None, (s.name,)),)))
        else:
            group.setdefault(s.lane, []).append(s.name)
    if group:
        stages.append(Stage(tuple((k, tuple(v)) for k, v in group.items())))
    return tuple(stages)


def check_table(steps: Sequence[Step]) -> None:
    """Names unique; needs and on_failure_of name earlier steps."""
    seen: set = set()
    for s in steps:
        if s.name in seen:
            raise ValueError(f"step table: {s.name} appears twice")
        for other in s.needs + ((s.on_failure_of,) if s.on_failure_of else ()):
            if other not in seen:
                raise ValueError(f"step table: {s.name} needs {other}, which is not an earlier step")
        seen.add(s.name)


def plan(budget: int, steps: Sequence[Step], overrides: dict | None = None, reserve: int = RESERVE_S,
         scale_min: int = SCALE_MIN) -> Plan:
    """Fits `steps` to `budget` seconds: caps from the table (or `overrides`,
    name -> seconds), then drops by drop rank and scales, as the module says."""
    check_table(steps)
    caps = {s.name: int((overrides or {}).get(s.name, s.cap)) for s in steps}
    unknown = set(overrides or {}) - set(caps)
    if unknown:
        raise ValueError(f"cap overrides name no step of the table: {', '.join(sorted(unknown))}")
    stages = stages_of(steps)
    counted = planned(steps)
    fixed = {s.name for s in counted if s.fixed}
    order = sorted((s for s in counted if s.drop is not None), key=lambda s: s.drop)
    dropped: list[str] = []

    def draft(scale_caps=caps):
        return Plan(budget, scale_caps, tuple(dropped), 100, stages, reserve)

    fixed_s = sum(caps[n] for n in fixed)
    avail = budget - reserve - fixed_s
    scale = 100
    for candidate in [*order, None]:
        scalable = draft().total - reserve - fixed_s
        if scalable <= avail:
            scale = 100
            break
        scale = avail * 100 // scalable if avail > 0 else 0
        if scale >= scale_min or candidate is None:
            break
        dropped.append(candidate.name)
    if scale >= 100:
        return Plan(budget, caps, tuple(dropped), 100, stages, reserve)
    scalable_names = {s.name for s in counted} - fixed
    while True:  # MIN_CAP can hold a few caps above their share: scale the rest a little further
        scaled = {n: max(MIN_CAP, c * scale // 100) if n in scalable_names else c for n, c in caps.items()}
        fitted = Plan(budget, scaled, tuple(dropped), scale, stages, reserve)
        if fitted.total <= budget or scale == 0:
            return fitted
        scale -= 1
