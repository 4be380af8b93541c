"""Casts of GEMM operands to FP8 with current scaling.

A cast returns (data, inv_scale): data = saturate(x * scale) in FP8 with
scale = fp8_max / amax, and inv_scale = 1 / scale is what torch._scaled_mm
multiplies back. Tensorwise: one scale; rowwise: one per row (dim -1 is the
contracted one).
"""
from __future__ import annotations

import torch

EPS = 1e-12


def fp8_max(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max)


def cast_to_fp8(x: torch.Tensor, dtype: torch.dtype, rowwise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x (2-D) -> (FP8 data of x's shape, float32 inverse scale: [] or [rows, 1])."""
    x32 = x.float()
    if rowwise:
        amax = x32.abs().amax(dim=-1, keepdim=True)
    else:
        amax = x32.abs().amax()
    return cast_with_amax(x32, dtype, amax)


def cast_with_amax(x32: torch.Tensor, dtype: torch.dtype, amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The cast of float32 ``x32`` given its amax (a float32 scalar or [rows, 1]).
    The FSDP2 FP8 all-gather (fsdp.py) casts a weight shard with the amax of the
    whole weight through this function, so its bytes are those cast_to_fp8
    gives the unsharded weight."""
    # Non-finite amax (an Inf/NaN in x) gives scale 0 or NaN: the GEMM then
    # produces NaN, as the high-precision GEMM would.
    scale = fp8_max(dtype) / amax.clamp(min=EPS)
    limit = fp8_max(dtype)
    data = (x32 * scale).clamp(-limit, limit).to(dtype)
    return data, scale.reciprocal()
