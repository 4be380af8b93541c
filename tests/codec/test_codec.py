"""The FP8 block codec on the CPU against the independent reference in
codec_reference.py, the error bounds DESIGN.md promises, and bad arguments."""
import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fp8comm
from tests.support import tiers
from tests.support.reference import dequantize as ref_dequantize
from tests.support.reference import half_ulp, sqnr_db
from tests.support.reference import quantize as ref_quantize

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SIZES = [0, 1, 15, 16, 33, 1000, (1 << 20) + 7]


def u8(t):
    return t.view(torch.uint8)


def assert_codes_match_reference(x, block_size, fp8_dtype):
    codes, scales = fp8comm.quantize(x, block_size=block_size, fp8_dtype=fp8_dtype)
    ref_codes, ref_scales = ref_quantize(x, block_size, fp8_dtype)
    assert codes.dtype == fp8_dtype and codes.shape == (x.numel(),)
    assert scales.dtype == torch.float8_e8m0fnu and scales.numel() == math.ceil(x.numel() / block_size)
    assert torch.equal(u8(scales), ref_scales)
    got = u8(codes)
    nan = torch.isnan(codes.float())
    assert torch.equal(nan, torch.isnan(ref_codes.view(fp8_dtype).float()))
    assert torch.equal(got[~nan], ref_codes[~nan])
    return codes, scales


@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_codes_and_scales_match_reference(n, dtype, fp8_dtype):
    x = (torch.randn(n) * 3).to(dtype)
    codes, scales = assert_codes_match_reference(x, 32, fp8_dtype)
    out = fp8comm.dequantize(codes, scales, dtype=dtype)
    expect = ref_dequantize(u8(codes), u8(scales), 32, fp8_dtype).to(dtype)
    assert out.dtype == dtype and torch.equal(out, expect)


@pytest.mark.parametrize("block_size", [16, 48, 128, 4096])
def test_block_sizes(block_size):
    x = torch.randn(3 * block_size + 5) * torch.logspace(-3, 3, 3 * block_size + 5)
    assert_codes_match_reference(x, block_size, torch.float8_e4m3fn)


@pytest.mark.parametrize("fp8_dtype", FP8)
def test_round_trip_error_within_half_ulp(fp8_dtype):
    x = torch.randn(1 << 16) * torch.logspace(-20, 20, 1 << 16)
    codes, scales = fp8comm.quantize(x, fp8_dtype=fp8_dtype)
    y = fp8comm.dequantize(codes, scales)
    err = (y.double() - x.double()).abs()
    assert (err <= half_ulp(x, 32, fp8_dtype)).all()


