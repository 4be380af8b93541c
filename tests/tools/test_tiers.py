"""The tier rule (tests/support/tiers.py): the covers are what they claim, and
on the real suite the fast tier keeps every test function at least once
(unless marked full) and every pool-parametrized module's backends and world
sizes, while the fast and full tiers together are the whole suite."""
import itertools
import subprocess
import sys
from collections import defaultdict

from tests.support import REPO_ROOT, tiers


def grid(**values):
    return [dict(zip(values, combo)) for combo in itertools.product(*values.values())]


def test_pairwise_cover_keeps_every_pair_and_is_small():
    cases = grid(path=["scalar", "avx2", "avx512", "cuda"], fmt=["e4m3", "e5m2", "mxfp4"],
                 dtype=["f32", "bf16", "f16"], block=[16, 32, 48, 256])
    chosen = [cases[i] for i in tiers.pairwise_cover(cases)]
    for a, b in itertools.combinations(cases[0], 2):
        assert {(c[a], c[b]) for c in chosen} == {(c[a], c[b]) for c in cases}, (a, b)
    assert len(chosen) <= 24 < len(cases)


def test_pairwise_cover_of_a_filtered_grid_takes_only_cases_that_exist():
    cases = [c for c in grid(a=[0, 1, 2], b=[0, 1, 2], c=[0, 1]) if c["a"] != c["b"]]
    chosen = [cases[i] for i in tiers.pairwise_cover(cases)]
    assert {(c["a"], c["b"]) for c in chosen} == {(c["a"], c["b"]) for c in cases}


def test_one_wise_cover_keeps_every_value():
    cases = grid(backend=["fp8gloo", "fp8ncclsim"], world=[2, 3, 4])
    chosen = [cases[i] for i in tiers.one_wise_cover(cases)]
    assert {c["backend"] for c in chosen} == {"fp8gloo", "fp8ncclsim"}
    assert {c["world"] for c in chosen} == {2, 3, 4} and len(chosen) == 3


def test_case_objects_are_grids_and_draws_are_not_axes():
    cases = [tiers.axes({"c": {"fmt": f, "seed": s}}) for s, f in enumerate(["e4m3", "mxfp4"] * 20)]
    kept = tiers._without_draws(cases)
    assert all(set(c) == {"c.fmt"} for c in kept)


def tiers_of_the_suite():
    """{node id: (tier, marked full)} of every test, from one collection."""
    out = subprocess.run([sys.executable, "-m", "pytest", "tests", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "-p", "tests.support.tiers", "--tier", "all"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [line.split("\t") for line in out.stdout.splitlines() if line.startswith("TIER\t")]
    return {node: (tier, marked == "1") for _, tier, marked, node in rows}


def test_the_fast_tier_keeps_every_test_function_and_every_pool_backend():
    of = tiers_of_the_suite()
    fast = {n for n, (t, _) in of.items() if t in ("fast", "both")}
    assert 0 < len(fast) < len(of)
    by_function = defaultdict(list)
    for node, (tier, marked) in of.items():
        by_function[node.split("[")[0]].append((tier, marked))
    for function, cases in by_function.items():
        # a function wholly in the full tier is marked so (a long study), never dropped by a cover
        assert any(t in ("fast", "both") for t, _ in cases) or all(m for _, m in cases), function
    for node, (tier, marked) in of.items():
        module = node.split("::")[0]
        for backend in ("fp8gloo", "fp8ncclsim"):
            if f"[{backend}" in node and not marked:
                assert any(f"[{backend}" in n and n.startswith(module) for n in fast), (module, backend)
