"""Casts of GEMM operands to FP8 with current scaling.

A cast returns (data, inv_scale): data = saturate(x * scale) in FP8 with
scale = fp8_max / amax, and inv_scale = 1 / scale is what torch._scaled_mm
multiplies back. Tensorwise: one scale; rowwise: one per row (dim -1 is the
contracted one).

Two implementations give the same bytes:

- the fused operator ``torch.ops.fp8comm.cast_fp8`` (csrc/linear/): amax,
  scale and cast in one or two kernels, optionally writing the cast of x.t()
  (the transpose a backward GEMM needs) in the same pass. Its CPU twin runs the
  scalar math of the CUDA kernels and equals the eager chain bit for bit
  (tests/nn/test_fused_cast.py);
- the eager chain of torch ops below (``eager_cast_fp8``), the reference.

The CPU always uses the operator; CUDA does too unless ``FP8COMM_FUSED_CAST=0``
(docs/fp8_linear.md, "Fused casts") or the build has no CUDA kernels: those
keep the eager chain.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from .. import _C
from ..codec import CODEC_DTYPES, FP8_DTYPES, fp8_dtype_choices, fp8_max

EPS = 1e-12
FUSED_CAST_ENV = "FP8COMM_FUSED_CAST"  # declared, with its default, in csrc/common/env.h


class Fp8Cast(NamedTuple):
    """The cast of x ([M, K]) and of x.t() ([K, M], contiguous), each None
    unless asked for. Tensorwise: one inverse scale ([]) for both; rowwise:
    inv_scale is [M, 1] (per row of x), inv_scale_t [K, 1] (per column of x)."""

    data: Optional[torch.Tensor]
    inv_scale: Optional[torch.Tensor]
    data_t: Optional[torch.Tensor]
    inv_scale_t: Optional[torch.Tensor]


def fused_cast_enabled(device: torch.device) -> bool:
    """Whether casts of tensors on ``device`` run in the fused operator."""
    if device.type == "cpu":
        return True
    if device.type == "cuda":  # a build without CUDA kernels casts eagerly: the same bytes
        return _C.has_cuda and _C.env_flag(FUSED_CAST_ENV)
    return False


def cast_fp8(
    x: torch.Tensor,
    dtype: torch.dtype,
    rowwise: bool,
    *,
    with_data: bool = True,
    with_transpose: bool = False,
    amax: Optional[torch.Tensor] = None,
) -> Fp8Cast:
    """The cast of 2-D ``x`` and/or of ``x.t()`` (see :class:`Fp8Cast`).
    ``amax`` (tensorwise only, one float32 element) replaces x's own amax."""
    if fused_cast_enabled(x.device) and (amax is None or amax.numel() == 1):
        if amax is not None:
            amax = amax.detach().reshape(()).to(torch.float32)
        data, inv, data_t, inv_t = torch.ops.fp8comm.cast_fp8(
            x.detach(), dtype, rowwise, with_data, with_transpose, amax
        )
        return Fp8Cast(
            data if with_data else None,
            inv if with_data else None,
            data_t if with_transpose else None,
            inv_t if with_transpose else None,
        )
    return eager_cast_fp8(x, dtype, rowwise, with_data=with_data, with_transpose=with_transpose, amax=amax)


