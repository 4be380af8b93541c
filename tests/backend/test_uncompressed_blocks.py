"""fp8comm.uncompressed (DESIGN.md, "Uncompressed blocks"): inside a block
every compressible op on the group passes through, bitwise plain gloo, and
is counted as passed through; after it the same op is compressed again.
Blocks nest and are left on exceptions; entering and leaving are collective,
and ranks that do not switch together fail loudly instead of hanging."""
import pytest
import torch

from tests.support.harness import PoolSpec
from tests.support.scenarios import uncompressed as us

UNCOMPRESSED_SQNR_DB = 45.0  # any result above it did not go through FP8


POOLS = [PoolSpec(world, backend, timeout_s=60, id=f"{backend}-{world}")
         for backend, world in [("fp8gloo", 2), ("fp8gloo", 3), ("fp8ncclsim", 2)]]


def sqnr_db(ref, got):
    noise = (got.double() - ref.double()).pow(2).sum().item()
    return float("inf") if noise == 0 else 10 * torch.log10(ref.double().pow(2).sum() / noise).item()


@pytest.mark.parametrize("op", list(us.COMPRESSIBLE))
def test_every_compressible_op_passes_through_inside_the_block(pool, op):
    name = us.COMPRESSIBLE[op][0]
    calls = 2 if name.endswith("_tensor_coalesced") else 1  # one collective per pair
    for r in pool.run(us.inside_and_after, op):
        assert torch.equal(r.inside.view(torch.uint8), r.plain.view(torch.uint8))
        assert r.inside_stats["per_op"] == {name: {"compressed": 0, "passthrough": calls}}, r.inside_stats
        assert r.inside_stats["bytes_sent"] == r.inside_stats["bytes_sent_uncompressed"]
        assert r.after_stats["per_op"] == {name: {"compressed": calls, "passthrough": 0}}, r.after_stats
        assert sqnr_db(r.plain, r.after) < UNCOMPRESSED_SQNR_DB


def test_blocks_nest_and_are_left_on_exceptions(pool):
    expected = [
        ("before", True, 0),
        ("outer", False, 1),
        ("inner", False, 2),
        ("outer again", False, 1),
        ("reused inside itself", False, 2),
        ("after", True, 0),
        ("after an exception", True, 0),
        ("a block after the exception", False, 1),
        ("after a block on plain gloo", True, 0),
    ]
    for log in pool.run(us.nesting_and_exceptions):
        assert log == expected


def test_a_rank_entering_alone_fails_loudly_and_the_late_ones_at_once(pool):
    answers = pool.run(us.one_rank_enters_alone, 1.5)
    first = answers[0]
    others = ", ".join(str(r) for r in range(1, pool.world))
    assert first.error is not None and f"rank(s) {others} did not" in first.error, first.error
    assert "waited 1.5 s for every rank to enter" in first.error and "collective" in first.error
    assert 1.5 <= first.seconds < 10, first.seconds
    assert "switches no more" in first.again, first.again
    for late in answers[1:]:
        assert late.error is not None and "after another rank had stopped waiting" in late.error, late.error
        assert late.seconds < 10, late.seconds
    assert all(a.depth == 0 for a in answers)


def test_a_rank_leaving_on_an_exception_fails_the_others_loudly(pool):
    answers = pool.run(us.one_rank_leaves_on_an_exception, 1.5)
    last = pool.world - 1
    assert answers[last].error == "this rank failed inside the block"
    for a in answers[:last]:
        assert a.error is not None and f"rank(s) {last} did not" in a.error, a.error
        assert "to leave a block" in a.error
    assert all(a.depth == 0 for a in answers)


def test_a_bad_timeout_is_refused_before_any_switch(pool):
    assert all(e.startswith("ValueError: fp8comm.uncompressed: timeout must be positive") for e in
               pool.run(us.bad_timeout, -1.0))
    assert all(e.startswith("TypeError: fp8comm.uncompressed: timeout must be") for e in
               pool.run(us.bad_timeout, "soon"))
    test_blocks_nest_and_are_left_on_exceptions(pool)  # the group still switches
