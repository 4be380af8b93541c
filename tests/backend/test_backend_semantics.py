"""fp8gloo and fp8ncclsim (fp8nccl's path on the CPU): exact passthrough, non-finite values, async Works and futures,
stats, and DDP / FSDP2 training — with real processes."""
from __future__ import annotations

from typing import Callable, NamedTuple

import pytest
import torch
import torch.distributed as dist

import fp8comm
from tests.support.harness import PoolSpec, ctx
from tests.support.inputs import rank_input
from tests.support.ops import Call, flat, reduce_op, run
from tests.support.scenarios import collectives
from tests.support.scenarios.collectives import Exact
from tests.support.torch_features import NO_GLOO_LIST_ALL_TO_ALL, gloo_has_list_all_to_all


# ---------------------------------------------------------------- scenarios
# Run on every rank of the pool: module-level, the ranks import this module.
# fp8comm's semantics beyond compression: what passes through is plain
# gloo's, bit for bit; the AVG / PREMUL_SUM emulation is exact; DDP and FSDP2
# train on the fp8 group.

class Case(NamedTuple):
    """One passthrough case: op (a name in the ops table), this rank's inputs
    from inp(n, dtype), the Call's reduce op and root, and what to compare of
    the outputs."""
    op: str
    inputs: Callable
    reduce: str = "sum"
    root: int | str = 0  # or "last": the last rank
    result: Callable = None  # outputs -> the tensor to compare (default: all of them, flat)


def _all_reduce_case(dtype, reduce):
    if dtype.is_floating_point:
        return Case("all_reduce", lambda inp, r, w: [inp(5000, dtype)], reduce)
    return Case("all_reduce", lambda inp, r, w: [inp(5000).mul(100).to(dtype)], reduce)


def _sparse(inp, rank, world):  # e.g. sparse embedding gradients under DDP: gloo sums them
    return [torch.sparse_coo_tensor(torch.tensor([[1, 5 + rank, 9]]), inp(3), (40,))]


PASSTHROUGH_CASES = {
    **{f"all_reduce_{dtype}_{reduce}": _all_reduce_case(getattr(torch, dtype), reduce)
       for dtype, reduce in [("int64", "sum"), ("int32", "max"), ("float64", "sum"), ("float32", "max"),
                             ("float32", "min"), ("float32", "product"), ("bfloat16", "max")]},
    "sparse_all_reduce": Case("all_reduce", _sparse, result=lambda outs: outs[0].coalesce().to_dense()),
    "small_all_reduce": Case("all_reduce", lambda inp, r, w: [inp(1000)]),  # below min_numel: a loss, a grad norm
    "small_reduce_scatter": Case("reduce_scatter_tensor", lambda inp, r, w: [inp(100 * w)]),
    "all_gather_default": Case("all_gather_tensor", lambda inp, r, w: [inp(5000)]),  # all_gather compression is opt-in
    "all_gather_fp8": Case("all_gather_tensor", lambda inp, r, w: [inp(5000).to(torch.float8_e4m3fn)]),
    "broadcast": Case("broadcast", lambda inp, r, w: [inp(3000)], root="last"),
    "reduce": Case("reduce", lambda inp, r, w: [inp(3000)]),
    "gather": Case("gather", lambda inp, r, w: [inp(300)]),
    "scatter": Case("scatter", lambda inp, r, w: [inp(300) * j for j in range(w)]),
    "all_to_all_single": Case("all_to_all_single", lambda inp, r, w: [inp(64 * w)]),
    "all_to_all": Case("all_to_all", lambda inp, r, w: [inp(40 * w)]),
    "send_recv": Case("send_recv", lambda inp, r, w: [inp(20000)]),
    "barrier": Case("barrier", lambda inp, r, w: [], result=lambda outs: torch.ones(1)),
    "zero_size": Case("zero_size", lambda inp, r, w: [torch.empty(0)]),
}


def _run_case(name: str, pg, rank: int, world: int) -> torch.Tensor:
    case = PASSTHROUGH_CASES[name]

    def inp(n, dtype=torch.float32):
        return rank_input(rank, n, dtype, seed=3)

    xs = case.inputs(inp, rank, world)
    call = Call(pg, rank, world, reduce_op(case.reduce), root=world - 1 if case.root == "last" else case.root)
    if case.op == "zero_size":  # an all_reduce and a reduce_scatter of nothing
        out = run("all_reduce", call, xs)[0]
        run("reduce_scatter_tensor", call, [torch.empty(0)])
        return out
    as_bytes = pg is ctx().gloo and xs and xs[0].dtype == torch.float8_e4m3fn  # plain gloo has no float8 types
    outs = run(case.op, call, [x.view(torch.uint8) for x in xs] if as_bytes else xs)
    if case.result is not None:
        return case.result(outs)
    out = flat(outs, xs[0] if xs else torch.empty(0))
    return out.view(torch.uint8) if out.dtype == torch.float8_e4m3fn else out


