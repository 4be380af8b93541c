"""Fp8Linear: a drop-in nn.Linear whose three GEMMs run in FP8.

forward      y  = x  @ W^T     (E4M3 x E4M3)
grad_input   dx = dy @ W       (E5M2 x E4M3 tensorwise, E4M3 x E4M3 rowwise)
grad_weight  dW = dy^T @ x
all through torch._scaled_mm with current scaling or, in the delayed recipe,
the scales of an amax history (config.py, delayed.py; on CUDA with the
recipe's use_fast_accum per GEMM; on the CPU, as its emulated kernel computes
it: scaled_mm_cpu); outputs in the input's dtype, weight gradients in the
weight's dtype. The bias is added in high precision, so its gradient is
exactly nn.Linear's.

Casts run in the fused operator of scaling.py (amax, scale, cast and the
transpose a backward GEMM needs, in one pass). What backward keeps, all FP8
but W: tensorwise saves the casts of x^T and W^T (one byte per element instead
of two or four), written transposed by the forward casts; a transpose of a
tensorwise cast is the same bytes. Rowwise needs scales along the other dims:
it saves x^T cast along M (what backward would cast from x, computed in the
same forward pass) and W (a parameter, held anyway), which backward casts
along its columns.

Under FSDP2 with the FP8 all-gather (fsdp.py) the weight arrives already cast
(an Fp8WeightCast): its bytes and inverse scale go to the GEMMs as they are.
"""
from __future__ import annotations

import warnings
from collections import Counter

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import delayed
from .config import Recipe, recipe_of
from .fsdp import Fp8WeightCast, unwrap_weight
from .scaling import cast_fp8

_GEMM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_counts: Counter = Counter()
_warned: set = set()


def linear_stats() -> dict:
    """{"fp8_calls": n, "fallback_calls": n, "fallback_reasons": {reason: n},
    "weight_precast_calls": n, "delayed_casts": n, "saturated_casts": n} for
    all Fp8Linear calls in this process. weight_precast_calls counts the FP8
    calls whose weight arrived already cast by the FSDP2 FP8 all-gather (so it
    was not cast again); delayed_casts the operand casts of the delayed recipe,
    and saturated_casts those of them in which an element exceeded the
    history's range (fp8_max / scale) and was saturated to +-fp8_max. Reading
    saturated_casts waits for the devices' casts so far."""
    reasons = {k[len("fallback:"):]: v for k, v in _counts.items() if k.startswith("fallback:")}
    return {"fp8_calls": _counts["fp8"], "fallback_calls": sum(reasons.values()), "fallback_reasons": reasons,
            "weight_precast_calls": _counts["precast"], **delayed.delayed_stats()}


def reset_linear_stats() -> None:
    _counts.clear()
    delayed.reset_delayed_stats()


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
            "(counted in fp8comm.nn.linear_stats(); warned once per reason)",
            stacklevel=3,
        )


def _mm(a, b, scale_a, scale_b, out_dtype, rowwise: bool, fast_accum: bool):
    """a @ b with FP8 operands, by the GEMM of a's device (_GEMMS)."""
    return _GEMMS[a.device.type](a, b, scale_a, scale_b, out_dtype, rowwise, fast_accum)


def scaled_mm_cuda(a, b, scale_a, scale_b, out_dtype, rowwise: bool, fast_accum: bool):
    """torch._scaled_mm with use_fast_accum; its rowwise GEMMs produce bf16 only."""
    if rowwise and out_dtype != torch.bfloat16:
        return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16,
                                use_fast_accum=fast_accum).to(out_dtype)
    return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype, use_fast_accum=fast_accum)


def _cpu_gemm(a, b, scale_a, scale_b, out_dtype, rowwise: bool, fast_accum: bool):
    # The CPU GEMM has one accumulation: fast_accum does not apply.
    return scaled_mm_cpu(a, b, scale_a, scale_b, out_dtype)