def cast_to_fp8(x: torch.Tensor, dtype: torch.dtype, rowwise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x (2-D) -> (FP8 data of x's shape, float32 inverse scale: [] or [rows, 1])."""
    c = cast_fp8(x, dtype, rowwise)
    return c.data, c.inv_scale


def cast_with_amax(x32: torch.Tensor, dtype: torch.dtype, amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The tensorwise cast of ``x32`` given its amax (a float32 scalar).
    The FSDP2 FP8 all-gather (fsdp.py) casts a weight shard with the amax of the
    whole weight through this function, so its bytes are those cast_to_fp8
    gives the unsharded weight."""
    if amax.numel() != 1:  # a [rows, 1] amax: the eager chain only
        return _eager_cast_with_amax(x32.float(), dtype, amax)
    c = cast_fp8(x32, dtype, rowwise=False, amax=amax)
    return c.data, c.inv_scale


# ---------------------------------------------------------------- the eager chain
def _eager_cast_with_amax(x32: torch.Tensor, dtype: torch.dtype, amax: torch.Tensor):
    # Non-finite amax (an Inf/NaN in x) gives scale 0 or NaN: the GEMM then
    # produces NaN, as the high-precision GEMM would.
    scale = fp8_max(dtype) / amax.clamp(min=EPS)
    limit = fp8_max(dtype)
    data = (x32 * scale).clamp(-limit, limit).to(dtype)
    return data, scale.reciprocal()


def eager_cast_fp8(
    x: torch.Tensor,
    dtype: torch.dtype,
    rowwise: bool,
    *,
    with_data: bool = True,
    with_transpose: bool = False,
    amax: Optional[torch.Tensor] = None,
) -> Fp8Cast:
    """The reference: the same casts as chains of eager torch ops."""
    x32 = x.float()
    if not rowwise:
        if amax is None:
            amax = x32.abs().amax()
        data, inv = _eager_cast_with_amax(x32, dtype, amax.float())
        data_t = data.t().contiguous() if with_transpose else None
        return Fp8Cast(data if with_data else None, inv if with_data else None, data_t,
                       inv.clone() if with_transpose else None)
    if amax is not None:
        raise ValueError("fp8comm: amax can only be given to the tensorwise cast")
    data = inv = data_t = inv_t = None
    if with_data:
        data, inv = _eager_cast_with_amax(x32, dtype, x32.abs().amax(dim=-1, keepdim=True))
    if with_transpose:
        xt = x32.t()
        data_t, inv_t = _eager_cast_with_amax(xt, dtype, xt.abs().amax(dim=-1, keepdim=True))
        data_t = data_t.contiguous()
    return Fp8Cast(data, inv, data_t, inv_t)


# ---------------------------------------------------------------- fake kernel
@torch.library.register_fake("fp8comm::cast_fp8")
def _cast_fp8_fake(x, fp8_dtype, rowwise, with_data=True, with_transpose=False, amax=None):
    torch._check(x.dim() == 2, lambda: f"fp8comm.cast_fp8: x must be 2-D ([rows, cols]), got {x.dim()}-D")
    torch._check(
        x.dtype in CODEC_DTYPES,
        lambda: f"fp8comm.cast_fp8 x: expected a float32, bfloat16 or float16 tensor, got {x.dtype}",
    )
    torch._check(
        fp8_dtype in FP8_DTYPES,
        lambda: f"fp8comm.cast_fp8: fp8_dtype must be {fp8_dtype_choices()}, got {fp8_dtype}",
    )
    torch._check(with_data or with_transpose, lambda: "fp8comm.cast_fp8: nothing to do")
    torch._check(amax is None or not rowwise, lambda: "fp8comm.cast_fp8: amax is for the tensorwise cast")
    m, k = x.shape
    f32 = torch.float32
    data = x.new_empty((m, k) if with_data else (0,), dtype=fp8_dtype)
    inv = x.new_empty(((m, 1) if rowwise else ()) if with_data else (0,), dtype=f32)
    data_t = x.new_empty((k, m) if with_transpose else (0,), dtype=fp8_dtype)
    inv_t = x.new_empty(((k, 1) if rowwise else ()) if with_transpose else (0,), dtype=f32)
    return data, inv, data_t, inv_t


@torch.library.register_fake("fp8comm::cast_fp8_scaled")
def _cast_fp8_scaled_fake(x, fp8_dtype, scale, with_data=True, with_transpose=False):
    torch._check(x.dim() == 2, lambda: f"fp8comm.cast_fp8_scaled: x must be 2-D ([rows, cols]), got {x.dim()}-D")
    torch._check(
        x.dtype in CODEC_DTYPES,
        lambda: f"fp8comm.cast_fp8_scaled x: expected a float32, bfloat16 or float16 tensor, got {x.dtype}",
    )
    torch._check(
        fp8_dtype in FP8_DTYPES,
        lambda: f"fp8comm.cast_fp8_scaled: fp8_dtype must be {fp8_dtype_choices()}, got {fp8_dtype}",
    )
    torch._check(with_data or with_transpose, lambda: "fp8comm.cast_fp8_scaled: nothing to do")
    m, k = x.shape
    f32 = torch.float32
    data = x.new_empty((m, k) if with_data else (0,), dtype=fp8_dtype)
    inv = x.new_empty(() if with_data else (0,), dtype=f32)
    data_t = x.new_empty((k, m) if with_transpose else (0,), dtype=fp8_dtype)
    inv_t = x.new_empty(() if with_transpose else (0,), dtype=f32)
    return data, inv, data_t, inv_t, x.new_empty((), dtype=f32)
