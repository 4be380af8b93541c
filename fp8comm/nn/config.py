"""Recipes of the FP8 linear layer (DESIGN.md, "FP8 compute").

Current ("real-time") scaling (tensorwise, rowwise): every GEMM operand is
scaled from its own amax in this step, no history. The scale maps the
operand's amax onto the FP8 format's largest value.

Delayed scaling (delayed): each operand is scaled from an amax history the
layer keeps (delayed.py), as Transformer Engine's ``DelayedScaling`` recipe
defines it: the fields amax_history_len, amax_compute_algo ("max" /
"most_recent") and margin, with TE's HYBRID format (E4M3 forward, E5M2
backward).
"""
from __future__ import annotations

import dataclasses

import torch

from ..codec import E4M3, E5M2


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How each of the three GEMMs of a linear layer is cast to FP8.

    name: "tensorwise" or "rowwise".
    input_dtype / weight_dtype / grad_output_dtype: the FP8 formats.
    rowwise: one scale per row of each operand along the contracted dim
        (else one scale per tensor).
    fast_accum_output / fast_accum_grad_input / fast_accum_grad_weight:
        torch._scaled_mm's ``use_fast_accum`` for the GEMM of y, dx and dW on
        CUDA (faster, less precise accumulation). torchao's float8 defaults:
        on for the output GEMM, off for the two gradient GEMMs. The CPU GEMM
        has one accumulation and ignores them. Change them with
        ``dataclasses.replace(RECIPES["rowwise"], fast_accum_output=False)``.
    scaling: "current" (the operand's own amax) or "delayed" (an amax
        history; tensorwise only). The fields below serve "delayed" only,
        with Transformer Engine's meaning and defaults (DelayedScaling):
    amax_history_len: how many amaxes each operand's history keeps.
    amax_compute_algo: "max" (the largest amax in the history) or
        "most_recent" (the last one recorded) gives the amax of the scale.
    margin: scale = fp8_max * 2**-margin / amax: the largest value recorded
        lands 2**margin below the FP8 format's largest, head room for growth.
    reduce_amax: with torch.distributed initialized, the amaxes a layer
        records are all_reduce MAX over the default process group, so every
        rank holds the same history and scales (DESIGN.md, "FP8 compute").
    """

    name: str
    input_dtype: torch.dtype
    weight_dtype: torch.dtype
    grad_output_dtype: torch.dtype
    rowwise: bool
    fast_accum_output: bool = True
    fast_accum_grad_input: bool = False
    fast_accum_grad_weight: bool = False
    scaling: str = "current"
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    margin: int = 0
    reduce_amax: bool = True

    def __post_init__(self):
        if self.scaling not in ("current", "delayed"):
            raise ValueError(f"fp8comm.nn.Recipe {self.name!r}: scaling must be 'current' or 'delayed', "
                             f"got {self.scaling!r}")
        if self.scaling == "delayed":
            if self.rowwise:
                raise ValueError(f"fp8comm.nn.Recipe {self.name!r}: delayed scaling is tensorwise "
                                 "(one history per operand); set rowwise=False")
            if self.amax_compute_algo not in ("max", "most_recent"):
                raise ValueError(f"fp8comm.nn.Recipe {self.name!r}: amax_compute_algo must be 'max' or "
                                 f"'most_recent', got {self.amax_compute_algo!r}")
            if not (isinstance(self.amax_history_len, int) and self.amax_history_len >= 1):
                raise ValueError(f"fp8comm.nn.Recipe {self.name!r}: amax_history_len must be an int >= 1, "
                                 f"got {self.amax_history_len!r}")
            if not (isinstance(self.margin, int) and self.margin >= 0):
                raise ValueError(f"fp8comm.nn.Recipe {self.name!r}: margin must be an int >= 0 "
                                 f"(powers of two of head room), got {self.margin!r}")

    @property
    def delayed(self) -> bool:
        return self.scaling == "delayed"


RECIPES = {
    # E4M3 for forward operands, E5M2 (more range) for gradients; one scale
    # per tensor, so the backward GEMMs reuse the forward casts transposed.
    "tensorwise": Recipe("tensorwise", E4M3, E4M3, E5M2, rowwise=False),
    # E4M3 everywhere with a scale per row: a row with one outlier does not
    # crush the others. Backward casts again along the new contracted dims.
    "rowwise": Recipe("rowwise", E4M3, E4M3, E4M3, rowwise=True),
    # Tensorwise, with the scales from an amax history (Transformer Engine's
    # default recipe, DelayedScaling with its HYBRID format): the cast needs
    # no pass over the operand before it. Change the fields with
    # ``dataclasses.replace(RECIPES["delayed"], amax_history_len=16)``.
    "delayed": Recipe("delayed", E4M3, E4M3, E5M2, rowwise=False, scaling="delayed"),
}


def recipe_of(recipe: str | Recipe) -> Recipe:
    if isinstance(recipe, Recipe):
        return recipe
    if recipe not in RECIPES:
        raise ValueError(f"fp8comm: unknown FP8 recipe {recipe!r}; choose one of {sorted(RECIPES)}")
    return RECIPES[recipe]
