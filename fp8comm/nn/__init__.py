"""FP8 compute: Fp8Linear and convert_to_fp8 (DESIGN.md, "FP8 compute")."""
from .config import RECIPES, Recipe  # noqa: F401
from .convert import convert_to_fp8, default_filter  # noqa: F401
from .fsdp import Fp8AllGatherWeight, Fp8WeightCast, has_fp8_all_gather, precompute_fp8_scales_for_fsdp  # noqa: F401
from .linear import Fp8Linear, linear_stats, reset_linear_stats  # noqa: F401
