"""Inputs of the multi-rank tests, drawn from per-rank seeds: every rank can
rebuild every other rank's input and so compute a reference without
communicating."""
from __future__ import annotations

import torch


def rank_input(rank: int, n: int, dtype=torch.float32, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    """Gaussian values (times `scale`) of rank `rank`, in `dtype`."""
    gen = torch.Generator().manual_seed(seed * 7919 + rank)
    return (torch.randn(n, generator=gen) * scale).to(dtype)


def any_dtype_input(rank: int, n: int, dtype, seed: int = 0) -> torch.Tensor:
    """Values of rank `rank` in any dtype gloo moves: bool, small integers
    (so that sums do not overflow), complex, floating point."""
    g = torch.Generator().manual_seed(seed * 31 + rank)
    x = torch.randn(n, generator=g) * 10
    if dtype == torch.bool:
        return x > 0
    if dtype.is_complex:
        return torch.complex(x, -2 * x).to(dtype)
    if dtype in (torch.uint8, torch.int8):
        return x.clamp(-40, 40).abs().to(dtype) if dtype == torch.uint8 else x.clamp(-40, 40).to(dtype)
    return x.to(dtype)


# Per dtype: a subnormal magnitude and a huge one (fp16's range is not fp32's:
# 1e-39 is 0 in fp16, 1e37 is Inf), and the decades "wide" spans.
SUBNORMAL = {torch.float32: 1e-39, torch.bfloat16: 1e-39, torch.float16: 1e-6}
HUGE = {torch.float32: 1e37, torch.bfloat16: 1e37, torch.float16: 1e4}
DECADES = {torch.float32: (-30, 30), torch.bfloat16: (-30, 30), torch.float16: (-7, 4)}
PATTERNS = ["randn", "wide", "subnormal", "huge", "zeros", "nonfinite", "mixed"]


def adversarial_input(rank: int, n: int, kind: str, dtype, seed: int) -> torch.Tensor:
    """Values of rank `rank` in one of PATTERNS: the special values the codec
    must survive (subnormals, huge values, signed zeros, NaN and Inf, many
    decades in one block)."""
    gen = torch.Generator().manual_seed(seed * 131 + rank)
    x = torch.randn(n, generator=gen)
    lo, hi = DECADES[dtype]
    if kind == "wide":  # magnitudes across the dtype's decades
        x = x * torch.pow(10.0, torch.randint(lo, hi, (n,), generator=gen).float())
    elif kind == "subnormal":
        x = x * SUBNORMAL[dtype]
    elif kind == "huge":
        x = x * HUGE[dtype]
    elif kind == "zeros":
        x = torch.where(torch.rand(n, generator=gen) < 0.5, torch.zeros(n), -torch.zeros(n))
    elif kind == "nonfinite":
        pick = torch.rand(n, generator=gen)
        x = torch.where(pick < 0.02, torch.full((n,), float("nan")), x)
        x = torch.where((pick >= 0.02) & (pick < 0.03), torch.full((n,), float("inf")), x)
        x = torch.where((pick >= 0.03) & (pick < 0.035), torch.full((n,), float("-inf")), x)
    elif kind == "mixed":  # every special value in one tensor, so blocks mix them
        pick = torch.randint(0, 6, (n,), generator=gen)
        x = torch.where(pick == 1, x * SUBNORMAL[dtype], x)
        x = torch.where(pick == 2, x * HUGE[dtype], x)
        x = torch.where(pick == 3, torch.zeros(n) * torch.sign(x), x)
        x = torch.where(pick == 4, x * 10.0 ** lo, x)
    out = x.to(dtype)
    assert kind != "subnormal" or dtype == torch.float32 or bool((out != 0).any()) or n < 8
    return out


def strided_view(values: torch.Tensor, fill: float = 9.0):
    """(a stride-2 view holding `values`, its base): the other half of the base
    is `fill`, to show a call wrote nowhere but into the view."""
    base = torch.full((values.numel(), 2), fill, dtype=values.dtype)
    base[:, 0] = values
    view = base[:, 0]
    assert not view.is_contiguous()
    return view, base


def neighbours_intact(base: torch.Tensor, fill: float = 9.0) -> bool:
    return bool((base[:, 1] == fill).all())


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype and the same bytes (so -0, NaN payloads and signs count)."""
    return a.dtype == b.dtype and torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                                            b.contiguous().reshape(-1).view(torch.uint8))


PREMUL_FACTORS = [0.5, 0.75, 1.25, 1.0]  # one PREMUL_SUM factor per rank (float32 numbers)
