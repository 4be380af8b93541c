"""FSDP2 with fp8comm's compressed reduce-scatter (and, opt-in, all-gather)
on a mesh of plain nccl / gloo groups (DESIGN.md, "Any group").

    fully_shard(block, mesh=mesh) ...; fully_shard(model, mesh=mesh)
    fp8comm.fsdp.compress_communication(model)   # gradients' reduce-scatter in FP8

FSDP2 calls the installed comms with its own group, reduce op and buffers;
each call is fp8comm.functional's, so it equals FSDP2 over an fp8 group with
the same options bitwise. With ``error_feedback`` each FSDP parameter group's
reduce-scatter keeps what the wire dropped of its gradients and adds it to the
next step's (DESIGN.md, "Error feedback"). In HSDP only the shard dimension's reduce-scatter
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
from .error_feedback import Residuals, residual_dtype
from .options import Options


def _check_options(options, where: str):
    if options is not None and not isinstance(options, Options):
        raise TypeError(f"fp8comm.fsdp.{where}: options must be fp8comm.Options, got {type(options).__name__}")
    return options


class _Alloc:
    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class Fp8ReduceScatter(_Alloc, ReduceScatter):
    """FSDP2's ReduceScatter comm, compressed (fp8comm.functional.reduce_scatter_tensor).
    ``error_feedback``: False; True (a float32 residual the size of the
    group's unsharded gradients) or torch.bfloat16 (half that)."""

    def __init__(self, options: Options | None = None, error_feedback=False):
        self.options = _check_options(options, "Fp8ReduceScatter")
        dtype = residual_dtype(error_feedback, "fp8comm.fsdp.Fp8ReduceScatter")
        self.residuals = Residuals(dtype, "fp8comm.fsdp.Fp8ReduceScatter") if dtype is not None else None

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op=dist.ReduceOp.SUM, async_op: bool = False):
        residual = None
        if self.residuals is not None:
            # One FSDP parameter group, one input layout: a new size is a new model.
            residual = self.residuals.for_input("the reduce-scatter input", input_tensor, group)
        return functional.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group,
                                                async_op=async_op, options=self.options, residual=residual)


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
                           options: Options | None = None, error_feedback=False) -> int:
    """Installs fp8comm's comms on every FSDP2 (``fully_shard``) module of
    ``module``'s tree: the gradients' reduce-scatter, and with ``all_gather``
    the parameters' all-gather, whose options must then compress all_gather
    (``Options(compress="all")``). ``error_feedback`` (False, True: float32,
    torch.bfloat16): each module's reduce-scatter keeps its residual
    (Fp8ReduceScatter). Call it after ``fully_shard``. Returns how many FSDP
    modules it set."""
    _check_options(options, "compress_communication")
    residual_dtype(error_feedback, "fp8comm.fsdp.compress_communication")
    if error_feedback and not reduce_scatter:
        raise ValueError("fp8comm.fsdp.compress_communication: error_feedback applies to the gradients' "
                         "reduce-scatter; pass reduce_scatter=True with it")
    if all_gather and "all_gather" not in (options or Options()).resolved().compress:
        raise ValueError("fp8comm.fsdp.compress_communication: all_gather=True, but the options do not compress "
                         "all_gather; pass options=fp8comm.Options(compress='all') (or a list naming all_gather)")
    fsdp_modules = [m for m in module.modules() if isinstance(m, FSDPModule)]
    if not fsdp_modules:
        raise ValueError("fp8comm.fsdp.compress_communication: the module tree has no fully_shard module; "
                         "call fully_shard on it first")
    for m in fsdp_modules:
        if reduce_scatter:
            m.set_custom_reduce_scatter(Fp8ReduceScatter(options, error_feedback))
        if all_gather:
            m.set_custom_all_gather(Fp8AllGather(options))
    return len(fsdp_modules)
