"""Scenarios for tests/test_wire_headers.py (run on every rank of a DistPool)."""
from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

import fp8comm
from dist_harness import ctx


def mismatched_reduce_scatter(per_rank_small: int = 40_000):
    """A compressed reduce_scatter where rank 0 passes half the size of the
    others. Returns (error text or None, whether the output was written)."""
    c = ctx()
    k = per_rank_small if c.rank == 0 else 2 * per_rank_small
    out = torch.full((k,), 7.0)
    try:
        dist.reduce_scatter_tensor(out, torch.ones(k * c.world), group=c.group)
        return None, bool((out != 7.0).any())
    except RuntimeError as e:
        return str(e), bool((out != 7.0).any())


def mismatched_options(op: str, option: str, timeout_s: float):
    """Same sizes, but rank 0's group compresses with different options (a
    different fp8_dtype or block_size): the bytes would decode to garbage.
    Returns (error text or None, whether the tensor was written, seconds)."""
    c = ctx()
    differs = c.rank == 0
    kw = {"min_numel": 1, "compress": "all"}
    if option == "fp8_dtype":
        kw["fp8_dtype"] = "e5m2" if differs else "e4m3"
    else:
        kw["block_size"] = 64 if differs else 32
    group = dist.new_group(backend="fp8gloo", pg_options=fp8comm.Options(**kw),
                           timeout=datetime.timedelta(seconds=timeout_s))
    n = 3 * (1 << 21) + 4096  # several all_reduce chunks: nothing may be written before the check
    x = torch.full((n,), 1.5)
    t0 = time.monotonic()
    try:
        if op == "all_reduce":
            dist.all_reduce(x, group=group)
            written = bool((x != 1.5).any())
        elif op == "reduce_scatter":
            out = torch.full((n,), 1.5)
            dist.reduce_scatter_tensor(out, torch.ones(n * c.world), group=group)
            written = bool((out != 1.5).any())
        else:
            out = torch.full((n * c.world,), 1.5)
            dist.all_gather_into_tensor(out, torch.ones(n), group=group)
            written = bool((out != 1.5).any())
        return None, written, time.monotonic() - t0
    except RuntimeError as e:
        return str(e), bool((x != 1.5).any()) if op == "all_reduce" else False, time.monotonic() - t0
