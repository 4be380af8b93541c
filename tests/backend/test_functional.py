"""fp8comm.functional (DESIGN.md, "Any group"): all_reduce,
reduce_scatter_tensor and all_gather_into_tensor compress over a plain
group's own backend (gloo, and the fp8ncclsim transport standing for nccl)
and give bitwise the result of the same call on an fp8gloo / fp8ncclsim
group with the same options, flat and in the inter_node scope, with
and without async_op; one compressor per (group, device, options), counted by
get_stats(group) and switched off by uncompressed(group); errors name the
call and what to pass."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import fp8comm
import fp8comm.functional as F
from fp8comm import registry
from tests.support.harness import PoolSpec, ctx
from tests.support.inputs import rank_input, same_bits


# ---------------------------------------------------------------- scenarios
# Run on every rank of the pool: module-level, the ranks import this module.

PLAIN = {"fp8gloo": "gloo", "fp8ncclsim": "ncclsim"}


def _groups(options: dict):
    """A plain group and an fp8 group of the same ranks (the pool's kind), with `options`."""
    world = list(range(ctx().world))
    fp8 = dist.get_backend()
    return dist.new_group(world, backend=PLAIN[fp8]), dist.new_group(
        world, backend=fp8, pg_options=fp8comm.Options(**options))


def _call(op: str, fn_group, rank: int, world: int, numel: int, dtype, reduce_op, async_op: bool, via: str,
          options: dict):
    x = rank_input(rank, numel * world, dtype, seed=3)
    if op == "all_reduce":
        out, args = x.clone(), ()
    elif op == "reduce_scatter_tensor":
        out, args = torch.empty(numel, dtype=dtype), (x,)
    else:
        out, args = torch.empty(numel * world, dtype=dtype), (x[rank * numel:(rank + 1) * numel].clone(),)
    kwargs = {"group": fn_group, "async_op": async_op}
    if op != "all_gather_into_tensor":
        kwargs["op"] = reduce_op
    if via == "functional":
        work = getattr(F, op)(out, *args, options=fp8comm.Options(**options), **kwargs)
    else:
        work = getattr(dist, op)(out, *args, **kwargs)
    if async_op:
        assert work is not None
        future_value = work.get_future().wait()
        assert future_value is not None
    else:
        assert work is None
    return out


def functional_equals_fp8_group(op: str, dtype_name: str, reduce_name: str, async_op: bool, options: dict) -> dict:
    c = ctx()
    dtype = getattr(torch, dtype_name)
    reduce_op = getattr(dist.ReduceOp, reduce_name)
    plain, fp8 = _groups(options)
    numel = 4096 + 96  # several blocks, not a power of two
    got = _call(op, plain, c.rank, c.world, numel, dtype, reduce_op, async_op, "functional", options)
    want = _call(op, fp8, c.rank, c.world, numel, dtype, reduce_op, async_op, "dist", options)
    return {"same": same_bits(got, want), "compressed": fp8comm.get_stats(plain)["calls_compressed"]}


def one_compressor_per_options() -> dict:
    plain, _ = _groups({})
    t = torch.ones(20000)
    F.all_reduce(t, group=plain)
    F.all_reduce(t, group=plain)
    F.all_reduce(t, group=plain, options=fp8comm.Options(block_size=64))
    made = registry.compressors(plain)
    return {"count": len(made), "stats": fp8comm.get_stats(plain)["calls_compressed"],
            "same": F.compressor(plain, "cpu", None) is made[0]}


def uncompressed_block_covers_it() -> dict:
    plain, _ = _groups({})
    t = rank_input(ctx().rank, 20000, torch.float32, seed=1)
    want = t.clone()
    dist.all_reduce(want, group=plain)  # gloo itself
    F.all_reduce(t.clone(), group=plain)  # creates the compressor
    with fp8comm.uncompressed(plain):
        got = t.clone()
        F.all_reduce(got, group=plain)
    stats = fp8comm.get_stats(plain)
    return {"exact": same_bits(got, want), "compressed": stats["calls_compressed"],
            "passthrough": stats["calls_passthrough"]}


def on_an_fp8_group_uses_its_backend() -> dict:
    _, fp8 = _groups({"min_numel": 1024})
    backend = fp8._get_backend(torch.device("cpu"))
    used = F.compressor(fp8, "cpu", None) is backend
    try:
        F.all_reduce(torch.ones(4096), group=fp8, options=fp8comm.Options(block_size=64))
        error = ""
    except ValueError as e:
        error = str(e)
    return {"used": used, "error": error, "made": len(registry.compressors(fp8))}


# ---------------------------------------------------------------- tests

POOLS = [
    PoolSpec(2, "fp8gloo", id="flat-2"),
    PoolSpec(3, "fp8gloo", id="flat-3"),
    PoolSpec(4, "fp8gloo", env={"FP8COMM_LOCAL_SIZE": "2"}, id="nodes-2x2", attrs={"scope": "inter_node"}),
    PoolSpec(3, "fp8ncclsim", id="ncclsim-3"),
    PoolSpec(4, "fp8ncclsim", env={"FP8COMM_LOCAL_SIZE": "2"}, id="ncclsim-nodes-2x2",
             attrs={"scope": "inter_node"}),
]
OPS = ["all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor"]


def _options(pool, **extra) -> dict:
    return {"compress": "all", "min_numel": 1024, "scope": getattr(pool, "scope", "all"), **extra}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("async_op", [False, True])
def test_bitwise_the_fp8_groups_result(pool, op, dtype, async_op):
    for r in pool.run(functional_equals_fp8_group, op, dtype, "SUM", async_op, _options(pool)):
        assert r["same"], r
        assert r["compressed"] == 1, r


@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter_tensor"])
@pytest.mark.parametrize("reduce", ["AVG", "MAX"])
def test_other_reductions(pool, op, reduce):
    # MAX passes through on both (no compressed MAX); AVG is compressed on both.
    for r in pool.run(functional_equals_fp8_group, op, "float32", reduce, False, _options(pool)):
        assert r["same"], r
        assert r["compressed"] == (1 if reduce == "AVG" else 0), r


def test_block_size_option_reaches_the_wire(pool):
    for r in pool.run(functional_equals_fp8_group, "all_reduce", "float32", "SUM", False,
                      _options(pool, block_size=128, wire_format="e5m2")):
        assert r["same"], r


def test_one_compressor_per_group_and_options(pool):
    for r in pool.run(one_compressor_per_options):
        assert r == {"count": 2, "stats": 3, "same": True}, r


def test_uncompressed_block_covers_it(pool):
    for r in pool.run(uncompressed_block_covers_it):
        assert r == {"exact": True, "compressed": 1, "passthrough": 1}, r


def test_on_an_fp8_group_its_own_backend_runs(pool):
    for r in pool.run(on_an_fp8_group_uses_its_backend):
        assert r["used"] and r["made"] == 0, r
        assert "fp8comm.functional.all_reduce: the group's backend is fp8comm's" in r["error"], r


def test_errors_name_the_call():
    with pytest.raises(TypeError, match=r"fp8comm.functional.all_reduce: group must be a torch.distributed "):
        F.all_reduce(torch.ones(4), group="dp")
    with pytest.raises(TypeError, match=r"fp8comm.functional.reduce_scatter_tensor: input must be a torch.Tensor"):
        F.reduce_scatter_tensor(torch.ones(4), [torch.ones(4)])
