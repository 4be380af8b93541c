"""fp8comm: FP8-compressed torch.distributed collectives and FP8 linear layers.

    import fp8comm                                    # registers fp8nccl / fp8gloo
    dist.init_process_group("cpu:gloo,cuda:fp8nccl")
    model = fp8comm.convert_to_fp8(model)
"""
import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C  # noqa: F401  (registers the torch.ops.fp8comm operators)
from .codec import (  # noqa: F401
    dequant_sum,
    dequant_sum_requantize,
    dequantize,
    dequantize_segments,
    quantize,
    quantize_segments,
    segment_bytes,
)

__version__ = "0.1.0"
