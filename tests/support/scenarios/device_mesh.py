"""Scenarios for tests/integrations/test_device_mesh.py (run on every rank of
a 4-rank fp8gloo DistPool): DeviceMesh over an fp8 world, its dimension
groups made the lazy way (new_group) or as under eager init (split_group),
and HSDP-shaped FSDP2 training with FP8 compute over a 2x2 mesh."""
from __future__ import annotations

import contextlib
from unittest import mock

import torch
import torch.distributed as dist

import fp8comm
from tests.support.groups import cpu_as_accelerator
from tests.support.harness import ctx
from tests.support.inputs import rank_input
from tests.support.scenarios import fsdp as F

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
