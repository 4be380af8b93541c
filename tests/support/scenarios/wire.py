"""Scenarios for tests/backend/test_wire_headers.py (run on every rank of a DistPool)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from tests.support.harness import ctx


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
