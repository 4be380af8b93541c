"""An independent reference of the NVFP4 wire format in plain torch ops, from
the exhaustive E2M1 and E4M3 value tables.

A segment's elements (times premul, in float32) are cut into blocks of 16.
The segment scale g is the smallest power of two with segment amax <= 6 * 448
* g (finite elements; g in [2**-117, 2**117]; 1 for a segment without a finite
non-zero element). A block's scale byte is the E4M3 code c nearest to amax / (6
g) (ties to the even code), one code higher where amax > 7 * value(c) * g; a
block of zeros stores 1.0 (0x38), one holding Inf or NaN stores 0x7F (E4M3's
NaN) and decodes to NaN throughout. Elements are divided by S = value(c) * g in
float32 (one correctly rounded division) and round to the nearest E2M1 value
(mxfp4_reference's table and ties), capped at the largest code whose value
times S is finite. Nothing here calls fp8comm's codec.
"""
import torch

from tests.support import mxfp4_reference as mx

BLOCK = 16
NAN_SCALE = 0x7F
ONE = 0x38
FLT_MAX = torch.finfo(torch.float32).max


def e4m3_values() -> torch.Tensor:
    """float64 value of each E4M3 magnitude code 0..126 (0x7F is NaN)."""
    out = []
    for c in range(127):
        e, m = c >> 3, c & 7
        out.append(m / 8 * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return torch.tensor(out, dtype=torch.float64)


def nearest_e4m3(t: torch.Tensor) -> torch.Tensor:
    """Codes of the E4M3 values nearest to non-negative float64 t <= 448, ties to even."""
    grid = e4m3_values()
    upper = torch.searchsorted(grid, t).clamp(max=126)
    lower = (upper - 1).clamp(min=0)
    d_lo, d_up = t - grid[lower], grid[upper] - t
    pick_up = (d_up < d_lo) | ((d_up == d_lo) & (upper % 2 == 0))
    return torch.where(pick_up, upper, lower)


def _finite_abs(v: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(v), v.abs(), torch.zeros_like(v))


def segment_scale(v: torch.Tensor) -> float:
    amax = float(_finite_abs(v).max()) if v.numel() else 0.0
    if amax == 0.0:
        return 1.0
    e = -117
    while amax > 6 * 448 * 2.0**e and e < 117:
        e += 1
    return 2.0**e


def quantize_segment(x: torch.Tensor, premul: float = 1.0, capacity: int | None = None):
    """(packed codes, uint8; block scale bytes, uint8; segment scale g) of one
    segment; elements past x up to `capacity` (whole blocks) are zeros."""
    n = x.numel()
    cap = capacity if capacity is not None else -(-n // BLOCK) * BLOCK
    v = torch.nn.functional.pad(x.reshape(-1).float() * premul, (0, cap - n)).view(-1, BLOCK)  # float32 products
    g = segment_scale(v)
    amax = _finite_abs(v).amax(dim=1).double()
    c = nearest_e4m3(amax / (6 * g))
    grid = e4m3_values()
    c = torch.where(amax > 7 * grid[c] * g, c + 1, c)
    c = torch.where(amax == 0, torch.full_like(c, ONE), c)
    s = (grid[c] * g).float()  # exact
    scaled = (v / s[:, None]).double()  # float32 division, as the codec's
    limit_val = torch.tensor(mx.E2M1_VALUES, dtype=torch.float64)
    # the largest E2M1 value whose product with S stays finite
    cap_val = torch.stack([torch.where(limit_val[k] * s.double() <= FLT_MAX, limit_val[k], torch.zeros(()).double())
                           for k in range(8)]).amax(dim=0)
    finite = torch.isfinite(v)
    mag = mx.round_to_e2m1(torch.minimum(torch.where(finite, scaled.abs(), torch.zeros_like(scaled)),
                                         cap_val[:, None]))
    sign = torch.signbit(v) & finite
    codes = torch.where(finite, mag | (sign.to(torch.int64) << 3), torch.zeros_like(mag)).reshape(-1)
    scales = torch.where(finite.all(dim=1), c, torch.full_like(c, NAN_SCALE))
    return mx.pack(codes), scales.to(torch.uint8), g


def dequantize_segment(packed: torch.Tensor, scale_bytes: torch.Tensor, g: float, n: int) -> torch.Tensor:
    """float64 values; NaN throughout a 0x7F block."""
    codes = mx.unpack(packed, -(-n // BLOCK) * BLOCK).view(-1, BLOCK)
    b = scale_bytes.to(torch.int64)
    s = torch.where(b == NAN_SCALE, torch.full(b.shape, float("nan"), dtype=torch.float64),
                    e4m3_values()[b.clamp(max=126)] * g)
    return (mx.decode(codes) * s[:, None]).reshape(-1)[:n]


def half_step(x: torch.Tensor, block_size: int = BLOCK) -> torch.Tensor:
    """Half the E2M1 step at each element's magnitude under its block's scale,
    x being one segment: the round-trip error bound (float64). Steps: 0.5 below
    2, 1 in [2, 4), 2 above (the block maximum, at most 7, rounds to 6)."""
    assert block_size == BLOCK, "NVFP4 has blocks of 16"
    n = x.numel()
    codes, scales, g = quantize_segment(x)
    s = torch.where(scales == NAN_SCALE, torch.ones(()).double(), e4m3_values()[scales.long().clamp(max=126)] * g)
    v = torch.nn.functional.pad(x.reshape(-1).double(), (0, (-n) % BLOCK)).view(-1, BLOCK).abs() / s[:, None]
    step = torch.where(v < 2, 0.5, torch.where(v < 4, 1.0, 2.0))
    return (0.5 * step * s[:, None]).reshape(-1)[:n]
