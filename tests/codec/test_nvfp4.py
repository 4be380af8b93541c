"""The NVFP4 wire format (E2M1 codes in blocks of 16, an E4M3 scale per block
times a float32 power-of-two scale per segment) on the CPU codec against the
independent reference of tests/support/nvfp4_reference.py: the scale rules,
the segment layout, non-finite blocks, the extremes of float32, the sums the
collectives use, and the documented accuracy. Whatever CPU kernels this
machine runs; test_codec_simd.py compares them with the scalar loops."""
import math

import pytest
import torch

import fp8comm
from tests.support import nvfp4_reference as ref
from tests.support.reference import sqnr_db
from tests.codec.test_mxfp4 import spread

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
FMT = "nvfp4"
B = 16


def u8(t):
    return t.view(torch.uint8)


def same(a, b):
    """Equal values, NaN where the other has NaN."""
    return torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(a[~torch.isnan(a)], b[~torch.isnan(b)])


def specials(n, dtype, seed):
    """spread() with blocks of exact zeros, a NaN, an Inf and a -Inf."""
    x = spread(n, dtype, seed)
    if n >= 80:
        x[16:32] = 0.0
        x[40], x[50], x[70] = float("nan"), float("inf"), float("-inf")
    return x


@pytest.mark.parametrize("premul", [1.0, 0.375])
@pytest.mark.parametrize("n", [1, 15, 16, 33, 1000, 4099])
@pytest.mark.parametrize("dtype", DTYPES)
def test_codes_and_scales_equal_the_reference(n, dtype, premul):
    x = specials(n, dtype, seed=n)
    S = fp8comm.segment_bytes(n, wire_format=FMT)
    out = torch.full((S,), 0xA5, dtype=torch.uint8)
    fp8comm.quantize_segments(x, out, 1, n, wire_format=FMT, premul=premul)
    codes, scales, g = ref.quantize_segment(x, premul)
    blocks = math.ceil(n / B)
    head = 4 + blocks
    assert out[:4].view(torch.float32).item() == g
    assert torch.equal(out[4:head], scales) and (out[head:math.ceil(head / 16) * 16] == 0).all()
    assert torch.equal(out[math.ceil(head / 16) * 16:], codes)
    back = torch.empty(n, dtype=dtype)
    fp8comm.dequantize_segments(out, back, 1, n, wire_format=FMT)
    assert same(back.float(), ref.dequantize_segment(codes, scales, g, n).to(dtype).float())


@pytest.mark.parametrize("dtype", DTYPES)
def test_flat_quantize_returns_the_segment_scale_third(dtype):
    x = spread(1000, dtype, seed=3)
    codes, scales, segment_scale = fp8comm.quantize(x, wire_format=FMT)
    assert codes.dtype == torch.float4_e2m1fn_x2 and codes.shape == (500,)
    assert scales.dtype == torch.float8_e4m3fn and scales.shape == (63,)
    assert segment_scale.dtype == torch.float32 and segment_scale.shape == (1,)
    ref_codes, ref_scales, g = ref.quantize_segment(x)
    assert torch.equal(u8(codes), ref_codes[:500]) and torch.equal(u8(scales), ref_scales) and segment_scale.item() == g
    back = fp8comm.dequantize(codes, scales, segment_scale, wire_format=FMT, dtype=dtype, numel=1000)
    assert torch.equal(back, ref.dequantize_segment(ref_codes, ref_scales, g, 1000).to(dtype))
    assert torch.equal(fp8comm.dequantize(*fp8comm.quantize(x, wire_format=FMT), wire_format=FMT, dtype=dtype), back)


def test_errors_name_what_nvfp4_needs():
    x = torch.randn(64)
    with pytest.raises(ValueError, match="wire_format 'nvfp4' has blocks of 16 elements, got block_size=32"):
        fp8comm.quantize(x, wire_format=FMT, block_size=32)
    codes, scales, segment_scale = fp8comm.quantize(x, wire_format=FMT)
    with pytest.raises(ValueError, match="needs the segment scale quantize returned third"):
        fp8comm.dequantize(codes, scales, wire_format=FMT)
    with pytest.raises(ValueError, match="are mxfp4 or nvfp4; name the format"):
        fp8comm.dequantize(codes, scales, segment_scale)
    with pytest.raises(ValueError, match="has no segment scale"):
        fp8comm.dequantize(*fp8comm.quantize(x, wire_format="mxfp4"), segment_scale, wire_format="mxfp4")


