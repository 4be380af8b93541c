"""An independent reference of the FP8 block format in plain torch ops.

The scale rule is written from DESIGN.md with torch.frexp, the rounding is
torch's own float -> float8 cast (round to nearest even), so agreement with
fp8comm's C++ codec is a real check, not a tautology.
"""
import torch

FP8_MAX_EXP = {torch.float8_e4m3fn: 8, torch.float8_e5m2: 15}  # fp8_max = 1.75 * 2**exp
MANT_BITS = {torch.float8_e4m3fn: 3, torch.float8_e5m2: 2}
MIN_NORMAL_EXP = {torch.float8_e4m3fn: -6, torch.float8_e5m2: -14}


def block_view(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """Flat float32 values of x padded with zeros to whole blocks, shape [blocks, block_size]."""
    flat = x.reshape(-1).float()
    pad = (-flat.numel()) % block_size
    return torch.nn.functional.pad(flat, (0, pad)).view(-1, block_size)


def scale_exponents(x: torch.Tensor, block_size: int, fp8_dtype) -> torch.Tensor:
    """Per block: the smallest e with amax <= fp8_max * 2**e (finite elements only),
    clamped to >= -126; 0 for blocks with no finite non-zero element."""
    blocks = block_view(x, block_size)
    finite = torch.where(torch.isfinite(blocks), blocks.abs(), torch.zeros_like(blocks))
    amax = finite.amax(dim=1)
    mant, exp = torch.frexp(amax)  # amax = mant * 2**exp, mant in [0.5, 1)
    # fp8_max = 0.875 * 2**(max_exp + 1)
    e = torch.where(mant <= 0.875, exp - FP8_MAX_EXP[fp8_dtype] - 1, exp - FP8_MAX_EXP[fp8_dtype])
    e = e.clamp(min=-126)
    return torch.where(amax == 0, torch.zeros_like(e), e).to(torch.int32)


def quantize(x: torch.Tensor, block_size: int, fp8_dtype, premul: float = 1.0):
    """(codes as uint8, scale bytes as uint8) exactly as DESIGN.md specifies."""
    n = x.numel()
    e = scale_exponents(x.reshape(-1).float() * premul, block_size, fp8_dtype)
    v = block_view(x, block_size) * premul
    scaled = v * torch.pow(2.0, -e.double()).float()[:, None]
    # Near FLT_MAX, values that would round up to 2**128 on decode round down.
    top = (2.0 - 2.0 ** -MANT_BITS[fp8_dtype]) * torch.pow(2.0, 127.0 - e.double())
    limit = torch.minimum(top, torch.full_like(top, 1.75 * 2.0 ** FP8_MAX_EXP[fp8_dtype])).float()[:, None]
    finite = torch.isfinite(scaled)
    scaled = torch.where(finite, torch.maximum(torch.minimum(scaled, limit), -limit), scaled)
    if fp8_dtype == torch.float8_e4m3fn:
        scaled = torch.where(torch.isinf(scaled), torch.full_like(scaled, float("nan")), scaled)
    codes = scaled.to(fp8_dtype).view(torch.uint8).reshape(-1)[:n]
    return codes, (e + 127).to(torch.uint8)


def dequantize(codes_u8: torch.Tensor, scale_bytes: torch.Tensor, block_size: int, fp8_dtype) -> torch.Tensor:
    """float32 values of (codes, scales)."""
    n = codes_u8.numel()
    vals = codes_u8.view(fp8_dtype).float()
    scales = torch.pow(2.0, scale_bytes.double() - 127).float().repeat_interleave(block_size)[:n]
    return vals * scales


def half_ulp(x: torch.Tensor, block_size: int, fp8_dtype) -> torch.Tensor:
    """Half an ulp of the wire format at each element's magnitude, in units of
    the element (the round-trip error bound). fp8_dtype: an FP8 torch dtype, or
    "mxfp4" / "nvfp4" (tests/support/mxfp4_reference.py, nvfp4_reference.py)."""
    if fp8_dtype == "mxfp4":
        from tests.support.mxfp4_reference import half_step
        return half_step(x, block_size)
    if fp8_dtype == "nvfp4":  # x is one segment: its scale is part of every block's
        from tests.support.nvfp4_reference import half_step
        return half_step(x, block_size)
    e = scale_exponents(x, block_size, fp8_dtype)
    scale = torch.pow(2.0, e.double()).repeat_interleave(block_size)[: x.numel()]
    y = (x.reshape(-1).double().abs() / scale).clamp(min=2.0 ** MIN_NORMAL_EXP[fp8_dtype])
    _, exp = torch.frexp(y)
    ulp = torch.pow(2.0, (exp - 1 - MANT_BITS[fp8_dtype]).double())
    return 0.5 * ulp * scale


def sqnr_db(ref: torch.Tensor, got: torch.Tensor) -> float:
    ref = ref.double().reshape(-1)
    err = got.double().reshape(-1) - ref
    signal = ref.pow(2).sum().item()
    noise = err.pow(2).sum().item()
    if noise == 0:
        return float("inf")
    return 10.0 * torch.log10(torch.tensor(signal / noise)).item()