# The GEMM of each device _fallback_reason lets through.
_GEMMS = {"cpu": _cpu_gemm, "cuda": scaled_mm_cuda}


def _torch_emulates_scaled_mm_on_cpu() -> bool:
    """Whether torch runs a CPU _scaled_mm through its emulated kernel. On CPUs
    with AMX (Intel Sapphire Rapids and later) it sends FP8 operands to oneDNN
    instead (torch's _scaled_mm_out_cpu), whose FP8 matmul there is a
    reference loop. Unknown (a torch without the probe): assume AMX."""
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return probe is not None and not probe()


def _torch_scaled_mm_cpu_takes_rowwise() -> bool:
    """Whether torch's CPU _scaled_mm takes rowwise scales ([M, 1] and [1, N]).
    The emulated kernel of some releases (torch 2.11's) asserts one scale
    per tensor."""
    a = torch.zeros(16, 16, dtype=torch.float8_e4m3fn, device="cpu")
    scale_a, scale_b = torch.ones(16, 1, device="cpu"), torch.ones(1, 16, device="cpu")
    try:
        torch._scaled_mm(a, a.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
    except (RuntimeError, ValueError):
        return False
    return True


_CPU_SCALED_MM_IS_EMULATED = _torch_emulates_scaled_mm_on_cpu()
# Probed only where torch's kernel would be used: an AMX CPU runs the steps here.
_CPU_SCALED_MM_TAKES_ROWWISE = _CPU_SCALED_MM_IS_EMULATED and _torch_scaled_mm_cpu_takes_rowwise()


def scaled_mm_cpu(a, b, scale_a, scale_b, out_dtype):
    """a @ b of FP8 operands on the CPU, as torch's emulated _scaled_mm
    computes it: operands widened exactly to FP32 and scaled, an FP32 GEMM,
    the result cast to out_dtype.

    Where torch takes that kernel itself, this is torch._scaled_mm. On CPUs
    with AMX torch's _scaled_mm goes to oneDNN's reference FP8 loop instead,
    orders of magnitude slower for the same result (docs/fp8_linear.md, "Intel
    CPUs with AMX"). There, under torch.compile, and for rowwise scales where
    torch's CPU kernel has none (_torch_scaled_mm_cpu_takes_rowwise), the
    emulated kernel's steps run here (no global switch, nothing for other
    threads to see); tests/nn/test_linear.py checks them against
    torch._scaled_mm bit for bit.
    """
    if not torch.compiler.is_compiling():
        rowwise = scale_a.numel() != 1 or scale_b.numel() != 1
        if _CPU_SCALED_MM_TAKES_ROWWISE if rowwise else _CPU_SCALED_MM_IS_EMULATED:
            return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)
    return emulated_scaled_mm(a, b, scale_a, scale_b, out_dtype)


def emulated_scaled_mm(a, b, scale_a, scale_b, out_dtype):
    """The steps of torch's emulated CPU _scaled_mm (_scaled_mm_out_cpu_emulated)."""
    wide_a = a.contiguous().to(torch.float32) * scale_a
    wide_b = b.contiguous().to(torch.float32) * scale_b
    return torch.matmul(wide_a, wide_b).to(out_dtype)


