"""Eager init on a GPU (marked cuda; skipped without one; bench/gpu_session.sh
runs it as its own step): ``init_process_group(..., device_id=...)`` with
fp8nccl at world size 1, real NCCL.

- The world's NCCL communicator is connected at creation, and subgroups are
  split from it: torch.distributed.split_group (what DeviceMesh calls under
  eager init) through ProcessGroupFp8.split, new_group through fp8nccl's
  creator (its NCCL transport splits from the world's), and a plain "nccl"
  new_group through torch, from the world's NCCL transport; the world's NCCL
  counts each split.
- The subgroups compress as the world does and compute its bits.
- DeviceMesh 1-D and 2-D over the world.
- barrier() without device ids (what Lightning calls for a backend not named
  "nccl") runs on the bound device.
Both backend strings: "cpu:gloo,cuda:fp8nccl" (the CPU split by gloo itself)
and "cpu:fp8gloo,cuda:fp8nccl" (one object for both devices, split once).
"""
import os
import tempfile

import pytest
import torch
import torch.distributed as dist

import fp8comm

pytestmark = pytest.mark.cuda

if not (torch.cuda.is_available() and fp8comm._C.has_cuda and dist.is_nccl_available()):
    pytest.skip("needs a GPU, NCCL and fp8comm built with CUDA", allow_module_level=True)

N = 65536
OPTIONS = {"min_numel": 1024, "compress": "all"}
DEVICE = torch.device("cuda", 0)


@pytest.fixture(scope="module", params=["cpu:gloo,cuda:fp8nccl", "cpu:fp8gloo,cuda:fp8nccl"])
def world(request):
    with tempfile.TemporaryDirectory() as d:
        torch.cuda.set_device(DEVICE)
        dist.init_process_group(request.param, init_method=f"file://{os.path.join(d, 'store')}", rank=0,
                                world_size=1, device_id=DEVICE, pg_options=fp8comm.Options(**OPTIONS))
        try:
            yield request.param
        finally:
            dist.destroy_process_group()


def fp8(group):
    return group._get_backend(DEVICE)


def world_nccl():
    return fp8(dist.group.WORLD).transport("cuda")


def all_reduced(group):
    x = (torch.randn(N, generator=torch.Generator().manual_seed(0)) * 3).to(DEVICE)
    fp8comm.reset_stats(group)
    dist.all_reduce(x, group=group)
    torch.cuda.synchronize()
    return x.cpu(), fp8comm.get_stats(group)


def check_like_the_world(group):
    assert isinstance(fp8(group), fp8comm._C.ProcessGroupFp8) and fp8(group).name() == "fp8nccl"
    assert fp8(group).options == fp8(dist.group.WORLD).options
    got, stats = all_reduced(group)
    want, _ = all_reduced(dist.group.WORLD)
    assert torch.equal(got, want)
    assert stats["calls_compressed"] == 1 and stats["calls_passthrough"] == 0, stats


def test_the_world_is_connected_and_can_split(world):
    assert fp8(dist.group.WORLD).supports_splitting
    assert world_nccl()._is_initialized()


def test_split_group_splits_the_world_communicator(world):
    before = world_nccl().comm_split_count()
    sub = dist.split_group(split_ranks=[[0]], group_desc="eager-split")
    assert world_nccl().comm_split_count() == before + 1
    assert dist.get_backend(sub) == world
    check_like_the_world(sub)


def test_new_group_splits_the_world_communicator(world):
    before = world_nccl().comm_split_count()
    group = dist.new_group([0])
    check_like_the_world(group)  # the first collective at the latest connects it
    assert world_nccl().comm_split_count() == before + 1


def test_a_plain_nccl_group_splits_from_the_world_nccl(world):
    before = world_nccl().comm_split_count()
    plain = dist.new_group([0], backend="nccl")
    x = torch.ones(N, device=DEVICE)
    dist.all_reduce(x, group=plain)
    torch.cuda.synchronize()
    assert torch.equal(x.cpu(), torch.ones(N))
    assert world_nccl().comm_split_count() == before + 1


def test_device_mesh(world):
    from torch.distributed.device_mesh import init_device_mesh

    assert init_device_mesh("cuda", (1,)).get_group() == dist.group.WORLD
    mesh = init_device_mesh("cuda", (1, 1), mesh_dim_names=("dp", "tp"))
    for name in ("dp", "tp"):
        check_like_the_world(mesh.get_group(name))


def test_barrier_without_device_ids(world):
    fp8comm.reset_stats()
    dist.barrier()  # reaches fp8nccl with no device ids: it names the bound device to NCCL
    torch.cuda.synchronize()
    assert fp8comm.get_stats()["per_op"]["barrier"]["passthrough"] == 1
