"""DeviceMesh over an fp8 world, 4 real processes on fp8gloo.

- 1-D: the mesh's group is the world itself.
- 2-D, lazily initialized world: DeviceMesh makes each dimension's groups
  with new_group, which names no options: they take the world's, so they
  compress as the world does.
- 2-D under eager init (``init_process_group(device_id=...)``): DeviceMesh
  splits the world (split_group); the CPU stands in for the accelerator.
- HSDP: FSDP2 over a 2x2 mesh with Fp8Linear layers; its gradient
  reduce-scatters (over "shard") and all-reduces (over "replicate") go over
  the wire compressed, the replicas of each shard stay bitwise identical
  (all_reduce gives every rank the same bits), and the losses follow those of
  the same training over plain gloo groups.
Each all_reduce is checked against the exact sum; a split group's bits
against new_group's are in tests/backend/test_split.py.
"""
import pytest
import torch

from tests.support.harness import PoolSpec
from tests.support.reference import sqnr_db
from tests.support.scenarios import device_mesh as M
from tests.support.torch_features import SPLIT_NEEDS_CUDA, split_group_takes_the_bound_device

MIN_SQNR_DB = 25.0  # E4M3 through two quantizations: ~27-31 dB on randn


POOLS = [PoolSpec(4, "fp8gloo", pg_options={"min_numel": 1024})]


def check_dimension(rank, name, d, members):
    assert d["members"] == members, (rank, name, d["members"])
    assert d["type"] == "ProcessGroupFp8" and d["backend_string"] == "fp8gloo", d
    assert d["same_options"], f"{name}: not the world's options"
    assert sqnr_db(d["exact"], d["sum"]) > MIN_SQNR_DB, name
    assert d["stats"]["calls_compressed"] == 1 and d["stats"]["calls_passthrough"] == 0, d["stats"]


def check_all_reduces_agree(results, name):
    for r in results:
        peers = [results[m][name]["sum"] for m in r[name]["members"]]
        assert all(torch.equal(p, peers[0]) for p in peers), f"{name}: members disagree"


def test_1d_mesh_is_the_world(pool):
    results = pool.run(M.mesh_all_reduces, [4], ["dp"], eager=False, seed=1)
    for rank, r in enumerate(results):
        assert r["dp"]["is_world"]
        check_dimension(rank, "dp", r["dp"], [0, 1, 2, 3])
    check_all_reduces_agree(results, "dp")


@pytest.mark.parametrize("eager", [False, True], ids=["lazy-new-group", "eager-split"])
def test_2d_mesh_groups_are_fp8_groups(pool, eager):
    if eager and not split_group_takes_the_bound_device():
        pytest.skip(SPLIT_NEEDS_CUDA)
    results = pool.run(M.mesh_all_reduces, [2, 2], ["dp", "tp"], eager=eager, seed=2)
    for rank, r in enumerate(results):
        check_dimension(rank, "dp", r["dp"], [rank % 2, rank % 2 + 2])
        check_dimension(rank, "tp", r["tp"], [rank // 2 * 2, rank // 2 * 2 + 1])
    for name in ("dp", "tp"):
        check_all_reduces_agree(results, name)


def test_hsdp_trains_with_fp8_compute_and_communication(pool):
    fp8 = pool.run(M.hsdp_training, plain=False, timeout=300)
    plain = pool.run(M.hsdp_training, plain=True, timeout=300)
    assert fp8[0]["mesh"] == [[0, 1], [2, 3]]
    for rank, r in enumerate(fp8):
        stats = r["stats"]
        # per step: a reduce-scatter over "shard" and an all-reduce over "replicate" for each
        # of the two blocks and the root, all compressed
        assert stats["shard"]["per_op"]["reduce_scatter_tensor"] == {"compressed": 9, "passthrough": 0}, stats
        assert stats["replicate"]["per_op"] == {"all_reduce": {"compressed": 9, "passthrough": 0}}, stats
        assert stats["replicate"]["bytes_sent"] < 0.3 * stats["replicate"]["bytes_sent_uncompressed"], stats
        # the parameter all-gathers pass through (all_gather compression is opt-in)
        passed = {op: n["passthrough"] for op, n in stats["shard"]["per_op"].items() if n["passthrough"]}
        assert set(passed) == {"all_gather_into_tensor"}, stats
        assert r["fp8_calls"] == plain[rank]["fp8_calls"] > 0  # FP8 GEMMs in both runs
        assert r["losses"] == fp8[0]["losses"]
    for a, b in ((0, 2), (1, 3)):  # the two replicas of each shard
        for key, shard in fp8[a]["shards"].items():
            assert torch.equal(shard, fp8[b]["shards"][key]), f"replicas of {key} differ"
    fp8_losses, plain_losses = fp8[0]["losses"], plain[0]["losses"]
    assert fp8_losses[-1] < fp8_losses[0]  # it trains
    for got, ref in zip(fp8_losses, plain_losses):
        assert abs(got - ref) < 0.01 * ref, (fp8_losses, plain_losses)