class _Fp8Matmul(torch.autograd.Function):
    """x2d [M, K] @ weight[N, K]^T in FP8, with FP8 backward GEMMs.

    _scaled_mm wants its first operand row-major and its second column-major,
    so every backward GEMM needs a transpose of a forward operand: the casts
    write them (``with_transpose``: the cast of x.t(), contiguous) in the same
    pass as the forward cast, and only what backward uses is saved, in FP8
    where that costs no accuracy:

    tensorwise  saves x^T and W^T cast (1 byte per element; the transpose of a
                tensorwise cast is the same bytes), nothing high-precision.
    rowwise     saves the column-wise cast of x (x^T cast along M, exactly what
                backward would cast from x, so it costs nothing in accuracy and
                holds 1 byte per element instead of x's 2 or 4) and W itself
                (a parameter, held anyway; a cast copy would add memory), which
                backward casts along its columns.
    """

    @staticmethod
    def forward(ctx, x2d: torch.Tensor, weight: torch.Tensor, recipe: Recipe, grad_enabled: bool,
                state: "delayed.DelayedState | None" = None):
        # needs_input_grad follows requires_grad even under no_grad, where no
        # backward will run: then no transpose is written and nothing is saved.
        need_dx = ctx.needs_input_grad[0] and grad_enabled
        need_dw = ctx.needs_input_grad[1] and grad_enabled
        ctx.recipe = recipe
        ctx.dtypes = (x2d.dtype, weight.dtype)
        ctx.state = state
        if recipe.rowwise:
            xq, xs, xtq, xts = cast_fp8(x2d, recipe.input_dtype, True, with_transpose=need_dw)
            wq, ws, _, _ = cast_fp8(weight, recipe.weight_dtype, True)
            out = _mm(xq, wq.t(), xs, ws.t(), x2d.dtype, True, recipe.fast_accum_output)
            ctx.save_for_backward(xtq, xts, weight if need_dx else None)
            return out
        amaxes = {}
        if state is not None:  # delayed: the histories' scales; this step's amaxes recorded
            xq, xs, xqt, amaxes[delayed.INPUT] = state.cast(x2d, recipe.input_dtype, delayed.INPUT, need_dw)
        else:
            xq, xs, xqt, _ = cast_fp8(x2d, recipe.input_dtype, False, with_transpose=need_dw)
        ctx.w_is_transposed = not isinstance(weight, Fp8WeightCast)
        if isinstance(weight, Fp8WeightCast):  # gathered as FP8 (tensorwise only): not cast again
            wq, ws, wqt = weight._data, weight._inv_scale, weight._data
        elif state is not None:
            wq, ws, wqt, amaxes[delayed.WEIGHT] = state.cast(weight, recipe.weight_dtype, delayed.WEIGHT, need_dx)
        else:
            wq, ws, wqt, _ = cast_fp8(weight, recipe.weight_dtype, False, with_transpose=need_dx)
        if state is not None:
            state.record(amaxes)  # one all_reduce for both (reduce_amax)
        # wq.t() is [K, N] column-major, as _scaled_mm wants its second operand.
        out = _mm(xq, wq.t(), xs, ws, x2d.dtype, False, recipe.fast_accum_output)
        ctx.save_for_backward(xqt if need_dw else None, xs, wqt if need_dx else None, ws)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        recipe: Recipe = ctx.recipe
        x_dtype, w_dtype = ctx.dtypes
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        go = grad_out.contiguous()
        grad_x = grad_w = None
        state: delayed.DelayedState | None = ctx.state
        if state is not None:
            gq, gs, gqt, amax = state.cast(go, recipe.grad_output_dtype, delayed.GRAD_OUTPUT, need_dw)
            gst = gs
            state.record({delayed.GRAD_OUTPUT: amax})
        else:
            gq, gs, gqt, gst = cast_fp8(go, recipe.grad_output_dtype, recipe.rowwise, with_data=need_dx,
                                        with_transpose=need_dw)
        if not recipe.rowwise:
            xqt, xs, wqt, ws = ctx.saved_tensors
            gs = gs if gs is not None else gst  # one scale for dy and dy^T
            if need_dx:
                if not ctx.w_is_transposed:  # the gathered FP8 weight: its transpose, made here
                    wqt = wqt.t().contiguous()
                # dx [M, K] = dy [M, N] @ W [N, K]   (W column-major: W^T row-major, transposed)
                grad_x = _mm(gq, wqt.t(), gs, ws, x_dtype, False, recipe.fast_accum_grad_input)
            if need_dw:
                # dW [N, K] = dy^T [N, M] @ x [M, K]
                grad_w = _mm(gqt, xqt.t(), gs, xs, w_dtype, False, recipe.fast_accum_grad_weight)
        else:
            xtq, xts, weight = ctx.saved_tensors
            # Scales along each GEMM's contracted dim: N for dx, M for dW.
            if need_dx:
                _, _, wtq, wts = cast_fp8(weight, recipe.weight_dtype, True, with_data=False,
                                          with_transpose=True)  # W^T [K, N], per row over N
                grad_x = _mm(gq, wtq.t(), gs, wts.t(), x_dtype, True,
                             recipe.fast_accum_grad_input)  # gq [M, N], per row over N
            if need_dw:
                grad_w = _mm(gqt, xtq.t(), gst, xts.t(), w_dtype, True,
                             recipe.fast_accum_grad_weight)  # dy^T, x^T [., M], over M
        return grad_x, grad_w, None, None, None


