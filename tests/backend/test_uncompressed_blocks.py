"""fp8comm.uncompressed (DESIGN.md, "Uncompressed blocks"): inside a block
every compressible op on the group passes through, bitwise plain gloo, and
is counted as passed through; after it the same op is compressed again.
Blocks nest and are left on exceptions; entering and leaving are collective,
and ranks that do not switch together fail loudly instead of hanging."""
from __future__ import annotations

import time
from typing import NamedTuple

import pytest
import torch
import torch.distributed as dist

import fp8comm
from fp8comm.registry import fp8_backends
from tests.support.groups import plain_gloo_group
from tests.support.harness import PoolSpec, ctx
from tests.support.inputs import rank_input
from tests.support.ops import Call, flat, run
from tests.support.stats import calls as stats_calls


# ---------------------------------------------------------------- scenarios
# Run on every rank of the pool: module-level, the ranks import this module.
# Scenarios of fp8comm.uncompressed (run on every rank of a DistPool): inside
# a block every compressible op passes through, bitwise plain gloo; blocks
# nest and are left on exceptions; ranks that do not switch together fail
# loudly, naming the ranks that did not come.

# The compressible forms of the ops table -> the name stats count them under,
# and this rank's input sizes for a group of w ranks (two inputs: two
# collectives in one call, or one all_reduce of their concatenation).
COMPRESSIBLE = {
    "all_reduce": ("all_reduce", lambda w: [5000]),
    "all_reduce_coalesced": ("all_reduce_coalesced", lambda w: [3000, 2000]),
    "reduce_scatter_tensor": ("reduce_scatter_tensor", lambda w: [2048 * w]),
    "reduce_scatter_list": ("reduce_scatter", lambda w: [2048 * w]),
    "reduce_scatter_coalesced": ("reduce_scatter_tensor_coalesced", lambda w: [2048 * w, 1500 * w]),
    "all_gather_tensor": ("all_gather_into_tensor", lambda w: [3000]),
    "all_gather_list": ("all_gather", lambda w: [3000]),
    "all_gather_coalesced": ("all_gather_into_tensor_coalesced", lambda w: [3000, 2000]),
}
GROUP_OPTIONS = {"compress": "all", "min_numel": 1024}


def fp8_group_like_the_pool(**options):
    """A new group of the pool's fp8 backend (fp8gloo or fp8ncclsim)."""
    options = {**GROUP_OPTIONS, **options}
    return dist.new_group(backend=dist.get_backend(ctx().group), pg_options=fp8comm.Options(**options))


_GROUP = {}


def shared_group():
    """One group for the scenarios that leave it able to switch."""
    if "group" not in _GROUP:
        _GROUP["group"] = fp8_group_like_the_pool()
    return _GROUP["group"]


class InsideAndAfter(NamedTuple):
    inside: torch.Tensor  # the op's outputs inside the block
    plain: torch.Tensor  # the same op on plain gloo
    after: torch.Tensor  # the same op after the block
    inside_stats: dict
    after_stats: dict


def inside_and_after(op: str) -> InsideAndAfter:
    c = ctx()
    group = shared_group()
    sizes = COMPRESSIBLE[op][1](c.world)

    def issue(pg):
        xs = [rank_input(c.rank, n, seed=i) for i, n in enumerate(sizes)]
        return flat(run(op, Call(pg, c.rank, c.world), xs), xs[0])

    fp8comm.reset_stats(group)
    with fp8comm.uncompressed(group):
        inside = issue(group)
    inside_stats = fp8comm.get_stats(group)
    fp8comm.reset_stats(group)
    after = issue(group)
    return InsideAndAfter(inside, issue(c.gloo), after, inside_stats, fp8comm.get_stats(group))


def _compressed_now(group) -> bool:
    """Whether an all_reduce above min_numel is compressed on `group` now."""
    before = fp8comm.get_stats(group)["calls_compressed"]
    dist.all_reduce(rank_input(ctx().rank, 5000), group=group)
    return fp8comm.get_stats(group)["calls_compressed"] > before


def nesting_and_exceptions() -> list:
    """What each step of nested and failing blocks leaves: (step, compressed
    now, open blocks on the group)."""
    group = shared_group()
    backend = fp8_backends(group)[0]
    log = []

    def note(step):
        log.append((step, _compressed_now(group), backend.uncompressed_depth))

    note("before")
    block = fp8comm.uncompressed(group)
    with block:
        note("outer")
        with fp8comm.uncompressed(group):
            note("inner")
        note("outer again")
        with block:  # the same object, nested in itself
            note("reused inside itself")
    note("after")
    try:
        with fp8comm.uncompressed(group):
            with fp8comm.uncompressed(group):
                raise KeyError("raised inside two blocks")
    except KeyError:
        note("after an exception")
    with fp8comm.uncompressed(group):
        note("a block after the exception")
    with fp8comm.uncompressed(ctx().gloo):  # no fp8 backend: nothing to switch
        dist.all_reduce(torch.ones(5000), group=ctx().gloo)
    note("after a block on plain gloo")
    return log


