"""FSDP2 with fp8comm's compressed reduce-scatter (and, opt-in, all-gather)
on a mesh of plain nccl / gloo groups (DESIGN.md, "Any group").

    fully_shard(block, mesh=mesh) ...; fully_shard(model, mesh=mesh)
    fp8comm.fsdp.compress_communication(model)   # gradients' reduce-scatter in FP8

FSDP2 calls the installed comms with its own group, reduce op and buffers;
each call is fp8comm.functional's, so it equals FSDP2 over an fp8 group with
the same options bitwise. In HSDP only the shard dimension's reduce-scatter
(and all-gather) is replaced; the replicate dimension's all-reduce stays
FSDP2's.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from . import functional
from .options import Options


def _check_options(options, where: str):
    if options is not None and not isinstance(options, Options):
        raise TypeError(f"fp8comm.fsdp.{where}: options must be fp8comm.Options, got {type(options).__name__}")
    return options


class _Alloc:
    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class Fp8ReduceScatter(_Alloc, ReduceScatter):
    """FSDP2's ReduceScatter comm, compressed (fp8comm.functional.reduce_scatter_tensor)."""

    def __init__(self, options: Options | None = None):
        self.options = _check_options(options, "Fp8ReduceScatter")

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op=dist.ReduceOp.SUM, async_op: bool = False):
        return functional.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group,
                                                async_op=async_op, options=self.options)


class Fp8AllGather(_Alloc, AllGather):
    """FSDP2's AllGather comm, compressed where the options compress all_gather
    (fp8comm.functional.all_gather_into_tensor)."""

    def __init__(self, options: Options | None = None):
        self.options = _check_options(options, "Fp8AllGather")

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 async_op: bool = False):
        return functional.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op,
                                                 options=self.options)


def compress_communication(module: torch.nn.Module, *, reduce_scatter: bool = True, all_gather: bool = False,
                           options: Options | None = None) -> int:
    """Installs fp8comm's comms on every FSDP2 (``fully_shard``) module of
    ``module``'s tree: the gradients' reduce-scatter, and with ``all_gather``
    the parameters' all-gather, whose options must then compress all_gather
    (``Options(compress="all")``). Call it after ``fully_shard``. Returns how
    many FSDP modules it set."""
    _check_options(options, "compress_communication")
    if all_gather and "all_gather" not in (options or Options()).resolved().compress:
        raise ValueError("fp8comm.fsdp.compress_communication: all_gather=True, but the options do not compress "
                         "all_gather; pass options=fp8comm.Options(compress='all') (or a list naming all_gather)")
    fsdp_modules = [m for m in module.modules() if isinstance(m, FSDPModule)]
    if not fsdp_modules:
        raise ValueError("fp8comm.fsdp.compress_communication: the module tree has no fully_shard module; "
                         "call fully_shard on it first")
    for m in fsdp_modules:
        if reduce_scatter:
            m.set_custom_reduce_scatter(Fp8ReduceScatter(options))
        if all_gather:
            m.set_custom_all_gather(Fp8AllGather(options))
    return len(fsdp_modules)
