"""Ranks that resolve different options would issue mismatched collectives
(device segments carry no header to catch it). At group creation
the ranks exchange a fingerprint of their options; a mismatch raises on every
rank at once, naming the option and every rank's value."""
import pytest

from tests.support.harness import PoolSpec
from tests.support.scenarios import nccl as ns

CASES = [
    ("min_numel", None, "min_numel: rank 0 has 2048, rank 1 has 1024"),
    ("block_size", None, "block_size: rank 0 has 64, rank 1 has 32"),
    ("fp8_dtype", None, "fp8_dtype: rank 0 has 'e5m2', rank 1 has 'e4m3'"),
    ("compress", None, "compress: rank 0 has 'all_reduce,reduce_scatter,all_gather', rank 1 has"),
    ("scope", None, "scope: rank 0 has 'inter_node', rank 1 has 'all'"),
    ("", {"FP8COMM_MIN_NUMEL": "4096"}, "min_numel: rank 0 has 4096, rank 1 has 16384"),
]


# The pool's groups are plain gloo; each scenario creates the group under test on `pool.backend`.
POOLS = [PoolSpec(2, "gloo", timeout_s=20, id=backend, attrs={"backend": backend}) for backend in ("fp8gloo", "fp8ncclsim")]


@pytest.mark.parametrize("option,env,expected", CASES, ids=[c[0] or next(iter(c[1])) for c in CASES])
def test_mismatched_options_raise_on_every_rank_at_creation(pool, option, env, expected):
    answers = pool.run(ns.options_disagree, pool.backend, option, env)
    for rank, (error, seconds) in enumerate(answers):
        assert error is not None, f"rank {rank} created a group with mismatched options"
        assert expected in error, error
        assert "same fp8comm.Options" in error
        assert seconds < 10, seconds


def test_matching_options_create_the_group(pool):
    for error, _ in pool.run(ns.options_disagree, pool.backend, "", None):
        assert error is None