class Refusal(NamedTuple):
    error: str | None  # what entering or leaving raised on this rank
    seconds: float
    again: str | None  # what the next switch raised on this rank
    depth: int  # open blocks after it


def _try_block(group, timeout_s, body=None) -> tuple[str | None, float]:
    t0 = time.monotonic()
    try:
        with fp8comm.uncompressed(group, timeout=timeout_s):
            if body:
                body()
    except RuntimeError as e:
        return str(e), time.monotonic() - t0
    return None, time.monotonic() - t0


def one_rank_enters_alone(timeout_s: float) -> Refusal:
    """Rank 0 enters a block that the others do not enter (yet): it gives up
    after timeout_s. The others try to enter afterwards: they fail at once
    instead of passing alone."""
    c = ctx()
    group = fp8_group_like_the_pool()
    if c.rank == 0:
        error, seconds = _try_block(group, timeout_s)
        again, _ = _try_block(group, timeout_s)
    dist.barrier(group=plain_gloo_group())
    if c.rank != 0:
        error, seconds = _try_block(group, 60.0)
        again = None
    return Refusal(error, seconds, again, fp8_backends(group)[0].uncompressed_depth)


def one_rank_leaves_on_an_exception(timeout_s: float) -> Refusal:
    """Every rank enters; the last rank raises inside the block and leaves at
    once; the others leave normally and wait for it in vain."""
    c = ctx()
    group = fp8_group_like_the_pool()
    last = c.world - 1

    def body():
        if c.rank == last:
            raise RuntimeError("this rank failed inside the block")

    error, seconds = _try_block(group, timeout_s, body)
    return Refusal(error, seconds, None, fp8_backends(group)[0].uncompressed_depth)


def bad_timeout(timeout) -> str:
    try:
        with fp8comm.uncompressed(shared_group(), timeout=timeout):
            pass
    except (TypeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


# -------------------------------------------------------------------- tests

UNCOMPRESSED_SQNR_DB = 45.0  # any result above it did not go through FP8


POOLS = [PoolSpec(world, backend, timeout_s=60, id=f"{backend}-{world}")
         for backend, world in [("fp8gloo", 2), ("fp8gloo", 3), ("fp8ncclsim", 2)]]


def sqnr_db(ref, got):
    noise = (got.double() - ref.double()).pow(2).sum().item()
    return float("inf") if noise == 0 else 10 * torch.log10(ref.double().pow(2).sum() / noise).item()


@pytest.mark.parametrize("op", list(COMPRESSIBLE))
def test_every_compressible_op_passes_through_inside_the_block(pool, op):
    name = COMPRESSIBLE[op][0]
    calls = 2 if name.endswith("_tensor_coalesced") else 1  # one collective per pair
    for r in pool.run(inside_and_after, op):
        assert torch.equal(r.inside.view(torch.uint8), r.plain.view(torch.uint8))
        assert stats_calls(r.inside_stats) == {name: {"compressed": 0, "passthrough": calls}}, r.inside_stats
        assert r.inside_stats["per_op"][name]["passthrough_reasons"] == {"uncompressed block": calls}
        assert r.inside_stats["bytes_sent"] == r.inside_stats["bytes_sent_uncompressed"]
        assert stats_calls(r.after_stats) == {name: {"compressed": calls, "passthrough": 0}}, r.after_stats
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
    for log in pool.run(nesting_and_exceptions):
        assert log == expected


def test_a_rank_entering_alone_fails_loudly_and_the_late_ones_at_once(pool):
    answers = pool.run(one_rank_enters_alone, 1.5)
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
    answers = pool.run(one_rank_leaves_on_an_exception, 1.5)
    last = pool.world - 1
    assert answers[last].error == "this rank failed inside the block"
    for a in answers[:last]:
        assert a.error is not None and f"rank(s) {last} did not" in a.error, a.error
        assert "to leave a block" in a.error
    assert all(a.depth == 0 for a in answers)


def test_a_bad_timeout_is_refused_before_any_switch(pool):
    assert all(e.startswith("ValueError: fp8comm.uncompressed: timeout must be positive") for e in
               pool.run(bad_timeout, -1.0))
    assert all(e.startswith("TypeError: fp8comm.uncompressed: timeout must be") for e in
               pool.run(bad_timeout, "soon"))
    test_blocks_nest_and_are_left_on_exceptions(pool)  # the group still switches
