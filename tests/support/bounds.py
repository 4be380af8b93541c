"""The error-bound oracle of the compressed collectives: each output element
against the exact FP64 result and the bound docs/reliability.md documents
("Error bounds of the compressed paths")."""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from tests.support.reference import half_ulp

# Half the smallest subnormal step of the output dtype: the absolute rounding floor.
SUBNORMAL_STEP = {torch.float32: 2.0**-149, torch.bfloat16: 2.0**-133, torch.float16: 2.0**-24}
OUT_EPS = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


class Violations(NamedTuple):
    outside_bound: int  # elements farther from the exact result than the bound (or non-finite where it is finite)
    nonfinite_mismatch: int  # elements finite where the exact result is not

    @property
    def ok(self) -> bool:
        return self.outside_bound == 0 and self.nonfinite_mismatch == 0

    def __add__(self, other):  # summed over the outputs of a call
        return Violations(self.outside_bound + other.outside_bound, self.nonfinite_mismatch + other.nonfinite_mismatch)


NONE = Violations(0, 0)
FOUR_BIT = ("mxfp4", "nvfp4")  # E2M1 formats: a non-finite input makes its whole block NaN


def segment_half_ulps(x: torch.Tensor, seg: int, block: int, fp8_dtype) -> torch.Tensor:
    """The FP8 half-ulp bound of each element, with blocks restarting every
    `seg` elements (wire segments)."""
    parts = [half_ulp(part.float(), block, fp8_dtype) for part in x.reshape(-1).split(seg)]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


def nonfinite_blocks(ys: list, seg: int, block: int) -> torch.Tensor:
    """Per element of the concatenated ys' positions (one tensor when the ys
    are summed): whether its wire block, blocks restarting every `seg`
    elements, holds a non-finite value of any y."""
    bad = torch.stack([~torch.isfinite(y.reshape(-1)) for y in ys]).any(dim=0)
    parts = []
    for part in bad.split(seg):
        pad = (-part.numel()) % block
        blocks = torch.nn.functional.pad(part, (0, pad)).view(-1, block).any(dim=1, keepdim=True)
        parts.append(blocks.expand(-1, block).reshape(-1)[:part.numel()])
    return torch.cat(parts) if parts else bad


def bound_violations(op: str, ys: list, out: torch.Tensor, div: int, block: int, fp8_dtype, rank: int) -> Violations:
    """Checks one compressed collective's output on this rank element by
    element against the exact FP64 result and the documented bound. op:
    "all_reduce", "reduce_scatter" or "all_gather". ys: what each rank put on
    the wire (its input times its PREMUL_SUM factor, in FP32): for all_reduce
    the whole tensor, for reduce_scatter the whole input, for all_gather the
    input. div: the group size for AVG, else 1. fp8_dtype: the FP8 torch
    dtype, or a 4-bit format, whose blocks holding a non-finite value decode to
    NaN throughout (E2M1 has no NaN code): there a NaN output is the promise."""
    P = len(ys)
    dtype = out.dtype
    m = ys[0].numel() if op != "reduce_scatter" else ys[0].numel() // P
    whole_block_nan = None
    if op == "all_gather":
        if fp8_dtype in FOUR_BIT:
            whole_block_nan = torch.cat([nonfinite_blocks([y], m, block) for y in ys])
        ref = torch.cat([y.double() for y in ys])
        bound = torch.cat([segment_half_ulps(y, m, block, fp8_dtype) for y in ys])
        slack = torch.zeros_like(ref)
    else:
        exact = sum(y.double() for y in ys) / div
        slack = 4 * P * 2.0**-24 * sum(y.double().abs() for y in ys) / div  # FP32 summation
        if op == "all_reduce":
            seg = math.ceil(math.ceil(m / P) / block) * block  # the algorithm's segment length
            first = sum(segment_half_ulps(y, seg, block, fp8_dtype) for y in ys) / div
            # The FP32 sum s of the decoded pieces is re-quantized: at most half an
            # ulp of s under its block's scale. |s| <= |exact| + first (+ slack)
            # element by element, and half_ulp grows with the element and with its
            # block's max, so the half ulp of that upper bound bounds the second error.
            # (Where pieces cancel, s can be several binades above the exact sum.)
            upper = (exact.abs() + first + slack).float()
            bound = first + segment_half_ulps(upper, seg, block, fp8_dtype)
            ref = exact
            if fp8_dtype in FOUR_BIT:
                whole_block_nan = nonfinite_blocks(ys, seg, block)
        else:
            sl = slice(rank * m, (rank + 1) * m)
            bound = sum(segment_half_ulps(y, m, block, fp8_dtype)[sl] for y in ys) / div
            ref, slack = exact[sl], slack[sl]
            if fp8_dtype in FOUR_BIT:
                whole_block_nan = nonfinite_blocks([y.reshape(-1) for y in ys], m, block)[sl]
    out64 = out.double().reshape(-1)
    # The result v before the cast to the output dtype is within bound + slack
    # of ref, so the cast adds at most eps * (|ref| + bound + slack) (cancelling
    # sums make |v| much larger than |ref|).
    within = bound + slack
    tol = within + OUT_EPS[dtype] * (ref.abs() + within) + SUBNORMAL_STEP[dtype]
    finite_ref = torch.isfinite(ref)
    in_range = finite_ref & (ref.abs() < torch.finfo(dtype).max / 2)
    outside = int(((out64 - ref).abs() > tol)[in_range & torch.isfinite(out64)].sum())
    nan_allowed = torch.isnan(out64) & whole_block_nan if whole_block_nan is not None else torch.zeros_like(in_range)
    outside += int((~torch.isfinite(out64) & in_range & ~nan_allowed).sum())  # a finite result must stay finite
    return Violations(outside, int((torch.isfinite(out64) & ~finite_ref).sum()))
