"""The DistPool harness: a scenario that fails on one rank fails that test
alone; the pool's next scenario gets fresh ranks with working groups, so one
root cause shows as one failure, not as every later test of the module."""
import os

import pytest
import torch.distributed as dist
from tests.support.harness import DistPool, ScenarioError, ctx


def fail_on_rank_1():
    if ctx().rank == 1:
        raise RuntimeError("planted failure")
    return os.getpid()


def all_reduce_ranks():
    import torch

    t = torch.tensor([float(ctx().rank + 1)])
    dist.all_reduce(t, group=ctx().group)
    return os.getpid(), t.item()


def test_a_failed_scenario_fails_alone_and_the_next_gets_fresh_ranks():
    pool = DistPool(2, backend="fp8gloo")
    try:
        before = [pid for pid, _ in pool.run(all_reduce_ranks)]
        with pytest.raises(ScenarioError, match="planted failure"):
            pool.run(fail_on_rank_1)
        after = pool.run(all_reduce_ranks)
        assert [total for _, total in after] == [3.0, 3.0]
        assert not set(before) & {pid for pid, _ in after}  # new processes, not the killed ones
    finally:
        pool.close()
