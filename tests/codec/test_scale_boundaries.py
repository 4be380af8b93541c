"""Every scale boundary of every scale kind, bit for bit: blocks whose finite
amax is exactly the format's largest value times a power of two, and one ulp
of the input dtype below and above it: a scale rule that rounds the wrong way
only at equality changes the bytes there, where random data lands only by
chance, and where code that every path shares agrees with itself.

- E8M0 block scales (E4M3, E5M2, MXFP4): amax = fmax * 2^k (fmax 448, 57344,
  6) for every k the input dtype holds, E8M0's clamp at 2^-126 (subnormal
  amaxes) and its top (amaxes near FLT_MAX) included.
- NVFP4's segment scale g, the smallest power of two with segment amax <=
  6 * 448 * g: segment amaxes 2688 * 2^k, k across g's range [2^-117, 2^117]
  and past its lower clamp, in short segments and (a few k) in segments
  longer than one block of the tiled CUDA kernels holds.
- NVFP4's E4M3 block scale c under a fixed g: block amaxes 6 * value(c) * g
  (the block maximum lands on E2M1's 6), 6 * g times the midpoint of two
  codes (ties to the even code) and 7 * value(c) * g (one code higher above
  it), for every E4M3 code c.

Each input runs through the CPU codec against the independent references of
tests/support (reference.py, mxfp4_reference.py, nvfp4_reference.py), through
every CPU kernel level this machine runs against the scalar loops, and
through both CUDA kernel sets under the host SIMT emulator
(test_kernels_on_host's library) against the CPU codec; a quantize and a sum + re-quantize whose
only addend is the input, which must give the quantize's bytes. The decoded
block maximum never saturates: it is finite and within half a step of the
input. tests/tools/plant_bugs.py holds the boundary bugs this file must catch.
"""
import ctypes
import functools

import pytest
import torch

import fp8comm
from fp8comm import _C
from tests.support import mxfp4_reference as mx
from tests.support import nvfp4_reference as nv
from tests.support import reference as fp8ref
from tests.support.cpu_kernels import HAS_AVX2, HAS_AVX512

try:  # the emulated kernels need a C++ compiler: without one only their tests skip
    from tests.codec import test_kernels_on_host as host
    from tests.codec.test_kernels_on_host import lib, lib_path  # noqa: F401 (its fixtures, used below)
except pytest.skip.Exception as why:
    host = None
    _no_host = str(why)

    @pytest.fixture
    def lib():
        pytest.skip(_no_host)

# The formats' largest finite values (OCP FP8, E2M1), written here, not read from the codec.
FMAX = {"e4m3": 448.0, "e5m2": 57344.0, "mxfp4": 6.0, "nvfp4": 6.0}
E8M0_FORMATS = ["e4m3", "e5m2", "mxfp4"]
FORMATS = E8M0_FORMATS + ["nvfp4"]
FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
INT = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
BLOCK = {"e4m3": 32, "e5m2": 32, "mxfp4": 32, "nvfp4": 16}
SEGMENT_LIMIT = 6 * 448  # NVFP4: segment amax <= SEGMENT_LIMIT * g
# NVFP4 segment-scale exponents: across g's range, around its clamp at 2^-117 and its top.
SEGMENT_EXPS = sorted({*range(-160, 117, 6), -119, -118, -117, -116, -115, -1, 0, 1, 115, 116})
# The segment scales under which every E4M3 block-scale boundary is tried (those the dtype holds).
BLOCK_SCALE_G_EXPS = [-117, -60, -10, 0, 4, 50, 116]
NV_SEGMENT_BLOCKS = 8  # blocks per NVFP4 segment-boundary segment: a whole group for the SIMD kernels
# Long NVFP4 segment-boundary segments: more tiles than one block of the tiled CUDA kernels holds
# (8 of 512 elements), so blocks share the segment's amax; theirs sits in the second half.
NV_LONG_SEGMENT_EXPS = [-118, -117, -1, 0, 1, 116]
NV_LONG_SEGMENT_BLOCKS = 9 * 512 // 16 + 5


