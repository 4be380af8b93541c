"""NaN in what the codec writes. Every NaN in an element output (dequantize,
dequant_sum; float32, bfloat16, float16) is one canonical pattern per dtype,
the positive quiet NaN with a zero payload (fp8_block_math.h), whatever made
it: a NaN code of either sign, a NaN input with a payload or a sign, a
signalling NaN, Inf - Inf in a sum. Which NaN an operation yields differs
between x86 and CUDA, and the outputs must be the same bits on both. Every
NaN on the wire is the one positive NaN code (E4M3 0x7F, E5M2 0x7E); MXFP4,
which has no NaN code, gives a block holding one E8M0's NaN scale (0xFF).
Everything that is not NaN equals codec_reference.py (MXFP4:
mxfp4_reference.py) bit for bit.

Every test runs once per SIMD level this CPU has (scalar loops, AVX2,
AVX-512): what a level needs is detected by switching it on, never assumed."""
import math

import pytest
import torch

import fp8comm
from tests.support.cpu_kernels import HAS_AVX2, HAS_AVX512
from tests.support import mxfp4_reference as mx_ref
from tests.support.reference import dequantize as ref_dequantize
from tests.support.reference import quantize as ref_quantize
from fp8comm import _C

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
CANONICAL_NAN = {torch.float32: 0x7FC00000, torch.bfloat16: 0x7FC0, torch.float16: 0x7E00}
NAN_CODE = {torch.float8_e4m3fn: 0x7F, torch.float8_e5m2: 0x7E}
NAN_CODES = {torch.float8_e4m3fn: [0x7F, 0xFF], torch.float8_e5m2: [0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF]}
# NaN inputs of every kind: quiet with a payload, signalling, either sign, all ones.
NAN_INPUTS = {
    torch.float32: [0x7FC00001, 0xFFC12345, 0x7F800001, 0xFF800001, 0x7FBFFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 0xFFC00000],
    torch.bfloat16: [0x7FC1, 0xFFC1, 0x7F81, 0xFF81, 0x7FBF, 0x7FFF, 0xFFFF, 0xFFC0],
    torch.float16: [0x7E01, 0xFE01, 0x7C01, 0xFC01, 0x7DFF, 0x7FFF, 0xFFFF, 0xFE00],
}


@pytest.fixture(autouse=True, params=["scalar", "avx2", "avx512"])
def simd_level(request):
    level = request.param
    if level == "avx2" and not HAS_AVX2:
        pytest.skip("this CPU lacks AVX2 / F16C: the codec runs its scalar loops only")
    if level == "avx512" and not HAS_AVX512:
        pytest.skip("this CPU lacks AVX-512 F / BW: the codec has no AVX-512 level here")
    old_simd, old_avx512 = _C.cpu_simd_enabled(), _C.cpu_avx512_enabled()
    _C.set_cpu_simd(level != "scalar")
    _C.set_cpu_avx512(level == "avx512")
    try:
        yield level
    finally:
        _C.set_cpu_avx512(old_avx512)
        _C.set_cpu_simd(old_simd)


def bits(t):
    return t.contiguous().view(INT_VIEW[t.dtype]).long() & ((1 << (8 * t.element_size())) - 1)


def from_bits(patterns, dtype):
    """A tensor of dtype holding these exact bit patterns."""
    wide = torch.tensor(patterns, dtype=torch.int64)
    if dtype == torch.float32:
        return wide.to(torch.int32).view(torch.float32)
    return (wide - ((wide >= 0x8000).long() << 16)).to(torch.int16).view(dtype)


def assert_nan_canonical(out, ref):
    """out is NaN exactly where ref is, each NaN the canonical pattern of out's
    dtype; every other element equals ref bit for bit."""
    nan = torch.isnan(ref)
    assert nan.any(), "the case holds no NaN: it tests nothing"
    assert torch.equal(torch.isnan(out), nan)
    got = bits(out)
    wrong = got[nan] != CANONICAL_NAN[out.dtype]
    assert not wrong.any(), (
        f"{int(wrong.sum())} of {int(nan.sum())} NaNs are not {CANONICAL_NAN[out.dtype]:#x}: "
        f"{sorted({hex(v) for v in got[nan][wrong].tolist()})}")
    assert torch.equal(got[~nan], bits(ref)[~nan])


