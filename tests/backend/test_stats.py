"""Stats a user can find (DESIGN.md, "Stats"): get_stats() without a group
adds up every fp8 group of the process (the default group, new_group
groups, fp8comm.functional's compressors over plain groups) and lists each
with its name, description and ranks; get_stats of a plain group reads
zeros; reset_stats() zeroes them all. Every passthrough call is counted
under its reason, and a group warns once per op when a call that
Options.compress names passes through for its size, unless
FP8COMM_WARN_PASSTHROUGH=0."""
from __future__ import annotations

import contextlib
import os
import tempfile

import pytest
import torch
import torch.distributed as dist

import fp8comm
import fp8comm.functional as F
from fp8comm import _C
from fp8comm.stats import STAT_KEYS
from tests.support.groups import fp8_group, plain_gloo_group
from tests.support.harness import PoolSpec, ctx

_PAIR: list = []


def _pair():
    """An fp8gloo group of ranks 0 and 1 (None on the others), made once."""
    if not _PAIR:
        _PAIR.append(dist.new_group([0, 1], backend="fp8gloo", group_desc="pair",
                                    pg_options=fp8comm.Options(min_numel=16, compress="all_reduce")))
    group = _PAIR[0]
    return None if group == dist.GroupMember.NON_GROUP_MEMBER else group


# ---------------------------------------------------------------- scenarios
def every_group() -> dict:
    """Calls on the default group, a pair group, a functional compressor over
    the pool's gloo group and a plain gloo group; the stats they leave."""
    c, pair, plain = ctx(), _pair(), plain_gloo_group()
    fp8comm.reset_stats()
    dist.all_reduce(torch.ones(4096), group=c.group)
    dist.broadcast(torch.ones(100), src=0, group=c.group)
    if pair is not None:
        dist.all_reduce(torch.ones(100), group=pair)
        dist.all_reduce(torch.ones(100), group=pair)
    F.all_reduce(torch.ones(4096), group=c.gloo, options=fp8comm.Options(min_numel=1024))
    dist.all_reduce(torch.ones(100), group=plain)
    out = {"all": fp8comm.get_stats(), "world": fp8comm.get_stats(dist.group.WORLD),
           "pair": fp8comm.get_stats(pair) if pair is not None else None,
           "functional": fp8comm.get_stats(c.gloo), "plain": fp8comm.get_stats(plain),
           "names": {"world": c.group.group_name, "functional": c.gloo.group_name,
                     "pair": pair.group_name if pair is not None else None}}
    fp8comm.reset_stats(plain)  # nothing to reset
    fp8comm.reset_stats()
    out["reset"] = fp8comm.get_stats()
    return out


def reasons() -> dict:
    """One passthrough call for each reason a group sees on the CPU; per_op of each group."""
    c = ctx()
    pg = fp8_group("compress=all_reduce;min_numel=1024")
    one_node = fp8_group("compress=all_reduce;min_numel=1024;scope=inter_node")
    fp8comm.reset_stats(pg)
    fp8comm.reset_stats(one_node)
    dist.all_reduce(torch.ones(4096), group=pg)  # compressed
    dist.all_reduce(torch.ones(100), group=pg)
    dist.all_reduce(torch.ones(100), group=pg)
    dist.all_reduce(torch.ones(4096, dtype=torch.int32), group=pg)
    dist.all_reduce(torch.ones(4096), op=dist.ReduceOp.MAX, group=pg)
    dist.all_reduce(torch.ones(0), group=pg)
    with fp8comm.uncompressed(pg):
        dist.all_reduce(torch.ones(4096), group=pg)
    dist.all_gather_into_tensor(torch.empty(4096 * c.world), torch.ones(4096), group=pg)
    dist.broadcast(torch.ones(4096), src=0, group=pg)
    dist.barrier(group=pg)
    dist.all_reduce(torch.ones(4096), group=one_node)
    return {"group": fp8comm.get_stats(pg)["per_op"], "one_node": fp8comm.get_stats(one_node)["per_op"]}


@contextlib.contextmanager
def _stderr_into(path: str):
    """This process's file descriptor 2 (where C++ warnings go) into `path`."""
    saved = os.dup(2)
    with open(path, "w") as f:
        os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def warnings_of_a_new_group(warn: str | None) -> str:
    """What a new group (made with FP8COMM_WARN_PASSTHROUGH=`warn`, None:
    unset) writes to stderr over calls that pass through for several reasons,
    three ops below min_numel each twice."""
    c = ctx()
    saved = os.environ.pop("FP8COMM_WARN_PASSTHROUGH", None)
    if warn is not None:
        os.environ["FP8COMM_WARN_PASSTHROUGH"] = warn
    try:
        pg = dist.new_group(backend="fp8gloo", pg_options=fp8comm.Options(
            min_numel=1024, compress=["all_reduce", "all_gather", "all_to_all"]))
    finally:
        os.environ.pop("FP8COMM_WARN_PASSTHROUGH", None)
        if saved is not None:
            os.environ["FP8COMM_WARN_PASSTHROUGH"] = saved
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "stderr")
        with _stderr_into(path):
            for _ in range(2):
                dist.all_reduce(torch.ones(100), group=pg)
                dist.all_gather_into_tensor(torch.empty(100 * c.world), torch.ones(100), group=pg)
                dist.all_to_all_single(torch.empty(100 * c.world), torch.ones(100 * c.world), group=pg)
            dist.all_reduce(torch.ones(4096, dtype=torch.int32), group=pg)  # dtype: no warning
            dist.broadcast(torch.ones(100), src=0, group=pg)  # no compressed form: no warning
            dist.reduce_scatter_tensor(torch.empty(100), torch.ones(100 * c.world), group=pg)  # not named
            dist.all_reduce(torch.ones(4096), group=pg)  # compressed
        with open(path) as f:
            return f.read()


