"""The FP8 block codec (DESIGN.md, "Wire format").

A tensor of n elements is cut into blocks of ``block_size`` elements; each block
has one power-of-two scale stored as one E8M0 byte (``torch.float8_e8m0fnu``,
value ``2**(byte - 127)``) and ``block_size`` FP8 codes (E4M3 or E5M2). The
scale is the smallest power of two that keeps the block maximum unsaturated;
rounding is to nearest even, or stochastic (``rounding="stochastic"``: unbiased,
the random bits a hash of ``rounding_key``, the segment and the element's index in
it, DESIGN.md "Stochastic rounding"); non-finite inputs decode to non-finite.

The fused operators below work on *wire segments*: ``[scales][codes]`` runs of
``segment_bytes(m, block_size)`` bytes holding m elements each, the unit the
backend sends to one peer. All operators are ``torch.ops.fp8comm.*`` with fake
implementations, so they trace under torch.compile.
"""
from __future__ import annotations

import torch

from . import _C

__all__ = [
    "quantize",
    "dequantize",
    "segment_bytes",
    "quantize_segments",
    "dequantize_segments",
    "dequant_sum",
    "dequant_sum_requantize",
]

# The FP8 dtypes, from the one registry (csrc/codec/fp8_block_math.h, the torch
# dtypes in fp8_dtype_table.h): (name, torch dtype, largest finite value) each.
_FP8_REGISTRY = _C.fp8_dtypes()
FP8_DTYPES = tuple(dtype for _, dtype, _ in _FP8_REGISTRY)  # what fp8_dtype arguments take
FP8_DTYPE_BY_NAME = {name: dtype for name, dtype, _ in _FP8_REGISTRY}  # "e4m3" -> torch.float8_e4m3fn
_FP8_MAX = {dtype: fp8_max for _, dtype, fp8_max in _FP8_REGISTRY}
E4M3 = FP8_DTYPE_BY_NAME["e4m3"]
E5M2 = FP8_DTYPE_BY_NAME["e5m2"]
CODEC_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def fp8_max(fp8_dtype: torch.dtype) -> float:
    """The largest finite value of an FP8 dtype (448 for E4M3)."""
    return _FP8_MAX[fp8_dtype]


def fp8_dtype_choices() -> str:
    """The FP8 dtypes as errors list them: torch.float8_e4m3fn or torch.float8_e5m2."""
    names = [str(d) for d in FP8_DTYPES]
    return ", ".join(names[:-1]) + " or " + names[-1]


def segment_bytes(segment_numel: int, block_size: int = 32) -> int:
    """Bytes of one wire segment of ``segment_numel`` elements: the scale bytes
    padded to 16, then the codes padded to a whole block."""
    return _C.segment_bytes(segment_numel, block_size)


def _key(rounding_key: int) -> int:
    """A 64-bit key as the operators' signed int takes it (the same 64 bits)."""
    if not 0 <= rounding_key < 1 << 64 and not -(1 << 63) <= rounding_key < 0:
        raise ValueError(f"fp8comm codec: rounding_key must fit 64 bits, got {rounding_key}")
    return rounding_key - (1 << 64) if rounding_key >= 1 << 63 else rounding_key


