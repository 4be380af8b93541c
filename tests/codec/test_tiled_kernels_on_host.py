"""The tiled CUDA codec (csrc/codec/codec_cuda_tiled.cu), run on the host
under the SIMT emulator: every codec case of test_kernels_on_host.py (every
format, both dtypes and float16, stochastic rounding, unaligned views, odd
sizes, non-finite blocks, random codes and scales) through the tiled
launchers, equal to the CPU codec bit for bit; the kernels it hands to
codec_cuda.cu's (block sizes it has no kernels for) named, and NVFP4's
launches; grids that loop; every scale boundary; and the software semantics of the
hardware FP8 conversions (fp8_convert_cuda.cuh) against torch's own casts.

The shared tests are imported, so pytest runs them here with this module's
`kernels` fixture: the tiled launchers."""
import ctypes
import math

import pytest
import torch

import fp8comm
from tests.codec.test_kernels_on_host import (  # noqa: F401 (fixtures and tests pytest collects here)
    ELEM, FORMAT, Launchers, assert_same_bits, embed, kernels_launched, lib, lib_path, nasty, outers, own_args,
    pieces_for, test_dequant_sum, test_dequant_sum_requantize, test_dequant_sum_requantize_stochastic,
    test_dequantize_segments, test_mismatched_own_dtype_is_an_error, test_quantize_and_dequantize_flat,
    test_quantize_segments, test_quantize_segments_stochastic, wire)

FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0, "mxfp4": 6.0}
TORCH_FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


@pytest.fixture(scope="module")
def kernels(lib):
    return Launchers(lib, "simt_tiled_")


def quantize_both(lib, kernels, x, P, m, B, fmt, premul=1.0, rounding=None, offset=1):
    """Wire segments of x from the CPU codec and from the tiled kernels, at
    `offset` bytes from a 16-byte boundary."""
    S = fp8comm.segment_bytes(m, B, wire_format=fmt)
    cpu, cpu_view, emu, emu_view = outers(P * S, torch.uint8, offset)
    extra = dict(rounding="stochastic", rounding_key=rounding) if rounding is not None else {}
    fp8comm.quantize_segments(x, cpu_view, P, m, block_size=B, wire_format=fmt, premul=premul, **extra)
    layout = wire(lib, emu_view, P, m, B, fmt)
    if rounding is not None:
        layout.rounding, layout.rounding_key = 1, rounding
    assert kernels.quantize(x.data_ptr(), ELEM[x.dtype], x.numel(), premul, None, ctypes.byref(layout)) == 0
    return emu, cpu


@pytest.mark.fast
@pytest.mark.parametrize("fmt,B,dtype,offset,tiled", [
    ("e4m3", 32, torch.float32, 1, True), ("e5m2", 16, torch.bfloat16, 1, True),
    ("mxfp4", 64, torch.float16, 1, True), ("e4m3", 512, torch.bfloat16, 1, True),
    ("e4m3", 256, torch.float32, 1, True), ("e4m3", 48, torch.float32, 1, False),
    ("e5m2", 1024, torch.bfloat16, 1, False), ("nvfp4", 16, torch.float32, 0, True),
    ("nvfp4", 16, torch.bfloat16, 1, True)])
def test_which_kernels_run(lib, kernels, fmt, B, dtype, offset, tiled):
    """The tiled kernels take every format with a power-of-two block up to
    their 512-element tile, at any address; the rest go to codec_cuda.cu's
    kernels, and the bytes are the CPU codec's either way. NVFP4's quantize
    and re-quantize (one launch each for these short segments) are tested
    for launches in test_nvfp4_launches."""
    gen = torch.Generator().manual_seed(B)
    P, m = 3, 700
    x = embed(nasty(P * m - 9, dtype, gen, finite=fmt == "nvfp4"), 2)
    lib.simt_take_launches()
    emu, cpu = quantize_both(lib, kernels, x, P, m, B, fmt, offset=offset)
    names = kernels_launched(lib)
    assert all(("tiled" in n) == tiled for n in names), names
    assert_same_bits(emu, cpu, "wire segments")
    S = fp8comm.segment_bytes(m, B, wire_format=fmt)
    pieces = torch.empty(P * S, dtype=torch.uint8)
    fp8comm.quantize_segments(x, pieces, P, m, block_size=B, wire_format=fmt)
    out = torch.empty(P * m, dtype=dtype)
    assert kernels.dequantize(ctypes.byref(wire(lib, pieces, P, m, B, fmt)), out.data_ptr(), ELEM[dtype], P * m) == 0
    decoded = kernels_launched(lib)
    assert all(("tiled" in n) == (B <= 512 and B & (B - 1) == 0) for n in decoded), decoded
    S1 = fp8comm.segment_bytes(m, B, wire_format=fmt)
    req_cpu, req_cpu_view, req_emu, req_emu_view = outers(S1, torch.uint8, offset)
    fp8comm.dequant_sum_requantize(pieces, req_cpu_view, P, m, block_size=B, wire_format=fmt, post_div=2)
    lib.simt_take_launches()
    assert kernels.dequant_sum_requantize(ctypes.byref(wire(lib, pieces, P, m, B, fmt)), 0, None, ELEM[dtype], 0,
                                          1.0, None, 2, ctypes.byref(wire(lib, req_emu_view, 1, m, B, fmt))) == 0
    assert all(("tiled" in n) == tiled for n in kernels_launched(lib))
    assert_same_bits(req_emu, req_cpu, "re-quantized segment")


