"""convert_to_fp8: swap a model's nn.Linear layers for Fp8Linear, in place."""
from __future__ import annotations

import warnings
from typing import Callable

import torch.nn as nn

from .config import Recipe, recipe_of
from .fsdp import wrap_weight
from .linear import Fp8Linear


def default_filter(module: nn.Linear, fqn: str, recipe: Recipe) -> bool:
    """Which linears gain from FP8 unless told otherwise.

    Every dim must be a multiple of 16 (_scaled_mm). Beyond that the cast
    overhead must be amortized by a GEMM large enough: we follow torchao's
    H100 thresholds for its float8 training (its README's tensorwise /
    rowwise tables): tensorwise skips layers with out <= 4096 and
    in <= 1024; rowwise skips in <= 2048, out <= 1024, or (in <= 4096 and
    out <= 2048). These are GPU figures; on the CPU FP8 GEMMs are never faster
    (docs/fp8_linear.md), so pass module_filter_fn to convert small or CPU
    models. bench/linear.py finds the crossover on the GPU at hand.
    """
    out_f, in_f = module.weight.shape
    if in_f % 16 or out_f % 16:
        return False
    if recipe.rowwise:
        return not (in_f <= 2048 or out_f <= 1024 or (in_f <= 4096 and out_f <= 2048))
    return not (out_f <= 4096 and in_f <= 1024)


def convert_to_fp8(
    model: nn.Module,
    *,
    recipe: str | Recipe = "tensorwise",
    module_filter_fn: Callable[[nn.Module, str], bool] | None = None,
    fp8_all_gather: bool = False,
) -> nn.Module:
    """Replaces every nn.Linear in ``model`` (the model itself included) with an
    Fp8Linear sharing its parameters, skipping those for which
    ``module_filter_fn(module, fqn)`` returns False (torchao's convention); with
    no filter, :func:`default_filter` decides. Returns the model.

    ``fp8_all_gather=True`` (tensorwise and delayed recipes; call before ``fully_shard``):
    FSDP2 all-gathers the converted layers' weights as the FP8 bytes their
    forward GEMM consumes, cast once from the shard with the whole weight's
    scale (fsdp.py). The weight parameters become Fp8AllGatherWeight, which
    behaves as the plain tensor everywhere else (optimizers, state_dict, DDP,
    FSDP1). Off by default: see docs/fp8_linear.md, "FP8 all-gather". Under
    the delayed recipe the gathered weight keeps its current scaling (the
    whole weight's amax, which all shards must agree on anyway); its input and
    gradient casts take their histories' scales. The rowwise recipe keeps the
    exact all-gather (a warning says so)."""
    rec = recipe_of(recipe)
    if fp8_all_gather and rec.rowwise:
        warnings.warn(
            "fp8comm.convert_to_fp8: fp8_all_gather serves the tensorwise recipe only; rowwise weights are "
            "all-gathered exactly (their backward needs column-wise scales that row-cast FP8 bytes cannot give)",
            stacklevel=2,
        )
        fp8_all_gather = False

    def convert(linear: nn.Linear) -> Fp8Linear:
        new = Fp8Linear.from_linear(linear, recipe=rec)
        if fp8_all_gather:
            wrap_weight(new, rec.weight_dtype)
        return new

    def wanted(mod: nn.Module, fqn: str) -> bool:
        if type(mod) is not nn.Linear:  # subclasses (Fp8Linear included) are left alone
            return False
        return module_filter_fn(mod, fqn) if module_filter_fn is not None else default_filter(mod, fqn, rec)

    if wanted(model, ""):
        return convert(model)
    for fqn, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            child_fqn = f"{fqn}.{name}" if fqn else name
            if wanted(child, child_fqn):
                setattr(parent, name, convert(child))
    return model