def quantize(
    x: torch.Tensor,
    *,
    block_size: int = 32,
    fp8_dtype: torch.dtype = E4M3,
    rounding: str = "nearest",
    rounding_key: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x`` (float32/bfloat16/float16, any shape) to FP8 blocks.

    Returns ``(codes, scales)``: ``codes`` is 1-D ``fp8_dtype`` with ``x.numel()``
    elements; ``scales`` is 1-D ``torch.float8_e8m0fnu`` with one element per block
    (``scales.view(torch.uint8)`` gives the raw exponent bytes). ``rounding``:
    "nearest" (even) or "stochastic", whose random bits ``rounding_key`` (64 bits)
    selects: the same key gives the same bytes.
    """
    return torch.ops.fp8comm.quantize(x, block_size, fp8_dtype, rounding, _key(rounding_key))


def dequantize(
    codes: torch.Tensor, scales: torch.Tensor, *, block_size: int = 32, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Decode ``(codes, scales)`` from :func:`quantize` into a 1-D ``dtype`` tensor."""
    return torch.ops.fp8comm.dequantize(codes, scales, block_size, dtype)


def quantize_segments(
    x: torch.Tensor,
    out: torch.Tensor,
    num_segments: int,
    segment_numel: int,
    *,
    block_size: int = 32,
    fp8_dtype: torch.dtype = E4M3,
    premul: float | torch.Tensor = 1.0,
    rounding: str = "nearest",
    rounding_key: int = 0,
) -> None:
    """Quantize ``x * premul`` (flattened; ``numel <= num_segments * segment_numel``)
    into ``out``, a uint8 buffer of ``num_segments`` wire segments. Elements past
    ``x.numel()`` are written as zeros. ``rounding`` and ``rounding_key``: as
    :func:`quantize` (segment r's bits are keyed by the key and r)."""
    factor = premul if isinstance(premul, torch.Tensor) else None
    scalar = 1.0 if factor is not None else float(premul)
    torch.ops.fp8comm.quantize_segments(x, out, num_segments, segment_numel, block_size, fp8_dtype, scalar, factor,
                                        rounding, _key(rounding_key))


def dequantize_segments(
    segments: torch.Tensor,
    out: torch.Tensor,
    num_segments: int,
    segment_numel: int,
    *,
    block_size: int = 32,
    fp8_dtype: torch.dtype = E4M3,
) -> None:
    """Decode ``num_segments`` wire segments into the first ``out.numel()`` elements
    of the flat ``out`` (contiguous, float32/bfloat16/float16)."""
    torch.ops.fp8comm.dequantize_segments(segments, out, num_segments, segment_numel, block_size, fp8_dtype)


def _sum_function(op, name: str, doc: str, quantizes: bool = False):
    """dequant_sum and dequant_sum_requantize: the same arguments (the latter's
    rounding too), another output."""

    def run(
        pieces: torch.Tensor,
        out: torch.Tensor,
        num_pieces: int,
        segment_numel: int,
        *,
        block_size: int = 32,
        fp8_dtype: torch.dtype = E4M3,
        post_div: int = 1,
        own: torch.Tensor | None = None,
        own_premul: float = 1.0,
        rounding: str = "nearest",
        rounding_key: int = 0,
    ) -> None:
        if not quantizes and (rounding != "nearest" or rounding_key != 0):
            raise ValueError(f"fp8comm.{name} writes no FP8 codes, so it takes no rounding; got rounding="
                             f"{rounding!r}, rounding_key={rounding_key} (dequant_sum_requantize takes them)")
        extra = (rounding, _key(rounding_key)) if quantizes else ()
        op(pieces, out, num_pieces, segment_numel, block_size, fp8_dtype, post_div, own, own_premul, *extra)

    run.__name__ = run.__qualname__ = name
    run.__doc__ = doc
    return run


dequant_sum = _sum_function(
    torch.ops.fp8comm.dequant_sum,
    "dequant_sum",
    """``out = (own * own_premul + the decoded pieces) / post_div``, summed in
    float32, ``own`` first and then the pieces in order; ``out.numel() <=
    segment_numel``. ``own`` (optional, at most ``segment_numel`` elements, the
    dtype of ``out``) is a rank's own contribution, added without quantization,
    zero past its end; with it ``num_pieces`` may be 0.""",
)

dequant_sum_requantize = _sum_function(
    torch.ops.fp8comm.dequant_sum_requantize,
    "dequant_sum_requantize",
    """Like :func:`dequant_sum`, but quantizes the float32 sum into ``out``, one
    wire segment of ``segment_numel`` elements (``own`` may have any codec dtype);
    ``rounding`` and ``rounding_key`` as :func:`quantize`.""",
    quantizes=True,
)


# ---------------------------------------------------------------- fake kernels
@torch.library.register_fake("fp8comm::quantize")
def _quantize_fake(x, block_size, fp8_dtype, rounding="nearest", rounding_key=0):
    n = x.numel()
    codes = x.new_empty((n,), dtype=fp8_dtype)
    scales = x.new_empty(((n + block_size - 1) // block_size,), dtype=torch.float8_e8m0fnu)
    return codes, scales


@torch.library.register_fake("fp8comm::dequantize")
def _dequantize_fake(codes, scales, block_size, dtype):
    return codes.new_empty((codes.numel(),), dtype=dtype)


def _writes_out(*args, **kwargs):
    """The operators that write into ``out`` return nothing."""
    return None


for _name in ("quantize_segments", "dequantize_segments", "dequant_sum", "dequant_sum_requantize"):
    torch.library.register_fake(f"fp8comm::{_name}")(_writes_out)