def test_extremes_of_float32_stay_finite_and_zeros_stay_zero():
    big = torch.tensor([3.4e38, -3.4028234e38] + [1.0] * 14 + [2.0**-140] * 16)
    codes, scales, g = ref.quantize_segment(big)
    out = fp8comm.dequantize(*fp8comm.quantize(big, wire_format=FMT), wire_format=FMT)
    assert torch.isfinite(out).all() and torch.equal(out, ref.dequantize_segment(codes, scales, g, 32).float())
    assert out[0] > 2e38 and out[1] < -2e38
    tiny = torch.full((48,), 2.0**-149) * torch.arange(48)  # float32 subnormals
    out = fp8comm.dequantize(*fp8comm.quantize(tiny, wire_format=FMT), wire_format=FMT)
    codes, scales, g = ref.quantize_segment(tiny)
    assert torch.equal(out, ref.dequantize_segment(codes, scales, g, 48).float())
    zeros = torch.zeros(40)
    c, s, seg = fp8comm.quantize(zeros, wire_format=FMT)
    assert seg.item() == 1.0 and (u8(s) == ref.ONE).all() and (u8(c) == 0).all()


def test_the_block_maximum_rounds_to_its_nearest_code():
    """Never saturating beyond a rounding step: the block maximum in code units
    is at most 7 (it rounds to 6, its nearest code on E2M1's grid continued to 8),
    so its error is at most half of the top step."""
    x = torch.randn(1 << 16, generator=torch.Generator().manual_seed(4)) * torch.exp(
        torch.randn(1 << 12, generator=torch.Generator().manual_seed(5)).repeat_interleave(16) * 4)
    codes, scales, seg = fp8comm.quantize(x, wire_format=FMT)
    s = ref.e4m3_values()[u8(scales).long()] * seg.item()
    blocks = x.double().view(-1, B)
    amax = blocks.abs().amax(dim=1)
    assert (amax <= 7 * s).all()
    y = fp8comm.dequantize(codes, scales, seg, wire_format=FMT).double().view(-1, B)
    at_max = blocks.abs().argmax(dim=1, keepdim=True)
    err = (blocks.gather(1, at_max) - y.gather(1, at_max)).abs().squeeze(1)
    assert (err <= s).all()  # half of the 4 -> 6 (-> 8) step


def test_sqnr_on_gaussian_and_heavy_tailed_data_is_the_documented_figure():
    """DESIGN.md, "Wire format": NVFP4 keeps 20.3 dB or more per quantization of
    Gaussian data and 20.5 dB of Student-t(3) data (MXFP4: 18.7 and 16.6)."""
    g = torch.Generator().manual_seed(0)
    gauss = torch.randn(1 << 20, generator=g)
    heavy = torch.distributions.StudentT(3.0).sample((1 << 20,))
    for x, floor in ((gauss, 20.3), (heavy, 20.5)):
        db = sqnr_db(x, fp8comm.dequantize(*fp8comm.quantize(x, wire_format=FMT), wire_format=FMT))
        assert floor <= db <= floor + 2.0, db


def test_segment_bytes():
    assert fp8comm.segment_bytes(100, wire_format=FMT) == 16 + 7 * 8  # 4 + 7 scale bytes padded, 7 blocks of codes
    assert fp8comm.segment_bytes(1 << 20, wire_format=FMT) == (4 + (1 << 16) + 12) + (1 << 19)


