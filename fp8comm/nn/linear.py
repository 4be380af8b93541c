"""Fp8Linear: a drop-in nn.Linear whose three GEMMs run in FP8.

forward      y  = x  @ W^T     (E4M3 x E4M3)
grad_input   dx = dy @ W       (E5M2 x E4M3 tensorwise, E4M3 x E4M3 rowwise)
grad_weight  dW = dy^T @ x
all through torch._scaled_mm with current scaling (config.py); outputs in the
input's dtype, weight gradients in the weight's dtype. The bias is added in
high precision, so its gradient is exactly nn.Linear's.

What backward keeps: tensorwise saves the FP8 casts of x and W (one byte per
element instead of two or four) and reuses them transposed — a transpose of a
tensorwise cast is exact. Rowwise needs new scales along the other dims, so it
saves x in high precision (W is a parameter, held anyway) and casts again.

Under FSDP2 with the FP8 all-gather (fsdp.py) the weight arrives already cast
(an Fp8WeightCast): its bytes and inverse scale go to the GEMMs as they are.
"""
from __future__ import annotations

import warnings
from collections import Counter

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import Recipe, recipe_of
from .fsdp import Fp8WeightCast, unwrap_weight
from .scaling import cast_to_fp8

_GEMM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_counts: Counter = Counter()
_warned: set = set()


def stats() -> dict:
    """{"fp8_calls": n, "fallback_calls": n, "fallback_reasons": {reason: n},
    "weight_precast_calls": n} for all Fp8Linear forward calls in this process;
    weight_precast_calls counts the FP8 calls whose weight arrived already cast
    by the FSDP2 FP8 all-gather (so it was not cast again)."""
    reasons = {k[len("fallback:"):]: v for k, v in _counts.items() if k.startswith("fallback:")}
    return {"fp8_calls": _counts["fp8"], "fallback_calls": sum(reasons.values()), "fallback_reasons": reasons,
            "weight_precast_calls": _counts["precast"]}


def reset_stats() -> None:
    _counts.clear()


def _fallback_reason(x2d: torch.Tensor, weight: torch.Tensor) -> str | None:
    """Why this GEMM cannot run in FP8, or None. _scaled_mm needs every GEMM
    dim (tokens, in, out) to be a multiple of 16, a float input, and a device
    with FP8 support (CPU, or CUDA compute capability >= 8.9)."""
    if x2d.dtype not in _GEMM_DTYPES:
        return f"dtype {x2d.dtype}"
    m, k = x2d.shape
    n = weight.shape[0]
    if m % 16 or k % 16 or n % 16:
        return "dims not multiples of 16"
    if x2d.device.type == "cuda" and torch.cuda.get_device_capability(x2d.device) < (8, 9):
        return "GPU without FP8 tensor cores"
    if x2d.device.type not in ("cpu", "cuda"):
        return f"device {x2d.device.type}"
    return None


def _count_fallback(reason: str) -> None:
    _counts["fallback:" + reason] += 1
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(
            f"fp8comm.nn.Fp8Linear: {reason}; this GEMM runs in high precision "
            "(counted in fp8comm.nn.stats(); warned once per reason)",
            stacklevel=3,
        )


def _mm(a, b, scale_a, scale_b, out_dtype, rowwise: bool):
    """a @ b with FP8 operands; rowwise GEMMs on CUDA produce bf16 only."""
    if rowwise and a.device.type == "cuda" and out_dtype != torch.bfloat16:
        return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16).to(out_dtype)
    return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)


