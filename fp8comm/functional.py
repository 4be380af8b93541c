"""Compressed collectives on any process group (DESIGN.md, "Any group").

    import fp8comm.functional as F
    F.reduce_scatter_tensor(out, grads, group=mesh.get_group("dp"))  # a plain nccl / gloo group
    tokens = F.all_to_all_single_autograd(x, out_splits, in_splits, ep_group, options=E4M3_A2A)  # MoE dispatch

The group's own backend is the transport of a ProcessGroupFp8 made on the
first call for (group, device, options): a collective step, as the call is.
Results are bitwise those of the same call on an fp8 group with those
options; ``fp8comm.get_stats(group)`` and ``fp8comm.uncompressed(group)``
cover it.
"""
from __future__ import annotations

import types

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions

from . import _C, backend, registry, splits
from .options import Options
from .uncompressed_blocks import uncompressed

# Under torch.compile each call is a graph break and runs eagerly: dynamo
# cannot trace into the backend object (it is not one of torch's functional
# collectives, whose ops it captures).
_eager = torch.compiler.disable


def _group_or_default(group, op: str) -> dist.ProcessGroup:
    if group is None:
        if not dist.is_initialized():
            raise RuntimeError(f"fp8comm.functional.{op}: no process group: call init_process_group first "
                               "or pass group=")
        return dist.distributed_c10d._get_default_group()
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"fp8comm.functional.{op}: group must be a torch.distributed ProcessGroup, "
                        f"got {type(group).__name__}")
    return group


def _resolved(options, op: str) -> Options:
    if options is None:
        return Options().resolved()
    if not isinstance(options, Options):
        raise TypeError(f"fp8comm.functional.{op}: options must be fp8comm.Options, got {type(options).__name__}")
    return options.resolved()


def _inner(group: dist.ProcessGroup, device: torch.device, op: str):
    try:
        inner = group._get_backend(device)
    except RuntimeError as e:
        raise ValueError(f"fp8comm.functional.{op}: the group has no backend for {device.type} tensors ({e}); "
                         "create it with a backend for that device") from e
    if not isinstance(inner, _C.ProcessGroupFp8) and inner.name() not in ("gloo", "nccl"):
        raise ValueError(f"fp8comm.functional.{op}: the group's {device.type} backend is {inner.name()!r}; "
                         "fp8comm compresses over gloo and nccl groups")
    return inner


def compressor(group, device: torch.device, options, op: str = "compressor"):
    """The ProcessGroupFp8 that runs ``group``'s compressed calls on ``device``
    with ``options``: the group's own when it has one, else one made over the
    group's backend, cached for the group's life."""
    group = _group_or_default(group, op)
    device = torch.device(device)
    inner = _inner(group, device, op)
    if isinstance(inner, _C.ProcessGroupFp8):
        if options is not None and _resolved(options, op) != inner.options:
            raise ValueError(f"fp8comm.functional.{op}: the group's backend is fp8comm's, with options "
                             f"{inner.options}; pass options=None (or those) to use it, or call on a plain "
                             "nccl / gloo group")
        return inner
    resolved = _resolved(options, op)
    key = (device.type, repr(resolved))  # every field, the per-process ones included
    return registry.compressor(group, key, lambda number: _make(group, device, inner, resolved, number))


def _timeout_of(inner):
    """The borrowed backend's timeout (torch's gloo and NCCL keep it in their options)."""
    options = getattr(inner, "options", None)
    return getattr(options, "_timeout", None) or dist.default_pg_timeout


def _store_of(group):
    """The group's store (torch < 2.13 has no _get_process_group_store)."""
    c10d = dist.distributed_c10d
    getter = getattr(c10d, "_get_process_group_store", None)
    return getter(group) if getter is not None else c10d._world.pg_map[group][1]


