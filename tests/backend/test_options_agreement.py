"""Ranks that resolve different options would issue mismatched collectives
(device segments carry no header to catch it). At group creation
the ranks exchange a fingerprint of their options; a mismatch raises on every
rank at once, naming the option and every rank's value."""
from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

import fp8comm
from tests.support.harness import PoolSpec, ctx


# ---------------------------------------------------------------- scenarios
# Run on every rank of the pool: module-level, the ranks import this module.

def options_disagree(backend: str, option: str, env_rank0: dict | None = None):
    """Rank 0 creates a group with a different option (or environment) than
    the others. Returns (error text or None, seconds)."""
    c = ctx()
    differs = c.rank == 0
    kw = {"min_numel": 1024, "compress": "all_reduce,reduce_scatter", "block_size": 32, "wire_format": "e4m3"}
    if differs and option:
        kw[option] = {"min_numel": 2048, "compress": "all", "block_size": 64, "wire_format": "mxfp4",
                      "scope": "inter_node", "rounding": "stochastic", "rounding_seed": 7}[option]
    for name in env_rank0 or {}:  # an option the environment sets is left unset on every rank
        kw.pop(name.removeprefix("FP8COMM_").lower(), None)
    saved = dict(os.environ)
    if differs and env_rank0:
        os.environ.update(env_rank0)
    t0 = time.monotonic()
    try:
        group = dist.new_group(backend=backend, pg_options=fp8comm.Options(**kw))
        dist.all_reduce(torch.ones(100_000), group=group)
        return None, time.monotonic() - t0
    except ValueError as e:
        return str(e), time.monotonic() - t0
    finally:
        os.environ.clear()
        os.environ.update(saved)


# -------------------------------------------------------------------- tests

CASES = [
    ("min_numel", None, "min_numel: rank 0 has 2048, rank 1 has 1024"),
    ("block_size", None, "block_size: rank 0 has 64, rank 1 has 32"),
    ("wire_format", None, "wire_format: rank 0 has 'mxfp4', rank 1 has 'e4m3'"),
    ("compress", None, "compress: rank 0 has 'all_reduce,reduce_scatter,all_gather', rank 1 has"),
    ("scope", None, "scope: rank 0 has 'inter_node', rank 1 has 'all'"),
    ("rounding", None, "rounding: rank 0 has 'stochastic', rank 1 has 'nearest'"),
    ("rounding_seed", None, "rounding_seed: rank 0 has 7, rank 1 has 0"),
    ("", {"FP8COMM_ROUNDING_SEED": "3"}, "rounding_seed: rank 0 has 3, rank 1 has 0"),
    ("", {"FP8COMM_MIN_NUMEL": "4096"}, "min_numel: rank 0 has 4096, rank 1 has 16384"),
]


# The pool's groups are plain gloo; each scenario creates the group under test on `pool.backend`.
POOLS = [PoolSpec(2, "gloo", timeout_s=20, id=backend, attrs={"backend": backend}) for backend in ("fp8gloo", "fp8ncclsim")]


@pytest.mark.parametrize("option,env,expected", CASES, ids=[c[0] or next(iter(c[1])) for c in CASES])
def test_mismatched_options_raise_on_every_rank_at_creation(pool, option, env, expected):
    answers = pool.run(options_disagree, pool.backend, option, env)
    for rank, (error, seconds) in enumerate(answers):
        assert error is not None, f"rank {rank} created a group with mismatched options"
        assert expected in error, error
        assert "same fp8comm.Options" in error
        assert seconds < 10, seconds


def test_matching_options_create_the_group(pool):
    for error, _ in pool.run(options_disagree, pool.backend, "", None):
        assert error is None