# -------------------------------------------------------------------- tests
POOLS = [PoolSpec(3, "fp8gloo", pg_options={"min_numel": 1024, "compress": "all"})]


def _counters(stats: dict) -> dict:
    """The counters of a stats dict, per_op included, without group descriptions."""
    return {key: stats[key] for key in (*STAT_KEYS, "per_op")}


def _added(parts: list) -> dict:
    total = {key: 0 for key in STAT_KEYS}
    total["per_op"] = {}
    for part in parts:
        for key in STAT_KEYS:
            total[key] += part[key]
        for op, entry in part["per_op"].items():
            into = total["per_op"].setdefault(op, {})
            for key, value in entry.items():
                if key == "passthrough_reasons":
                    reasons = into.setdefault(key, {})
                    for why, n in value.items():
                        reasons[why] = reasons.get(why, 0) + n
                else:
                    into[key] = into.get(key, 0) + value
    return total


def test_get_stats_adds_up_every_fp8_group_and_lists_each(pool):
    for rank, r in enumerate(pool.run(every_group)):
        everything, names = r["all"], r["names"]
        groups = {g["name"]: g for g in everything["groups"]}
        assert _counters(everything) == _added(everything["groups"]), everything
        # each group as get_stats(group) reads it, with its ranks and description
        assert _counters(groups[names["world"]]) == _counters(r["world"])
        assert groups[names["world"]]["ranks"] == [0, 1, 2]
        assert groups[names["functional"]]["ranks"] == [0, 1, 2]
        assert _counters(groups[names["functional"]]) == _counters(r["functional"])
        assert r["functional"]["calls_compressed"] == 1
        assert r["world"]["calls_compressed"] == 1 and r["world"]["per_op"]["broadcast"]["passthrough"] == 1
        if rank < 2:
            pair = groups[names["pair"]]
            assert pair["ranks"] == [0, 1] and pair["desc"] == "pair"
            assert _counters(pair) == _counters(r["pair"]) and pair["calls_compressed"] == 2
        else:
            assert names["pair"] is None
        assert everything["calls_compressed"] == r["world"]["calls_compressed"] + 1 + (2 if rank < 2 else 0)
        # a plain group: zeros, and listed nowhere
        assert r["plain"] == {**{key: 0 for key in STAT_KEYS}, "per_op": {}}
        # reset_stats() zeroes every group
        assert all(g["calls_compressed"] == g["calls_passthrough"] == 0 for g in r["reset"]["groups"])
        assert r["reset"]["calls_compressed"] == r["reset"]["calls_passthrough"] == r["reset"]["bytes_sent"] == 0


def test_every_passthrough_call_says_why(pool):
    for r in pool.run(reasons):
        group, one_node = r["group"], r["one_node"]
        assert group["all_reduce"]["compressed"] == 1
        assert group["all_reduce"]["passthrough_reasons"] == {
            "below min_numel": 2, "dtype": 1, "reduce op": 1, "empty": 1, "uncompressed block": 1}
        assert group["all_gather_into_tensor"]["passthrough_reasons"] == {"op not in compress": 1}
        assert group["broadcast"]["passthrough_reasons"] == {"no compressed form": 1}
        assert group["barrier"]["passthrough_reasons"] == {"no compressed form": 1}
        assert one_node["all_reduce"]["passthrough_reasons"] == {"inter_node scope: one node": 1}
        for entry in (*group.values(), *one_node.values()):
            assert sum(entry["passthrough_reasons"].values()) == entry["passthrough"], entry
            assert set(entry["passthrough_reasons"]) <= set(_C.passthrough_reasons())


def _size_warnings(text: str) -> list:
    return [line for line in text.splitlines() if "below min_numel" in line]


def test_a_group_warns_once_per_op_that_passes_through_for_its_size(pool):
    for text in pool.run(warnings_of_a_new_group, None):
        warned = _size_warnings(text)
        assert sorted(w.split("fp8comm: ")[1].split(" on group")[0] for w in warned) == [
            "all_gather_into_tensor", "all_reduce", "all_to_all"], text
        assert all("FP8COMM_WARN_PASSTHROUGH=0" in w and "elements per rank" in w for w in warned), text


@pytest.mark.parametrize("warn", ["0", "1"])
def test_the_size_warning_follows_its_variable(pool, warn):
    for text in pool.run(warnings_of_a_new_group, warn):
        assert len(_size_warnings(text)) == (3 if warn == "1" else 0), text


def test_the_variable_takes_0_or_1(monkeypatch):
    monkeypatch.setenv("FP8COMM_WARN_PASSTHROUGH", "no")
    with pytest.raises(ValueError, match="FP8COMM_WARN_PASSTHROUGH must be 0 \\(off\\) or 1 \\(on\\), got 'no'"):
        _C.env_flag("FP8COMM_WARN_PASSTHROUGH")


def test_get_stats_before_any_group_is_zeros():
    assert not dist.is_initialized()
    assert fp8comm.get_stats() == {**{key: 0 for key in STAT_KEYS}, "per_op": {}, "groups": []}
    fp8comm.reset_stats()
