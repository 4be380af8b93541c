"""Delayed scaling: the casts of the "delayed" recipe (config.py), with the
scale an amax history gives, as Transformer Engine's DelayedScaling defines it.

The state of one Fp8Linear, registered buffers (so ``state_dict`` carries it
and a checkpoint resumes bit for bit):

    fp8_amax_history  float32 [amax_history_len, 3], newest row first; one
                      column per operand: INPUT, WEIGHT, GRAD_OUTPUT
    fp8_scale         float32 [3]: the scale each operand's next cast uses
    fp8_amax_count    int64 [3]: how many amaxes each operand has recorded

One cast (:meth:`DelayedState.cast`): data = saturate(x * scale) in FP8 with
the operand's scale from the history, and this step's amax of x read in the
same pass: the fused operator ``torch.ops.fp8comm.cast_fp8_scaled`` where the
casts run fused (scaling.fused_cast_enabled: the CPU twin, and on CUDA the
tiled kernels when FP8COMM_CUDA_CAST names them, one pass over x that
records its amax, with the transpose from the same codes; the legacy set
has no such cast), else :func:`cast_with_scale`'s torch ops (an
elementwise cast and a max-reduction that does not wait for it). The same
bytes (NaN codes aside: the operator writes 0x7F, as every fused cast does). An element beyond fp8_max / scale saturates to
+-fp8_max; a cast in which one would not have rounded to fp8_max anyway
(:func:`saturation_threshold`) is counted in ``linear_stats()["saturated_casts"]``.

Recording (:meth:`DelayedState.record`, training mode only): the amaxes (NaN
read as 0, as TE's fmaxf reads it) are all_reduce MAX over the default group
when ``recipe.reduce_amax`` and torch.distributed is initialized; each goes
to row 0 of its column, the older rows move down one, the oldest drops out;
then scale = fp8_max * 2**-margin / a, with a = the column's max
("max") or row 0 ("most_recent"); an a that is 0 or not finite keeps the old
scale (TE's rule).

The first cast of an operand, before anything is recorded, takes its scale
from its own amax (current scaling, the tensorwise recipe's bytes), as
float8_experimental (torchao's delayed scaling) initialized its history; TE
starts from scale 1. Which operands have recorded is known on the host (a
flag per operand, restored from fp8_amax_count when a state_dict is loaded),
so no cast waits on the device to choose its path.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Optional

import torch
import torch.distributed as dist

from ..codec import fp8_max
from .config import Recipe
from .. import _C
from .scaling import EPS, fused_cast_enabled

INPUT, WEIGHT, GRAD_OUTPUT = 0, 1, 2
OPERANDS = ("input", "weight", "grad_output")
HISTORY, SCALE, COUNT = "fp8_amax_history", "fp8_scale", "fp8_amax_count"

# Casts counted per device, as device tensors (read by linear_stats(); no sync per cast).
_saturated: dict = {}
_casts: Counter = Counter()


def delayed_stats() -> dict:
    saturated = sum(int(t.item()) for t in _saturated.values())
    return {"delayed_casts": _casts["casts"], "saturated_casts": saturated}


def reset_delayed_stats() -> None:
    _saturated.clear()
    _casts.clear()


def register_state(module: torch.nn.Module, recipe: Recipe, device) -> None:
    """The delayed-scaling buffers of ``module`` (fresh: nothing recorded)."""
    module.register_buffer(HISTORY, torch.zeros(recipe.amax_history_len, 3, dtype=torch.float32, device=device))
    module.register_buffer(SCALE, torch.ones(3, dtype=torch.float32, device=device))
    module.register_buffer(COUNT, torch.zeros(3, dtype=torch.int64, device=device))
    module._fp8_recorded = [False, False, False]


def saturation_threshold(dtype: torch.dtype) -> float:
    """The largest |x * scale| that rounds to fp8_max without saturating: fp8_max
    plus half its step (464 for E4M3, 61440 for E5M2). A product the history's
    scale merely rounded past fp8_max (amax * (fp8_max / amax) in float32) is
    not a saturation."""
    limit = fp8_max(dtype)
    step = 2.0 ** math.floor(math.log2(limit)) * torch.finfo(dtype).eps
    return limit + step / 2


@torch.no_grad()
def reset_state(module: torch.nn.Module) -> None:
    """Back to nothing recorded, in place (the buffers keep their device)."""
    getattr(module, HISTORY).zero_()
    getattr(module, SCALE).fill_(1.0)
    getattr(module, COUNT).zero_()
    module._fp8_recorded = [False, False, False]


def cast_with_scale(x: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor):
    """(saturate(x * scale) in ``dtype``, 1 / scale, max|x| as float32, whether
    x * scale's amax saturated, as a 0/1 int64 tensor). The product and its
    clamp are those of the current-scaling cast, so a scale equal to current
    scaling's gives its bytes."""
    x32 = x.detach().float()
    limit = fp8_max(dtype)
    data = (x32 * scale).clamp(-limit, limit).to(dtype)
    amax = x32.abs().amax()
    return data, scale.reciprocal(), amax, saturated_of(amax, scale, dtype)


def saturated_of(amax: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Whether amax * scale saturated (an Inf too; a NaN does not compare), as a 0/1 int64 tensor."""
    return (amax * scale > saturation_threshold(dtype)).to(torch.int64)


def scaled_cast_fused(device: torch.device) -> bool:
    """Whether a delayed cast on ``device`` runs in cast_fp8_scaled: the CPU
    twin, or on CUDA the tiled kernels alone, so FP8COMM_CUDA_CAST=legacy
    keeps every CUDA cast in the set a GPU has measured."""
    if not fused_cast_enabled(device):
        return False
    return device.type != "cuda" or _C.cuda_cast() == "tiled"


class DelayedState:
    """What one call of an Fp8Linear needs of its delayed-scaling state."""

    def __init__(self, module: torch.nn.Module, recipe: Recipe):
        self.module = module
        self.recipe = recipe
        self.history: torch.Tensor = getattr(module, HISTORY)
        self.scale: torch.Tensor = getattr(module, SCALE)
        self.count: torch.Tensor = getattr(module, COUNT)
        self.recording = module.training
        if self.history.dtype != torch.float32 or self.scale.dtype != torch.float32:
            raise TypeError(
                f"fp8comm.nn.Fp8Linear (delayed recipe): {HISTORY} and {SCALE} must stay float32, found "
                f"{self.history.dtype}; a module-wide .to(dtype) / .half() converted them: convert the parameters "
                f"alone (or use FSDP2's MixedPrecisionPolicy / autocast), or restore them with "
                f"layer.{HISTORY} = layer.{HISTORY}.float() before any step ran")

    def cast(self, x: torch.Tensor, dtype: torch.dtype, slot: int, with_transpose: bool = False):
        """(data, inv_scale, data_t or None, amax) of 2-D ``x`` for operand ``slot``."""
        if self.module._fp8_recorded[slot]:
            scale = self.scale[slot]
        else:  # nothing recorded yet: the operand's own amax (one more pass, once)
            amax = x.detach().abs().amax().float()
            scale = self._scaled_max(dtype) / amax.clamp(min=EPS)
        if scaled_cast_fused(x.device):
            data, inv, data_t, _, amax = torch.ops.fp8comm.cast_fp8_scaled(
                x.detach(), dtype, scale.reshape(()).to(torch.float32), True, with_transpose)
            saturated = saturated_of(amax, scale, dtype)
            data_t = data_t if with_transpose else None
        else:
            data, inv, amax, saturated = cast_with_scale(x, dtype, scale)
            data_t = data.t().contiguous() if with_transpose else None  # a tensorwise cast's transpose: same bytes
        _casts["casts"] += 1
        key = str(x.device)
        _saturated[key] = _saturated[key] + saturated if key in _saturated else saturated
        return data, inv, data_t, amax

    def _scaled_max(self, dtype: torch.dtype) -> float:
        return fp8_max(dtype) * 2.0 ** -self.recipe.margin

    @torch.no_grad()
    def record(self, amaxes: dict) -> None:
        """Records {slot: amax} (training mode only) and updates those slots' scales."""
        if not self.recording or not amaxes:
            return
        slots = list(amaxes)
        values = torch.stack([amaxes[s].reshape(()) for s in slots]).to(self.history.device)
        values = torch.where(torch.isnan(values), torch.zeros_like(values), values)
        if self.recipe.reduce_amax and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(values, op=dist.ReduceOp.MAX)
        dtypes = (self.recipe.input_dtype, self.recipe.weight_dtype, self.recipe.grad_output_dtype)
        hist = self.history
        for value, slot in zip(values.unbind(), slots):
            hist[1:, slot] = hist[:-1, slot].clone()
            hist[0, slot] = value
            a = hist[0, slot] if self.recipe.amax_compute_algo == "most_recent" else hist[:, slot].amax()
            fresh = self._scaled_max(dtypes[slot]) / a
            self.scale[slot] = torch.where(torch.isfinite(a) & (a > 0), fresh, self.scale[slot])
            self.count[slot] += 1
            self.module._fp8_recorded[slot] = True


def sync_recorded_flags(module: torch.nn.Module) -> None:
    """The host's flags from fp8_amax_count (after a state_dict was loaded)."""
    module._fp8_recorded = [bool(c) for c in getattr(module, COUNT).tolist()]


def delayed_state(module: torch.nn.Module, recipe: Recipe) -> Optional[DelayedState]:
    return DelayedState(module, recipe) if recipe.delayed else None
