"""The compressed all_to_all's split check (DESIGN.md, "Algorithms",
all_to_all) at every (sender, receiver) position.

Before any data moves, every rank gathers every rank's split sizes and checks
that what rank s sends rank d is what rank d expects from rank s. A
disagreement planted at one position (rank s sending one row more, or rank d
expecting one row more), for every pair (s, d) on 2 and 3 ranks, the own slice
(s == d) and the last rank included, raises on every rank the same error,
which names the op, both ranks and both counts; no output is written, no rank
hangs, and the group still gives the same result afterwards. It is checked
through each entry that reaches the check: dist.all_to_all_single and
dist.all_to_all on an fp8 group, and fp8comm.functional.all_to_all_single on
a plain group.

One pool per world size runs every position in one scenario: the check raises
after the split sizes' all_gather has completed on every rank, so the group
is in step for the next position (the design's "the group stays usable").
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import fp8comm
import fp8comm.functional as F
from tests.support.harness import PoolSpec, ctx
from tests.support.inputs import rank_input, same_bits

OPTIONS = {"compress": "all_to_all", "min_numel": 0}
WIDTH = 8  # elements a row
ROWS = 2  # rows every rank sends every rank when the sizes agree
ENTRIES = ("single", "list", "functional")
SIDES = ("sends", "expects")  # rank s sends one row more; rank d expects one row more
PLAIN = {"fp8gloo": "gloo", "fp8ncclsim": "ncclsim"}
OP = "all_to_all"  # the name every entry's error carries

POOLS = PoolSpec.grid(("fp8gloo", "fp8ncclsim"), (2, 3), pg_options=OPTIONS, timeout_s=60)


# ---------------------------------------------------------------- scenarios
# Run on every rank of the pool: module-level, the ranks import this module.

_PLAIN: list = []


def _plain_group():
    """A plain group of every rank (the pool's transport kind), made once."""
    if not _PLAIN:
        _PLAIN.append(dist.new_group(backend=PLAIN[dist.get_backend(ctx().group)]))
    return _PLAIN[0]


def _sizes(world: int, rank: int, side: str | None, s: int, d: int) -> tuple[list, list]:
    """(rows this rank sends each rank, rows it expects from each) with one
    disagreement planted at (s, d) on `side`'s rank (None: they agree)."""
    sends, expects = [ROWS] * world, [ROWS] * world
    if side == "sends" and rank == s:
        sends[d] += 1
    if side == "expects" and rank == d:
        expects[s] += 1
    return sends, expects


def _outputs(entry: str, expects: list) -> list:
    """The outputs of one call, filled with 7 (an error must leave them so)."""
    if entry == "list":
        return [torch.full((n, WIDTH), 7.0) for n in expects]
    return [torch.full((sum(expects), WIDTH), 7.0)]


def _call(entry: str, outs: list, sends: list, expects: list) -> None:
    """One all_to_all through `entry` into `outs`."""
    c = ctx()
    x = rank_input(c.rank, sum(sends) * WIDTH, torch.float32, seed=11).view(-1, WIDTH)
    if entry == "list":
        dist.all_to_all(outs, list(x.split(sends)), group=c.group)
    elif entry == "single":
        dist.all_to_all_single(outs[0], x, expects, sends, group=c.group)
    else:
        F.all_to_all_single(outs[0], x, expects, sends, group=_plain_group(), options=fp8comm.Options(**OPTIONS))


def _agreeing(entry: str) -> list:
    c = ctx()
    sends, expects = _sizes(c.world, c.rank, None, 0, 0)
    outs = _outputs(entry, expects)
    _call(entry, outs, sends, expects)
    return outs


def every_position() -> dict:
    """Every entry, side and position in turn: {(entry, side, s, d): (the
    error's text or None, whether the outputs stayed untouched)}, and under
    "recovered" whether each entry's agreeing call gives after the errors
    what it gave before them."""
    c = ctx()
    before = {entry: _agreeing(entry) for entry in ENTRIES}
    found = {}
    for entry in ENTRIES:
        for side in SIDES:
            for s in range(c.world):
                for d in range(c.world):
                    sends, expects = _sizes(c.world, c.rank, side, s, d)
                    outs = _outputs(entry, expects)
                    try:
                        _call(entry, outs, sends, expects)
                        error = None
                    except RuntimeError as e:
                        error = str(e)
                    found[(entry, side, s, d)] = (error, all(bool((o == 7.0).all()) for o in outs))
    after = {entry: _agreeing(entry) for entry in ENTRIES}
    found["recovered"] = {entry: all(same_bits(a, b) for a, b in zip(after[entry], before[entry]))
                          for entry in ENTRIES}
    return found


def wrong_length_lists() -> dict:
    """all_to_all_single with one split size too few, then too many, on
    either side: {(side, length): the error's type and text or None}, and
    whether an agreeing call still works after them."""
    c = ctx()
    found = {}
    for side in ("input", "output"):
        for length in (c.world - 1, c.world + 1):
            sizes = [ROWS] * length
            good = [ROWS] * c.world
            x = torch.zeros(ROWS * c.world, WIDTH)
            out = torch.full((ROWS * c.world, WIDTH), 7.0)
            try:
                if side == "input":
                    dist.all_to_all_single(out, x, good, sizes, group=c.group)
                else:
                    dist.all_to_all_single(out, x, sizes, good, group=c.group)
                found[(side, length)] = None
            except Exception as e:  # noqa: BLE001 (the type is part of what is checked)
                found[(side, length)] = (type(e).__name__, str(e))
    _agreeing("single")  # raises if the group were left out of step
    found["usable"] = True
    return found


# -------------------------------------------------------------------- tests
@pytest.mark.pools("fp8gloo-3")
def test_a_split_list_of_the_wrong_length_is_refused_by_name(pool):
    """One split size too few or too many: every rank refuses it where it
    enters, naming the op and what to pass (not an IndexError from the
    bytes the call would count), and the group stays usable."""
    for r in pool.run(wrong_length_lists, timeout=60):
        assert r.pop("usable") is True
        for key, got in r.items():
            assert got is not None and got[0] != "IndexError", (key, got)
            assert f"fp8comm {OP}" in got[1] and "split sizes for a group of" in got[1], (key, got)


def test_every_position_raises_on_every_rank(pool):
    """The first error of any (entry, side, s, d) is the failure message;
    every one is listed where more fail."""
    results = pool.run(every_position, timeout=60)
    elements = ROWS * WIDTH
    wrong = []
    for entry in ENTRIES:
        for side in SIDES:
            for s in range(pool.world):
                for d in range(pool.world):
                    key = (entry, side, s, d)
                    errors = {r[key][0] for r in results}
                    sent = elements + (WIDTH if side == "sends" else 0)
                    expected = elements + (WIDTH if side == "expects" else 0)
                    names = (f"fp8comm {OP}: rank {s} sends {sent} elements to rank {d}",
                             f"rank {d} expects {expected} from rank {s}")
                    if len(errors) != 1 or None in errors:
                        wrong.append((key, "not the same error on every rank", sorted(map(str, errors))))
                    elif not all(n in next(iter(errors)) for n in names):
                        wrong.append((key, "the error does not name the op and the position", errors))
                    elif not all(r[key][1] for r in results):
                        wrong.append((key, "an output was written", [r[key][1] for r in results]))
    assert not wrong, f"{len(wrong)} of {len(ENTRIES) * len(SIDES) * pool.world ** 2} positions:\n" + "\n".join(
        map(str, wrong))
    for r in results:
        assert r["recovered"] == {entry: True for entry in ENTRIES}, r["recovered"]


@pytest.mark.parametrize("world", [2, 3])
def test_every_position_is_planted(world):
    """The grid the scenario walks: every (s, d), own slice and last rank
    included, on each side exactly one rank's sizes change."""
    for side in SIDES:
        for s in range(world):
            for d in range(world):
                changed = [r for r in range(world) if _sizes(world, r, side, s, d) != _sizes(world, r, None, 0, 0)]
                assert changed == [s if side == "sends" else d]