def assert_codes_canonical(codes_u8, nan, ref_codes_u8, fp8_dtype):
    """Wire codes: NaN positions hold the one NaN code, the rest the reference's."""
    assert nan.any()
    assert (codes_u8[nan] == NAN_CODE[fp8_dtype]).all(), sorted({hex(v) for v in codes_u8[nan].tolist()})
    assert torch.equal(codes_u8[~nan], ref_codes_u8[~nan])


def wire_nan(x, fp8_dtype):
    """Where the codes of x are NaN codes: x's NaNs, and in E4M3 (no Inf) its infinities."""
    nan = torch.isnan(x)
    return nan | torch.isinf(x) if fp8_dtype == torch.float8_e4m3fn else nan


def wire(P, m, block_size):
    return torch.empty(P * fp8comm.segment_bytes(m, block_size), dtype=torch.uint8)


def segment_parts(buf, r, m, block_size):
    """(scale bytes, codes) of wire segment r, as views into buf."""
    S = fp8comm.segment_bytes(m, block_size)
    blocks = math.ceil(m / block_size)
    scale_bytes = S - blocks * block_size
    seg = buf[r * S:(r + 1) * S]
    return seg[:blocks], seg[scale_bytes:scale_bytes + m]


def build_pieces(P, m, block_size, fp8_dtype, seed):
    """P wire segments of m elements: random codes (NaN and Inf codes of both
    signs among them) over random ordinary scales, the first half of the
    blocks plain codes only (so the fast decodes run), and pieces 0 and 1
    holding opposite infinities at a few positions (E5M2: its Inf codes;
    E4M3: its largest codes under the largest scale, which overflow float32)."""
    g = torch.Generator().manual_seed(seed)
    buf = wire(P, m, block_size)
    buf.zero_()
    blocks = math.ceil(m / block_size)
    for r in range(P):
        scales, codes = segment_parts(buf, r, m, block_size)
        scales.copy_(torch.randint(110, 140, (blocks,), generator=g, dtype=torch.uint8))
        codes.copy_(torch.randint(0, 256, (m,), generator=g, dtype=torch.uint8))
        codes[: (blocks // 2) * block_size] &= 0x77  # no special code in the first half
        nan_codes = torch.tensor(NAN_CODES[fp8_dtype], dtype=torch.uint8)
        tail = torch.arange((blocks // 2) * block_size + r, m, 5)  # NaN codes, every kind, in the second half
        codes[tail] = nan_codes[torch.arange(tail.numel()) % nan_codes.numel()]
    if P >= 2:
        inf_block = blocks - 4  # a whole block of the second half that the own addend covers
        at = inf_block * block_size + torch.tensor([1, 4, 9])
        same_sign = inf_block * block_size + 12
        for r, sign in ((0, 0x00), (1, 0x80)):
            scales, codes = segment_parts(buf, r, m, block_size)
            if fp8_dtype == torch.float8_e5m2:
                codes[at] = 0x7C | sign
            else:
                scales[inf_block] = 254
                codes[at] = 0x7E | sign
            codes[same_sign] = codes[at[0]] & 0x7F  # +Inf + +Inf: stays +Inf
    return buf


def reference_sum(buf, P, m, block_size, fp8_dtype, own, own_premul, post_div):
    """(own * premul, then + each decoded piece in order) / post_div in float32."""
    acc = torch.zeros(m)
    if own is not None:
        acc[: own.numel()] = own.float() * own_premul
    for r in range(P):
        scales, codes = segment_parts(buf, r, m, block_size)
        piece = ref_dequantize(codes, scales, block_size, fp8_dtype)
        acc = piece.clone() if (r == 0 and own is None) else acc + piece
    return acc / post_div if post_div > 1 else acc


def nan_input(n, dtype, seed):
    """n values of dtype: Gaussian, with every kind of NaN input (payloads,
    signalling, either sign) at every 7th element and infinities of both
    signs at a few more."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g).to(dtype)
    at = torch.arange(3, n, 7)
    patterns = NAN_INPUTS[dtype]
    x[at] = from_bits([patterns[i % len(patterns)] for i in range(at.numel())], dtype)
    x[5::61] = float("inf")
    x[6::67] = float("-inf")
    return x


# ---------------------------------------------------------------- decoding codes
@pytest.mark.parametrize("block_size", [16, 32, 48])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fp8_dtype", FP8)
def test_nan_codes_decode_to_the_canonical_nan(fp8_dtype, dtype, block_size):
    """Every code byte, NaN codes of both signs (E4M3 0x7F / 0xFF, E5M2 0x7D-0x7F
    / 0xFD-0xFF) and Inf codes among them, through dequantize and
    dequantize_segments; blocks of plain codes around them, and a tail."""
    g = torch.Generator().manual_seed(block_size)
    n = 256 * 6 + 5
    codes = torch.cat([torch.arange(256, dtype=torch.uint8).repeat(3),
                       torch.randint(0, 256, (256 * 3 + 5,), generator=g, dtype=torch.uint8)])
    codes[256 * 3: 256 * 3 + 4 * block_size] &= 0x77  # whole blocks of plain codes too
    codes[-3] = NAN_CODES[fp8_dtype][-1]  # a NaN in the tail
    scales = torch.randint(110, 140, (math.ceil(n / block_size),), generator=g, dtype=torch.uint8)
    ref = ref_dequantize(codes, scales, block_size, fp8_dtype).to(dtype)
    out = fp8comm.dequantize(codes.view(fp8_dtype), scales.view(torch.float8_e8m0fnu), block_size=block_size,
                             dtype=dtype)
    assert_nan_canonical(out, ref)
    for code in NAN_CODES[fp8_dtype]:
        assert (bits(out[codes == code]) == CANONICAL_NAN[dtype]).all()
    if fp8_dtype == torch.float8_e5m2:
        assert (out[codes == 0x7C] == float("inf")).all() and (out[codes == 0xFC] == float("-inf")).all()

    P, m = 2, n // 2 + 3  # the same codes as two wire segments
    buf = wire(P, m, block_size).zero_()
    for r in range(P):
        seg_scales, seg_codes = segment_parts(buf, r, m, block_size)
        part = codes[r * m:(r + 1) * m]
        seg_codes[: part.numel()] = part
        seg_scales.copy_(torch.randint(110, 140, (seg_scales.numel(),), generator=g, dtype=torch.uint8))
    out = torch.full((n,), 7.0, dtype=dtype)
    fp8comm.dequantize_segments(buf, out, P, m, block_size=block_size, fp8_dtype=fp8_dtype)
    ref = torch.cat([ref_dequantize(*reversed(segment_parts(buf, r, m, block_size)), block_size, fp8_dtype)
                     for r in range(P)])[:n].to(dtype)
    assert_nan_canonical(out, ref)


# ---------------------------------------------------------------- sums
ADDENDS = [(3, False), (0, True), (3, True)]  # (pieces, own addend)


@pytest.mark.parametrize("post_div", [1, 3])
@pytest.mark.parametrize("pieces,with_own", ADDENDS)
@pytest.mark.parametrize("block_size", [16, 32, 48])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fp8_dtype", FP8)
def test_sums_write_the_canonical_nan(fp8_dtype, dtype, block_size, pieces, with_own, post_div):
    """dequant_sum: NaN from NaN codes of either sign, from Inf - Inf between
    pieces and between the own addend and a piece, and from NaN own inputs
    (payloads, signalling, either sign) in blocks the fast and the exact
    decodes take and in the tail; an own addend shorter than the output. The
    same sum re-quantized (dequant_sum_requantize) writes the one NaN code."""
    m = block_size * 16 + 7
    buf = build_pieces(pieces, m, block_size, fp8_dtype, seed=block_size + pieces)
    own = None
    kw = dict(block_size=block_size, fp8_dtype=fp8_dtype, post_div=post_div)
    if with_own:
        own = nan_input(m - block_size - 5, dtype, seed=block_size)
        if pieces >= 2:  # own +-Inf against a piece's opposite infinity
            inf_at = (math.ceil(m / block_size) - 4) * block_size  # build_pieces' block of infinities
            own[inf_at + 4] = float("inf")  # piece 0 +Inf, piece 1 -Inf there: NaN either way
            own[inf_at + 12] = float("-inf")  # pieces +Inf + +Inf there
        kw.update(own=own, own_premul=0.75)
    ref = reference_sum(buf, pieces, m, block_size, fp8_dtype, own, 0.75, post_div)
    if with_own and pieces >= 2:
        assert torch.isnan(ref[inf_at + 12])  # -Inf + Inf + Inf

    out = torch.full((m - 3,), 7.0, dtype=dtype)
    fp8comm.dequant_sum(buf, out, pieces, m, **kw)
    assert_nan_canonical(out, ref[: m - 3].to(dtype))

    requant = wire(1, m, block_size)
    requant.fill_(0xAB)
    fp8comm.dequant_sum_requantize(buf, requant, pieces, m, **kw)
    scales, codes = segment_parts(requant, 0, m, block_size)
    ref_codes, ref_scales = ref_quantize(ref, block_size, fp8_dtype)
    assert torch.equal(scales, ref_scales)
    assert_codes_canonical(codes, wire_nan(ref, fp8_dtype), ref_codes, fp8_dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fp8_dtype", FP8)
def test_inf_minus_inf_is_the_canonical_nan(fp8_dtype, dtype):
    """Opposite infinities in one sum: +Inf and -Inf pieces (E5M2 Inf codes;
    E4M3 codes that overflow float32 under the largest scale), and an own
    +-Inf against a piece's opposite one; x86 makes the negative default NaN
    of Inf - Inf. Same-sign infinities stay Inf."""
    block_size, m = 32, 64 + 5
    buf = wire(2, m, block_size)
    buf.zero_()
    for r, sign in ((0, 0x00), (1, 0x80)):
        scales, codes = segment_parts(buf, r, m, block_size)
        scales.fill_(127)
        if fp8_dtype == torch.float8_e5m2:
            inf_code = 0x7C
        else:
            scales[1] = 254
            inf_code = 0x7E
        codes[[32, 40, 50]] = inf_code | sign  # +Inf + -Inf
        codes[[33, 41]] = inf_code  # +Inf + +Inf
        codes[[66]] = 0x7C | sign if fp8_dtype == torch.float8_e5m2 else 0x7F | sign  # the tail: Inf - Inf or NaNs
    own = torch.zeros(m, dtype=dtype)
    own[[33, 35]] = float("-inf")  # against +Inf + +Inf; against nothing (stays -Inf)
    kw = dict(block_size=block_size, fp8_dtype=fp8_dtype)
    for own_kw in ({}, dict(own=own)):
        ref = reference_sum(buf, 2, m, block_size, fp8_dtype, own_kw.get("own"), 1.0, 1)
        assert torch.isnan(ref[[32, 40, 50]]).all()
        out = torch.full((m,), 7.0, dtype=dtype)
        fp8comm.dequant_sum(buf, out, 2, m, **kw, **own_kw)
        assert_nan_canonical(out, ref.to(dtype))
        assert out[41] == float("inf") and (out[35] == float("-inf") if own_kw else out[33] == float("inf"))
        requant = wire(1, m, block_size)
        fp8comm.dequant_sum_requantize(buf, requant, 2, m, **kw, **own_kw)
        _, codes = segment_parts(requant, 0, m, block_size)
        assert (codes[wire_nan(ref, fp8_dtype)] == NAN_CODE[fp8_dtype]).all()


# ---------------------------------------------------------------- NaN inputs
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fp8_dtype", FP8)
def test_nan_inputs_of_every_kind(fp8_dtype, dtype, block_size):
    """NaN inputs with payloads, signalling NaNs, either sign: quantize writes
    the one NaN code; the decoded round trip and the own addend passed
    through dequant_sum (no pieces, factor 1: the output is the input where it
    is not NaN) write the canonical NaN."""
    n = block_size * 12 + 9
    x = nan_input(n, dtype, seed=block_size + 1)
    nan = wire_nan(x, fp8_dtype)
    codes, scales = fp8comm.quantize(x, block_size=block_size, fp8_dtype=fp8_dtype)
    ref_codes, ref_scales = ref_quantize(x, block_size, fp8_dtype)
    assert torch.equal(scales.view(torch.uint8), ref_scales)
    assert_codes_canonical(codes.view(torch.uint8), nan, ref_codes, fp8_dtype)
    back = fp8comm.dequantize(codes, scales, block_size=block_size, dtype=dtype)
    assert_nan_canonical(back, ref_dequantize(ref_codes, ref_scales, block_size, fp8_dtype).to(dtype))

    out = torch.full((n,), 7.0, dtype=dtype)
    fp8comm.dequant_sum(wire(0, n, block_size), out, 0, n, block_size=block_size, fp8_dtype=fp8_dtype, own=x)
    assert_nan_canonical(out, x)
    out.fill_(7.0)
    fp8comm.dequant_sum(wire(0, n, block_size), out, 0, n, block_size=block_size, fp8_dtype=fp8_dtype, own=x,
                        own_premul=-2.0, post_div=2)
    assert_nan_canonical(out, (x.float() * -2.0 / 2).to(dtype))


# ---------------------------------------------------------------- MXFP4
# E2M1 has no NaN or Inf code: a NaN-scaled block (E8M0 0xFF) decodes to NaN
# throughout, large codes under a large scale overflow float32 to +-Inf, and a
# re-quantized block holding a non-finite value gets the NaN scale (its codes
# those of its finite values, 0 for the non-finite ones).
MX = dict(wire_format="mxfp4")


def mx_parts(buf, r, m, block_size):
    """(scale bytes, packed code bytes) of MXFP4 wire segment r, as views into buf."""
    S = fp8comm.segment_bytes(m, block_size, **MX)
    blocks = math.ceil(m / block_size)
    seg = buf[r * S:(r + 1) * S]
    return seg[:blocks], seg[S - blocks * block_size // 2:]


def mx_wire(P, m, block_size):
    return torch.empty(P * fp8comm.segment_bytes(m, block_size, **MX), dtype=torch.uint8)


def mx_reference_sum(buf, P, m, block_size, own, own_premul, post_div):
    """As reference_sum, each piece decoded by the MXFP4 reference."""
    acc = torch.zeros(m)
    if own is not None:
        acc[: own.numel()] = own.float() * own_premul
    for r in range(P):
        scales, codes = mx_parts(buf, r, m, block_size)
        piece = mx_ref.dequantize(codes, scales, m, block_size).float()  # float64 products are exact
        acc = piece.clone() if (r == 0 and own is None) else acc + piece
    return acc / post_div if post_div > 1 else acc


def mx_build_pieces(P, m, block_size, seed):
    """P MXFP4 wire segments of m elements: random codes over ordinary scales,
    the first half of the blocks plain, NaN scales on a few blocks of the
    second half, and pieces 0 and 1 with codes of opposite signs under the
    largest scale in one block (+-2 and more times 2^127: +-Inf, Inf - Inf
    in the sum)."""
    g = torch.Generator().manual_seed(seed)
    buf = mx_wire(P, m, block_size).zero_()
    blocks = math.ceil(m / block_size)
    for r in range(P):
        scales, codes = mx_parts(buf, r, m, block_size)
        scales.copy_(torch.randint(110, 140, (blocks,), generator=g, dtype=torch.uint8))
        codes[: (m + 1) // 2] = torch.randint(0, 256, ((m + 1) // 2,), generator=g, dtype=torch.uint8)
        if m % 2:
            codes[m // 2] &= 0xF  # padding past m: zero codes, as on the wire
        scales[blocks // 2 + 1 + r::3] = mx_ref.NAN_SCALE
    if P >= 2:
        inf_block = blocks - 4  # a whole block of the second half that the own addend covers
        lo = inf_block * block_size // 2
        big = torch.tensor([0x77, 0x65, 0x40, 0x07, 0x70, 0x11], dtype=torch.uint8)  # codes 4-7: +Inf
        for r, sign in ((0, 0x00), (1, 0x88)):
            scales, codes = mx_parts(buf, r, m, block_size)
            scales[inf_block] = 254
            codes[lo:lo + 6] = big ^ sign
            codes[lo + 6] = 0x77  # the same sign in both pieces: +Inf + +Inf stays +Inf
    return buf


@pytest.mark.parametrize("block_size", [16, 32, 48])
@pytest.mark.parametrize("dtype", DTYPES)
def test_mxfp4_nan_scales_decode_to_the_canonical_nan(dtype, block_size):
    """Every code byte (all pairs of E2M1 codes, both signs) under ordinary
    scales and under E8M0's NaN scale, through dequantize and
    dequantize_segments; whole blocks of ordinary scales around them, an odd
    count's tail in a NaN block."""
    g = torch.Generator().manual_seed(block_size + 100)
    n = 256 * 2 * 6 + 5
    packed = torch.cat([torch.arange(256, dtype=torch.uint8).repeat(3),
                        torch.randint(0, 256, (256 * 3 + 3,), generator=g, dtype=torch.uint8)])
    packed[-1] &= 0xF
    blocks = math.ceil(n / block_size)
    scales = torch.randint(110, 140, (blocks,), generator=g, dtype=torch.uint8)
    scales[1::3] = mx_ref.NAN_SCALE
    scales[-1] = mx_ref.NAN_SCALE
    ref = mx_ref.dequantize(packed, scales, n, block_size).to(dtype)
    out = fp8comm.dequantize(packed.view(torch.float4_e2m1fn_x2), scales.view(torch.float8_e8m0fnu),
                             block_size=block_size, dtype=dtype, numel=n, wire_format="mxfp4")
    assert_nan_canonical(out, ref)
    assert torch.isnan(out.view(-1)[block_size:2 * block_size]).all()

    P, m = 2, n // 2 + 3  # the same codes as two wire segments (m odd: a half-used byte in each)
    assert m % 2
    codes = mx_ref.unpack(packed, n)
    buf = mx_wire(P, m, block_size).zero_()
    for r in range(P):
        seg_scales, seg_codes = mx_parts(buf, r, m, block_size)
        part = mx_ref.pack(codes[r * m:(r + 1) * m])
        seg_codes[: part.numel()] = part
        seg_scales.copy_(torch.randint(110, 140, (seg_scales.numel(),), generator=g, dtype=torch.uint8))
        seg_scales[r::2] = mx_ref.NAN_SCALE
    out = torch.full((n,), 7.0, dtype=dtype)
    fp8comm.dequantize_segments(buf, out, P, m, block_size=block_size, **MX)
    ref = torch.cat([mx_ref.dequantize(*reversed(mx_parts(buf, r, m, block_size)), m, block_size)
                     for r in range(P)])[:n].to(dtype)
    assert_nan_canonical(out, ref)


@pytest.mark.parametrize("post_div", [1, 3])
@pytest.mark.parametrize("pieces,with_own", ADDENDS)
@pytest.mark.parametrize("block_size", [16, 32, 48])
@pytest.mark.parametrize("dtype", DTYPES)
def test_mxfp4_sums_write_the_canonical_nan(dtype, block_size, pieces, with_own, post_div):
    """dequant_sum of MXFP4 pieces: NaN from NaN-scaled blocks, from Inf - Inf
    between pieces (codes that overflow under the largest scale) and between
    the own addend and a piece, and from NaN own inputs of every kind; an own
    addend shorter than the output. Re-quantized (dequant_sum_requantize):
    the NaN scale exactly on the blocks holding a non-finite sum, the
    reference's codes everywhere (0 at non-finite elements)."""
    m = block_size * 16 + 7
    buf = mx_build_pieces(pieces, m, block_size, seed=block_size + pieces)
    own = None
    kw = dict(block_size=block_size, post_div=post_div, **MX)
    if with_own:
        own = nan_input(m - block_size - 5, dtype, seed=block_size)
        own[: 4 * block_size] = torch.randn(4 * block_size, generator=torch.Generator().manual_seed(1)).to(dtype)
        if pieces >= 2:
            inf_at = (math.ceil(m / block_size) - 4) * block_size  # mx_build_pieces' block of infinities
            own[inf_at + 12] = float("-inf")  # against the pieces' +Inf + +Inf
            own[inf_at + 13] = float("inf")  # with them: stays +Inf
        kw.update(own=own, own_premul=0.75)
    ref = mx_reference_sum(buf, pieces, m, block_size, own, 0.75, post_div)
    if pieces >= 2:
        inf_at = (math.ceil(m / block_size) - 4) * block_size
        assert torch.isnan(ref[inf_at:inf_at + 4]).all()  # +-Inf - +-Inf
        assert ref[inf_at + 13] == float("inf")  # +Inf + +Inf
        if with_own:
            assert torch.isnan(ref[inf_at + 12])  # -Inf + Inf + Inf
    assert torch.isfinite(ref[: 4 * block_size]).all()  # plain blocks too

    out = torch.full((m - 3,), 7.0, dtype=dtype)
    fp8comm.dequant_sum(buf, out, pieces, m, **kw)
    assert_nan_canonical(out, ref[: m - 3].to(dtype))

    requant = mx_wire(1, m, block_size).fill_(0xAB)
    fp8comm.dequant_sum_requantize(buf, requant, pieces, m, **kw)
    scales, codes = mx_parts(requant, 0, m, block_size)
    ref_codes, ref_scales = mx_ref.quantize(ref, block_size)
    blocks = math.ceil(m / block_size)
    nonfinite_block = (~torch.isfinite(torch.nn.functional.pad(ref, (0, blocks * block_size - m)))).view(blocks, -1)
    assert torch.equal(scales == mx_ref.NAN_SCALE, nonfinite_block.any(1)) and nonfinite_block.any()
    assert torch.equal(scales, ref_scales)
    assert torch.equal(codes[: ref_codes.numel()], ref_codes)
    assert (codes[ref_codes.numel():] == 0).all() and (requant[scales.numel():16] == 0).all()  # padding


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("dtype", DTYPES)
def test_mxfp4_nan_inputs_of_every_kind(dtype, block_size):
    """NaN inputs with payloads, signalling NaNs, either sign, infinities:
    quantize gives their blocks the NaN scale and the reference's codes; the
    decoded round trip and the own addend passed through dequant_sum write
    the canonical NaN. Every third block has no non-finite input."""
    n = block_size * 12 + 9
    x = nan_input(n, dtype, seed=block_size + 1)
    for j in range(0, math.ceil(n / block_size), 3):
        x[j * block_size:(j + 1) * block_size] = torch.randn(min(block_size, n - j * block_size),
                                                             generator=torch.Generator().manual_seed(j)).to(dtype)
    codes, scales = fp8comm.quantize(x, block_size=block_size, **MX)
    ref_codes, ref_scales = mx_ref.quantize(x, block_size)
    assert torch.equal(scales.view(torch.uint8), ref_scales)
    assert torch.equal(codes.view(torch.uint8), ref_codes)
    nan_blocks = scales.view(torch.uint8) == mx_ref.NAN_SCALE
    assert nan_blocks.any() and not nan_blocks.all()
    back = fp8comm.dequantize(codes, scales, block_size=block_size, dtype=dtype, numel=n, wire_format="mxfp4")
    assert_nan_canonical(back, mx_ref.dequantize(ref_codes, ref_scales, n, block_size).to(dtype))

    out = torch.full((n,), 7.0, dtype=dtype)
    fp8comm.dequant_sum(mx_wire(0, n, block_size), out, 0, n, block_size=block_size, own=x, **MX)
    assert_nan_canonical(out, x)
    out.fill_(7.0)
    fp8comm.dequant_sum(mx_wire(0, n, block_size), out, 0, n, block_size=block_size, own=x, own_premul=-2.0,
                        post_div=2, **MX)
    assert_nan_canonical(out, (x.float() * -2.0 / 2).to(dtype))