class Fp8Linear(nn.Linear):
    """nn.Linear with FP8 GEMMs. Same constructor (plus ``recipe``), same
    parameters and state_dict keys, so checkpoints load both ways. The delayed
    recipe adds its amax history as buffers (delayed.py): their keys join the
    state_dict; a checkpoint without them loads as a fresh history, and one
    with them loads into a current-scaling layer, which ignores them."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None,
                 recipe: str | Recipe = "tensorwise"):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.recipe = recipe_of(recipe)
        if self.recipe.delayed:
            delayed.register_state(self, self.recipe, device)

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe: str | Recipe = "tensorwise") -> "Fp8Linear":
        """An Fp8Linear sharing ``linear``'s parameters (no copy)."""
        new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta",
                  recipe=recipe)
        new.weight = linear.weight
        new.bias = linear.bias
        if new.recipe.delayed:  # the history beside the weight, not on "meta"
            delayed.register_state(new, new.recipe, linear.weight.device)
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
        state = delayed.delayed_state(self, self.recipe)
        out = _Fp8Matmul.apply(x2d, weight, self.recipe, torch.is_grad_enabled(), state)
        out = out.reshape(*x.shape[:-1], self.out_features)
        return out + bias.to(out.dtype) if bias is not None else out

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        # state_dict values are plain tensors (or DTensors of plain tensors)
        # even when the weight is wrapped for the FP8 all-gather.
        super()._save_to_state_dict(destination, prefix, keep_vars)
        key = prefix + "weight"
        if not keep_vars and key in destination:
            destination[key] = unwrap_weight(destination[key])

    def reset_parameters(self) -> None:
        super().reset_parameters()
        self.reset_fp8_state()

    def reset_fp8_state(self) -> None:
        """The delayed recipe's history back to nothing recorded (a no-op for
        the others). ``reset_parameters`` calls it; after ``to_empty`` (a model
        built on the meta device) call either, or load a checkpoint."""
        if getattr(self, "recipe", None) is not None and self.recipe.delayed and hasattr(self, delayed.HISTORY):
            delayed.reset_state(self)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        keys = [prefix + k for k in (delayed.HISTORY, delayed.SCALE, delayed.COUNT)]
        if not self.recipe.delayed:  # a delayed layer's checkpoint: its history does not apply here
            state_dict = {k: v for k, v in state_dict.items() if k not in keys}
        elif not any(k in state_dict for k in keys):  # a current-scaling checkpoint: a fresh history
            state_dict = {**state_dict, **{k: getattr(self, k[len(prefix):]) for k in keys}}
        elif prefix + delayed.HISTORY in state_dict:
            got = tuple(state_dict[prefix + delayed.HISTORY].shape)
            if got != tuple(self.fp8_amax_history.shape):
                error_msgs.append(
                    f"fp8comm.nn.Fp8Linear {prefix!r}: the checkpoint's amax history is {got}, this layer's "
                    f"recipe keeps {tuple(self.fp8_amax_history.shape)}; build the layer with "
                    f"amax_history_len={got[0]} to resume it")
                return
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        if self.recipe.delayed:
            delayed.sync_recorded_flags(self)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe.name}"
