"""The two test tiers (DESIGN.md, "Testing strategy").

fast: what `python -m pytest tests -q` runs (the README's test command).
full: everything else; CI runs it after the fast tier (`--tier full`), and
`--tier all` runs both.

A test's tier follows one rule, applied at collection (tests/conftest.py):

- A parametrized test keeps in the fast tier a pairwise-covering subset of its
  cases: every value of every axis, and every pair of values of any two axes
  that occurs in its grid (format x codec path, dtype x block size, op x pool,
  ...), appears in at least one fast case. Its other cases (the higher-order
  combinations of the exhaustive grid) are in the full tier. An axis is a
  parameter, or a field of a parameter that is a dataclass, a named tuple or
  a dict (a list of case objects is a grid too); a field with more than
  DRAW_VALUES distinct values is a random draw (a seed, a size), not an axis.
- A module's pools (tests/conftest.py's `pool`; starting one costs seconds
  per rank) are cut first: the fast tier runs on a subset of them in which
  each backend, world size, option set and attribute of the module's pools
  appears once (a 2 x 3 grid of backends and worlds keeps three); and a test
  that runs on a pool, or in a module that declares `CASES_TAKE_SECONDS =
  True` (ranks that die or hang on purpose, started per case), keeps each
  value of each of its axes once (one-wise) instead of each pair.
- `@pytest.mark.full` puts a test (or a case, via pytest.param) in the full
  tier whole: long studies, soaks, multi-seed statistics.
- `@pytest.mark.fast` keeps every case of a test in the fast tier, where each
  case is a different contract (a list of documented errors, say).

Hypothesis runs `examples(n)` examples: n in the full tier, fewer in the fast
one, and its tests run in both tiers.
"""
from __future__ import annotations

import dataclasses
import itertools
import os
from collections import defaultdict
from typing import Hashable, Iterable, Sequence

TIERS = ("fast", "full", "all")
ENV = "FP8COMM_TEST_TIER"  # set for the ranks a test starts, so they see the same tier
_FAST_HYPOTHESIS_SHARE = 6
DRAW_VALUES = 12


def current() -> str:
    """The tier being run ("fast" when not set: the README's command)."""
    return os.environ.get(ENV, "fast")


