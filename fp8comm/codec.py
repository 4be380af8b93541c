"""The block codec (DESIGN.md, "Wire format").

A tensor of n elements is cut into blocks of ``block_size`` elements, each with
one scale and ``block_size`` codes of the wire format (``WIRE_FORMATS``):
``"e4m3"`` or ``"e5m2"`` (one FP8 byte each) or ``"mxfp4"`` (OCP MX FP4: E2M1
codes, two per byte, element 2i in the low nibble), each block scaled by a power
of two stored as one E8M0 byte (``torch.float8_e8m0fnu``, value ``2**(byte -
127)``); or ``"nvfp4"`` (E2M1 codes in blocks of 16, each block scaled by an
E4M3 byte times one float32 power of two per segment, its *segment scale*). The
scale never lets the block maximum saturate; rounding is to nearest even, or
stochastic (``rounding="stochastic"``: unbiased, the random bits a hash of
``rounding_key``, the segment and the element's index in it, DESIGN.md
"Stochastic rounding"); non-finite inputs decode to non-finite (the 4-bit
formats have no NaN code: such a block gets its scale's NaN, and all of it
decodes to NaN).

The fused operators below work on *wire segments*: ``[scales][codes]`` runs of
``segment_bytes(m, block_size)`` bytes holding m elements each, the unit the
backend sends to one peer. All operators are ``torch.ops.fp8comm.*`` with fake
implementations, so they trace under torch.compile.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from . import _C

__all__ = [
    "WIRE_FORMATS",
    "WireFormatInfo",
    "wire_format_info",
    "default_block_size",
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

class WireFormatInfo(NamedTuple):
    """A wire format's row of the one registry (WireTraits in fp8_block_math.h)."""

    codes_dtype: torch.dtype  # the torch dtype of its codes
    code_bits: int  # 8, or 4 (two codes per byte)
    max: float  # the largest finite code value
    scales_dtype: torch.dtype  # the torch dtype of its block scales
    block_size: int  # the block size it requires; 0: any valid one
    segment_scale_bytes: int  # bytes of its segment scale (float32), 0: none


_WIRE_REGISTRY = {row[0]: WireFormatInfo(*row[1:]) for row in _C.wire_formats()}
WIRE_FORMATS = tuple(_WIRE_REGISTRY)  # ("e4m3", "e5m2", "mxfp4", "nvfp4")


def wire_format_info(wire_format: str) -> WireFormatInfo:
    """The registry row of a wire format by name."""
    return _WIRE_REGISTRY[_wire_format(wire_format, None)]


def wire_format_max(wire_format: str) -> float:
    """The largest finite code value of a wire format (6 for the 4-bit ones)."""
    return wire_format_info(wire_format).max


def wire_format_code_bits(wire_format: str) -> int:
    """Bits per code of a wire format (8, or 4 for the 4-bit ones)."""
    return wire_format_info(wire_format).code_bits


def default_block_size(wire_format: str) -> int:
    """The block size a format uses unless told otherwise: the one it requires,
    else 32 (the OCP MX block)."""
    return wire_format_info(wire_format).block_size or 32


def _block_size(block_size: int | None, wire_format: str) -> int:
    return default_block_size(wire_format) if block_size is None else block_size


def _wire_format(wire_format: str | None, fp8_dtype: torch.dtype | None, default: str = "e4m3") -> str:
    """The wire format a codec call names: ``wire_format`` by name, or the older
    ``fp8_dtype`` (an FP8 torch dtype, the dtype of the codes); not both."""
    if fp8_dtype is not None:
        name = {info.codes_dtype: n for n, info in _WIRE_REGISTRY.items() if info.code_bits == 8}.get(fp8_dtype)
        if name is None or fp8_dtype not in FP8_DTYPES:
            raise ValueError(f"fp8comm codec: fp8_dtype must be {fp8_dtype_choices()}, got {fp8_dtype}; "
                             f"name the format with wire_format= (one of {', '.join(WIRE_FORMATS)})")
        if wire_format is not None and wire_format.lower() != name:
            raise ValueError(f"fp8comm codec: fp8_dtype={fp8_dtype} and wire_format={wire_format!r} disagree; "
                             "give wire_format alone")
        return name
    if wire_format is None:
        return default
    name = str(wire_format).lower()
    if name in _WIRE_REGISTRY:  # plain Python, so torch.compile traces it
        return name
    return _C.wire_format_name(str(wire_format), "fp8comm codec")  # raises the one error (fp8_dtype_table.h)