def name(dtype):
    return str(dtype).split(".")[-1]


# ------------------------------------------------------------------ inputs
def representable(values, dtype):
    """The float64 `values` that `dtype` holds exactly, finite and non-zero, as dtype."""
    t = torch.tensor(values, dtype=torch.float64)
    d = t.to(dtype)
    return d[torch.isfinite(d) & (d.double() == t) & (t != 0)]


def with_neighbours(at):
    """Each positive value of `at` and the values one ulp of its dtype below
    and above (its neighbours in the dtype's bits), the non-finite and zero
    ones dropped."""
    bits = at.view(INT[at.dtype]).to(torch.int64)
    rows = torch.stack([bits - 1, bits, bits + 1], dim=1).reshape(-1)
    v = rows.to(INT[at.dtype]).view(at.dtype)
    return v[torch.isfinite(v) & (v != 0)]


def blocks_with_amax(amax, block, gen):
    """One block per value of `amax` (positive, of the input dtype): that
    value with a random sign at a random place, the other elements random
    magnitudes in [amax / 64, amax) with random signs (so the SIMD group
    kernels take the blocks whole)."""
    n = amax.numel()
    a = amax.double()[:, None]
    sign = torch.randint(0, 2, (n, block), generator=gen).double() * 2 - 1
    x = a * torch.empty(n, block, dtype=torch.float64).uniform_(1 / 64, 1, generator=gen) * sign
    place = torch.randint(0, block, (n,), generator=gen)
    x[torch.arange(n), place] = a[:, 0] * sign[torch.arange(n), place]
    return x.to(amax.dtype).reshape(-1)


def e8m0_amaxes(fmt, dtype):
    """fmax * 2^k for every k whose product the dtype holds, with their neighbours."""
    return with_neighbours(representable([FMAX[fmt] * 2.0**k for k in range(-180, 130)], dtype))


def segment_amaxes(dtype):
    """NVFP4 segment amaxes 2688 * 2^k and their neighbours."""
    return with_neighbours(representable([SEGMENT_LIMIT * 2.0**k for k in SEGMENT_EXPS], dtype))


def block_scale_amaxes(g, dtype):
    """NVFP4 block amaxes at every E4M3 block-scale boundary under segment
    scale g, with their neighbours, none above the segment's 2688 g."""
    v = nv.e4m3_values()[1:]  # codes 1..126
    points = torch.cat([6 * v * g, 6 * g * (v[:-1] + v[1:]) / 2, 7 * v * g])
    amax = with_neighbours(representable(points.tolist(), dtype))
    return amax[amax.double() <= SEGMENT_LIMIT * g]


