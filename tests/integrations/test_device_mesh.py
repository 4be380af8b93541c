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
from __future__ import annotations

import contextlib
from unittest import mock

import pytest
import torch
import torch.distributed as dist

import fp8comm
from tests.support.groups import cpu_as_accelerator
from tests.support.harness import PoolSpec, ctx
from tests.support.inputs import rank_input
from tests.support.reference import sqnr_db
from tests.support.scenarios import fsdp as F
from tests.support.stats import calls as stats_calls
from tests.support.torch_features import SPLIT_NEEDS_CUDA, split_group_takes_the_bound_device


# ---------------------------------------------------------------- scenarios
# Run on every rank of the pool: module-level, the ranks import this module.
# DeviceMesh over the fp8 world, its dimension groups made the lazy way
# (new_group) or as under eager init (split_group), and HSDP-shaped FSDP2
# training with FP8 compute over a 2x2 mesh.

N = 8192  # elements per rank: above the pool's min_numel


def fp8_backend(group):
    return group._get_backend(torch.device("cpu"))


def _mesh(shape, names, eager: bool):
    """init_device_mesh("cpu", ...) as a lazily initialized world makes it
    (new_group per dimension) or, with `eager`, as an eagerly initialized one
    does (split_group): the other function refuses to run, so the path is
    the one named."""
    from torch.distributed import device_mesh

    unexpected = "new_group" if eager else "split_group"

    def refuse(*args, **kwargs):
        raise AssertionError(f"DeviceMesh called {unexpected}: not the path under test")

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(device_mesh, unexpected, refuse))
        if eager:
            stack.enter_context(cpu_as_accelerator())
        return device_mesh.init_device_mesh("cpu", shape, mesh_dim_names=names)


def mesh_all_reduces(shape, names, eager: bool, seed: int):
    """An all_reduce on each dimension's group of a new mesh: per dimension
    its ranks, backend, options, the result and the exact sum, the stats."""
    c = ctx()
    mesh = _mesh(tuple(shape), tuple(names), eager)
    world = fp8_backend(c.group)
    out = {}
    for name in names:
        group = mesh.get_group(name)
        members = dist.get_process_group_ranks(group)
        be = fp8_backend(group)
        fp8comm.reset_stats(group)
        x = rank_input(c.rank, N, seed=seed, scale=3.0)
        dist.all_reduce(x, group=group)
        out[name] = {
            "members": members, "type": type(be).__name__, "backend_string": dist.get_backend(group),
            "same_options": be.options == world.options, "is_world": group == c.group, "sum": x,
            "exact": torch.stack([rank_input(r, N, seed=seed, scale=3.0).double() for r in members]).sum(0),
            "stats": fp8comm.get_stats(group),
        }
    return out


def hsdp_training(plain: bool, steps: int = 3):
    """FSDP2 as HSDP: a 2x2 mesh ("replicate", "shard"), each block and the
    root sharded over "shard" and replicated over "replicate", the block
    linears Fp8Linear (FP8 compute); the mesh's groups are the world's fp8
    backend or, with `plain`, plain gloo (the reference). Returns the global
    mean losses, the stats of each mesh dimension, Fp8Linear's counts and
    this rank's parameter shards after training."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    c = ctx()
    names = ("replicate", "shard")
    override = dict.fromkeys(names, "gloo") if plain else None
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=names, backend_override=override)
    model = F.build("fp8")
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    groups = {name: mesh.get_group(name) for name in names}
    if not plain:
        for group in groups.values():
            fp8comm.reset_stats(group)
    fp8comm.nn.reset_linear_stats()
    losses = F.train_losses(model, opt, c.rank, steps)
    return {
        "losses": losses,
        "stats": None if plain else {name: fp8comm.get_stats(g) for name, g in groups.items()},
        "fp8_calls": fp8comm.nn.linear_stats()["fp8_calls"],
        "shards": {k: v.to_local().detach().clone() for k, v in model.state_dict().items()},
        "mesh": mesh.mesh.tolist(),
    }


# -------------------------------------------------------------------- tests

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
    results = pool.run(mesh_all_reduces, [4], ["dp"], eager=False, seed=1)
    for rank, r in enumerate(results):
        assert r["dp"]["is_world"]
        check_dimension(rank, "dp", r["dp"], [0, 1, 2, 3])
    check_all_reduces_agree(results, "dp")


@pytest.mark.parametrize("eager", [False, True], ids=["lazy-new-group", "eager-split"])
def test_2d_mesh_groups_are_fp8_groups(pool, eager):
    if eager and not split_group_takes_the_bound_device():
        pytest.skip(SPLIT_NEEDS_CUDA)
    results = pool.run(mesh_all_reduces, [2, 2], ["dp", "tp"], eager=eager, seed=2)
    for rank, r in enumerate(results):
        check_dimension(rank, "dp", r["dp"], [rank % 2, rank % 2 + 2])
        check_dimension(rank, "tp", r["tp"], [rank // 2 * 2, rank // 2 * 2 + 1])
    for name in ("dp", "tp"):
        check_all_reduces_agree(results, name)


def test_hsdp_trains_with_fp8_compute_and_communication(pool):
    fp8 = pool.run(hsdp_training, plain=False, timeout=300)
    plain = pool.run(hsdp_training, plain=True, timeout=300)
    assert fp8[0]["mesh"] == [[0, 1], [2, 3]]
    for rank, r in enumerate(fp8):
        stats = r["stats"]
        # per step: a reduce-scatter over "shard" and an all-reduce over "replicate" for each
        # of the two blocks and the root, all compressed
        assert stats_calls(stats["shard"])["reduce_scatter_tensor"] == {"compressed": 9, "passthrough": 0}, stats
        assert stats_calls(stats["replicate"]) == {"all_reduce": {"compressed": 9, "passthrough": 0}}, stats
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
