"""CUDA codec kernels equal the CPU codec bit for bit (marked cuda; skipped
without a GPU or without fp8comm's CUDA kernels)."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fp8comm
from tests.support import tiers

pytestmark = pytest.mark.cuda

if not (torch.cuda.is_available() and fp8comm._C.has_cuda):
    pytest.skip("needs a GPU and fp8comm built with CUDA", allow_module_level=True)

# the wire formats (the 4-bit ones: NaN-scaled non-finite blocks; NVFP4: blocks of
# 16 with E4M3 scales times a float32 segment scale)
FORMATS = ["e4m3", "e5m2", "mxfp4", "nvfp4"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
BLOCKS = [16, 32, 48, 128, 4096]
SIZES = [0, 1, 15, 33, 1000, (1 << 20) + 7]


@pytest.fixture(autouse=True, params=["legacy", "tiled"])
def cuda_codec(request, monkeypatch):
    """Every test on both CUDA kernel sets (FP8COMM_CUDA_CODEC, read at every
    call): codec_cuda.cu's and codec_cuda_tiled.cu's, the same bytes."""
    monkeypatch.setenv("FP8COMM_CUDA_CODEC", request.param)
    assert fp8comm._C.cuda_codec() == request.param
    return request.param


def format_blocks(blocks):
    """(format, block size) pairs: every format with each of `blocks`, a format
    that requires one block size (NVFP4: 16) with that one."""
    pairs = []
    for fmt in FORMATS:
        required = fp8comm.codec.wire_format_info(fmt).block_size
        pairs += [(fmt, required)] if required else [(fmt, b) for b in blocks]
    return pairs


def bits(t):
    """Raw bits, so NaN payloads and -0 count."""
    t = t.contiguous().cpu()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def nasty(n, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=gen) * torch.logspace(-30, 30, max(n, 1))[:n]
    if n > 10:
        x[3], x[7], x[9] = float("nan"), float("inf"), -0.0
        x[n // 2] = 3.3e38
        x[n - 1] = 1e-42
    return x.to(dtype)


def codes_per_element(fmt):
    """Codes per element of fp8comm.quantize's codes tensor: 1, or 2 for MXFP4."""
    return 8 // fp8comm.codec.wire_format_code_bits(fmt)


def assert_same(cpu, gpu):
    """Tensors of the same bits, pairwise."""
    assert len(cpu) == len(gpu)
    for a, b in zip(cpu, gpu):
        assert torch.equal(bits(a), bits(b))


@pytest.mark.parametrize("fmt,block_size", format_blocks(BLOCKS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_quantize_and_dequantize(n, block_size, dtype, fmt):
    """(codes, scales) and NVFP4's segment scale, and their decoding."""
    x = nasty(n, dtype)
    q_cpu = fp8comm.quantize(x, block_size=block_size, wire_format=fmt)
    q_gpu = fp8comm.quantize(x.cuda(), block_size=block_size, wire_format=fmt)
    assert_same(q_cpu, q_gpu)
    d_cpu = fp8comm.dequantize(*q_cpu, wire_format=fmt, block_size=block_size, dtype=dtype, numel=n)
    d_gpu = fp8comm.dequantize(*q_gpu, wire_format=fmt, block_size=block_size, dtype=dtype, numel=n)
    assert torch.equal(bits(d_cpu), bits(d_gpu))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_misaligned_views(dtype, fmt):
    """Sources at odd element offsets; codes decoded from their second element
    (MXFP4: the second byte, codes 2..), so code loads are misaligned too."""
    base = nasty(100_003, dtype)
    per = codes_per_element(fmt)
    B = fp8comm.codec.default_block_size(fmt)
    for offset in (1, 3, 8):
        x = base[offset:]
        c_cpu, s_cpu, *g_cpu = fp8comm.quantize(x, wire_format=fmt)
        c_gpu, s_gpu, *g_gpu = fp8comm.quantize(base.cuda()[offset:], wire_format=fmt)
        assert_same([c_cpu, s_cpu, *g_cpu], [c_gpu, s_gpu, *g_gpu])
        n = x.numel() - per
        out_cpu = fp8comm.dequantize(c_cpu[1:], s_cpu[: math.ceil(n / B)], *g_cpu, wire_format=fmt, dtype=dtype,
                                     numel=n)
        out_gpu = fp8comm.dequantize(c_gpu[1:], s_gpu[: math.ceil(n / B)], *g_gpu, wire_format=fmt, dtype=dtype,
                                     numel=n)
        assert torch.equal(bits(out_cpu), bits(out_gpu))


def grid_probes(fmt):
    """Blocks of 32 that put, after the block scale, every value of the FP8
    grid, every midpoint between neighbours (a tie) and one float32 ulp either
    side of each under the rounding: what the tiled kernels' hardware
    conversion must round as the software encode does (DESIGN.md, "The CUDA
    kernel sets"). Each block holds 448 or 57344 (its amax, scale 1) and is
    repeated at the scales 2^-100 and 2^100."""
    dtype = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fmt]
    v = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).float()
    v = v[torch.isfinite(v) & (v >= 0)].unique()
    mid = (v[1:] + v[:-1]) / 2
    probes = torch.cat([v, mid, torch.nextafter(mid, torch.full_like(mid, math.inf)),
                        torch.nextafter(mid, torch.zeros_like(mid))])
    probes = torch.cat([probes, -probes])
    pad = (-probes.numel()) % 31
    probes = torch.cat([probes, torch.zeros(pad)]).view(-1, 31)
    blocks = torch.cat([torch.full((probes.shape[0], 1), v.max().item()), probes], dim=1).flatten()
    return torch.cat([blocks, blocks * 2.0 ** -100, blocks * 2.0 ** 100])


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_every_rounding_case_of_the_fp8_grid(fmt):
    """The hardware conversion (tiled kernels) and the software encode agree
    on every grid value, tie and near-tie, as the CPU codec encodes them."""
    x = grid_probes(fmt)
    q_cpu = fp8comm.quantize(x, block_size=32, wire_format=fmt)
    q_gpu = fp8comm.quantize(x.cuda(), block_size=32, wire_format=fmt)
    assert_same(q_cpu, q_gpu)
    d_cpu = fp8comm.dequantize(*q_cpu, wire_format=fmt, block_size=32, dtype=torch.float32, numel=x.numel())
    d_gpu = fp8comm.dequantize(*q_gpu, wire_format=fmt, block_size=32, dtype=torch.float32, numel=x.numel())
    assert torch.equal(bits(d_cpu), bits(d_gpu))