def passthrough_vs_gloo(case: str):
    """Runs one case on the fp8 group and on plain gloo with the same inputs;
    the results must be bitwise equal."""
    c = ctx()
    fp8comm.reset_stats(c.group)
    got = _run_case(case, c.group, c.rank, c.world)
    stats = fp8comm.get_stats(c.group)
    return Exact(got, _run_case(case, c.gloo, c.rank, c.world), stats)


def stats_of_last(case: str):
    """Stats of the fp8 group after running `case` once on it."""
    c = ctx()
    fp8comm.reset_stats(c.group)
    _run_case(case, c.group, c.rank, c.world)
    return fp8comm.get_stats(c.group)


AVG_PREMUL_FORMS = {  # the form -> (the op, its exact reference on plain gloo)
    "all_reduce": ("all_reduce", "all_reduce"),
    "all_reduce_coalesced": ("all_reduce_coalesced", "all_reduce_coalesced"),
    "reduce_scatter_tensor": ("reduce_scatter_tensor", "reduce_scatter_tensor"),
    "reduce_scatter_list": ("reduce_scatter_list", "reduce_scatter_tensor"),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter_coalesced", "reduce_scatter_tensor"),
}


def avg_premul_passthrough(form: str, dtype_name: str, op: str, factor_kind: str = ""):
    """AVG / PREMUL_SUM on tensors that pass through (float64 always; float32
    here under min_numel) over gloo, which has neither. The reference is plain
    gloo's SUM of each rank's input multiplied by its factor in the input's
    own dtype (then divided by the group size for AVG): bit for bit what the
    design promises."""
    c = ctx()
    w = c.world
    dtype = getattr(torch, dtype_name)
    factor = 0.1 * (c.rank + 1)  # one factor per rank, as NCCL allows; 0.1 is not a float32 number
    rop = reduce_op(op, factor, factor_kind, dtype)
    n = 999
    x = rank_input(c.rank, n * w, dtype, seed=5)
    pre = x * factor if op == "premul_sum" else x.clone()
    name, ref_name = AVG_PREMUL_FORMS[form]

    def inputs(t):
        return [t[:n].clone(), t[n:].clone()] if name == "all_reduce_coalesced" else [t.clone()]

    fp8comm.reset_stats(c.group)
    got = torch.cat(run(name, Call(c.group, c.rank, w, rop), inputs(x)))
    stats = fp8comm.get_stats(c.group)
    ref = torch.cat(run(ref_name, Call(c.gloo, c.rank, w), inputs(pre)))
    if op == "avg":
        ref = ref / w
    return Exact(got, ref, stats)


def _mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(128, 256), torch.nn.GELU(), torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 8)
    )


class Training(NamedTuple):
    params: torch.Tensor  # every parameter after training, flat
    losses: list  # per step
    stats: dict


