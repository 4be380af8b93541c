"""Scenarios of fp8comm's semantics beyond compression (run on every rank of a
DistPool): what passes through is plain gloo's, bit for bit; the AVG /
PREMUL_SUM emulation is exact; DDP and FSDP2 train on the fp8 group."""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.distributed as dist

import fp8comm
from tests.support.harness import ctx
from tests.support.inputs import rank_input
from tests.support.ops import Call, flat, reduce_op, run


class Exact(NamedTuple):
    got: torch.Tensor  # on the fp8 group
    expected: torch.Tensor  # on plain gloo (or the exact reference)
    stats: dict  # the fp8 group's, for the call


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