def nvfp4_segments(P, m, dtype, gen):
    """P segments of m elements (the last 5 short), each of its own magnitude
    (a segment scale apart) with its amax in its last 100 elements (the last
    tile or slice), one of zeros (g = 1)."""
    x = torch.randn(P * m - 5, generator=gen, dtype=torch.float64)
    for r in range(P):
        x[r * m + m - 100] = 50.0
        x[r * m:(r + 1) * m] *= 2.0 ** (7 * r - 9)
    x[m:2 * m] = 0
    return embed(x.to(dtype), 1)


@pytest.mark.fast
@pytest.mark.parametrize("m,launches", [
    (700, ["quantize_short_segments_tiled_kernel"]),
    (4096, ["quantize_short_segments_tiled_kernel"]),
    (4097, ["segment_amax_tiled_kernel", "quantize_tiled_kernel"]),
    (9 * 4096 + 100, ["segment_amax_tiled_kernel", "quantize_tiled_kernel"])])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nvfp4_launches(lib, kernels, m, launches, dtype):
    """NVFP4's quantize and sum + re-quantize: segments of at most one
    block's 8 tiles (4096 elements) in one launch that reads the source once;
    longer ones in two (the amax pass, then the quantize), whose blocks share
    a segment through per-slice amaxes in a poisoned workspace, on the
    emulator's 3 blocks, so both grids loop. Bytes equal to the CPU codec's
    for segments a scale apart, one of zeros, the last one short, at an
    address whose headers are not 4-byte aligned."""
    gen = torch.Generator().manual_seed(m)
    P, B = 4, 16
    x = nvfp4_segments(P, m, dtype, gen)
    lib.simt_take_launches()
    emu, cpu = quantize_both(lib, kernels, x, P, m, B, "nvfp4", premul=3.0, offset=1)
    assert kernels_launched(lib) == launches
    assert_same_bits(emu, cpu, "wire segments")
    S = fp8comm.segment_bytes(m, B, wire_format="nvfp4")
    pieces = torch.empty(P * S, dtype=torch.uint8)
    fp8comm.quantize_segments(x, pieces, P, m, block_size=B, wire_format="nvfp4")
    own = embed(torch.randn(m - 2, generator=gen).to(dtype), 3)
    own_c = (1, own.data_ptr(), ELEM[dtype], own.numel(), -2.0, None)
    req_cpu, req_cpu_view, req_emu, req_emu_view = outers(S, torch.uint8, 1)
    fp8comm.dequant_sum_requantize(pieces, req_cpu_view, P, m, block_size=B, wire_format="nvfp4", post_div=P,
                                   own=own, own_premul=-2.0)
    lib.simt_take_launches()
    assert kernels.dequant_sum_requantize(ctypes.byref(wire(lib, pieces, P, m, B, "nvfp4")), *own_c, P,
                                          ctypes.byref(wire(lib, req_emu_view, 1, m, B, "nvfp4"))) == 0
    assert kernels_launched(lib) == launches
    assert_same_bits(req_emu, req_cpu, "re-quantized segment")


@pytest.mark.fast
@pytest.mark.parametrize("P", [3, 4])
def test_nvfp4_empty_segments_get_their_header(lib, kernels, P):
    """Segments of no elements still get their header (g = 1), from the
    quantize and from the sum + re-quantize of a piece count with kernels of
    its own (4: one launch) and without (3: two launches)."""
    B, m = 16, 0
    S = fp8comm.segment_bytes(m, B, wire_format="nvfp4")
    x = torch.zeros(0)
    emu, cpu = quantize_both(lib, kernels, x, P, m, B, "nvfp4")
    assert_same_bits(emu, cpu, "wire segments")
    pieces = torch.empty(P * S, dtype=torch.uint8)
    fp8comm.quantize_segments(x, pieces, P, m, block_size=B, wire_format="nvfp4")
    req_cpu, req_cpu_view, req_emu, req_emu_view = outers(S, torch.uint8, 1)
    fp8comm.dequant_sum_requantize(pieces, req_cpu_view, P, m, block_size=B, wire_format="nvfp4")
    assert kernels.dequant_sum_requantize(ctypes.byref(wire(lib, pieces, P, m, B, "nvfp4")), 0, None, ELEM[x.dtype],
                                          0, 1.0, None, 1, ctypes.byref(wire(lib, req_emu_view, 1, m, B, "nvfp4"))) == 0
    assert_same_bits(req_emu, req_cpu, "re-quantized segment")