def fp8_max(fp8_dtype: torch.dtype) -> float:
    """The largest finite value of an FP8 dtype (448 for E4M3)."""
    return _FP8_MAX[fp8_dtype]


def fp8_dtype_choices() -> str:
    """The FP8 dtypes as errors list them: torch.float8_e4m3fn or torch.float8_e5m2."""
    names = [str(d) for d in FP8_DTYPES]
    return ", ".join(names[:-1]) + " or " + names[-1]


def segment_bytes(segment_numel: int, block_size: int | None = None, wire_format: str = "e4m3") -> int:
    """Bytes of one wire segment of ``segment_numel`` elements: the segment scale
    (if the format has one) and the block scales padded to 16, then the codes
    padded to a whole block."""
    fmt = _wire_format(wire_format, None)
    return _C.segment_bytes(segment_numel, _block_size(block_size, fmt), fmt)


def _key(rounding_key: int) -> int:
    """A 64-bit key as the operators' signed int takes it (the same 64 bits)."""
    if not 0 <= rounding_key < 1 << 64 and not -(1 << 63) <= rounding_key < 0:
        raise ValueError(f"fp8comm codec: rounding_key must fit 64 bits, got {rounding_key}")
    return rounding_key - (1 << 64) if rounding_key >= 1 << 63 else rounding_key


def quantize(
    x: torch.Tensor,
    *,
    block_size: int | None = None,
    wire_format: str | None = None,
    fp8_dtype: torch.dtype | None = None,
    rounding: str = "nearest",
    rounding_key: int = 0,
) -> tuple[torch.Tensor, ...]:
    """Quantize ``x`` (float32/bfloat16/float16, any shape) to blocks of
    ``wire_format`` ("e4m3" unless given; ``fp8_dtype``, an FP8 torch dtype, is
    the older spelling of the FP8 formats); ``block_size`` defaults to
    :func:`default_block_size` (32; 16 for "nvfp4", the only one it takes).

    Returns ``(codes, scales)``, and for a format with a segment scale ("nvfp4")
    ``(codes, scales, segment_scale)``, so ``dequantize(*quantize(x, ...), ...)``
    round-trips. ``codes`` is 1-D: ``x.numel()`` elements of
    ``torch.float8_e4m3fn`` / ``torch.float8_e5m2``, or for the 4-bit formats
    ``ceil(x.numel() / 2)`` elements of ``torch.float4_e2m1fn_x2`` (two codes
    each, the first in the low nibble). ``scales`` is 1-D, one per block, of the
    format's ``scales_dtype`` (``torch.float8_e8m0fnu``; ``torch.float8_e4m3fn``
    for "nvfp4"); ``segment_scale`` one float32. ``rounding``: "nearest" (even)
    or "stochastic", whose random bits ``rounding_key`` (64 bits) selects: the
    same key gives the same bytes.
    """
    fmt = _wire_format(wire_format, fp8_dtype)
    codes, scales, segment_scale = torch.ops.fp8comm.quantize(x, _block_size(block_size, fmt), fmt, rounding,
                                                              _key(rounding_key))
    return (codes, scales, segment_scale) if _WIRE_REGISTRY[fmt].segment_scale_bytes else (codes, scales)


def _format_of_codes(codes: torch.Tensor, wire_format: str | None) -> str:
    """The format a dequantize names, or the one format whose codes have this
    dtype; a dtype two formats share names neither."""
    if wire_format is not None:
        return _wire_format(wire_format, None)
    names = [name for name, info in _WIRE_REGISTRY.items() if info.codes_dtype == codes.dtype]
    if len(names) != 1:
        raise ValueError(f"fp8comm.dequantize: codes of {codes.dtype} are "
                         f"{' or '.join(names) if names else 'the codes of no wire format'}; "
                         f"name the format with wire_format= (one of {', '.join(WIRE_FORMATS)})")
    return names[0]


