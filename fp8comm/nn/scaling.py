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
    # Non-finite amax (an Inf/NaN in x) gives scale 0 or NaN: the GEMM then
    # produces NaN, as the high-precision GEMM would.
    scale = fp8_max(dtype) / amax.clamp(min=EPS)
    limit = fp8_max(dtype)
    data = (x32 * scale).clamp(-limit, limit).to(dtype)
    return data, scale.reciprocal()
