"""The tier rule (tests/support/tiers.py): the covers are what they claim, and
a function the rule would leave out of the fast tier is reported (every
collection checks the suite for that: tests/conftest.py)."""
import itertools

from tests.support import tiers


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


class FakeItem:
    def __init__(self, nodeid, full=False):
        self.nodeid, self.full = nodeid, full

    def get_closest_marker(self, name):
        return object() if name == "full" and self.full else None


def test_a_function_without_a_fast_case_is_reported_unless_marked_full():
    of = {FakeItem("t.py::test_a[x]"): "full", FakeItem("t.py::test_a[y]"): "fast",
          FakeItem("t.py::test_b[x]"): "full", FakeItem("t.py::test_c", full=True): "full",
          FakeItem("t.py::test_d[x]"): "both"}
    assert tiers.unplaced(of) == ["t.py::test_b"]