def _make(group, device, inner, options: Options, number: int):
    name = f"{group.group_name}/fp8comm.functional/{number}"
    opts = types.SimpleNamespace(
        store=dist.PrefixStore(name + "/", _store_of(group)),
        group_rank=group.rank(),
        group_size=group.size(),
        timeout=_timeout_of(inner),
        global_ranks_in_group=dist.get_process_group_ranks(group),
        group_id=name,
    )
    # The inter_node scope's node transports are of the borrowed backend's kind.
    node_transport = backend.node_transport_of(inner)
    return backend.create(device.type, opts, options, make_transport=node_transport, inner=inner, borrowed=True)


def _finish(work, async_op: bool):
    if async_op:
        return work
    work.wait()
    return None


@_eager
def all_reduce(tensor: torch.Tensor, op=dist.ReduceOp.SUM, group=None, async_op: bool = False, options=None, *,
               residual: torch.Tensor | None = None):
    """``tensor`` <- the reduction of every rank's ``tensor``, compressed as on
    an fp8 group (``dist.all_reduce``'s arguments; ``options``: fp8comm.Options,
    default the FP8COMM_* environment). Returns a Work when ``async_op``.

    ``residual`` (error feedback; SUM, AVG, PREMUL_SUM): a float32 or bfloat16
    tensor of ``tensor.numel()`` elements, added to ``tensor`` first and then
    overwritten with what the wire dropped of each element (zeros where the
    call passes through exactly); read it once the call is through."""
    _check_tensor(tensor, "all_reduce", "tensor")
    opts = dist.AllreduceOptions()
    opts.reduceOp = op
    opts.asyncOp = async_op
    pg = compressor(group, tensor.device, options, "all_reduce")
    if residual is None:
        return _finish(pg.allreduce([tensor], opts), async_op)
    _feed_back(residual, tensor, op, "all_reduce", "tensor")
    return _finish(pg._allreduce_keeping_residual(tensor, opts, residual), async_op)


@_eager
def reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor, op=dist.ReduceOp.SUM, group=None,
                          async_op: bool = False, options=None, *, residual: torch.Tensor | None = None):
    """``output`` <- the reduction of this rank's segment of every rank's
    ``input`` (``dist.reduce_scatter_tensor``'s arguments), compressed.

    ``residual``: error feedback as in all_reduce, for ``input`` (which the
    residual is added to); this rank's own segment is exact, its residual 0."""
    _check_tensor(output, "reduce_scatter_tensor", "output")
    _check_tensor(input, "reduce_scatter_tensor", "input")
    opts = dist.ReduceScatterOptions()
    opts.reduceOp = op
    opts.asyncOp = async_op
    pg = compressor(group, input.device, options, "reduce_scatter_tensor")
    if residual is None:
        return _finish(pg._reduce_scatter_base(output, input, opts), async_op)
    _feed_back(residual, input, op, "reduce_scatter_tensor", "input")
    return _finish(pg._reduce_scatter_keeping_residual(output, input, opts, residual), async_op)


@_eager
def all_gather_into_tensor(output: torch.Tensor, input: torch.Tensor, group=None, async_op: bool = False,
                           options=None):
    """Segment r of ``output`` <- rank r's ``input`` (``dist.all_gather_into_tensor``'s
    arguments), compressed where the options compress all_gather."""
    _check_tensor(output, "all_gather_into_tensor", "output")
    _check_tensor(input, "all_gather_into_tensor", "input")
    opts = AllgatherOptions()
    opts.asyncOp = async_op
    pg = compressor(group, input.device, options, "all_gather_into_tensor")
    return _finish(pg._allgather_base(output, input, opts), async_op)


