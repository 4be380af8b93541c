"""Recipes of the FP8 linear layer (DESIGN.md, "FP8 compute").

Current ("real-time") scaling: every GEMM operand is scaled from its own amax
in this step, no history. The scale maps the operand's amax onto the FP8
format's largest value.
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
    """

    name: str
    input_dtype: torch.dtype
    weight_dtype: torch.dtype
    grad_output_dtype: torch.dtype
    rowwise: bool
    fast_accum_output: bool = True
    fast_accum_grad_input: bool = False
    fast_accum_grad_weight: bool = False


RECIPES = {
    # E4M3 for forward operands, E5M2 (more range) for gradients; one scale
    # per tensor, so the backward GEMMs reuse the forward casts transposed.
    "tensorwise": Recipe("tensorwise", E4M3, E4M3, E5M2, rowwise=False),
    # E4M3 everywhere with a scale per row: a row with one outlier does not
    # crush the others. Backward casts again along the new contracted dims.
    "rowwise": Recipe("rowwise", E4M3, E4M3, E4M3, rowwise=True),
}


def recipe_of(recipe: str | Recipe) -> Recipe:
    if isinstance(recipe, Recipe):
        return recipe
    if recipe not in RECIPES:
        raise ValueError(f"fp8comm: unknown FP8 recipe {recipe!r}; choose one of {sorted(RECIPES)}")
    return RECIPES[recipe]