def examples(n: int) -> int:
    """Hypothesis's max_examples: n in the full tier, n // 6 (at least 4) in the fast one."""
    return n if current() != "fast" else max(4, n // _FAST_HYPOTHESIS_SHARE)


def _key(value) -> Hashable:
    try:
        hash(value)
        return (type(value).__name__, value)
    except TypeError:
        return (type(value).__name__, repr(value))


def axes(params: dict) -> dict[str, Hashable]:
    """The axes of one case: each parameter, and each field of a parameter that
    is a dataclass, a named tuple or a dict (named `param.field`)."""
    out = {}
    for name, value in params.items():
        if isinstance(value, dict):
            for field, v in value.items():
                out[f"{name}.{field}"] = _key(v)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            for f in dataclasses.fields(value):
                out[f"{name}.{f.name}"] = _key(getattr(value, f.name))
        elif isinstance(value, tuple) and hasattr(value, "_fields"):
            for field in value._fields:
                out[f"{name}.{field}"] = _key(getattr(value, field))
        else:
            out[name] = _key(value)
    return out


def _pairs(case: dict[str, Hashable]) -> set:
    names = sorted(case)
    singles = {((n, case[n]),) for n in names}
    return singles | {((a, case[a]), (b, case[b])) for a, b in itertools.combinations(names, 2)}


def _greedy_cover(covers: list[set]) -> list[int]:
    """Indices of a small subset of `covers` whose union is the union of all
    (greedy set cover; deterministic: ties go to the earlier one)."""
    uncovered = set().union(*covers) if covers else set()
    chosen = []
    while uncovered:
        best = max(range(len(covers)), key=lambda i: (len(covers[i] & uncovered), -i))
        chosen.append(best)
        uncovered -= covers[best]
    return sorted(chosen)


def pairwise_cover(cases: Sequence[dict[str, Hashable]]) -> list[int]:
    """Indices of a small subset of `cases` in which every value, and every
    pair of values of two axes, that occurs in `cases` occurs at least once."""
    return _greedy_cover([_pairs(c) for c in cases])


def _without_draws(cases: list[dict]) -> list[dict]:
    """The cases less their fields (`param.field`) that take more than DRAW_VALUES values."""
    values = defaultdict(set)
    for c in cases:
        for k, v in c.items():
            values[k].add(v)
    draws = {k for k, vs in values.items() if "." in k and len(vs) > DRAW_VALUES}
    return [{k: v for k, v in c.items() if k not in draws} for c in cases]


def _pool_axes(spec) -> dict[str, Hashable]:
    return {k: v for k, v in axes({"pool": spec}).items() if k not in ("pool.id", "pool.timeout_s")}


def one_wise_cover(cases: Sequence[dict[str, Hashable]]) -> list[int]:
    """Indices of a small subset of `cases` in which every value of every axis
    occurs at least once."""
    return _greedy_cover([set(c.items()) for c in cases])


def _fast_pools(items) -> dict:
    """{module name: the ids of the pool specs its fast tier runs on}."""
    specs = defaultdict(dict)
    for item in items:
        spec = getattr(item, "callspec", None) and item.callspec.params.get("pool")
        if spec is not None:
            specs[item.module.__name__][id(spec)] = spec
    out = {}
    for module, by_id in specs.items():
        ordered = list(by_id.values())
        out[module] = {id(ordered[i]) for i in one_wise_cover([_pool_axes(s) for s in ordered])}
    return out


def _is_hypothesis(item) -> bool:
    return getattr(getattr(item, "obj", None), "is_hypothesis_test", False)


def assign(items: Iterable) -> dict:
    """{item: "fast" | "full" | "both"} for collected pytest items, by the rule
    above ("both": a hypothesis test, at each tier's budget)."""
    items = list(items)
    tier = {}
    groups = defaultdict(list)
    pools = _fast_pools(items)
    for item in items:
        spec = getattr(item, "callspec", None) and item.callspec.params.get("pool")
        if item.get_closest_marker("full") is not None:
            tier[item] = "full"
        elif spec is not None and id(spec) not in pools[item.module.__name__]:
            tier[item] = "full"
        elif item.get_closest_marker("fast") is not None or not hasattr(item, "callspec"):
            tier[item] = "fast"
        else:
            groups[(item.module.__name__ if item.module else "", item.originalname)].append(item)
    for group in groups.values():
        cases = _without_draws([axes(i.callspec.params) for i in group])
        multi_rank = "pool" in group[0].callspec.params or getattr(group[0].module, "CASES_TAKE_SECONDS", False)
        fast = set(one_wise_cover(cases) if multi_rank else pairwise_cover(cases))
        for n, item in enumerate(group):
            tier[item] = "fast" if n in fast else "full"
    for item, t in tier.items():
        if t == "fast" and _is_hypothesis(item):
            tier[item] = "both"
    return tier


def unplaced(of: dict) -> list[str]:
    """The test functions the rule left with no case in the fast tier that
    are not marked full: a cover must never drop a function (checked on
    every collection, tests/conftest.py)."""
    by_function = defaultdict(list)
    for item, t in of.items():
        by_function[item.nodeid.split("[")[0]].append((t, item.get_closest_marker("full") is not None))
    return sorted(f for f, cases in by_function.items()
                  if not any(t in ("fast", "both") for t, _ in cases) and not all(m for _, m in cases))


def selected(tier_of_item: str, running: str) -> bool:
    """Whether a test of tier `tier_of_item` runs when tier `running` is run."""
    return running == "all" or tier_of_item in (running, "both")


def pytest_collection_finish(session):
    """With `-p tests.support.tiers --tier all --collect-only`: each test's tier,
    a line each (TIER<TAB>FULL-MARKED<TAB>NODE ID), for a developer asking which
    tier a test is in, and for tests/tools/test_tiers.py."""
    for item, tier in assign(session.items).items():
        marked = int(item.get_closest_marker("full") is not None)
        print(f"TIER\t{tier}\t{marked}\t{item.nodeid}")