class _Fp8Matmul(torch.autograd.Function):
    """x2d [M, K] @ weight[N, K]^T in FP8, with FP8 backward GEMMs."""

    @staticmethod
    def forward(ctx, x2d: torch.Tensor, weight: torch.Tensor, recipe: Recipe):
        xq, xs = cast_to_fp8(x2d, recipe.input_dtype, recipe.rowwise)
        if isinstance(weight, Fp8WeightCast):  # gathered as FP8 (tensorwise only): not cast again
            wq, ws = weight._data, weight._inv_scale
        else:
            wq, ws = cast_to_fp8(weight, recipe.weight_dtype, recipe.rowwise)
        # _scaled_mm wants its second operand column-major: wq.t() is [K, N] column-major.
        out = _mm(xq, wq.t(), xs, ws.t() if recipe.rowwise else ws, x2d.dtype, recipe.rowwise)
        if recipe.rowwise:
            ctx.save_for_backward(x2d, weight)
        else:
            ctx.save_for_backward(xq, xs, wq, ws)
        ctx.recipe = recipe
        ctx.dtypes = (x2d.dtype, weight.dtype)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        recipe: Recipe = ctx.recipe
        x_dtype, w_dtype = ctx.dtypes
        go = grad_out.contiguous()
        if not recipe.rowwise:
            xq, xs, wq, ws = ctx.saved_tensors
            gq, gs = cast_to_fp8(go, recipe.grad_output_dtype, rowwise=False)
            # dx [M, K] = dy [M, N] @ W [N, K]   (W column-major: the transpose made contiguous)
            grad_x = _mm(gq, wq.t().contiguous().t(), gs, ws, x_dtype, False)
            # dW [N, K] = dy^T [N, M] @ x [M, K]
            grad_w = _mm(gq.t().contiguous(), xq.t().contiguous().t(), gs, xs, w_dtype, False)
        else:
            x2d, weight = ctx.saved_tensors
            # Scales along each GEMM's contracted dim: N for dx, M for dW.
            gq, gs = cast_to_fp8(go, recipe.grad_output_dtype, rowwise=True)  # [M, N], per row over N
            wtq, wts = cast_to_fp8(weight.t(), recipe.weight_dtype, rowwise=True)  # [K, N], per row over N
            grad_x = _mm(gq, wtq.t(), gs, wts.t(), x_dtype, True)
            gtq, gts = cast_to_fp8(go.t(), recipe.grad_output_dtype, rowwise=True)  # [N, M], over M
            xtq, xts = cast_to_fp8(x2d.t(), recipe.input_dtype, rowwise=True)  # [K, M], over M
            grad_w = _mm(gtq, xtq.t(), gts, xts.t(), w_dtype, True)
        return grad_x, grad_w, None


class Fp8Linear(nn.Linear):
    """nn.Linear with FP8 GEMMs. Same constructor (plus ``recipe``), same
    parameters and state_dict keys, so checkpoints load both ways."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None,
                 recipe: str | Recipe = "tensorwise"):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.recipe = recipe_of(recipe)

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe: str | Recipe = "tensorwise") -> "Fp8Linear":
        """An Fp8Linear sharing ``linear``'s parameters (no copy)."""
        new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta",
                  recipe=recipe)
        new.weight = linear.weight
        new.bias = linear.bias
        new.train(linear.training)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.weight, self.bias
        precast = isinstance(weight, Fp8WeightCast)
        if precast and (self.recipe.rowwise or weight._data.dtype != self.recipe.weight_dtype):
            raise RuntimeError(
                f"fp8comm: this Fp8Linear ({self.recipe.name}) got a weight all-gathered as tensorwise "
                f"{weight._data.dtype}; the FP8 all-gather serves the tensorwise recipe only"
            )
        if torch.is_autocast_enabled(x.device.type):
            dtype = torch.get_autocast_dtype(x.device.type)
            x = x.to(dtype)
            if not precast:  # an FP8 weight goes to the GEMM as it is
                weight = weight.to(dtype)
            bias = bias.to(dtype) if bias is not None else None
        x2d = x.reshape(-1, self.in_features)
        reason = _fallback_reason(x2d, weight)
        if reason is not None:
            _count_fallback(reason)
            # A gathered FP8 weight takes part dequantized (the high-precision
            # weight is not on this rank); gradients reach it as usual.
            return F.linear(x, weight, bias)
        _counts["fp8"] += 1
        if precast:
            _counts["precast"] += 1
        elif weight.dtype != x2d.dtype:
            weight = weight.to(x2d.dtype)
        out = _Fp8Matmul.apply(x2d, weight, self.recipe).reshape(*x.shape[:-1], self.out_features)
        return out + bias.to(out.dtype) if bias is not None else out

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        # state_dict values are plain tensors (or DTensors of plain tensors)
        # even when the weight is wrapped for the FP8 all-gather.
        super()._save_to_state_dict(destination, prefix, keep_vars)
        key = prefix + "weight"
        if not keep_vars and key in destination:
            destination[key] = unwrap_weight(destination[key])

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe.name}"