@functools.lru_cache(maxsize=None)
def boundary_inputs(fmt, dtype):
    """[(x, m, P)]: inputs of P segments of m elements whose every block's
    amax sits at a boundary of fmt's scales (module docstring), each to be
    quantized in one call (the same tensors for every test: none writes them)."""
    gen = torch.Generator().manual_seed(FORMATS.index(fmt) * 10 + DTYPES.index(dtype))
    B = BLOCK[fmt]
    if fmt != "nvfp4":
        x = blocks_with_amax(e8m0_amaxes(fmt, dtype), B, gen)
        m = 8 * B  # segments of one SIMD group each
        x = torch.cat([x, torch.zeros((-x.numel()) % m, dtype=dtype)])
        return [(x, m, x.numel() // m)]
    # segments whose amax sits at a segment-scale boundary, in a random one of their blocks
    top = segment_amaxes(dtype)
    P = top.numel()
    amax = top.double()[:, None] * torch.exp2(-torch.empty(P, NV_SEGMENT_BLOCKS, dtype=torch.float64).uniform_(
        0.5, 12, generator=gen))
    amax[torch.arange(P), torch.randint(0, NV_SEGMENT_BLOCKS, (P,), generator=gen)] = top.double()
    inputs = [(blocks_with_amax(amax.to(dtype).reshape(-1), B, gen), NV_SEGMENT_BLOCKS * B, P)]
    # long segments whose amax sits at a segment-scale boundary in a random block of their second half
    top = with_neighbours(representable([SEGMENT_LIMIT * 2.0**k for k in NV_LONG_SEGMENT_EXPS], dtype))
    P, nb = top.numel(), NV_LONG_SEGMENT_BLOCKS
    below = torch.empty(P, nb, dtype=torch.float64).uniform_(0.5, 12, generator=gen)
    amax = top.double()[:, None] * torch.exp2(-below)
    amax[torch.arange(P), torch.randint(nb // 2, nb, (P,), generator=gen)] = top.double()
    inputs.append((blocks_with_amax(amax.to(dtype).reshape(-1), B, gen), nb * B, P))
    # a segment of every E4M3 block-scale boundary under a g set by its first block, at 2688 g
    for e in BLOCK_SCALE_G_EXPS:
        g = 2.0**e
        first = representable([SEGMENT_LIMIT * g], dtype)
        if first.numel() == 0:
            continue
        inner = block_scale_amaxes(g, dtype)
        x = blocks_with_amax(torch.cat([first, inner]), B, gen)
        inputs.append((x, x.numel(), 1))
    return inputs


# ------------------------------------------------------------------ references
def reference_wire(x, m, P, fmt):
    """The wire segments of x by the references of tests/support, byte for
    byte as quantize_segments writes them: [segment scale] block scales,
    zeros to 16, codes."""
    B = BLOCK[fmt]
    S = fp8comm.segment_bytes(m, B, wire_format=fmt)
    nb = m // B
    out = torch.zeros(P, S, dtype=torch.uint8)
    if fmt != "nvfp4":  # one reference call for all blocks: E8M0 scales are per block
        if fmt == "mxfp4":
            codes, scales = mx.quantize(x, B)
        else:
            codes, scales = fp8ref.quantize(x, B, FP8[fmt])
        out[:, :nb] = scales.view(P, nb)
        out[:, S - codes.numel() // P:] = codes.view(P, -1)
        return out.reshape(-1)
    for r in range(P):
        codes, scales, g = nv.quantize_segment(x[r * m:(r + 1) * m])
        out[r, :4] = torch.tensor([g], dtype=torch.float32).view(torch.uint8)
        out[r, 4:4 + nb] = scales
        out[r, S - codes.numel():] = codes
    return out.reshape(-1)


def quantize(x, m, P, fmt):
    out = torch.full((P * fp8comm.segment_bytes(m, BLOCK[fmt], wire_format=fmt),), 0xA5, dtype=torch.uint8)
    fp8comm.quantize_segments(x, out, P, m, block_size=BLOCK[fmt], wire_format=fmt)
    return out


def requantize_each(x, m, P, fmt):
    """Each segment through a sum + re-quantize whose one addend is the
    segment itself (no pieces): the quantize's bytes."""
    B = BLOCK[fmt]
    S = fp8comm.segment_bytes(m, B, wire_format=fmt)
    out = torch.full((P * S,), 0xA5, dtype=torch.uint8)
    none = torch.empty(0, dtype=torch.uint8)
    for r in range(P):
        fp8comm.dequant_sum_requantize(none, out[r * S:(r + 1) * S], 0, m, block_size=B, wire_format=fmt,
                                       own=x[r * m:(r + 1) * m])
    return out


def where_bytes_differ(got, want, x, m, fmt, what):
    """An error message naming the first differing byte: its segment, its
    part (segment scale, block scale, code) and its block's input amax."""
    bad = (got != want).nonzero().flatten()
    if bad.numel() == 0:
        return ""
    B = BLOCK[fmt]
    S = fp8comm.segment_bytes(m, B, wire_format=fmt)
    i = bad[0].item()
    r, at = divmod(i, S)
    head = 4 if fmt == "nvfp4" else 0
    nb = m // B
    code_start = S - (m if fmt in FP8 else m // 2)
    if at < head:
        part, blk = "the segment scale", None
    elif at < head + nb:
        part, blk = f"block {at - head}'s scale", at - head
    elif at >= code_start:
        per = 1 if fmt in FP8 else 2
        blk = (at - code_start) * per // B
        part = f"a code of block {blk}"
    else:
        part, blk = "scale padding", None
    seg = x[r * m:(r + 1) * m].float()
    amax = seg.abs().max().item() if blk is None else seg[blk * B:(blk + 1) * B].abs().max().item()
    return (f"{what}: {fmt} {name(x.dtype)}: {bad.numel()} bytes differ; the first, {part} of segment {r} "
            f"(amax {amax!r} = {amax.hex()}): got {got[i].item():#04x}, expected {want[i].item():#04x}")


# ------------------------------------------------------------------ CPU codec against the references
@pytest.mark.parametrize("dtype", DTYPES, ids=name)
@pytest.mark.parametrize("fmt", FORMATS)
def test_bytes_equal_the_reference(fmt, dtype):
    for x, m, P in boundary_inputs(fmt, dtype):
        want = reference_wire(x, m, P, fmt)
        got = quantize(x, m, P, fmt)
        assert torch.equal(got, want), where_bytes_differ(got, want, x, m, fmt, "quantize")
        got = requantize_each(x, m, P, fmt)
        assert torch.equal(got, want), where_bytes_differ(got, want, x, m, fmt, "sum + re-quantize")


def block_scales(wire, m, P, fmt):
    """Each block's scale S (float64) as the wire states it: 2^(byte - 127),
    or NVFP4's value(E4M3 byte) * g."""
    B = BLOCK[fmt]
    seg = wire.view(P, -1)
    if fmt != "nvfp4":
        return torch.exp2(seg[:, :m // B].double() - 127).reshape(-1)
    g = seg[:, :4].contiguous().view(torch.float32).double()
    return (nv.e4m3_values()[seg[:, 4:4 + m // B].long()] * g).reshape(-1)


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_decoded_block_maximum_does_not_saturate(fmt, dtype):
    """At every boundary the block maximum is within the block's scale (E8M0:
    amax <= fmax * S; NVFP4: amax <= 7 S, which rounds to 6) and decodes
    finite, within half a step of the format at its magnitude: E8M0 formats
    half an ulp of the format (tests/support/reference.py's bound), NVFP4
    half of E2M1's step (0.5 below 2 S, 1 below 4 S, else 2)."""
    B = BLOCK[fmt]
    for x, m, P in boundary_inputs(fmt, dtype):
        wire = quantize(x, m, P, fmt)
        back = torch.empty(P * m, dtype=torch.float32)
        fp8comm.dequantize_segments(wire, back, P, m, block_size=B, wire_format=fmt)
        xd = x.double()
        at_max = xd.view(-1, B).abs().argmax(dim=1) + torch.arange(0, P * m, B)
        S = block_scales(wire, m, P, fmt)
        keep = xd[at_max] != 0
        at_max, S = at_max[keep], S[keep]
        amax = xd[at_max].abs()
        if fmt == "nvfp4":
            assert (amax <= 7 * S).all()
            v = amax / S
            bound = 0.5 * S * torch.where(v < 2, 0.5, torch.where(v < 4, 1.0, 2.0))
        else:
            assert (amax <= FMAX[fmt] * S).all()
            bound = fp8ref.half_ulp(x.float(), B, "mxfp4" if fmt == "mxfp4" else FP8[fmt])[at_max]
        assert torch.isfinite(back[at_max]).all()
        err = (back.double()[at_max] - xd[at_max]).abs()
        worst = (err - bound).argmax()
        assert (err <= bound).all(), (f"{fmt} {name(dtype)}: block maximum {xd[at_max][worst].item()!r} "
                                      f"decodes to {back[at_max][worst].item()!r}")


# ------------------------------------------------------------------ SIMD kernels against the scalar loops
def kernel_levels():
    """The CPU kernel levels this machine runs: (name, simd, avx512)."""
    levels = [("scalar", False, False)]
    if HAS_AVX2:
        levels.append(("avx2", True, False))
    if HAS_AVX512:
        levels.append(("avx512", True, True))
    return levels


def on_each_level(fn):
    """{level: fn()} for every kernel level; the settings are restored."""
    old_simd, old_wide = _C.cpu_simd_enabled(), _C.cpu_avx512_enabled()
    results = {}
    try:
        for level, simd, wide in kernel_levels():
            _C.set_cpu_simd(simd)
            if HAS_AVX512:
                _C.set_cpu_avx512(wide)
            results[level] = fn()
    finally:
        _C.set_cpu_simd(old_simd)
        if HAS_AVX512:
            _C.set_cpu_avx512(old_wide)
    return results


@pytest.mark.skipif(not HAS_AVX2, reason="this CPU lacks AVX2 / F16C: the codec has no SIMD kernels here")
@pytest.mark.parametrize("dtype", DTYPES, ids=name)
@pytest.mark.parametrize("fmt", FORMATS)
def test_simd_kernels_equal_the_scalar_loops(fmt, dtype):
    for x, m, P in boundary_inputs(fmt, dtype):
        for what, op in (("quantize", quantize), ("sum + re-quantize", requantize_each)):
            results = on_each_level(lambda: op(x, m, P, fmt))
            scalar = results.pop("scalar")
            for level, got in results.items():
                assert torch.equal(got, scalar), where_bytes_differ(got, scalar, x, m, fmt, f"{what}, {level} kernels")


# ------------------------------------------------------------------ the CUDA kernels, emulated on the host
@pytest.mark.parametrize("kernels", ["legacy", "tiled"])
@pytest.mark.parametrize("dtype", DTYPES, ids=name)
@pytest.mark.parametrize("fmt", FORMATS)
def test_emulated_cuda_kernels_equal_the_cpu_codec(lib, fmt, dtype, kernels):
    """The quantize kernels of both CUDA kernel sets, and the sum + re-quantize
    of a few segments, against the CPU codec. NVFP4's segment scale: legacy,
    one warp per segment for the short segments, several sharing one through
    atomics for the long ones; tiled, one block per short segment (its amax
    in shared memory), several sharing a long one through per-slice amaxes
    (the long inputs: their amax in a later slice than the first)."""
    B = BLOCK[fmt]
    run = host.Launchers(lib, "simt_" if kernels == "legacy" else "simt_tiled_")
    for x, m, P in boundary_inputs(fmt, dtype):
        cpu = quantize(x, m, P, fmt)
        emu = torch.full_like(cpu, 0xA5)
        layout = host.wire(lib, emu, P, m, B, fmt)
        assert run.quantize(x.data_ptr(), host.ELEM[dtype], x.numel(), 1.0, None, ctypes.byref(layout)) == 0
        assert torch.equal(emu, cpu), where_bytes_differ(emu, cpu, x, m, fmt, "emulated quantize")
        S = fp8comm.segment_bytes(m, B, wire_format=fmt)
        none = torch.zeros(16, dtype=torch.uint8)
        for r in sorted({0, P // 2, P - 1}):
            own = x[r * m:(r + 1) * m]
            out = torch.full((S,), 0xA5, dtype=torch.uint8)
            assert run.dequant_sum_requantize(ctypes.byref(host.wire(lib, none, 0, m, B, fmt)), 1,
                                                   own.data_ptr(), host.ELEM[dtype], m, 1.0, None, 1,
                                                   ctypes.byref(host.wire(lib, out, 1, m, B, fmt))) == 0
            want = cpu[r * S:(r + 1) * S]
            assert torch.equal(out, want), where_bytes_differ(out, want, own, m, fmt, f"emulated re-quantize of {r}")