@_eager
def all_to_all_single(output: torch.Tensor, input: torch.Tensor, output_split_sizes=None, input_split_sizes=None,
                      group=None, async_op: bool = False, options=None):
    """Rows of ``input`` to each rank and theirs into ``output``
    (``dist.all_to_all_single``'s arguments: split sizes count rows of the
    first dimension, None for equal slices), compressed where the options
    compress all_to_all: only where ``compress`` names "all_to_all" ("all"
    does not include it); this rank's own slice is always exact."""
    op = "all_to_all_single"
    _check_tensor(output, op, "output")
    _check_tensor(input, op, "input")
    splits.check_pair(output, input, op)
    group = _group_or_default(group, op)
    _resolved(options, op)
    out_sizes = splits.as_sizes(output_split_sizes, op, "output_split_sizes")
    in_sizes = splits.as_sizes(input_split_sizes, op, "input_split_sizes")
    # Checked before the compressor is made: a call refused here is refused
    # on the rank that made it, without a collective step.
    splits.check(out_sizes, output, group.size(), op, "output_split_sizes", "output")
    splits.check(in_sizes, input, group.size(), op, "input_split_sizes", "input")
    pg = compressor(group, input.device, options, op)
    opts = dist.AllToAllOptions()
    opts.asyncOp = async_op
    # None travels as dist's empty list (equal slices), so the backend sees
    # what an fp8 group's dist.all_to_all_single gives it.
    return _finish(pg.alltoall_base(output, input, out_sizes or [], in_sizes or [], opts), async_op)


A2A = "all_to_all"


@_eager
def all_to_all_single_autograd(input: torch.Tensor, output_split_sizes, input_split_sizes, group, *, options=None,
                               backward_options=None) -> torch.Tensor:
    """torch.distributed._functional_collectives.all_to_all_single_autograd,
    compressed: a new tensor of ``sum(output_split_sizes)`` rows (``input``'s
    trailing dimensions) holding each rank's rows for this rank; its backward
    sends the gradient back the reverse way (the split sizes swapped).

    ``options``: the forward's fp8comm.Options (None: the FP8COMM_*
    environment, as the other calls); ``backward_options``: the backward's
    (None: exact, torch's own all_to_all). Either, when given, must name
    "all_to_all" in ``compress`` (or be compress="none", exact): this call
    adds nothing to the options, and refuses options that would pass it
    through unasked (``compress="all"`` does not include all_to_all), so one
    Options means the same here as on an fp8 group. ``group``: a process
    group (None: the default) or a one-dimensional DeviceMesh. Split sizes:
    lists of ints, or both None for equal slices (torch's rule). Under
    torch.compile a graph break, run eagerly."""
    op = "all_to_all_single_autograd"
    _check_tensor(input, op, "input")
    group = _group_or_default(_mesh_group(group, op), op)
    _names_all_to_all(options, op, "options")
    _names_all_to_all(backward_options, op, "backward_options")
    out_sizes = splits.as_sizes(output_split_sizes, op, "output_split_sizes")
    in_sizes = splits.as_sizes(input_split_sizes, op, "input_split_sizes")
    if (out_sizes is None) != (in_sizes is None):
        raise ValueError(f"fp8comm.functional.{op}: output_split_sizes and input_split_sizes must both be lists or "
                         "both None (equal slices)")
    if input.dim() == 0:
        raise ValueError(f"fp8comm.functional.{op}: input is a scalar; it needs a first dimension to split "
                         "(view it as shape [1])")
    if out_sizes is None:
        splits.check(None, input, group.size(), op, "input_split_sizes", "input")
        out_sizes = in_sizes = splits.equal(input.shape[0], group.size())
    splits.check(in_sizes, input, group.size(), op, "input_split_sizes", "input")
    return _AllToAllSingle.apply(input, out_sizes, in_sizes, group, options, backward_options)


class _AllToAllSingle(torch.autograd.Function):
    """all_to_all_single forward in ``options``; backward the reverse exchange
    of the gradient in ``backward_options`` (None: exact)."""

    @staticmethod
    def forward(ctx, input, out_sizes, in_sizes, group, options, backward_options):
        ctx.sizes, ctx.group, ctx.backward_options = (out_sizes, in_sizes), group, backward_options
        return _exchange(input, out_sizes, in_sizes, group, options)

    @staticmethod
    def backward(ctx, grad):
        out_sizes, in_sizes = ctx.sizes
        if ctx.backward_options is None:
            return _exact_exchange(grad, in_sizes, out_sizes, ctx.group), None, None, None, None, None
        return _exchange(grad, in_sizes, out_sizes, ctx.group, ctx.backward_options), None, None, None, None, None


