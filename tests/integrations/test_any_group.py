"""FSDP2 and DDP on plain gloo groups with fp8comm's comms installed
(fp8comm.fsdp.compress_communication, fp8comm.hooks.fp8_compress_hook):
training equals the same training over an fp8gloo group with the same
options bitwise (losses and weights), with the FP8 weight all-gather beside
it; in HSDP only the shard dimension is compressed; the hook state pickles;
bad arguments are refused where they enter."""
from __future__ import annotations

import pickle

import pytest
import torch
import torch.distributed as dist

import fp8comm
import fp8comm.fsdp
import fp8comm.functional
import fp8comm.hooks
from tests.support.harness import PoolSpec, ctx
from tests.support.inputs import same_bits
from tests.support.scenarios import fsdp as S

OPTIONS = {"min_numel": 1024}


# ---------------------------------------------------------------- scenarios
# Run on every rank of the pool: module-level, the ranks import this module.

def _train(model, steps: int) -> list:
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    return S.train_losses(model, opt, ctx().rank, steps)


def _reset_stats(group) -> None:
    """Counts from here on only (earlier tests' compressors of the group count too)."""
    if fp8comm.registry.fp8_backends(group):
        fp8comm.reset_stats(group)


def fsdp2_training(plain: bool, compress: bool, ext: bool, all_gather: bool = False, steps: int = 3) -> dict:
    """FSDP2 per block then the root, on the plain gloo group (fp8comm's comms
    installed when `compress`) or on the fp8gloo default group."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    c = ctx()
    pg = c.gloo if plain else c.group
    options = fp8comm.Options(**OPTIONS, compress="all" if all_gather else None)
    if not plain and all_gather:
        pg = dist.new_group(backend="fp8gloo", pg_options=options)
    model = S.build("fp8", fp8_all_gather=ext)
    mesh = DeviceMesh.from_group(pg, "cpu")
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    installed = fp8comm.fsdp.compress_communication(model, all_gather=all_gather, options=options) if compress else 0
    _reset_stats(pg)
    losses = _train(model, steps)
    full = {k: v.full_tensor() for k, v in model.state_dict().items()}
    stats = fp8comm.get_stats(pg) if (compress or not plain) else None
    return {"losses": losses, "full": full, "installed": installed,
            "compressed": stats["calls_compressed"] if stats else 0,
            "per_op": sorted(stats["per_op"]) if stats else []}


def hsdp_compresses_the_shard_dimension() -> dict:
    """HSDP on a 2 x 2 mesh of plain gloo groups (replicate, shard)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    rank = ctx().rank
    shard = [dist.new_group([0, 1], backend="gloo"), dist.new_group([2, 3], backend="gloo")][rank // 2]
    replicate = [dist.new_group([0, 2], backend="gloo"), dist.new_group([1, 3], backend="gloo")][rank % 2]
    mesh = DeviceMesh.from_group([replicate, shard], "cpu", mesh=torch.arange(4).view(2, 2),
                                 mesh_dim_names=("replicate", "shard"))
    model = S.build("fp8")
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    fp8comm.fsdp.compress_communication(model, options=fp8comm.Options(**OPTIONS))
    losses = _train(model, 2)
    return {"losses": losses, "shard": fp8comm.get_stats(shard)["calls_compressed"],
            "replicate": len(fp8comm.registry.compressors(replicate))}


def ddp_training(plain: bool, steps: int = 4) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    c = ctx()
    model = S.build("fp8")
    ddp = DDP(model, process_group=c.gloo if plain else c.group)
    if plain:
        ddp.register_comm_hook(fp8comm.hooks.Fp8HookState(c.gloo, fp8comm.Options(**OPTIONS)),
                               fp8comm.hooks.fp8_compress_hook)
    _reset_stats(c.gloo if plain else c.group)
    losses = _train(ddp, steps)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return {"losses": losses, "flat": flat,
            "compressed": fp8comm.get_stats(c.gloo if plain else c.group)["calls_compressed"]}


# ---------------------------------------------------------------- tests

POOLS = [PoolSpec(2, "fp8gloo", pg_options=OPTIONS)]


def _same_training(a: dict, b: dict) -> None:
    assert a["losses"] == b["losses"]
    for key in a["full"]:
        assert same_bits(a["full"][key], b["full"][key]), key


@pytest.mark.parametrize("ext", [False, True], ids=["bf16-gather", "fp8-weight-gather"])
def test_fsdp2_on_plain_gloo_equals_fsdp2_on_fp8gloo(pool, ext):
    compressed = pool.run(fsdp2_training, plain=True, compress=True, ext=ext)
    on_fp8 = pool.run(fsdp2_training, plain=False, compress=False, ext=ext)
    plain = pool.run(fsdp2_training, plain=True, compress=False, ext=ext)
    for mine, theirs, exact in zip(compressed, on_fp8, plain):
        assert mine["installed"] == 1 + S.BLOCKS
        assert mine["compressed"] == theirs["compressed"] > 0
        assert "reduce_scatter_tensor" in mine["per_op"]
        _same_training(mine, theirs)
        assert mine["losses"] != exact["losses"]  # it did compress


def test_fsdp2_all_gather_too(pool):
    compressed = pool.run(fsdp2_training, plain=True, compress=True, ext=False, all_gather=True)
    on_fp8 = pool.run(fsdp2_training, plain=False, compress=False, ext=False, all_gather=True)
    for mine, theirs in zip(compressed, on_fp8):
        assert "all_gather_into_tensor" in mine["per_op"]
        assert mine["compressed"] == theirs["compressed"]
        _same_training(mine, theirs)


def test_ddp_hook_equals_ddp_on_fp8gloo(pool):
    mine, theirs = pool.run(ddp_training, True), pool.run(ddp_training, False)
    for a, b in zip(mine, theirs):
        assert a["compressed"] == b["compressed"] > 0
        assert a["losses"] == b["losses"]
        assert same_bits(a["flat"], b["flat"])


def test_hsdp_compresses_only_the_shard_dimension():
    p = PoolSpec(4, "fp8gloo", pg_options=OPTIONS).start()
    try:
        for r in p.run(hsdp_compresses_the_shard_dimension):
            assert r["shard"] > 0 and r["replicate"] == 0, r
    finally:
        p.close()


def test_hook_state_pickles_without_its_group():
    state = fp8comm.hooks.Fp8HookState(group=None, options=fp8comm.Options(block_size=64))
    restored = pickle.loads(pickle.dumps(state))
    assert restored.group is None and restored.options == state.options


def test_arguments_are_checked_where_they_enter():
    with pytest.raises(TypeError, match="fp8comm.hooks.Fp8HookState: options must be fp8comm.Options"):
        fp8comm.hooks.Fp8HookState(options={"block_size": 64})
    with pytest.raises(ValueError, match="has no fully_shard module; call fully_shard on it first"):
        fp8comm.fsdp.compress_communication(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="the options do not compress all_gather"):
        fp8comm.fsdp.compress_communication(torch.nn.Linear(2, 2), all_gather=True,
                                            options=fp8comm.Options(compress="reduce_scatter"))