def ddp_train(steps: int = 20, hook: str = "none"):
    from torch.nn.parallel import DistributedDataParallel as DDP

    c = ctx()
    model = DDP(_mlp(), process_group=c.group)
    if hook == "future":  # a comm hook built on Work.get_future(), as users write them
        def allreduce_hook(state, bucket):
            t = bucket.buffer().div_(c.world)
            return dist.all_reduce(t, group=c.group, async_op=True).get_future().then(lambda f: f.value()[0])
        model.register_comm_hook(None, allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    fp8comm.reset_stats(c.group)
    gen = torch.Generator().manual_seed(100 + c.rank)
    losses = []
    for _ in range(steps):
        x = torch.randn(32, 128, generator=gen)
        y = torch.randn(32, 8, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    flat_params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return Training(flat_params, losses, fp8comm.get_stats(c.group))


def fsdp2_train(which: str, steps: int = 30):
    """A small MLP under fully_shard on the fp8 group or on plain gloo; the
    losses are the global mean loss per step (stats None on plain gloo)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    c = ctx()
    pg = c.group if which == "fp8" else c.gloo
    mesh = DeviceMesh.from_group(pg, "cpu")
    model = _mlp(seed=1)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(200 + c.rank)
    target = torch.nn.Linear(128, 8)
    torch.nn.init.normal_(target.weight, std=0.2, generator=torch.Generator().manual_seed(5))
    losses = []
    for _ in range(steps):
        x = torch.randn(64, 128, generator=gen)
        with torch.no_grad():
            y = target(x)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, group=c.gloo)
        losses.append(mean.item() / c.world)
    stats = fp8comm.get_stats(c.group) if which == "fp8" else None
    return Training(None, losses, stats)


# -------------------------------------------------------------------- tests

POOLS = PoolSpec.grid(("fp8gloo", "fp8ncclsim"), (2, 3), pg_options={"min_numel": 4096})


@pytest.mark.parametrize("case", list(PASSTHROUGH_CASES))
def test_passthrough_is_bitwise_plain_gloo(pool, case):
    if case == "all_to_all" and not gloo_has_list_all_to_all():
        pytest.skip(NO_GLOO_LIST_ALL_TO_ALL)
    for r in pool.run(passthrough_vs_gloo, case):
        assert r.got.dtype == r.expected.dtype
        assert torch.equal(r.got.view(torch.uint8), r.expected.view(torch.uint8))
        assert r.stats["calls_compressed"] == 0, r.stats
        assert r.stats["calls_passthrough"] >= (0 if case == "send_recv" else 1), r.stats  # a third rank sits out
        assert r.stats["bytes_sent"] == r.stats["bytes_sent_uncompressed"]


@pytest.mark.parametrize("case", ["small_all_reduce", "all_reduce_float64_sum", "all_reduce_float32_max"])
def test_passthrough_is_counted(pool, case):
    for stats in pool.run(stats_of_last, case):
        assert stats["calls_passthrough"] == 1 and stats["calls_compressed"] == 0
        assert stats["bytes_sent"] == stats["bytes_sent_uncompressed"]


AVG_PREMUL_CASES = [
    (form, dtype, op, factor_kind)
    for form in ["all_reduce", "all_reduce_coalesced", "reduce_scatter_tensor", "reduce_scatter_list",
                 "reduce_scatter_tensor_coalesced"]
    for dtype in ["float64", "float32"]
    for op, factor_kind in [("avg", ""), ("premul_sum", "double"), ("premul_sum", "tensor")]
]


@pytest.mark.parametrize("form,dtype,op,factor_kind", AVG_PREMUL_CASES)
def test_avg_and_premul_passthrough_are_exact(pool, form, dtype, op, factor_kind):
    """gloo has no AVG / PREMUL_SUM; fp8gloo's emulation on the exact path
    keeps the double factor and multiplies in the tensor's own dtype, so
    float64 results are bit for bit plain gloo's SUM of the pre-multiplied
    inputs (a float32 factor would be off by ~1e-8 relative)."""
    for r in pool.run(avg_premul_passthrough, form, dtype, op, factor_kind):
        assert r.got.dtype == r.expected.dtype
        assert torch.equal(r.got, r.expected)
        assert r.stats["calls_compressed"] == 0 and r.stats["calls_passthrough"] >= 1


@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter", "all_gather"])
def test_non_finite_positions_survive(pool, kind):
    results = pool.run(collectives.non_finite, kind)
    for r in results:  # the compressed path, not an exact passthrough
        assert r.stats["calls_compressed"] == 1 and r.stats["calls_passthrough"] == 0
    masks = [r.mask for r in results]
    n, world = 8192, pool.world
    expected = torch.zeros_like(masks[0])
    if kind == "all_reduce":
        expected[[5, n + 9, 2 * n - 1, 17]] = True
        for m in masks:
            assert torch.equal(m, expected)
    elif kind == "reduce_scatter":
        for rank, m in enumerate(masks):
            bad = {5, n + 9, 2 * n - 1, 17}
            idx = [i - rank * n for i in bad if rank * n <= i < (rank + 1) * n]
            exp = torch.zeros(n, dtype=torch.bool)
            exp[idx] = True
            assert torch.equal(m, exp)
    else:
        span = n * world
        expected[[5, n + 9, 2 * n - 1]] = True
        expected[(world - 1) * span + 17] = True
        for m in masks:
            assert torch.equal(m, expected)


def test_async_ops_in_flight_and_futures(pool):
    for r in pool.run(collectives.async_in_flight):
        assert min(r.sqnrs_db) >= 27.0 and max(r.sqnrs_db) < 45.0
        assert r.stats["calls_compressed"] == 5 and r.stats["calls_passthrough"] == 0


@pytest.mark.parametrize("hook", ["none", "future"])
def test_ddp_replicas_stay_bitwise_identical(pool, hook):
    results = pool.run(ddp_train, 20, hook)
    params = [r.params for r in results]
    for p in params[1:]:
        assert torch.equal(p.view(torch.int32), params[0].view(torch.int32))
    assert results[0].stats["calls_compressed"] >= 20  # gradient buckets went compressed
    losses = results[0].losses
    assert losses[-1] < losses[0]  # and it learns


def test_fsdp2_tracks_plain_gloo(pool):
    fp8 = pool.run(fsdp2_train, "fp8")
    gloo = pool.run(fsdp2_train, "gloo")
    fp8_losses, gloo_losses = fp8[0].losses, gloo[0].losses
    assert fp8[0].stats["per_op"]["reduce_scatter_tensor"]["compressed"] > 0
    assert fp8_losses[-1] < 0.5 * fp8_losses[0]
    assert abs(fp8_losses[-1] - gloo_losses[-1]) <= 0.02 * gloo_losses[-1]
