"""Splitting fp8 groups, 4 real processes, on fp8gloo and
on fp8ncclsim (fp8nccl's path: the fp8ncclsim transport splits as NCCL does).

torch splits a group where its backend can (``supports_splitting``):
``torch.distributed.split_group``, and DeviceMesh under eager init. A split
group must be an fp8 group of the same kind with the parent's options, and
compute what a group created with new_group over the same ranks computes,
bit for bit, compressed. torch's split_group needs an accelerator and a bound
device; here the CPU stands in for one (tests/support/groups.py). The world's
options are not the defaults, so that carrying them is seen.

Also here: fp8nccl's barrier names its device to NCCL when the caller gave
none (Lightning gives device ids only to a backend named "nccl").
"""
import pytest
import torch

from tests.support.harness import PoolSpec
from tests.support.reference import sqnr_db
from tests.support.scenarios import subgroups as S
from tests.support.torch_features import SPLIT_NEEDS_CUDA, split_group_takes_the_bound_device

OPTIONS = {"block_size": 64, "fp8_dtype": "e5m2", "min_numel": 1024, "compress": "all"}
OPS = ("all_reduce", "reduce_scatter", "all_gather")
MIN_SQNR_DB = 20.0  # E5M2 through one or two quantizations: ~25 dB on randn


POOLS = [PoolSpec(4, backend, pg_options=OPTIONS, id=backend) for backend in ("fp8gloo", "fp8ncclsim")]


def check_split_group(results, backend):
    for rank, r in enumerate(results):
        assert r["type"] == "ProcessGroupFp8" and r["name"] == "fp8gloo", r
        assert (r["rank"], r["size"]) == (rank % 2, 2)
        assert r["same_options"], r["options"]
        assert r["traits"] == r["parent_traits"]  # fp8ncclsim's split keeps NCCL's traits
        if backend == "fp8ncclsim":
            assert r["traits"]["reduces_avg_and_premul"] and not r["traits"]["segment_headers"]
        for op in OPS:
            assert torch.equal(r["got"][op], r["ref"][op]), f"rank {rank} {op}: differs from new_group's"
            assert sqnr_db(r["exact"][op], r["got"][op]) > MIN_SQNR_DB, op
            assert not torch.equal(r["got"][op].double(), r["exact"][op]), f"{op}: exact (not compressed?)"
        stats = r["stats"]
        assert stats["calls_compressed"] == 3 and stats["calls_passthrough"] == 0, stats
        assert stats["bytes_sent"] < 0.3 * stats["bytes_sent_uncompressed"], stats
    for a, b in ((0, 1), (2, 3)):  # all_reduce: the same bits on every rank of a split
        assert torch.equal(results[a]["got"]["all_reduce"], results[b]["got"]["all_reduce"])


def test_split_through_the_backend_api(pool):
    check_split_group(pool.run(S.split_through_backend_api, pool.backend, seed=1), pool.backend)


def test_torch_split_group(pool):
    if not split_group_takes_the_bound_device():
        pytest.skip(SPLIT_NEEDS_CUDA)
    results = pool.run(S.split_through_torch_split_group, pool.backend, seed=2)
    check_split_group(results, pool.backend)
    for rank, r in enumerate(results):
        assert r["backend_string"] == pool.backend  # what the parent was created with
        assert r["global_ranks"] == S.SPLITS[rank // 2]


def test_ranks_outside_the_split_get_no_group(pool):
    results = pool.run(S.split_leaves_out_the_other_ranks)
    assert results[2] is None and results[3] is None
    assert torch.equal(results[0], torch.full((S.N,), 3.0)) and torch.equal(results[1], results[0])


def test_options_given_at_the_split_are_used(pool):
    for r in pool.run(S.split_with_options, rank_dependent=False):
        assert r["error"] is None, r["error"]
        assert (r["block_size"], r["min_numel"], r["ops"]) == (32, 0, ["all_reduce"])
        assert r["cpu_threads"] == 1  # sized as at any group's creation
        assert r["stats"]["calls_compressed"] == 1, r["stats"]  # 256 elements: min_numel 0 compresses them


def test_ranks_that_split_with_different_options_all_raise(pool):
    for rank, r in enumerate(pool.run(S.split_with_options, rank_dependent=True)):
        assert r["error"] is not None, f"rank {rank} split with mismatched options"
        assert "min_numel: rank 0 has" in r["error"] and "same fp8comm.Options" in r["error"], r["error"]


def test_a_group_on_two_device_types_splits_its_transports_once(pool):
    for rank, r in enumerate(pool.run(S.split_of_a_group_on_two_device_types)):
        assert r["calls"] == [S.SPLITS[rank // 2]], r["calls"]  # torch asked twice, the transports split once
        assert r["one_object"] and r["type"] == "ProcessGroupFp8"
        assert torch.equal(r["sum"], torch.full((S.N,), float(sum(S.SPLITS[rank // 2]) + 2)))


def test_new_groups_never_split_from_an_fp8_backend(pool):
    for r in pool.run(S.split_source_under_eager_init):
        assert r == {"seen": None, "torch": "ProcessGroupFp8"}, r


def test_barrier_names_the_device_to_nccl(pool):
    if pool.backend != "fp8ncclsim":
        pytest.skip("device ids matter to NCCL only")
    for seen in pool.run(S.barrier_device_ids):
        assert seen == {"bound, none given": [0], "bound, [3] given": [3], "unbound, none given": []}, seen