def wire(num_segments, m, block_size, device, fmt="e4m3"):
    return torch.empty(num_segments * fp8comm.segment_bytes(m, block_size, wire_format=fmt), dtype=torch.uint8,
                       device=device)


@pytest.mark.parametrize("fmt,block_size", format_blocks(BLOCKS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,P", [(1000, 4), (100_003, 3), (5, 4), (1 << 20, 2)])
def test_fused_segment_ops(n, P, block_size, dtype, fmt):
    x = nasty(n, dtype, seed=1)
    m = math.ceil(n / P)
    kw = dict(block_size=block_size, wire_format=fmt)
    out = {}
    for device in ("cpu", "cuda"):
        buf = wire(P, m, block_size, device, fmt)
        buf.fill_(0xAB)
        fp8comm.quantize_segments(x.to(device)[1:] if n > 1 else x.to(device), buf, P, m, premul=0.75, **kw)
        deq = torch.empty(max(n - 1, 0), dtype=dtype, device=device)
        fp8comm.dequantize_segments(buf, deq, P, m, **kw)
        summed = torch.empty(m, dtype=dtype, device=device)
        fp8comm.dequant_sum(buf, summed, P, m, post_div=P, **kw)
        req = wire(1, m, block_size, device, fmt)
        req.fill_(0xCD)
        fp8comm.dequant_sum_requantize(buf, req, P, m, post_div=3, **kw)
        out[device] = (buf, deq, summed, req)
    for a, b in zip(out["cpu"], out["cuda"]):
        assert torch.equal(bits(a), bits(b))


@pytest.mark.parametrize("fmt,block_size", format_blocks(BLOCKS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_pieces", [0, 1, 3])
def test_sums_with_own_addend(num_pieces, block_size, dtype, fmt):
    """The own (unquantized) addend of reduce_scatter / all_reduce: CUDA equals
    the CPU bit for bit, with a premul, and an own shorter than the pieces
    (zeros past its end). The device-tensor premul runs in test_backend_cuda's
    PREMUL_SUM cases."""
    m = 10_000 + 7
    own = nasty(m - 50, dtype, seed=5)
    pieces = nasty(max(num_pieces, 1) * m, torch.float32, seed=6)
    kw = dict(block_size=block_size, wire_format=fmt)
    out = {}
    for device in ("cpu", "cuda"):
        buf = wire(num_pieces, m, block_size, device, fmt)
        if num_pieces:
            fp8comm.quantize_segments(pieces.to(device)[: num_pieces * m], buf, num_pieces, m, **kw)
        summed = torch.empty(m - 3, dtype=dtype, device=device)
        fp8comm.dequant_sum(buf, summed, num_pieces, m, post_div=2, own=own.to(device), own_premul=0.75, **kw)
        req = wire(1, m, block_size, device, fmt)
        req.fill_(0xCD)
        fp8comm.dequant_sum_requantize(buf, req, num_pieces, m, post_div=3, own=own.to(device), own_premul=-2.0, **kw)
        out[device] = (summed, req)
    for a, b in zip(out["cpu"], out["cuda"]):
        assert torch.equal(bits(a), bits(b))


@pytest.mark.parametrize("fmt", FORMATS)
def test_tensor_premul_on_the_device(fmt):
    x = nasty(50_000, torch.float32)
    B = fp8comm.codec.default_block_size(fmt)
    a = wire(2, 25_000, B, "cpu", fmt)
    b = wire(2, 25_000, B, "cuda", fmt)
    fp8comm.quantize_segments(x, a, 2, 25_000, wire_format=fmt, premul=torch.tensor(0.3))
    fp8comm.quantize_segments(x.cuda(), b, 2, 25_000, wire_format=fmt, premul=torch.tensor(0.3, device="cuda"))
    assert torch.equal(bits(a), bits(b))


def test_ops_run_on_the_current_stream():
    x = torch.randn(1 << 22, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = x * 2  # enqueued on s; the codec must read it after this
        codes, scales = fp8comm.quantize(y)
        back = fp8comm.dequantize(codes, scales)
    s.synchronize()
    c_cpu, s_cpu = fp8comm.quantize(x.cpu() * 2)
    assert torch.equal(bits(codes), bits(c_cpu)) and torch.equal(bits(back), bits(fp8comm.dequantize(c_cpu, s_cpu)))


@settings(max_examples=tiers.examples(40), deadline=None)
@given(
    n=st.integers(0, 20_000),
    log_scale=st.floats(-35, 35),
    dtype=st.sampled_from(DTYPES),
    fmt=st.sampled_from(FORMATS),
    block_size=st.sampled_from([16, 32, 64, 80, 512, 1024]),
    P=st.integers(1, 5),
    seed=st.integers(0, 2**31 - 1),
)
def test_hypothesis_cuda_equals_cpu(n, log_scale, dtype, fmt, block_size, P, seed):
    block_size = fp8comm.codec.wire_format_info(fmt).block_size or block_size  # NVFP4: 16
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, generator=gen) * 10.0**log_scale).to(dtype)
    m = max(1, math.ceil(n / P))
    kw = dict(block_size=block_size, wire_format=fmt)
    res = {}
    for device in ("cpu", "cuda"):
        buf = wire(P, m, block_size, device, fmt)
        fp8comm.quantize_segments(x.to(device), buf, P, m, **kw)
        summed = torch.empty(m, dtype=dtype, device=device)
        fp8comm.dequant_sum(buf, summed, P, m, **kw)
        res[device] = (buf, summed, *fp8comm.quantize(x.to(device), **kw))
    for a, b in zip(res["cpu"], res["cuda"]):
        assert torch.equal(bits(a), bits(b))


CANONICAL_NAN = {torch.float32: 0x7FC00000, torch.bfloat16: 0x7FC0, torch.float16: 0x7E00}
# NaN inputs: quiet with a payload, either sign, signalling, all ones
NAN_INPUTS = {torch.float32: [0x7FC00001, 0xFFC12345, 0x7F800001, 0xFF800001, 0xFFFFFFFF],
              torch.bfloat16: [0x7FC1, 0xFFC1, 0x7F81, 0xFF81, 0xFFFF],
              torch.float16: [0x7E01, 0xFE01, 0x7C01, 0xFC01, 0xFFFF]}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_outputs_are_the_canonical_nan(dtype, fmt):
    """CUDA arithmetic makes 0x7FFFFFFF of every NaN, x86 keeps signs and
    payloads; both write the one canonical NaN of the output dtype
    (fp8_block_math.h): every code decoded (NaN codes of both signs), the
    opposite codes summed (E5M2: Inf - Inf), NaN own inputs of every kind.
    MXFP4 (no NaN or Inf code): every code byte, in a block of E8M0's NaN
    scale in one piece, and in a block whose largest codes overflow float32
    under the largest scale in both pieces with opposite signs (Inf - Inf);
    NVFP4 the same with E4M3's NaN scale, and 448 times a segment scale of
    2^117 for the overflow."""
    block_size, m = (16 if fmt == "nvfp4" else 32), 512
    g = torch.Generator().manual_seed(0)
    S = fp8comm.segment_bytes(m, block_size, wire_format=fmt)
    buf = wire(2, m, block_size, "cpu", fmt)
    for r in range(2):
        if fmt == "nvfp4":  # [segment scale][32 block scales][12 padding][m / 2 code bytes]
            seg = buf[r * S:(r + 1) * S]
            seg[:4] = torch.tensor([2.0**117]).view(torch.uint8)
            seg[4:36] = torch.randint(0x30, 0x40, (32,), generator=g, dtype=torch.uint8)  # 0.5 to 1.875
            seg[36:48] = 0
            seg[48:] = torch.arange(256, dtype=torch.int32).to(torch.uint8) ^ (0x88 * r)
            seg[4 + 1] = 0x7E  # block 1: code 6 (nibble 7) times 448 * 2^117 is +-Inf
            if r == 0:
                seg[4 + 2] = 0x7F  # block 2 of piece 0: NaN throughout
            continue
        buf[r * S:r * S + 16] = torch.randint(120, 135, (16,), generator=g, dtype=torch.uint8)
        if fmt == "mxfp4":  # m / 2 code bytes: each byte once, both signs flipped in piece 1
            buf[r * S + 16:(r + 1) * S] = torch.arange(256, dtype=torch.int32).to(torch.uint8) ^ (0x88 * r)
            buf[r * S + 1] = 254  # block 1: codes 0x10-0x1F, 2 * 2^127 and above are +-Inf
            if r == 0:
                buf[r * S + 2] = 0xFF  # block 2 of piece 0: NaN throughout
            continue
        codes = torch.randint(0, 256, (m,), generator=g, dtype=torch.uint8)
        codes[:256] = torch.arange(256, dtype=torch.int32).to(torch.uint8) ^ (0x80 * r)
        buf[r * S + 16:(r + 1) * S] = codes
    own = torch.randn(m, generator=g).to(dtype)
    wide = torch.tensor(NAN_INPUTS[dtype], dtype=torch.int64)
    if dtype != torch.float32:
        wide = wide - ((wide >= 0x8000).long() << 16)  # as int16
    patterns = wide.to(torch.int32 if dtype == torch.float32 else torch.int16)  # int32 wraps
    at = torch.arange(3, m, 7)
    own.view(patterns.dtype)[at] = patterns[torch.arange(at.numel()) % patterns.numel()]
    kw = dict(block_size=block_size, wire_format=fmt)
    out = {}
    for device in ("cpu", "cuda"):
        deq = torch.empty(2 * m, dtype=dtype, device=device)
        fp8comm.dequantize_segments(buf.to(device), deq, 2, m, **kw)
        summed = torch.empty(m, dtype=dtype, device=device)
        fp8comm.dequant_sum(buf.to(device), summed, 2, m, post_div=2, own=own.to(device), **kw)
        req = wire(1, m, block_size, device, fmt)
        fp8comm.dequant_sum_requantize(buf.to(device), req, 2, m, own=own.to(device), **kw)
        out[device] = (deq, summed, req)
    for a, b in zip(out["cpu"], out["cuda"]):
        assert torch.equal(bits(a), bits(b))
    for values in out["cuda"][:2]:
        nan = torch.isnan(values.cpu())
        assert nan.any() and (bits(values)[nan] == CANONICAL_NAN[dtype]).all()
    if fmt == "mxfp4":
        deq, summed, _ = (t.cpu() for t in out["cuda"])
        assert torch.isnan(deq[64:96]).all() and torch.isnan(summed[64:96]).all()  # the NaN-scaled block
        block1 = torch.arange(32, 64)
        inf_minus_inf = block1[(block1 % 2 == 0) & (block1 % 32 // 2 % 8 >= 4)]  # low nibbles 4-7 (2, 3, 4, 6)
        assert torch.isnan(summed[inf_minus_inf]).all()
    if fmt == "nvfp4":
        deq, summed, _ = (t.cpu() for t in out["cuda"])
        assert torch.isnan(deq[32:48]).all() and torch.isnan(summed[32:48]).all()  # the NaN-scaled block
        assert torch.isnan(summed[30])  # byte 15 of block 1, low nibbles -6 and +6 (piece 1): -Inf + Inf


@pytest.mark.parametrize("fmt,block_size", format_blocks([32, 48, 512]))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,P", [(1000, 4), (100_003, 3), (1 << 20, 2)])
def test_stochastic_rounding_cuda_equals_cpu(n, P, block_size, dtype, fmt):
    """Stochastic rounding's keyed bits and encode: the CUDA kernels write the
    CPU codec's bytes (quantize, segments, requantized sums), for two keys."""
    x = nasty(n, dtype, seed=2)
    m = math.ceil(n / P)
    for key in (1, 0xDEADBEEF12345678):
        kw = dict(block_size=block_size, wire_format=fmt, rounding="stochastic", rounding_key=key)
        out = {}
        for device in ("cpu", "cuda"):
            flat = fp8comm.quantize(x.to(device), **kw)
            buf = wire(P, m, block_size, device, fmt)
            fp8comm.quantize_segments(x.to(device), buf, P, m, premul=0.75, **kw)
            req = wire(1, m, block_size, device, fmt)
            fp8comm.dequant_sum_requantize(buf, req, P, m, post_div=3, **kw)
            out[device] = (*flat, buf, req)
        assert_same(out["cpu"], out["cuda"])
