"""Fault scenarios (run on every rank of a DistPool): peers that die or get
stuck, ranks that call with different sizes or dtypes. They return what each
rank saw, errors as text, for the test to judge."""
from __future__ import annotations

import datetime
import os
import threading
import time
from typing import NamedTuple

import torch
import torch.distributed as dist

from tests.support.harness import ctx
from tests.support.inputs import rank_input
from tests.support.reference import sqnr_db


class Failure(NamedTuple):
    error: str | None  # what the call raised, if it did
    seconds: float  # until it returned or raised


class DeadPeer(NamedTuple):
    error: str | None
    seconds: float
    untouched: bool  # the failed call left the tensor as it was


class StuckPeer(NamedTuple):
    error: str | None
    raised_in: str  # "call" or "wait"
    seconds: float


class Wire(NamedTuple):
    error: str | None
    output_written: bool


class DtypeSum(NamedTuple):
    dtype: torch.dtype
    sqnr_db: float


def peer_dies(when: str, kind: str = "compressed", victim: int = 1):
    """`victim` exits before (or while) the others run an all_reduce: a
    compressed one, or a small PREMUL_SUM one that passes through (gloo has no
    PREMUL_SUM: fp8gloo sums a scaled copy)."""
    c = ctx()
    n = 1 << 22 if kind == "compressed" else 1000
    op = dist.ReduceOp.SUM if kind == "compressed" else dist._make_nccl_premul_sum(0.5)
    x = rank_input(c.rank, n, torch.float32)
    if c.rank == victim:
        if when == "before":
            os._exit(17)
        threading.Timer(0.05, lambda: os._exit(17)).start()
    t0 = time.monotonic()
    for _ in range(100):  # calls until the death lands in one (a call takes ~10 ms, the victim dies at 50 ms)
        before = x.clone()
        try:
            dist.all_reduce(x, op=op, group=c.group)
        except RuntimeError as e:
            return DeadPeer(str(e), time.monotonic() - t0, torch.equal(x, before))
    return DeadPeer(None, time.monotonic() - t0, True)


def peer_stuck(kind: str, stuck: int = 1, sleep_s: float = 7.0):
    """`stuck` sleeps instead of calling, then makes the call itself (its peers
    have given up by then, so it must fail within the timeout too). The others
    call with async_op=True: a compressed all_reduce (`kind` "compressed") or a
    small int64 one that passes through to gloo ("passthrough")."""
    c = ctx()
    n = 1 << 20 if kind == "compressed" else 100
    x = torch.ones(n) if kind == "compressed" else torch.ones(n, dtype=torch.int64)
    if c.rank == stuck:
        time.sleep(sleep_s)
    t0 = time.monotonic()
    where = "call"
    try:
        work = dist.all_reduce(x, group=c.group, async_op=True)
        where = "wait"
        work.wait()
        return StuckPeer(None, where, time.monotonic() - t0)
    except RuntimeError as e:
        return StuckPeer(str(e), where, time.monotonic() - t0)


def peer_stuck_after_set_timeout(timeout_s: float, stuck: int = 1, sleep_s: float = 7.0):
    """peer_stuck("compressed") after every rank has set the group's
    timeout to `timeout_s` (ProcessGroup.set_timeout, after creation)."""
    ctx().group.set_timeout(datetime.timedelta(seconds=timeout_s))
    return peer_stuck("compressed", stuck, sleep_s)


def mismatched_numel(which: str = "fp8", op: str = "all_reduce"):
    """Rank 0 passes 40 000 elements, the others 80 000 (for fp8gloo: the wire
    segments differ in size), on the fp8 group or on plain gloo (`which`)."""
    c = ctx()
    pg = c.group if which == "fp8" else c.gloo
    n = 40_000 if c.rank == 0 else 80_000
    x = torch.ones(n)
    t0 = time.monotonic()
    try:
        if op == "all_reduce":
            dist.all_reduce(x, group=pg)
        else:
            dist.reduce_scatter_tensor(torch.empty(n), torch.ones(n * c.world), group=pg)
        return Failure(None, time.monotonic() - t0)
    except RuntimeError as e:
        return Failure(str(e), time.monotonic() - t0)


def mismatched_dtype():
    """Same numel, float32 on rank 0 and bfloat16 elsewhere: FP8 wire segments
    do not depend on the source dtype, so each rank gets the sum in its dtype."""
    c = ctx()
    dtype = torch.float32 if c.rank == 0 else torch.bfloat16
    x = rank_input(c.rank, 50_000, dtype)
    dist.all_reduce(x, group=c.group)
    ref = sum(rank_input(r, 50_000, torch.float32 if r == 0 else torch.bfloat16).double() for r in range(c.world))
    return DtypeSum(x.dtype, sqnr_db(ref, x))



def mismatched_reduce_scatter(per_rank_small: int = 40_000):
    """A compressed reduce_scatter where rank 0 passes half the size of the
    others."""
    c = ctx()
    k = per_rank_small if c.rank == 0 else 2 * per_rank_small
    out = torch.full((k,), 7.0)
    try:
        dist.reduce_scatter_tensor(out, torch.ones(k * c.world), group=c.group)
        return Wire(None, bool((out != 7.0).any()))
    except RuntimeError as e:
        return Wire(str(e), bool((out != 7.0).any()))
