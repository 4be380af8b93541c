"""fp8comm: FP8-compressed torch.distributed collectives and FP8 linear layers.

    import fp8comm                                    # registers fp8nccl / fp8gloo
    dist.init_process_group("cpu:gloo,cuda:fp8nccl")
    model = fp8comm.convert_to_fp8(model)             # FP8 compute (Fp8Linear)
    with fp8comm.uncompressed():                      # exact collectives in this block
        evaluate(model)
"""
import torch
import torch.distributed  # noqa: F401  (ProcessGroupFp8 derives from its Backend binding)

try:
    from . import _C  # noqa: F401  (registers the torch.ops.fp8comm operators)
except ImportError as e:
    raise ImportError(
        f"fp8comm: its C++ extension fp8comm._C did not load ({e}). It must be built against the torch it runs "
        f"with (torch {torch.__version__} here; fp8comm needs >= 2.11): rebuild it with "
        "`pip install --no-build-isolation -e .` in this torch's environment.") from e
from . import functional  # noqa: F401  (compressed collectives on any group)
from .backend import register as _register_backends
from .codec import (  # noqa: F401
    WIRE_FORMATS,
    dequant_sum,
    dequant_sum_requantize,
    dequantize,
    dequantize_segments,
    quantize,
    quantize_segments,
    segment_bytes,
)
from .nn import Fp8Linear, convert_to_fp8, precompute_fp8_scales_for_fsdp  # noqa: F401
from .options import Options  # noqa: F401
from .stats import get_stats, reset_stats  # noqa: F401
from .subgroups import install as _install_splitter
from .uncompressed_blocks import uncompressed  # noqa: F401

_register_backends()
_install_splitter()

__version__ = "0.1.0"