@pytest.mark.parametrize("fp8_dtype,floor_db", [(torch.float8_e4m3fn, 31.0), (torch.float8_e5m2, 25.0)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_sqnr_on_randn(fp8_dtype, floor_db, dtype):
    x = torch.randn(1 << 20).to(dtype)
    codes, scales = fp8comm.quantize(x, fp8_dtype=fp8_dtype)
    assert sqnr_db(x, fp8comm.dequantize(codes, scales)) >= floor_db


@pytest.mark.parametrize("fp8_dtype", FP8)
def test_values_on_the_fp8_grid_round_trip_exactly(fp8_dtype):
    gen = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 256, (4096,), dtype=torch.uint8, generator=gen)
    grid = raw.view(fp8_dtype).float()
    grid = torch.where(torch.isfinite(grid), grid, torch.zeros_like(grid))
    block_exp = torch.randint(-100, 100, (4096 // 32,), generator=gen).repeat_interleave(32)
    x = grid * torch.pow(2.0, block_exp.float())
    codes, scales = fp8comm.quantize(x, fp8_dtype=fp8_dtype)
    assert torch.equal(fp8comm.dequantize(codes, scales), x)


def test_zeros_are_exact_and_keep_their_sign():
    x = torch.tensor([0.0, -0.0] * 40)
    codes, scales = fp8comm.quantize(x)
    y = fp8comm.dequantize(codes, scales)
    assert torch.equal(y, x) and torch.equal(torch.signbit(y), torch.signbit(x))
    assert (u8(scales) == 127).all()


@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("dtype", DTYPES)
def test_non_finite_positions_survive_and_the_rest_stays_accurate(fp8_dtype, dtype):
    x = torch.randn(1000)
    bad = torch.zeros(1000, dtype=torch.bool)
    bad[[3, 64, 65, 500, 999]] = True
    x_bad = x.clone()
    x_bad[[3, 64]] = float("nan")
    x_bad[[65, 500]] = float("inf")
    x_bad[999] = float("-inf")
    codes, scales = fp8comm.quantize(x_bad.to(dtype), fp8_dtype=fp8_dtype)
    y = fp8comm.dequantize(codes, scales)
    assert torch.equal(~torch.isfinite(y), bad)
    if fp8_dtype == torch.float8_e5m2:  # E5M2 has Inf: signs survive
        assert y[65] == float("inf") and y[999] == float("-inf")
    # The rest of each block is scaled from its finite max: as if the bad ones were 0.
    clean = torch.where(bad, torch.zeros_like(x), x).to(dtype)
    ref_codes, ref_scales = fp8comm.quantize(clean, fp8_dtype=fp8_dtype)
    assert torch.equal(u8(scales), u8(ref_scales))
    assert torch.equal(u8(codes)[~bad], u8(ref_codes)[~bad])


def test_mixed_magnitude_bucket_keeps_every_layer():
    """DESIGN.md's bucket: nine layers from 1e-6 to 1e2 in one flat buffer."""
    gen = torch.Generator().manual_seed(1)
    layers = [torch.randn(4099, generator=gen) * 10.0**k for k in range(-6, 3)]
    bucket = torch.cat(layers)
    codes, scales = fp8comm.quantize(bucket)
    y = fp8comm.dequantize(codes, scales)
    start = 0
    for layer in layers:
        got = y[start : start + layer.numel()]
        start += layer.numel()
        assert sqnr_db(layer, got) >= 30.0


def test_subnormal_and_huge_inputs():
    tiny = torch.tensor([1e-40, -3e-39, 1.4e-45, 0.0] * 8)
    huge = torch.tensor([3.0e38, -3.4e38, 1e38, 1.0] * 8)
    for x in (tiny, huge):
        codes, scales = assert_codes_match_reference(x, 32, torch.float8_e4m3fn)
        y = fp8comm.dequantize(codes, scales)
        assert torch.isfinite(y).all()
    # Near FLT_MAX the rounding goes down rather than up to 2**128 (Inf).
    y = fp8comm.dequantize(*fp8comm.quantize(huge))
    big = huge.abs() > 1e37
    assert ((y.double() - huge.double()).abs() <= 0.07 * huge.double().abs())[big].all()


def test_any_shape_and_non_contiguous_input():
    x = torch.randn(64, 48)
    xt = x.t()  # non-contiguous
    codes, scales = fp8comm.quantize(xt)
    ref_codes, ref_scales = fp8comm.quantize(xt.contiguous())
    assert torch.equal(u8(codes), u8(ref_codes)) and torch.equal(u8(scales), u8(ref_scales))
    y = fp8comm.dequantize(codes, scales).view(48, 64)
    assert sqnr_db(xt, y) >= 31


@settings(max_examples=tiers.examples(60), deadline=None)
@given(
    n=st.integers(0, 5000),
    log_scale=st.floats(-30, 30),
    dtype=st.sampled_from(DTYPES),
    fp8_dtype=st.sampled_from(FP8),
    block_size=st.sampled_from([16, 32, 64, 80, 256]),
    seed=st.integers(0, 2**31 - 1),
)
def test_hypothesis_matches_reference(n, log_scale, dtype, fp8_dtype, block_size, seed):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, generator=gen) * 10.0**log_scale).to(dtype)
    codes, scales = assert_codes_match_reference(x, block_size, fp8_dtype)
    y = fp8comm.dequantize(codes, scales, block_size=block_size)
    finite = torch.isfinite(x.float())
    err = (y.double() - x.double()).abs()[finite]
    assert (err <= half_ulp(x.float(), block_size, fp8_dtype)[finite]).all()


# ---------------------------------------------------------------- fused operators
def wire(num_segments, m, block_size=32):
    return torch.empty(num_segments * fp8comm.segment_bytes(m, block_size), dtype=torch.uint8)


def split_segment(buf, m, block_size=32):
    """(codes, scales) of one wire segment, for the flat API."""
    nb = math.ceil(m / block_size)
    scale_bytes = fp8comm.segment_bytes(m, block_size) - nb * block_size
    return buf[scale_bytes : scale_bytes + m].view(torch.float8_e4m3fn), buf[:nb].view(torch.float8_e8m0fnu)


def test_segment_bytes_layout():
    assert fp8comm.segment_bytes(32, 32) == 16 + 32
    assert fp8comm.segment_bytes(33, 32) == 16 + 64
    assert fp8comm.segment_bytes(1024 * 32, 32) == 1024 + 1024 * 32
    assert fp8comm.segment_bytes(0, 32) == 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,P", [(1000, 4), (1001, 3), (5, 4), (0, 2), (4096, 2)])
def test_quantize_segments_equals_per_segment_quantize(n, P, dtype):
    x = torch.randn(n).to(dtype)
    m = math.ceil(n / P) if n else 7
    buf = wire(P, m)
    buf.fill_(0xAB)  # padding must be overwritten with zero codes
    fp8comm.quantize_segments(x, buf, P, m, premul=0.5)
    S = fp8comm.segment_bytes(m, 32)
    for r in range(P):
        seg = buf[r * S : (r + 1) * S]
        part = x[r * m : (r + 1) * m]
        codes, scales = split_segment(seg, m)
        ref_codes, ref_scales = fp8comm.quantize(part.float() * 0.5)
        k = part.numel()
        assert torch.equal(u8(codes)[:k], u8(ref_codes))
        assert torch.equal(u8(scales)[: ref_scales.numel()], u8(ref_scales))
        nb_total = math.ceil(m / 32)
        codes_all = seg[S - nb_total * 32 :]
        assert (codes_all[k:] == 0).all()


def test_quantize_segments_tensor_premul_equals_float_premul():
    x = torch.randn(999)
    a, b = wire(3, 333), wire(3, 333)
    fp8comm.quantize_segments(x, a, 3, 333, premul=0.125)
    fp8comm.quantize_segments(x, b, 3, 333, premul=torch.tensor(0.125))
    assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dequantize_segments_round_trip(dtype):
    x = torch.randn(1001).to(dtype)
    P, m = 3, 334
    buf = wire(P, m)
    fp8comm.quantize_segments(x, buf, P, m)
    out = torch.empty(1001, dtype=dtype)
    fp8comm.dequantize_segments(buf, out, P, m)
    ref = torch.cat([fp8comm.dequantize(*fp8comm.quantize(x[r * m : (r + 1) * m]), dtype=dtype) for r in range(P)])
    assert torch.equal(out, ref)


@pytest.mark.parametrize("post_div", [1, 3])
@pytest.mark.parametrize("dtype", DTYPES)
def test_dequant_sum_equals_sum_of_dequantized(post_div, dtype):
    P, m = 3, 1000
    pieces = [torch.randn(m) * 10.0**r for r in range(P)]
    buf = wire(P, m)
    for r, p in enumerate(pieces):
        S = fp8comm.segment_bytes(m, 32)
        fp8comm.quantize_segments(p, buf[r * S : (r + 1) * S], 1, m)
    out = torch.empty(m - 3, dtype=dtype)
    fp8comm.dequant_sum(buf, out, P, m, post_div=post_div)
    acc = fp8comm.dequantize(*fp8comm.quantize(pieces[0]))
    for p in pieces[1:]:
        acc = acc + fp8comm.dequantize(*fp8comm.quantize(p))
    expect = (acc / post_div if post_div > 1 else acc)[: m - 3].to(dtype)
    assert torch.equal(out, expect)


def test_dequant_sum_requantize_equals_quantize_of_the_sum():
    P, m = 4, 777
    buf = wire(P, m)
    x = torch.randn(P * m)
    fp8comm.quantize_segments(x, buf, P, m)
    total = torch.empty(m)
    fp8comm.dequant_sum(buf, total, P, m, post_div=4)
    out = wire(1, m)
    fp8comm.dequant_sum_requantize(buf, out, P, m, post_div=4)
    ref = wire(1, m)
    fp8comm.quantize_segments(total, ref, 1, m)
    assert torch.equal(out, ref)


def test_dequant_sum_propagates_non_finite():
    P, m = 2, 64
    a = torch.randn(m)
    b = torch.randn(m)
    a[5] = float("nan")
    b[9] = float("inf")
    buf = wire(P, m)
    S = fp8comm.segment_bytes(m, 32)
    fp8comm.quantize_segments(a, buf[:S], 1, m)
    fp8comm.quantize_segments(b, buf[S:], 1, m)
    out = torch.empty(m)
    fp8comm.dequant_sum(buf, out, P, m)
    assert torch.equal(~torch.isfinite(out), torch.isin(torch.arange(m), torch.tensor([5, 9])))


# ------------------------------------------------- the own (unquantized) addend
def _pieces_of(parts, m):
    """The wire segments of `parts` (each quantized alone) and their sum decoded in FP32."""
    S = fp8comm.segment_bytes(m, 32)
    buf = wire(len(parts), m)
    acc = []
    for r, p in enumerate(parts):
        fp8comm.quantize_segments(p, buf[r * S:(r + 1) * S], 1, m)
        acc.append(fp8comm.dequantize(*fp8comm.quantize(p)).float())
    return buf, acc


@pytest.mark.parametrize("num_pieces", [0, 1, 3])
@pytest.mark.parametrize("post_div", [1, 4])
@pytest.mark.parametrize("dtype", DTYPES)
def test_dequant_sum_with_own_is_own_first_then_the_pieces(num_pieces, post_div, dtype):
    """out = (own * premul, then + each decoded piece in order) / post_div, in
    FP32, bitwise; own shorter than the output counts as zeros past its end."""
    m = 1000
    own = (torch.randn(m - 40) * 3).to(dtype)
    buf, decoded = _pieces_of([torch.randn(m) * 10.0**r for r in range(num_pieces)], m)
    out = torch.empty(m - 3, dtype=dtype)
    fp8comm.dequant_sum(buf, out, num_pieces, m, post_div=post_div, own=own, own_premul=0.5)
    acc = torch.zeros(m)
    acc[: own.numel()] = own.float() * 0.5
    for d in decoded:
        acc = acc + d
    expect = (acc / post_div if post_div > 1 else acc)[: m - 3].to(dtype)
    assert torch.equal(out, expect)


@pytest.mark.parametrize("num_pieces", [0, 1, 3])
@pytest.mark.parametrize("own_dtype", DTYPES)
def test_dequant_sum_requantize_with_own_equals_quantize_of_the_sum(num_pieces, own_dtype):
    m = 777  # not a whole number of blocks: the last block is part padding
    own = (torch.randn(m - 100) * 7).to(own_dtype)
    buf, _ = _pieces_of([torch.randn(m) for _ in range(num_pieces)], m)
    total = torch.empty(m)
    fp8comm.dequant_sum(buf, total, num_pieces, m, post_div=3, own=own.float(), own_premul=-2.0)
    out = wire(1, m)
    fp8comm.dequant_sum_requantize(buf, out, num_pieces, m, post_div=3, own=own, own_premul=-2.0)
    ref = wire(1, m)
    fp8comm.quantize_segments(total, ref, 1, m)
    assert torch.equal(out, ref)


def test_own_addend_is_exact_where_the_pieces_are_zero():
    """The own segment is never quantized: with zero pieces it comes back as it went in."""
    m = 512
    own = torch.randn(m) * torch.logspace(-6, 2, m)
    buf, _ = _pieces_of([torch.zeros(m)], m)
    out = torch.empty(m)
    fp8comm.dequant_sum(buf, out, 1, m, own=own)
    assert torch.equal(out, own)


def test_own_addend_propagates_non_finite():
    m = 64
    own, piece = torch.randn(m), torch.randn(m)
    own[3], own[7], piece[9] = float("nan"), float("-inf"), float("inf")
    buf, _ = _pieces_of([piece], m)
    out = torch.empty(m)
    fp8comm.dequant_sum(buf, out, 1, m, own=own)
    assert torch.equal(~torch.isfinite(out), torch.isin(torch.arange(m), torch.tensor([3, 7, 9])))


def test_bad_own_addend():
    with pytest.raises(RuntimeError, match="own has 101 elements, more than the 100 of a piece"):
        fp8comm.dequant_sum(wire(1, 100), torch.empty(100), 1, 100, own=torch.randn(101))
    with pytest.raises(RuntimeError, match="own is BFloat16 but out is Float"):
        fp8comm.dequant_sum(wire(1, 100), torch.empty(100), 1, 100, own=torch.randn(100).bfloat16())
    with pytest.raises(RuntimeError, match="expected a float32, bfloat16 or float16 tensor, got Double"):
        fp8comm.dequant_sum_requantize(wire(1, 100), wire(1, 100), 1, 100, own=torch.randn(100, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="the number of segments must be >= 1"):
        fp8comm.dequant_sum(wire(0, 100), torch.empty(100), 0, 100)


# ---------------------------------------------------------------- bad arguments
@pytest.mark.parametrize("block_size", [0, 8, 17, 40, 8192])
def test_bad_block_size(block_size):
    with pytest.raises(ValueError, match=r"block_size must be a multiple of 16 in \[16, 4096\]"):
        fp8comm.quantize(torch.randn(100), block_size=block_size)


def test_bad_dtypes():
    with pytest.raises(RuntimeError, match="expected a float32, bfloat16 or float16 tensor, got Int"):
        fp8comm.quantize(torch.arange(10, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="got Double"):
        fp8comm.quantize(torch.randn(10, dtype=torch.float64))
    with pytest.raises(ValueError, match="fp8_dtype must be torch.float8_e4m3fn or torch.float8_e5m2"):
        fp8comm.quantize(torch.randn(10), fp8_dtype=torch.float16)
    names = [f"'{name}'" for name in fp8comm.codec.WIRE_FORMATS]  # the one wording: fp8_dtype_table.h
    choices = ", ".join(names[:-1]) + " or " + names[-1]
    with pytest.raises(ValueError, match=re.escape(f"fp8comm codec: wire_format must be {choices}, got 'fp4'")):
        fp8comm.quantize(torch.randn(10), wire_format="fp4")
    with pytest.raises(ValueError, match="disagree"):
        fp8comm.quantize(torch.randn(10), wire_format="e4m3", fp8_dtype=torch.float8_e5m2)
    codes, scales = fp8comm.quantize(torch.randn(100))
    with pytest.raises(RuntimeError, match="need 4 scales, got 3"):
        fp8comm.dequantize(codes, scales[:3])
    with pytest.raises(ValueError, match="the codes of no wire format; name the format with wire_format="):
        fp8comm.dequantize(codes.view(torch.uint8), scales)
    with pytest.raises(ValueError, match="the codes of wire_format 'e5m2' are Float8_e5m2, got Float8_e4m3fn"):
        fp8comm.dequantize(codes, scales, wire_format="e5m2")
    codes, scales = fp8comm.quantize(torch.randn(99), wire_format="mxfp4")
    with pytest.raises(ValueError, match="are mxfp4 or nvfp4; name the format with wire_format="):
        fp8comm.dequantize(codes, scales)  # a dtype two formats share names neither
    with pytest.raises(RuntimeError, match="50 Float4_e2m1fn_x2 elements hold 100 codes, not numel=98"):
        fp8comm.dequantize(codes, scales, numel=98, wire_format="mxfp4")


def test_bad_wire_buffers():
    x = torch.randn(100)
    with pytest.raises(RuntimeError, match=r"out must be a contiguous uint8 tensor of 160 bytes"):
        fp8comm.quantize_segments(x, torch.empty(10, dtype=torch.uint8), 2, 50)
    with pytest.raises(RuntimeError, match="more than 2 segments of 40"):
        fp8comm.quantize_segments(x, wire(2, 40), 2, 40)
    with pytest.raises(RuntimeError, match="out has 200 elements, more than the 100"):
        fp8comm.dequant_sum(wire(2, 100), torch.empty(200), 2, 100)
    with pytest.raises(RuntimeError, match="post_div must be >= 1"):
        fp8comm.dequant_sum(wire(2, 100), torch.empty(100), 2, 100, post_div=0)


# ---------------------------------------------------------------- torch.compile
def test_ops_trace_under_torch_compile():
    def round_trip(x):
        codes, scales = fp8comm.quantize(x * 2)
        return fp8comm.dequantize(codes, scales, dtype=torch.float32) + 1

    x = torch.randn(300)
    compiled = torch.compile(round_trip, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x), round_trip(x))


@pytest.mark.parametrize("value,expect", [("0", "False False"), ("avx2", "True False"),
                                          ("bogus", "FP8COMM_CPU_SIMD must be")])
def test_environment_picks_the_kernels(value, expect):
    """FP8COMM_CPU_SIMD=0 / avx2 / anything else (an error naming the choices,
    not a silent default). On a CPU without AVX2 the SIMD kernels stay off."""
    import os
    import subprocess
    import sys

    code = ("import torch, fp8comm\nfrom fp8comm import _C\n"
            "try:\n    fp8comm.quantize(torch.randn(64))\n    print(_C.cpu_simd_enabled(), _C.cpu_avx512_enabled())\n"
            "except RuntimeError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "FP8COMM_CPU_SIMD": value},
                         capture_output=True, text=True, timeout=120)
    if value == "avx2" and "False False" in out.stdout:
        pytest.skip("this CPU has no AVX2 / F16C")
    assert expect in out.stdout, out.stdout + out.stderr


def _cpu_flags():
    """The CPU's feature flags as Linux reports them, or None where there are none to read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def test_default_kernels_follow_the_cpu_flags():
    """With FP8COMM_CPU_SIMD=1 the codec runs exactly the kernels the CPU's
    flags allow: AVX2 with avx2 and f16c, AVX-512 with avx512f and avx512bw
    besides. (The SIMD tests skip a level when the codec refuses to switch it
    on; this holds that refusal to what the CPU truly lacks.)"""
    import os
    import subprocess
    import sys

    flags = _cpu_flags()
    if flags is None:
        pytest.skip("no /proc/cpuinfo flags to compare with")
    avx2 = {"avx2", "f16c"} <= flags
    avx512 = avx2 and {"avx512f", "avx512bw"} <= flags
    code = "from fp8comm import _C\nprint(_C.cpu_simd_enabled(), _C.cpu_avx512_enabled())\n"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "FP8COMM_CPU_SIMD": "1"},
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == [str(avx2), str(avx512)], out.stdout + out.stderr
