"""Every CPU wire segment starts with a 16-byte header naming its collective,
format and size (csrc/algorithms/segment_header.h), checked by the receiver
before it reads the piece. Ranks that call with different sizes get an error
naming the rank, never a silently wrong result. (Ranks with different options
are stopped earlier, at group creation: tests/backend/test_options_agreement.py.)"""
from __future__ import annotations

from typing import NamedTuple

import pytest
import torch
import torch.distributed as dist

from tests.support.harness import DistPool, ctx


# ---------------------------------------------------------------- scenarios
# Run on every rank of the pool: module-level, the ranks import this module.

class Wire(NamedTuple):
    error: str | None
    output_written: bool


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


# -------------------------------------------------------------------- tests

GROUP_TIMEOUT_S = 10.0
SLACK_S = 15.0


@pytest.mark.parametrize("attempt", range(4))
def test_mismatched_reduce_scatter_never_returns_a_wrong_result(attempt):
    """gloo accepts a message shorter than the buffer posted for it, so without
    the header check the rank with the larger size could return a result
    summed from stale bytes. Every rank that answers raises an error, the rank
    with the larger size names rank 0's size, and no output is written."""
    pool = DistPool(2, backend="fp8gloo", pg_options={"min_numel": 1}, timeout_s=GROUP_TIMEOUT_S)
    answers = pool.run_with_deaths(mismatched_reduce_scatter, timeout=GROUP_TIMEOUT_S + SLACK_S + 60)
    assert answers, "both ranks died"
    for rank, r in answers.items():
        assert r.error is not None, f"rank {rank} returned a result from mismatched calls"
        assert not r.output_written
    if 1 in answers and "rank 0 called it with 40000 elements" not in answers[1].error:
        error = answers[1].error
        assert "Received data size" in error or "failed in the inner gloo backend" in error, answers
