"""An independent reference of the MXFP4 wire format (OCP MX FP4) in plain
torch ops, from the exhaustive E2M1 value table.

E2M1 has sixteen codes: bit 3 the sign, bits 0-2 index E2M1_VALUES. A block's
scale is the smallest power of two 2**e with amax <= 6 * 2**e (finite
elements; e >= -126; 0 for a block without a finite non-zero element), stored
as the E8M0 byte e + 127; a block holding Inf or NaN stores 0xFF (E8M0's NaN)
and decodes to NaN throughout. Elements round to the nearest value of the
table, ties to the even code (the one whose mantissa bit, bit 0, is clear);
the sign bit is the input's (so small negatives give -0). Two codes per byte,
element 2i in the low nibble. Nothing here calls fp8comm's codec.
"""
import torch

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
NAN_SCALE = 0xFF


def _blocks(x: torch.Tensor, block_size: int) -> torch.Tensor:
    flat = x.reshape(-1).float()
    pad = (-flat.numel()) % block_size
    return torch.nn.functional.pad(flat, (0, pad)).view(-1, block_size)


def scale_exponents(v: torch.Tensor) -> torch.Tensor:
    """Per block row of float32 values: the smallest e with amax <= 6 * 2**e."""
    finite = torch.where(torch.isfinite(v), v.abs(), torch.zeros_like(v))
    amax = finite.amax(dim=1).double()
    mant, exp = torch.frexp(amax)  # amax = mant * 2**exp, mant in [0.5, 1); 6 = 0.75 * 2**3
    e = torch.where(mant <= 0.75, exp - 3, exp - 2).clamp(min=-126)
    return torch.where(amax == 0, torch.zeros_like(e), e).to(torch.int64)


def round_to_e2m1(s: torch.Tensor) -> torch.Tensor:
    """Magnitude codes (0-7) of non-negative float64 values <= 6: the nearest
    table value, ties to the even code."""
    grid = torch.tensor(E2M1_VALUES, dtype=torch.float64)
    upper = torch.searchsorted(grid, s).clamp(max=7)
    lower = (upper - 1).clamp(min=0)
    d_lo, d_up = s - grid[lower], grid[upper] - s
    pick_up = (d_up < d_lo) | ((d_up == d_lo) & (upper % 2 == 0))
    return torch.where(pick_up, upper, lower)


def quantize(x: torch.Tensor, block_size: int = 32, premul: float = 1.0):
    """(codes packed two per byte, uint8; scale bytes, uint8)."""
    n = x.numel()
    v = _blocks(x, block_size) * premul  # the codec multiplies in float32 too
    e = scale_exponents(v)
    scaled = v.double() * torch.pow(2.0, -e.double())[:, None]
    # Near FLT_MAX the largest value times the scale must stay finite: 1.5 * 2**(127 - e).
    limit = torch.minimum(1.5 * torch.pow(2.0, 127.0 - e.double()), torch.full_like(e, 6.0, dtype=torch.float64))
    finite = torch.isfinite(scaled)
    mag = round_to_e2m1(torch.minimum(torch.where(finite, scaled.abs(), torch.zeros_like(scaled)), limit[:, None]))
    sign = torch.signbit(v) & finite
    codes = torch.where(finite, mag | (sign.to(torch.int64) << 3), torch.zeros_like(mag)).reshape(-1)[:n]
    scales = torch.where(finite.all(dim=1), e + 127, torch.full_like(e, NAN_SCALE))
    return pack(codes), scales.to(torch.uint8)


def pack(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes (int) -> bytes, element 2i in the low nibble."""
    c = torch.nn.functional.pad(codes.to(torch.int64), (0, codes.numel() % 2))
    return (c[0::2] | (c[1::2] << 4)).to(torch.uint8)


def unpack(packed: torch.Tensor, n: int) -> torch.Tensor:
    b = packed.view(torch.uint8).to(torch.int64)
    return torch.stack([b & 0xF, b >> 4], dim=1).reshape(-1)[:n]


def decode(codes: torch.Tensor) -> torch.Tensor:
    """float64 values of 4-bit codes."""
    grid = torch.tensor(E2M1_VALUES, dtype=torch.float64)
    mag = grid[codes & 7]
    return torch.where((codes & 8) != 0, -mag, mag)


def dequantize(packed: torch.Tensor, scale_bytes: torch.Tensor, n: int, block_size: int = 32) -> torch.Tensor:
    """float64 values of (packed codes, scale bytes); NaN throughout a 0xFF block."""
    sb = scale_bytes.view(torch.uint8).to(torch.int64)
    scale = torch.where(sb == NAN_SCALE, torch.full_like(sb, 0, dtype=torch.float64) * float("nan"),
                        torch.pow(2.0, (sb - 127).double()))
    return decode(unpack(packed, n)) * scale.repeat_interleave(block_size)[:n]


def half_step(x: torch.Tensor, block_size: int = 32) -> torch.Tensor:
    """Half the E2M1 step at each element's magnitude under its block's scale:
    the round-trip error bound (float64). Steps: 0.5 below 2, 1 in [2, 4), 2 above."""
    v = _blocks(x, block_size)
    e = scale_exponents(v)
    scale = torch.pow(2.0, e.double())[:, None]
    s = v.double().abs() / scale
    step = torch.where(s < 2, 0.5, torch.where(s < 4, 1.0, 2.0))
    return (0.5 * step * scale).reshape(-1)[: x.numel()]