@pytest.mark.fast
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grid_stride_over_many_tiles(lib, kernels, fmt, dtype):
    """More tiles than the emulated grid has warps (3 blocks of 8): every warp
    loops, for a quantize, a dequantize, a sum and a sum + re-quantize with
    pieces of P = 4 (a kernel of its own) and 3 (the generic one)."""
    gen = torch.Generator().manual_seed(5)
    B, m = (16 if fmt == "nvfp4" else 32), 4000
    for P in (4, 3):
        x = embed(nasty(P * m - 3, dtype, gen, finite=fmt in ("mxfp4", "nvfp4")), 1)
        emu, cpu = quantize_both(lib, kernels, x, P, m, B, fmt, premul=0.5, offset=0)
        assert_same_bits(emu, cpu, f"wire segments, P={P}")
        S = fp8comm.segment_bytes(m, B, wire_format=fmt)
        pieces = torch.empty(P * S, dtype=torch.uint8)
        fp8comm.quantize_segments(x, pieces, P, m, block_size=B, wire_format=fmt)
        back_cpu = torch.empty(P * m - 3, dtype=dtype)
        fp8comm.dequantize_segments(pieces, back_cpu, P, m, block_size=B, wire_format=fmt)
        back = torch.empty_like(back_cpu)
        assert kernels.dequantize(ctypes.byref(wire(lib, pieces, P, m, B, fmt)), back.data_ptr(), ELEM[dtype],
                                  back.numel()) == 0
        assert_same_bits(back, back_cpu, f"decoded, P={P}")
        own = embed(nasty(m - 7, dtype, gen, finite=True), 3)
        own_c = (1, own.data_ptr(), ELEM[dtype], own.numel(), -2.0, None)
        sum_cpu = torch.empty(m, dtype=dtype)
        fp8comm.dequant_sum(pieces, sum_cpu, P, m, block_size=B, wire_format=fmt, post_div=P, own=own,
                            own_premul=-2.0)
        sum_emu = torch.empty_like(sum_cpu)
        assert kernels.dequant_sum(ctypes.byref(wire(lib, pieces, P, m, B, fmt)), *own_c, P, sum_emu.data_ptr(),
                                   ELEM[dtype], m) == 0
        assert_same_bits(sum_emu, sum_cpu, f"sum, P={P}")
        out_cpu, out_emu = (torch.zeros(S, dtype=torch.uint8) for _ in range(2))
        fp8comm.dequant_sum_requantize(pieces, out_cpu, P, m, block_size=B, wire_format=fmt, post_div=P, own=own,
                                       own_premul=-2.0)
        assert kernels.dequant_sum_requantize(ctypes.byref(wire(lib, pieces, P, m, B, fmt)), *own_c, P,
                                              ctypes.byref(wire(lib, out_emu, 1, m, B, fmt))) == 0
        assert_same_bits(out_emu, out_cpu, f"re-quantized segment, P={P}")


def boundary_values(fmt, dtype):
    """Blocks of 32 whose amax sits exactly at the format's largest value
    times 2^k, and one ulp (of dtype) either side, for k over the scale range;
    each block's other values spread below its amax."""
    top = FP8_MAX[fmt]
    blocks = []
    for k in (-140, -126, -100, -9, -1, 0, 1, 7, 30, 100, 110, 118):
        edge = torch.tensor(top * 2.0 ** k, dtype=torch.float64).to(dtype)
        if not math.isfinite(edge.item()) or edge.item() == 0:
            continue
        for amax in (edge, torch.nextafter(edge, torch.tensor(0.0, dtype=dtype)),
                     torch.nextafter(edge, torch.tensor(math.inf, dtype=dtype))):
            if not math.isfinite(amax.item()):
                continue
            block = amax.item() * torch.linspace(-1, 1, 32, dtype=torch.float64)
            block[5] = amax.item()
            blocks.append(block.to(dtype))
    return torch.cat(blocks)


