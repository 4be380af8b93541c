"""The CPU codec's SIMD kernels against its scalar loops: the same bytes, bit
for bit, for every op, dtype, wire format (E4M3, E5M2, MXFP4, NVFP4) and
block size (NVFP4: its 16), on inputs built to hit every branch of the
kernels (plain blocks, Inf/NaN, blocks near FLT_MAX, subnormals, FP8 special
codes, the 4-bit formats' NaN-scale blocks and E2M1 ties, scales too large
for the fast decode, NVFP4 segment scales of every kind, stochastic
rounding, and denormals-are-zero mode). Every test runs with the AVX2 kernels alone and, on
a CPU with AVX-512, again with the AVX-512 ones (block size 32's quantize and
sum + re-quantize). What the CPU runs is detected (the codec refuses to switch
on kernels the CPU lacks), never assumed; FP8COMM_CPU_SIMD does not hide a
level from these tests."""
import pytest
import torch

import fp8comm
from tests.support.cpu_kernels import HAS_AVX2, HAS_AVX512
from fp8comm import _C

FORMATS = ["e4m3", "e5m2", "mxfp4", "nvfp4"]
# Every (format, block size) the codec takes: each size, or the one a format requires.
FORMAT_BLOCKS = [(f, b) for f in FORMATS for b in (16, 32, 48)
                 if fp8comm.codec.wire_format_info(f).block_size in (0, b)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


pytestmark = pytest.mark.skipif(not HAS_AVX2, reason="this CPU lacks AVX2 / F16C: the codec has no SIMD kernels here")


@pytest.fixture(autouse=True, params=["avx2", "avx512"])
def kernels(request):
    """Each test once per SIMD level this CPU runs (the AVX-512 kernels take
    over from the AVX2 ones where they apply); the settings are restored."""
    wide = request.param == "avx512"
    if wide and not HAS_AVX512:
        pytest.skip("this CPU lacks AVX-512 F / BW: the AVX2 kernels are its widest")
    old_avx512 = _C.set_cpu_avx512(wide)
    try:
        yield request.param
    finally:
        _C.set_cpu_avx512(old_avx512)


def both_paths(fn, flush_denormal=False):
    """fn() run with the scalar loops and with the SIMD kernels; with
    flush_denormal, in denormals-are-zero mode (FTZ and DAZ set in this
    thread) and on one codec thread (its workers keep their own mode, so
    which blocks see it would depend on the split); all restored after."""
    results = []
    threads = _C.cpu_threads()
    for simd in (False, True):
        old = _C.set_cpu_simd(simd)
        assert torch.set_flush_denormal(flush_denormal) or not flush_denormal
        _C.set_cpu_threads(1 if flush_denormal else threads)
        try:
            results.append(fn())
        finally:
            torch.set_flush_denormal(False)
            _C.set_cpu_threads(threads)
            _C.set_cpu_simd(old)
    return results


def same(a, b):
    """Bitwise equal, NaNs included: every path writes the one canonical NaN
    of the output dtype (tests/codec/test_codec_nan.py), and wire bytes the one NaN
    code."""
    if a.dtype not in INT_VIEW:
        return torch.equal(a, b)
    return a.dtype == b.dtype and torch.equal(a.view(INT_VIEW[a.dtype]), b.view(INT_VIEW[b.dtype]))


def inputs(n, dtype, seed):
    """Blocks of every kind, concatenated: Gaussian, random bit patterns
    (NaN, Inf, subnormals, huge), zeros, values near the dtype's max and
    block maxima from half of it up, tiny
    magnitudes, denormals of the dtype (zeros in denormals-are-zero mode),
    Gaussian blocks with a single Inf or NaN, Gaussian blocks
    with zeros of both signs and values that scale into FP8 subnormals, E2M1
    grid values and midpoints (ties, its subnormal 0.5) over many binades,
    NVFP4 blocks whose maximum is 7 scale steps, and whole blocks of Inf or
    NaN."""
    g = torch.Generator().manual_seed(seed)
    parts = [torch.randn(n, generator=g)]
    raw = torch.randint(-(2**31), 2**31 - 1, (n,), generator=g, dtype=torch.int64).to(torch.int32).view(torch.float32)
    parts.append(raw)
    parts.append(torch.zeros(n))
    top = torch.finfo(dtype).max
    parts.append(top * (1 - torch.rand(n, generator=g) * 0.01) * torch.sign(torch.randn(n, generator=g)))
    # block maxima around the scale where the code limit sets in (the grouped
    # quantize of 8 blocks of 32 takes the blocks below it, falls back above)
    edge = torch.randn(n, generator=g) * top * 0.25
    edge[::32] = top * (0.45 + 0.5 * torch.rand(len(edge[::32]), generator=g))
    parts.append(edge)
    parts.append(torch.randn(n, generator=g) * torch.finfo(dtype).tiny)
    parts.append(torch.randn(n, generator=g).to(dtype) * torch.finfo(dtype).tiny * 2.0**-6)  # denormals only
    spiked = torch.randn(n, generator=g)
    spiked[::37] = float("inf")
    spiked[5::41] = float("nan")
    parts.append(spiked)
    holes = torch.randn(n, generator=g)  # zeros of both signs among normal values, and a few tiny ones
    holes[::5] = 0.0
    holes[2::7] = -0.0
    holes[3::97] *= 1e-6
    parts.append(holes)
    parts.append(e2m1_grid(n, dtype, g))
    # NVFP4 blocks whose maximum is 7 times their scale S (E4M3 subnormal
    # scales 2^-9 and 2^-8 after the segment's 2688, g = 1): amax / S rounds
    # to the code past the largest, which the code limit clamps
    sevens = torch.randn(n, generator=g) * 2.0**-10
    sevens[::16] = 7 * 2.0**-9 * torch.randint(1, 3, (len(sevens[::16]),), generator=g).float()
    sevens[1::32] *= -1
    sevens[0] = 2688.0
    parts.append(sevens)
    bad = torch.randn(n, generator=g)  # runs holding whole blocks (of 16, 32 or 48) of Inf, -Inf or NaN
    bad[100:196] = float("inf")
    bad[300:396] = float("-inf")
    bad[500:596] = float("nan")
    parts.append(bad)
    return torch.cat(parts).to(dtype)


def e2m1_grid(n, dtype, g):
    """E2M1's values and the midpoints between them (ties round to the even
    code, 0.25 to zero, 0.75 to 1), with both signs, in runs of 16 sharing a
    binade; every run holds 6 (so a block's scale puts the grid on codes) or,
    for some, only values below 1 (E2M1 subnormals after scaling)."""
    grid = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0])
    x = grid[torch.randint(0, len(grid), (n,), generator=g)]
    x = x * torch.randn(n, generator=g).sign()
    x[::16] = 6.0
    x[::48] = 0.75  # blocks of 48 whose runs lack 6 elsewhere keep their maximum
    span = 8 if dtype == torch.float16 else 40
    binade = torch.exp2(torch.randint(-span, span, ((n + 15) // 16,), generator=g).float())
    return x * binade.repeat_interleave(16)[:n]


@pytest.fixture(params=[False, True], ids=["ieee", "daz"])
def flush_denormal(request):
    """Each test's codec calls once as they are and once in denormals-are-zero
    mode (both_paths' flush_denormal; the inputs are made outside it)."""
    return request.param


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("wire_format,block_size", FORMAT_BLOCKS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("premul", [1.0, 0.37, 3e30])
def test_quantize_same_bytes(wire_format, dtype, block_size, premul, rounding, flush_denormal):
    x = inputs(4096 + 13, dtype, seed=block_size)
    P = 3
    m = -(-x.numel() // P) + 37  # uneven segments: the last one partly empty
    assert_segments_same_bytes(x, P, m, block_size, wire_format, premul, rounding, 0xC0FFEE, flush_denormal)


def assert_segments_same_bytes(x, P, m, block_size, wire_format, premul, rounding, key, flush_denormal):
    """quantize_segments of x into P segments of m: the scalar loops' bytes and the SIMD kernels' are one."""
    out = torch.empty(P * fp8comm.codec.segment_bytes(m, block_size, wire_format=wire_format), dtype=torch.uint8)

    def run():
        out.fill_(0xAB)
        fp8comm.quantize_segments(x, out, P, m, block_size=block_size, wire_format=wire_format, premul=premul,
                                  rounding=rounding, rounding_key=key)
        return out.clone()

    scalar, simd = both_paths(run, flush_denormal)
    assert torch.equal(scalar, simd)


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("wire_format", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("premul", [1.0, 0.37, 3e30])
def test_quantize_one_kind_per_segment_same_bytes(wire_format, dtype, premul, rounding, flush_denormal):
    """Each kind of input block (inputs()) in a segment of its own, so a
    segment scale (NVFP4) is set by that kind alone: plain Gaussian segments,
    all-zero ones, ones whose amax is near FLT_MAX or is a subnormal."""
    n = 2048 + 48
    x = inputs(n, dtype, seed=29)
    P = x.numel() // n
    block_size = fp8comm.codec.default_block_size(wire_format)
    assert_segments_same_bytes(x, P, n, block_size, wire_format, premul, rounding, 0xBEEF, flush_denormal)


def random_segments(P, m, block_size, seed, wire_format, segment_scales=None):
    """Wire segments with arbitrary code bytes (every code, NaN and Inf codes
    included) and scale bytes over the whole range used, the scale's NaN
    included: E8M0 bytes (NaN 0xFF), or for NVFP4 E4M3 bytes (NaN 0x7F;
    negative ones too) after a segment scale, by default a power of two
    (segment 0 a moderate one, the others over the whole range a quantize
    writes, 2^-117 .. 2^117, so products reach FLT_MAX and subnormals), else
    segment r's is segment_scales[r] (any float)."""
    g = torch.Generator().manual_seed(seed)
    S = fp8comm.codec.segment_bytes(m, block_size, wire_format=wire_format)
    head = fp8comm.codec.wire_format_info(wire_format).segment_scale_bytes
    seg = torch.randint(0, 256, (P * S,), generator=g, dtype=torch.uint8)
    blocks = -(-m // block_size)
    scale_bytes = (head + blocks + 15) // 16 * 16
    for r in range(P):
        # mostly ordinary scales, some over the whole range (too large for the fast decode, subnormal results)
        if head:
            s = torch.randint(0x30, 0x48, (blocks,), generator=g, dtype=torch.uint8)  # E4M3 0.5 .. 4
            wide = torch.rand(blocks, generator=g) < 0.3
            s[wide] = torch.randint(0, 0x7F, (int(wide.sum()),), generator=g, dtype=torch.uint8)
            negative = torch.rand(blocks, generator=g) < 0.03
            s[negative] = torch.randint(0x80, 256, (int(negative.sum()),), generator=g, dtype=torch.uint8)
            s[torch.rand(blocks, generator=g) < 0.05] = 0x7F
            if segment_scales is not None:
                scale = float(segment_scales[r])
            else:
                scale = 2.0 ** int(torch.randint(-20, 21, (1,), generator=g) if r == 0
                                   else torch.randint(-117, 118, (1,), generator=g))
            seg[r * S:r * S + head] = torch.tensor([scale], dtype=torch.float32).view(torch.uint8)
        else:
            s = torch.randint(100, 140, (blocks,), generator=g, dtype=torch.uint8)
            wide = torch.rand(blocks, generator=g) < 0.3
            s[wide] = torch.randint(1, 255, (int(wide.sum()),), generator=g, dtype=torch.uint8)
            s[torch.rand(blocks, generator=g) < 0.05] = 0xFF
        seg[r * S + head:r * S + head + blocks] = s
        seg[r * S + head + blocks:r * S + scale_bytes] = 0
        if r == 0:  # and some blocks of plain codes only, so the fast paths run
            codes = seg[r * S + scale_bytes:(r + 1) * S].view(-1)
            codes[: codes.numel() // 2] &= 0x77
    return seg


@pytest.mark.parametrize("wire_format,block_size", FORMAT_BLOCKS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_decodes_same_bits(flush_denormal, wire_format, dtype, block_size):
    P, m = 3, 2048 + block_size * 5
    seg = random_segments(P, m, block_size, seed=block_size + 7, wire_format=wire_format)
    kw = dict(block_size=block_size, wire_format=wire_format)
    daz = flush_denormal
    deq = both_paths(lambda: _run(lambda o: fp8comm.dequantize_segments(seg, o, P, m, **kw), P * m - 7, dtype), daz)
    dsum = both_paths(lambda: _run(lambda o: fp8comm.dequant_sum(seg, o, P, m, **kw), m - 3, dtype), daz)
    avg = both_paths(lambda: _run(lambda o: fp8comm.dequant_sum(seg, o, P, m, post_div=P, **kw), m, dtype), daz)
    S = fp8comm.codec.segment_bytes(m, block_size, wire_format=wire_format)
    requant = both_paths(lambda: _requant(seg, P, m, S, kw), daz)
    stochastic = both_paths(lambda: _requant(seg, P, m, S, dict(kw, rounding="stochastic", rounding_key=5)), daz)
    for scalar, simd in (deq, dsum, avg, requant, stochastic):
        assert same(scalar, simd)


@pytest.mark.parametrize("dtype", DTYPES)
def test_decodes_any_segment_scale_same_bits(flush_denormal, dtype):
    """NVFP4 segments whose segment scale no quantize writes (NaN, Inf, zero,
    subnormal, negative, no power of two, FLT_MAX) decode, sum and re-quantize
    to the same bits on both paths."""
    wild = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 2.0**-140, -2.0, 3.0, 3.4028234663852886e38]
    P, block_size, m = len(wild), 16, 512 + 16 * 3
    kw = dict(block_size=block_size, wire_format="nvfp4")
    seg = random_segments(P, m, block_size, seed=41, wire_format="nvfp4", segment_scales=wild)
    S = fp8comm.codec.segment_bytes(m, block_size, wire_format="nvfp4")
    daz = flush_denormal
    deq = both_paths(lambda: _run(lambda o: fp8comm.dequantize_segments(seg, o, P, m, **kw), P * m - 7, dtype), daz)
    results = [deq]
    for r in range(P):  # each wild piece after an ordinary one, so not every sum is NaN
        ordinary = random_segments(1, m, block_size, seed=r, wire_format="nvfp4")
        pair = torch.cat([ordinary, seg[r * S:(r + 1) * S]])
        results.append(both_paths(lambda: _run(lambda o: fp8comm.dequant_sum(pair, o, 2, m, **kw), m, dtype), daz))
        results.append(both_paths(lambda: _requant(pair, 2, m, S, kw), daz))
    for scalar, simd in results:
        assert same(scalar, simd)


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("num_pieces", [0, 2])
@pytest.mark.parametrize("wire_format,block_size", FORMAT_BLOCKS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_sums_with_own_addend_same_bits(num_pieces, wire_format, dtype, block_size, rounding, flush_denormal):
    """The own addend (every kind of input block, a premul, shorter than the
    pieces so the last blocks take the scalar tail) on both paths."""
    m = 2048 + block_size * 5
    S = fp8comm.codec.segment_bytes(m, block_size, wire_format=wire_format)
    seg = random_segments(max(num_pieces, 1), m, block_size, seed=block_size + 11, wire_format=wire_format)
    seg = seg[: num_pieces * S]
    own = inputs(m // 8 + 1, dtype, seed=block_size)[: m - block_size - 5].to(dtype)
    kw = dict(block_size=block_size, wire_format=wire_format, own=own, own_premul=0.75)

    def requant():
        out = torch.full((S,), 0xAB, dtype=torch.uint8)
        fp8comm.dequant_sum_requantize(seg, out, num_pieces, m, post_div=3, rounding=rounding, rounding_key=9, **kw)
        return out

    dsum = both_paths(lambda: _run(lambda o: fp8comm.dequant_sum(seg, o, num_pieces, m, **kw), m - 3, dtype),
                      flush_denormal)
    for scalar, simd in (dsum, both_paths(requant, flush_denormal)):
        assert same(scalar, simd)


@pytest.mark.parametrize("own", [False, True])
@pytest.mark.parametrize("num_pieces", [1, 3])
@pytest.mark.parametrize("wire_format", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_plain_data_sums_same_bits(own, num_pieces, wire_format, dtype):
    """Ordinary gradients (no Inf/NaN, no value near zero, magnitudes within
    the dtype's range), so nearly every group of eight blocks takes the fast
    kernels end to end (a group whose sum cancels into FP8 subnormals takes
    the fallback): pieces quantized from such data, summed with and without
    the own addend, divided, re-quantized."""
    g = torch.Generator().manual_seed(num_pieces)
    m = 32 * 8 * 40 + 32 * 3  # 40 whole groups, then three blocks the group kernels leave to the per-block loop
    shape = (num_pieces + 1, m // 32, 32)  # blocks of magnitudes 2^-20..2^19 (float16: 2^-10..2^9)
    top = 10 if dtype == torch.float16 else 20
    magnitude = torch.exp2(torch.randint(-top, top, shape[:2] + (1,), generator=g).float())
    x = torch.randn(shape, generator=g).sign() * (0.5 + torch.rand(shape, generator=g)) * magnitude
    x = x.reshape(num_pieces + 1, m).to(dtype)
    S = fp8comm.codec.segment_bytes(m, wire_format=wire_format)  # its default block size (NVFP4: 16)
    seg = torch.empty(num_pieces * S, dtype=torch.uint8)
    fp8comm.quantize_segments(x[:num_pieces].reshape(-1), seg, num_pieces, m, wire_format=wire_format)
    kw = dict(wire_format=wire_format, post_div=num_pieces + 1)
    if own:
        kw.update(own=x[num_pieces], own_premul=0.5)

    def requant():
        out = torch.full((S,), 0xAB, dtype=torch.uint8)
        fp8comm.dequant_sum_requantize(seg, out, num_pieces, m, **kw)
        return out

    scalar, simd = both_paths(requant)
    assert torch.equal(scalar, simd)


def _run(op, n, dtype):
    out = torch.full((n,), 7.0, dtype=dtype)
    op(out)
    return out


def _requant(seg, P, m, S, kw):
    out = torch.full((S,), 0xAB, dtype=torch.uint8)
    fp8comm.dequant_sum_requantize(seg, out, P, m, **kw)
    return out


@pytest.mark.parametrize("wire_format", FORMATS)
def test_round_trip_through_both_paths(wire_format):
    """The full pipeline of a compressed all_reduce (quantize, sum and
    re-quantize, decode) gives the same bits on both paths."""
    P, m = 4, 1 << 14
    x = inputs(P * m // 11 + 1, torch.float32, seed=3)[: P * m]
    S = fp8comm.codec.segment_bytes(m, wire_format=wire_format)
    kw = dict(wire_format=wire_format)

    def run():
        send = torch.empty(P * S, dtype=torch.uint8)
        fp8comm.quantize_segments(x, send, P, m, **kw)
        mine = torch.empty(P * S, dtype=torch.uint8)
        for r in range(P):  # every rank's reduced segment, as if gathered: its own input plus the others' pieces
            pieces = torch.cat([send[q * S:(q + 1) * S] for q in range(P) if q != r])
            fp8comm.dequant_sum_requantize(pieces, mine[r * S:(r + 1) * S], P - 1, m, own=x[r * m:(r + 1) * m],
                                           **kw)
        out = torch.empty(x.numel())
        fp8comm.dequantize_segments(mine, out, P, m, **kw)
        return out

    scalar, simd = both_paths(run)
    assert same(scalar, simd)


@pytest.mark.parametrize("wire_format", FORMATS)
def test_large_float32_decode_same_bits(wire_format):
    """Decodes of 8 MiB and more of float32 per thread take streaming stores
    (codec_cpu_avx2.cpp, stream_bytes): the same bits, and nothing written
    around the output."""
    P, m = 2, (5 << 20) // 2 + 48
    seg = random_segments(P, m, fp8comm.codec.default_block_size(wire_format), seed=5, wire_format=wire_format)
    kw = dict(wire_format=wire_format)
    # the output 32 bytes into a fresh tensor (aligned, so it streams) and 8 short of its end
    scalar, simd = both_paths(lambda: _run(lambda o: fp8comm.dequantize_segments(seg, o[8:-8], P, m, **kw),
                                           P * m - 5 + 16, torch.float32))
    assert same(scalar, simd)
    assert (simd[:8] == 7.0).all() and (simd[-8:] == 7.0).all()


@pytest.mark.parametrize("n", [1, 31, 33, 32 * 8 * 3 + 15, 4096 + 7])
@pytest.mark.parametrize("wire_format", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_and_dequantize_odd_counts_same_bits(n, wire_format, dtype):
    """fp8comm.quantize / dequantize of a count that is no whole number of
    blocks (for MXFP4, of bytes either: the last byte holds one code)."""
    x = inputs(n // 11 + 1, dtype, seed=n)[:n]

    def run():
        quantized = fp8comm.quantize(x, wire_format=wire_format)  # NVFP4: and the segment scale
        back = fp8comm.dequantize(*quantized, wire_format=wire_format, dtype=dtype, numel=n)
        return (*(t.view(torch.uint8) for t in quantized), back)

    scalar, simd = both_paths(run)
    for a, b in zip(scalar, simd):
        assert same(a, b)


def test_switch_reports_and_restores():
    old = _C.cpu_simd_enabled()
    try:
        assert _C.set_cpu_simd(False) is old
        assert _C.cpu_simd_enabled() is False
        assert _C.set_cpu_simd(True) is False
        assert _C.cpu_simd_enabled() is True
    finally:
        _C.set_cpu_simd(old)


def test_avx512_switch_reports_and_restores(kernels):
    """Each switch returns the old setting. Where the CPU lacks AVX-512,
    switching it on is refused with an error that names the call, what it
    needs and what to do, and nothing changes."""
    wide = kernels == "avx512"
    assert _C.cpu_avx512_enabled() is wide
    if HAS_AVX512:
        assert _C.set_cpu_avx512(not wide) is wide
        assert _C.set_cpu_avx512(wide) is (not wide)
        return
    with pytest.raises(RuntimeError, match=r"set_cpu_avx512\(True\) needs a CPU with AVX-512 F and BW.*"
                                           r"the AVX2 kernels stay in use.*Switch it on only where the CPU has them"):
        _C.set_cpu_avx512(True)
    assert _C.cpu_avx512_enabled() is False
    assert _C.set_cpu_avx512(False) is False
    assert _C.cpu_avx512_enabled() is False

