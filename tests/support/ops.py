"""One table of the collectives the tests issue: op name -> a function that
issues that op, in that form, on a group. The passthrough, soak, fuzz,
min_numel and nothing-lost scenarios all issue their calls through it.

Every entry takes a Call (where and how) and this rank's input tensors, one
per tensor of the call, and returns Issued: the Work to wait on (None for a
synchronous call) and what the op writes on this rank, one output per input
(in-place ops: the inputs themselves). A form that has no multi-tensor call
(all_reduce, the tensor and list forms) issues one call per input and waits
on all but the last. Outputs are allocated as zeros of the input's dtype
unless given.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import torch
import torch.distributed as dist


@dataclasses.dataclass
class Call:
    group: Any
    rank: int
    world: int
    op: Any = dist.ReduceOp.SUM
    async_op: bool = False
    root: int = 0  # src / dst of broadcast, reduce, gather and scatter


class Issued(NamedTuple):
    work: Any  # wait on it before reading the outputs; None when the call was synchronous
    outputs: list  # what the op wrote on this rank


def reduce_op(kind: str, factor: float = 1.0, factor_kind: str = "double", dtype=torch.float32, device="cpu"):
    """sum, avg, max, min, product, or premul_sum with `factor` as a double or
    as a tensor of `dtype` on `device` (factor_kind "tensor")."""
    if kind == "premul_sum":
        return dist._make_nccl_premul_sum(
            torch.tensor(factor, dtype=dtype, device=device) if factor_kind == "tensor" else factor)
    return {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX,
            "min": dist.ReduceOp.MIN, "product": dist.ReduceOp.PRODUCT}[kind]


def flat(outputs: list, like: torch.Tensor) -> torch.Tensor:
    """The outputs of a call as one flat tensor (empty, of like's dtype, when there are none)."""
    return torch.cat([o.reshape(-1) for o in outputs]) if outputs else like.new_zeros(0)


def _each(c: Call, pairs, issue) -> Any:
    """Issues issue(*pair) for every pair; waits on all but the last Work."""
    work = None
    for i, pair in enumerate(pairs):
        work = issue(*pair)
        if work is not None and i < len(pairs) - 1:
            work.wait()
    return work


def _outputs(given, xs, numel):
    return given if given is not None else [x.new_zeros(numel(x)) for x in xs]


def all_reduce(c, xs, outs=None):
    return Issued(_each(c, [(x,) for x in xs], lambda x: dist.all_reduce(x, op=c.op, group=c.group,
                                                                         async_op=c.async_op)), xs)


def all_reduce_coalesced(c, xs, outs=None):
    return Issued(dist.all_reduce_coalesced(xs, op=c.op, group=c.group, async_op=c.async_op), xs)


def reduce(c, xs, outs=None):
    return Issued(_each(c, [(x,) for x in xs], lambda x: dist.reduce(x, dst=c.root, op=c.op, group=c.group,
                                                                     async_op=c.async_op)), xs)


def broadcast(c, xs, outs=None):
    return Issued(_each(c, [(x,) for x in xs], lambda x: dist.broadcast(x, src=c.root, group=c.group,
                                                                        async_op=c.async_op)), xs)


def _coalesced(c, pairs, issue):
    with dist._coalescing_manager(group=c.group, async_ops=c.async_op) as cm:
        for pair in pairs:
            issue(*pair)
    return cm if c.async_op else None


def reduce_scatter_tensor(c, xs, outs=None):
    outs = _outputs(outs, xs, lambda x: x.numel() // c.world)
    return Issued(_each(c, list(zip(outs, xs)), lambda o, x: dist.reduce_scatter_tensor(
        o, x, op=c.op, group=c.group, async_op=c.async_op)), outs)


def reduce_scatter_list(c, xs, outs=None):
    outs = _outputs(outs, xs, lambda x: x.numel() // c.world)
    return Issued(_each(c, list(zip(outs, xs)), lambda o, x: dist.reduce_scatter(
        o, list(x.chunk(c.world)), op=c.op, group=c.group, async_op=c.async_op)), outs)


def reduce_scatter_coalesced(c, xs, outs=None):
    outs = _outputs(outs, xs, lambda x: x.numel() // c.world)
    return Issued(_coalesced(c, zip(outs, xs), lambda o, x: dist.reduce_scatter_tensor(o, x, op=c.op,
                                                                                        group=c.group)), outs)


def all_gather_tensor(c, xs, outs=None):
    outs = _outputs(outs, xs, lambda x: x.numel() * c.world)
    return Issued(_each(c, list(zip(outs, xs)), lambda o, x: dist.all_gather_into_tensor(
        o, x, group=c.group, async_op=c.async_op)), outs)


def all_gather_list(c, xs, outs=None):
    """Each output is one tensor of world x input elements; the call gets its
    per-rank chunks."""
    outs = _outputs(outs, xs, lambda x: x.numel() * c.world)
    return Issued(_each(c, list(zip(outs, xs)), lambda o, x: dist.all_gather(
        list(o.chunk(c.world)), x, group=c.group, async_op=c.async_op)), outs)


def all_gather_coalesced(c, xs, outs=None):
    outs = _outputs(outs, xs, lambda x: x.numel() * c.world)
    return Issued(_coalesced(c, zip(outs, xs), lambda o, x: dist.all_gather_into_tensor(o, x, group=c.group)),
                  outs)


def all_gather_coalesced_lists(c, xs, outs=None):
    """The deprecated list-of-lists all_gather_coalesced; outputs rank by rank."""
    per_rank = [[x.new_zeros(x.numel()) for x in xs] for _ in range(c.world)]
    work = dist.all_gather_coalesced(per_rank, xs, group=c.group, async_op=c.async_op)
    return Issued(work, [t for tensors in per_rank for t in tensors])


def gather(c, xs, outs=None):
    """xs: one tensor; the root's outputs are every rank's, the others' none."""
    x = xs[0]
    outs = [x.new_zeros(x.numel()) for _ in range(c.world)] if c.rank == c.root else None
    work = dist.gather(x, outs, dst=c.root, group=c.group, async_op=c.async_op)
    return Issued(work, outs or [])


def scatter(c, xs, outs=None):
    """xs: the root's scatter list (world tensors; the others pass tensors of
    the same sizes, which are not read)."""
    out = xs[0].new_zeros(xs[0].numel()) if outs is None else outs[0]
    work = dist.scatter(out, list(xs) if c.rank == c.root else None, src=c.root, group=c.group,
                        async_op=c.async_op)
    return Issued(work, [out])


def all_to_all_single(c, xs, outs=None):
    outs = _outputs(outs, xs, lambda x: x.numel())
    return Issued(dist.all_to_all_single(outs[0], xs[0], group=c.group, async_op=c.async_op), outs)


def uneven_splits(rank: int, world: int):
    """(send, receive) split sizes of all_to_all_single_uneven: rank r sends
    r + 1 + j elements to rank j."""
    return [rank + 1 + j for j in range(world)], [r + 1 + rank for r in range(world)]


def all_to_all_single_uneven(c, xs, outs=None):
    """xs: one tensor of sum(uneven_splits(rank)[0]) elements."""
    sends, recvs = uneven_splits(c.rank, c.world)
    out = xs[0].new_zeros(sum(recvs))
    return Issued(dist.all_to_all_single(out, xs[0], recvs, sends, group=c.group, async_op=c.async_op), [out])


def all_to_all(c, xs, outs=None):
    """xs: one tensor of world chunks, chunk j for rank j."""
    chunks = list(xs[0].chunk(c.world))
    outs = [t.new_zeros(t.numel()) for t in chunks]
    return Issued(dist.all_to_all(outs, chunks, group=c.group, async_op=c.async_op), outs)


def send_recv(c, xs, outs=None):
    """Rank 0 sends its tensor to rank 1, which receives into its own; other ranks sit out."""
    if c.rank == 0:
        dist.send(xs[0], dst=1, group=c.group)
    elif c.rank == 1:
        dist.recv(xs[0], src=0, group=c.group)
    return Issued(None, xs)


def batch_isend_irecv(c, xs, outs=None):
    """A ring: each rank sends to the next and receives from the previous."""
    recv = xs[0].new_zeros(xs[0].numel())
    ops = [dist.P2POp(dist.isend, xs[0], (c.rank + 1) % c.world, group=c.group),
           dist.P2POp(dist.irecv, recv, (c.rank - 1) % c.world, group=c.group)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return Issued(None, [recv])


def barrier(c, xs, outs=None):
    return Issued(dist.barrier(group=c.group, async_op=c.async_op), [])


OPS: dict[str, Callable[..., Issued]] = {f.__name__: f for f in (
    all_reduce, all_reduce_coalesced, reduce, broadcast,
    reduce_scatter_tensor, reduce_scatter_list, reduce_scatter_coalesced,
    all_gather_tensor, all_gather_list, all_gather_coalesced, all_gather_coalesced_lists,
    gather, scatter, all_to_all_single, all_to_all_single_uneven, all_to_all, send_recv, batch_isend_irecv,
    barrier)}


# The compressed ops' names above -> the collective each runs.
FAMILIES = {
    "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_list": "reduce_scatter",
    "reduce_scatter_coalesced": "reduce_scatter",
    "all_gather_tensor": "all_gather",
    "all_gather_list": "all_gather",
    "all_gather_coalesced": "all_gather",
}


def run(name: str, call: Call, inputs: list, outputs: list | None = None) -> list:
    """Issues op `name` and waits for it; returns its outputs."""
    issued = OPS[name](call, inputs, outputs)
    if issued.work is not None and call.async_op:
        issued.work.wait()
    return issued.outputs


def run_counted(name: str, group, rank: int, world: int, x: torch.Tensor, op) -> tuple:
    """Op `name` on `group` with this rank's input `x` (left as it was), its
    stats counted from zero: (the one output, fp8comm.get_stats(group))."""
    import fp8comm

    fp8comm.reset_stats(group)
    out = run(name, Call(group, rank, world, op=op), [x.clone()])[0]
    return out, fp8comm.get_stats(group)
