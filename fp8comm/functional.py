"""Compressed collectives on any process group (DESIGN.md, "Any group").

    import fp8comm.functional as F
    F.reduce_scatter_tensor(out, grads, group=mesh.get_group("dp"))  # a plain nccl / gloo group

The group's own backend is the transport of a ProcessGroupFp8 made on the
first call for (group, device, options): a collective step, as the call is.
Results are bitwise those of the same call on an fp8 group with those
options; ``fp8comm.get_stats(group)`` and ``fp8comm.uncompressed(group)``
cover it.
"""
from __future__ import annotations

import types
import weakref

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions

from . import _C, backend
from .options import Options

# Under torch.compile each call is a graph break and runs eagerly: dynamo
# cannot trace into the backend object (it is not one of torch's functional
# collectives, whose ops it captures).
_eager = torch.compiler.disable

_COMPRESSORS: "weakref.WeakKeyDictionary[dist.ProcessGroup, dict]" = weakref.WeakKeyDictionary()


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


def compressors(group=None) -> list:
    """The ProcessGroupFp8 objects fp8comm.functional made for ``group`` (stats, uncompressed blocks)."""
    pg = group if group is not None else (dist.distributed_c10d._get_default_group() if dist.is_initialized()
                                          else None)
    return list(_COMPRESSORS.get(pg, {}).values()) if pg is not None else []


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
    made = _COMPRESSORS.setdefault(group, {})
    key = (device.type, repr(resolved))  # every field, the per-process ones included
    if key not in made:
        made[key] = _make(group, device, inner, resolved, len(made))
    return made[key]


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
    return backend._create(device.type, opts, options, make_transport=node_transport, inner=inner, borrowed=True)


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