def dequantize(
    codes: torch.Tensor,
    scales: torch.Tensor,
    segment_scale: torch.Tensor | None = None,
    *,
    wire_format: str | None = None,
    block_size: int | None = None,
    dtype: torch.dtype = torch.float32,
    numel: int | None = None,
) -> torch.Tensor:
    """Decode what :func:`quantize` returned into a 1-D ``dtype`` tensor.
    ``wire_format`` may be left out where the codes' dtype belongs to one format
    only (the FP8 ones); ``numel`` (default: every code) gives an odd element
    count of 4-bit codes, whose last byte holds one."""
    fmt = _format_of_codes(codes, wire_format)
    return torch.ops.fp8comm.dequantize(codes, scales, segment_scale, _block_size(block_size, fmt), dtype,
                                        -1 if numel is None else numel, fmt)


def quantize_segments(
    x: torch.Tensor,
    out: torch.Tensor,
    num_segments: int,
    segment_numel: int,
    *,
    block_size: int | None = None,
    wire_format: str | None = None,
    fp8_dtype: torch.dtype | None = None,
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
    fmt = _wire_format(wire_format, fp8_dtype)
    torch.ops.fp8comm.quantize_segments(x, out, num_segments, segment_numel, _block_size(block_size, fmt), fmt,
                                        scalar, factor, rounding, _key(rounding_key))


def dequantize_segments(
    segments: torch.Tensor,
    out: torch.Tensor,
    num_segments: int,
    segment_numel: int,
    *,
    block_size: int | None = None,
    wire_format: str | None = None,
    fp8_dtype: torch.dtype | None = None,
) -> None:
    """Decode ``num_segments`` wire segments into the first ``out.numel()`` elements
    of the flat ``out`` (contiguous, float32/bfloat16/float16)."""
    fmt = _wire_format(wire_format, fp8_dtype)
    torch.ops.fp8comm.dequantize_segments(segments, out, num_segments, segment_numel, _block_size(block_size, fmt),
                                          fmt)


def _sum_function(op, name: str, doc: str, quantizes: bool = False):
    """dequant_sum and dequant_sum_requantize: the same arguments (the latter's
    rounding too), another output."""

    def run(
        pieces: torch.Tensor,
        out: torch.Tensor,
        num_pieces: int,
        segment_numel: int,
        *,
        block_size: int | None = None,
        wire_format: str | None = None,
        fp8_dtype: torch.dtype | None = None,
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
        fmt = _wire_format(wire_format, fp8_dtype)
        op(pieces, out, num_pieces, segment_numel, _block_size(block_size, fmt), fmt, post_div, own, own_premul,
           *extra)

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
def _quantize_fake(x, block_size, wire_format, rounding="nearest", rounding_key=0):
    n = x.numel()
    info = _WIRE_REGISTRY[wire_format]
    per_element = 8 // info.code_bits
    codes = x.new_empty(((n + per_element - 1) // per_element,), dtype=info.codes_dtype)
    scales = x.new_empty(((n + block_size - 1) // block_size,), dtype=info.scales_dtype)
    segment_scale = x.new_empty((1 if info.segment_scale_bytes else 0,), dtype=torch.float32)
    return codes, scales, segment_scale


@torch.library.register_fake("fp8comm::dequantize")
def _dequantize_fake(codes, scales, segment_scale, block_size, dtype, numel, wire_format):
    per_element = 8 // _WIRE_REGISTRY[wire_format].code_bits
    return codes.new_empty((codes.numel() * per_element if numel < 0 else numel,), dtype=dtype)


def _writes_out(*args, **kwargs):
    """The operators that write into ``out`` return nothing."""
    return None


for _name in ("quantize_segments", "dequantize_segments", "dequant_sum", "dequant_sum_requantize"):
    torch.library.register_fake(f"fp8comm::{_name}")(_writes_out)