def _exchange(input: torch.Tensor, out_sizes: list, in_sizes: list, group, options) -> torch.Tensor:
    """A new tensor: ``input``'s rows exchanged by all_to_all_single in ``options``."""
    output = input.new_empty((sum(out_sizes), *input.shape[1:]))
    all_to_all_single(output, input.contiguous(), out_sizes, in_sizes, group=group, options=options)
    return output


def _exact_exchange(input: torch.Tensor, out_sizes: list, in_sizes: list, group) -> torch.Tensor:
    """``input``'s rows exchanged by torch's own all_to_all_single: exact (on
    an fp8 group, whose options may compress all_to_all, inside an
    uncompressed block)."""
    input = input.contiguous()
    output = input.new_empty((sum(out_sizes), *input.shape[1:]))
    if isinstance(_inner(group, input.device, "all_to_all_single_autograd"), _C.ProcessGroupFp8):
        with uncompressed(group):
            dist.all_to_all_single(output, input, out_sizes, in_sizes, group=group)
    else:
        dist.all_to_all_single(output, input, out_sizes, in_sizes, group=group)
    return output


def _names_all_to_all(options, op: str, which: str) -> None:
    """Refuses options that would pass the call through while asking for a
    compressed one: compress neither names all_to_all nor is empty."""
    if options is None:
        return
    compress = _resolved(options, op).compress
    if compress and A2A not in compress:
        raise ValueError(f"fp8comm.functional.{op}: {which} compress {','.join(compress)!r} does not name "
                         f"{A2A!r}, so this all_to_all would pass through exactly ('all' does not include it); "
                         f"add {A2A!r} to compress to compress it, or pass compress='none' (or {which}=None"
                         f"{'' if which == 'options' else ', exact'})")


def _mesh_group(group, op: str):
    """A one-dimensional DeviceMesh's process group (torch's drop-in takes
    either); anything else unchanged."""
    from torch.distributed.device_mesh import DeviceMesh

    if not isinstance(group, DeviceMesh):
        return group
    if group.ndim != 1:
        raise ValueError(f"fp8comm.functional.{op}: group is a {group.ndim}-dimensional DeviceMesh; pass one "
                         "dimension's group (mesh.get_group(dim))")
    return group.get_group()


_SUMS = (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.PREMUL_SUM)


def _feed_back(residual, input: torch.Tensor, op, name: str, what: str) -> None:
    """Checks an error-feedback residual where it enters and adds it to ``input``."""
    _check_tensor(residual, name, "residual")
    if not any(op == kind for kind in _SUMS):
        raise ValueError(f"fp8comm.functional.{name}: error feedback (residual=) needs a sum (SUM, AVG, "
                         f"PREMUL_SUM), got {op}; pass residual=None for this op")
    if not input.is_floating_point():
        raise TypeError(f"fp8comm.functional.{name}: error feedback (residual=) needs a floating-point {what}, "
                        f"got {input.dtype}")
    if residual.numel() != input.numel():
        raise ValueError(f"fp8comm.functional.{name}: residual has {residual.numel()} elements but the {what} has "
                         f"{input.numel()}; it must hold one value per {what} element")
    if residual.dtype not in (torch.float32, torch.bfloat16) or not residual.is_contiguous():
        raise ValueError(f"fp8comm.functional.{name}: residual must be a contiguous float32 or bfloat16 tensor, "
                         f"got {residual.dtype}{'' if residual.is_contiguous() else ', not contiguous'}")
    if residual.device != input.device:
        raise ValueError(f"fp8comm.functional.{name}: residual is on {residual.device} but the {what} is on "
                         f"{input.device}; keep it beside the {what}")
    input.add_(residual.view(input.shape))


def _check_tensor(t, op: str, what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"fp8comm.functional.{op}: {what} must be a torch.Tensor, got {type(t).__name__}")