@pytest.mark.parametrize("post_div", [1, 3])
@pytest.mark.parametrize("with_own", [False, True])
def test_sums_decode_add_and_requantize_as_the_reference(post_div, with_own):
    """Each piece decoded with its own segment scale; the re-quantized sum gets
    the segment scale of the sums."""
    P, m = 3, 160
    S = fp8comm.segment_bytes(m, wire_format=FMT)
    pieces = torch.empty(P * S, dtype=torch.uint8)
    xs = [spread(m, torch.float32, seed=20 + r) * 10.0 ** (2 * r) for r in range(P)]
    refs = []
    for r in range(P):
        fp8comm.quantize_segments(xs[r], pieces[r * S:(r + 1) * S], 1, m, wire_format=FMT)
        refs.append(ref.quantize_segment(xs[r]))
    own = spread(m, torch.float32, seed=99) if with_own else None
    acc = own.clone() if with_own else None
    for codes, scales, g in refs:  # the codec's order: own first, then the pieces in rank order
        d = ref.dequantize_segment(codes, scales, g, m).float()
        acc = d if acc is None else acc + d
    expect = acc / post_div if post_div != 1 else acc
    out = torch.empty(m)
    fp8comm.dequant_sum(pieces, out, P, m, wire_format=FMT, post_div=post_div, own=own)
    assert torch.equal(out, expect)
    seg = torch.empty(S, dtype=torch.uint8)
    fp8comm.dequant_sum_requantize(pieces, seg, P, m, wire_format=FMT, post_div=post_div, own=own)
    codes, scales, g = ref.quantize_segment(expect)
    assert seg[:4].view(torch.float32).item() == g
    assert torch.equal(seg[4:14], scales) and torch.equal(seg[16:], codes)


def test_each_segment_has_its_own_scale():
    """quantize_segments: P segments of different magnitudes, each scaled by its own g."""
    P, m = 4, 200
    x = torch.cat([spread(m, torch.float32, seed=r) * 10.0 ** (3 * r) for r in range(P)])[:P * m - 30]
    S = fp8comm.segment_bytes(m, wire_format=FMT)
    out = torch.empty(P * S, dtype=torch.uint8)
    fp8comm.quantize_segments(x, out, P, m, wire_format=FMT)
    for r in range(P):
        codes, scales, g = ref.quantize_segment(x[r * m:(r + 1) * m], capacity=208)
        seg = out[r * S:(r + 1) * S]
        assert seg[:4].view(torch.float32).item() == g
        assert torch.equal(seg[4:4 + 13], scales) and torch.equal(seg[32:], codes)


def test_stochastic_rounding_is_unbiased_below_the_top_code():
    """E[decode(q(x))] = x for every element whose value in code units is at
    most 6; the same key gives the same bytes."""
    x = spread(4096, torch.float32, seed=11)
    keys = range(1, 401)
    mean = sum(fp8comm.dequantize(*fp8comm.quantize(x, wire_format=FMT, rounding="stochastic", rounding_key=k),
                                  wire_format=FMT).double() for k in keys) / len(keys)
    codes, scales, seg = fp8comm.quantize(x, wire_format=FMT)
    s = (ref.e4m3_values()[u8(scales).long()] * seg.item()).repeat_interleave(B)
    inside = x.double().abs() <= 6 * s
    step = torch.where(x.double().abs() < 4 * s, s, 2 * s)  # code steps of 0.5 / 1 / 2 in code units
    z = ((mean - x.double()) / step)[inside & (x != 0)]
    assert z.abs().max() < 0.2 and abs(z.mean()) < 0.01, (z.abs().max(), z.mean())
    a = fp8comm.quantize(x, wire_format=FMT, rounding="stochastic", rounding_key=7)
    b = fp8comm.quantize(x, wire_format=FMT, rounding="stochastic", rounding_key=7)
    assert all(torch.equal(u8(p), u8(q)) for p, q in zip(a, b))


def test_an_empty_tensor_round_trips():
    codes, scales, segment_scale = fp8comm.quantize(torch.zeros(0), wire_format=FMT)
    assert codes.numel() == 0 and scales.numel() == 0 and segment_scale.item() == 1.0
    assert fp8comm.dequantize(codes, scales, segment_scale, wire_format=FMT).numel() == 0