@pytest.mark.fast
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "mxfp4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scale_boundaries(lib, kernels, fmt, dtype):
    """Every E8M0 scale boundary the tiled kernels meet, quantized and
    re-quantized through a sum, equals the CPU codec (and near FLT_MAX, where
    the code limit drops below the format's largest code, the software path)."""
    x = embed(boundary_values(fmt, dtype), 1)
    n = x.numel()
    emu, cpu = quantize_both(lib, kernels, x, 1, n, 32, fmt)
    assert_same_bits(emu, cpu, "wire segment")
    S = fp8comm.segment_bytes(n, 32, wire_format=fmt)
    out_cpu, out_emu = (torch.empty(S, dtype=torch.uint8) for _ in range(2))
    pieces = torch.zeros(0, dtype=torch.uint8)
    fp8comm.dequant_sum_requantize(pieces, out_cpu, 0, n, block_size=32, wire_format=fmt, own=x)
    assert kernels.dequant_sum_requantize(ctypes.byref(wire(lib, pieces, 0, n, 32, fmt)), 1, x.data_ptr(),
                                          ELEM[dtype], n, 1.0, None, 1,
                                          ctypes.byref(wire(lib, out_emu, 1, n, 32, fmt))) == 0
    assert_same_bits(out_emu, out_cpu, "re-quantized segment")


# ------------------------------------------------------------------ the conversions
def fp8_grid_probes(fmt):
    """Every finite value of the format, the midpoints between neighbours (ties
    to even), one float32 ulp either side of each, values past the largest,
    float32 subnormals and both zeros, each with both signs."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(TORCH_FP8[fmt]).float()
    v = codes[torch.isfinite(codes) & (codes >= 0)].sort().values.unique()
    mid = (v[1:] + v[:-1]) / 2
    up = torch.nextafter(mid, torch.full_like(mid, math.inf))
    down = torch.nextafter(mid, torch.zeros_like(mid))
    extra = torch.tensor([FP8_MAX[fmt] * 1.5, 3e38, 1e-45, 1e-40, 0.0])
    p = torch.cat([v, mid, up, down, extra])
    return torch.cat([p, -p])


@pytest.mark.fast
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_hardware_conversion_semantics(lib, fmt):
    """fp8_convert_cuda.cuh's software version of cvt.rn.satfinite: torch's
    round-to-nearest-even cast for every value within range, the largest
    finite code (sign kept) beyond it and for Inf, 0x7F for NaN; and of
    cvt.rn.f16x2 (then to float): torch's decode of every code."""
    x = fp8_grid_probes(fmt)
    got = torch.tensor([lib.simt_float2_to_fp8x2(FORMAT[fmt], a, b) for a, b in zip(x[0::2].tolist(),
                                                                                      x[1::2].tolist())],
                       dtype=torch.int32)
    codes = torch.stack([got & 0xFF, got >> 8], dim=1).flatten().to(torch.uint8)
    within = x.abs() <= FP8_MAX[fmt]
    want = x.to(TORCH_FP8[fmt]).view(torch.uint8)
    assert torch.equal(codes[within], want[within])
    largest = torch.tensor(FP8_MAX[fmt]).to(TORCH_FP8[fmt]).view(torch.uint8).item()
    assert torch.equal(codes[~within], torch.where(x[~within] < 0, largest | 0x80, largest).to(torch.uint8))
    got = [lib.simt_float2_to_fp8x2(FORMAT[fmt], a, b) for a, b in ((math.inf, -math.inf), (math.nan, -math.nan))]
    assert got == [largest | ((largest | 0x80) << 8), 0x7F | (0x7F << 8)], got

    out = (ctypes.c_float * 2)()
    decoded = []
    for c in range(0, 256, 2):
        lib.simt_fp8x2_to_float2(FORMAT[fmt], c | ((c + 1) << 8), out)
        decoded += [out[0], out[1]]
    decoded = torch.tensor(decoded)
    want = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(TORCH_FP8[fmt]).float()
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(decoded), nan)
    assert torch.equal(decoded[~nan].view(torch.int32), want[~nan].view(torch.int32))


@pytest.mark.fast
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_rounding_case_through_the_kernels(lib, kernels, fmt, dtype):
    """Blocks of 32 whose scale is 1 (each holds the format's largest value)
    carrying every grid value, tie and near-tie: the tiled kernels' hardware
    path (here its software twin) writes the CPU codec's codes."""
    probes = fp8_grid_probes(fmt)
    probes = probes[probes.abs() <= FP8_MAX[fmt]]
    probes = torch.cat([probes, torch.zeros((-probes.numel()) % 31)]).view(-1, 31)
    blocks = torch.cat([torch.full((probes.shape[0], 1), FP8_MAX[fmt]), probes], dim=1).flatten()
    x = embed(torch.cat([blocks, blocks * 2.0 ** -100, blocks * 2.0 ** 100]).to(dtype), 0)
    emu, cpu = quantize_both(lib, kernels, x, 1, x.numel(), 32, fmt)
    assert_same_bits(emu, cpu, "wire segment")
