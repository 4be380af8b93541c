"""Stochastic rounding (DESIGN.md, "Stochastic rounding"): unbiased per
element (normals and subnormals of every wire format: E4M3, E5M2, MXFP4's
E2M1; every input dtype), each result one of the two codes around the input,
the same bytes from the scalar loops, the AVX2 and the AVX-512 kernels (those
this CPU runs, detected; MXFP4 runs the scalar loops on every level until
those kernels take it) and any thread count, keyed reproducibly;
round-to-nearest unchanged. The CUDA
kernels' bytes: tests/codec/test_kernels_on_host.py. Compressed collectives
with Options(rounding="stochastic"): bitwise equal on every rank, reproducible
by seed, unbiased where round-to-nearest is not."""
from __future__ import annotations

import contextlib
import math

import pytest
import torch
import torch.distributed as dist

import fp8comm
from fp8comm import _C
from tests.support import mxfp4_reference, reference
from tests.support.cpu_kernels import HAS_AVX2, HAS_AVX512
from tests.support.harness import PoolSpec, ctx

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FP8 = [E4M3, E5M2]
# The wire formats: the FP8 dtypes, and MXFP4 by name (its codes are 4 bits).
FORMATS = [E4M3, E5M2, "mxfp4"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
KEYS = 4096  # independent draws per element: one wire segment each
SIGMAS = 5.0


def name(dtype):
    return str(dtype).split(".")[-1]


WIRE_NAME = {E4M3: "e4m3", E5M2: "e5m2", "mxfp4": "mxfp4"}


def fmt_kw(fmt):
    """The codec keyword naming a format."""
    return dict(wire_format=WIRE_NAME[fmt])


def seg_bytes(m, block_size, fmt):
    return fp8comm.segment_bytes(m, block_size, **fmt_kw(fmt))


def code_bytes_u8(codes, fmt, n):
    """fp8comm.quantize's codes of n elements as one uint8 code each (MXFP4's unpacked)."""
    u8 = codes.view(torch.uint8)
    return mxfp4_reference.unpack(u8, n).to(torch.uint8) if fmt == "mxfp4" else u8


# ---------------------------------------------------------------- inputs
def code_values(fmt):
    """Every finite non-negative value of the format, ascending."""
    if fmt == "mxfp4":
        return torch.tensor(mxfp4_reference.E2M1_VALUES, dtype=torch.float64)
    v = torch.arange(256, dtype=torch.uint8).view(fmt).double()
    return torch.unique(v[torch.isfinite(v) & (v >= 0)])


SMALLEST_NORMAL = {E4M3: 2.0 ** -6, E5M2: 2.0 ** -14, "mxfp4": 1.0}


def probe_block(fp8_dtype, dtype, seed):
    """One block of 32 at scale 2^0: element 0 is the format's max (it sets
    the scale and is a code), then codes themselves, values 0.6 of a step
    above a code (where round-to-nearest is biased by 0.4 of a step), and
    random values over the format's subnormals and normals, both signs; all
    representable in `dtype` (the values below are what the codec reads)."""
    gen = torch.Generator().manual_seed(seed)
    codes = code_values(fp8_dtype)
    fp8_max = codes[-1].item()
    smallest_normal = SMALLEST_NORMAL[fp8_dtype]
    pick = torch.randint(1, codes.numel() - 1, (6,), generator=gen)
    above = codes[pick] + 0.6 * (codes[pick + 1] - codes[pick])
    subnormal = torch.rand(8, generator=gen, dtype=torch.float64) * smallest_normal
    normal = torch.exp(torch.empty(14, dtype=torch.float64).uniform_(math.log(smallest_normal), math.log(fp8_max),
                                                                     generator=gen))
    x = torch.cat([torch.tensor([fp8_max], dtype=torch.float64), codes[pick[:3]], above, subnormal, normal])
    x = x * torch.where(torch.rand(32, generator=gen) < 0.5, -1.0, 1.0).double()
    x[0] = fp8_max
    return x.to(dtype)


def draws(x, fp8_dtype, rounding, key):
    """KEYS quantizations of the block x (one wire segment each, so each with
    its own bits), decoded: [KEYS, 32] float64."""
    seg = seg_bytes(32, 32, fp8_dtype)
    out = torch.empty(KEYS * seg, dtype=torch.uint8)
    fp8comm.quantize_segments(x.repeat(KEYS), out, KEYS, 32, **fmt_kw(fp8_dtype), rounding=rounding, rounding_key=key)
    decoded = torch.empty(KEYS * 32, dtype=torch.float32)
    fp8comm.dequantize_segments(out, decoded, KEYS, 32, **fmt_kw(fp8_dtype))
    return decoded.double().view(KEYS, 32)


def unbiased_violations(x, got, fp8_dtype):
    """Indices whose mean over the draws is further from x than SIGMAS standard
    errors of stochastic rounding (variance (x - lo)(hi - x) per draw), plus
    2^-26 of a step (the subnormal fixed point is exact to 2^-28 of one)."""
    codes = code_values(fp8_dtype)
    a = x.double().abs()
    hi = codes[torch.searchsorted(codes, a)]
    lo = codes[torch.searchsorted(codes, a, right=True) - 1]
    sd = torch.sqrt((a - lo) * (hi - a) / KEYS)
    bound = SIGMAS * sd + (hi - lo) * 2.0 ** -26
    return ((got.mean(0) - x.double()).abs() > bound).nonzero().flatten().tolist()


# ---------------------------------------------------------------- unbiased
@pytest.mark.parametrize("dtype", DTYPES, ids=name)
@pytest.mark.parametrize("fp8_dtype", FORMATS, ids=name)
def test_mean_of_many_keys_is_the_input(fp8_dtype, dtype):
    x = probe_block(fp8_dtype, dtype, seed=hash((name(fp8_dtype), name(dtype))) & 0xFFFF)
    got = draws(x, fp8_dtype, "stochastic", key=0x5EED)
    assert unbiased_violations(x, got, fp8_dtype) == []
    # the same test fails round-to-nearest (the values 0.6 of a step above a code)
    assert len(unbiased_violations(x, draws(x, fp8_dtype, "nearest", key=0x5EED), fp8_dtype)) >= 6


@pytest.mark.parametrize("fp8_dtype", FORMATS, ids=name)
def test_each_result_is_one_of_the_two_codes_around_the_input(fp8_dtype):
    codes = code_values(fp8_dtype)
    for seed in range(4):
        x = probe_block(fp8_dtype, torch.float32, seed)
        got = draws(x, fp8_dtype, "stochastic", key=seed)
        a = x.double().abs()
        hi = codes[torch.searchsorted(codes, a)]
        lo = codes[torch.searchsorted(codes, a, right=True) - 1]
        mag = got.abs()
        assert ((mag == lo) | (mag == hi)).all()
        assert (torch.sign(got) * torch.sign(x.double()) >= 0).all()
        assert (got[:, 0] == x[0].double()).all(), "the block maximum must stay its code (no saturation)"
        # both neighbours occur where the input lies well between them
        frac = (a - lo) / torch.where(hi > lo, hi - lo, 1.0)
        between = (frac > 0.01) & (frac < 0.99)
        assert between.sum() >= 20
        assert ((mag == lo).any(0) & (mag == hi).any(0))[between].all()


def test_non_finite_inputs_give_round_to_nearest_codes():
    """And the same scales: MXFP4's NaN scale (0xFF) for a block with a
    non-finite input, its finite elements still rounded stochastically."""
    x = torch.tensor([1.0, math.inf, -math.inf, math.nan, -0.0, 0.0, 3.3, -1e-30] * 4 + [1.0, 3.3, -0.7, 0.1] * 8)
    special = ~torch.isfinite(x) | (x == 0)
    for fmt in FORMATS:
        near, near_s = fp8comm.quantize(x, **fmt_kw(fmt))
        if fmt == "mxfp4":
            assert near_s.view(torch.uint8).tolist() == [mxfp4_reference.NAN_SCALE, 127]  # 3 < 3.3 <= 6 * 2^0
        for key in range(8):
            sr, sr_s = fp8comm.quantize(x, **fmt_kw(fmt), rounding="stochastic", rounding_key=key)
            assert torch.equal(sr_s.view(torch.uint8), near_s.view(torch.uint8))
            sr_codes, near_codes = code_bytes_u8(sr, fmt, x.numel()), code_bytes_u8(near, fmt, x.numel())
            assert torch.equal(sr_codes[special], near_codes[special])


# ---------------------------------------------------------------- keys
def test_same_key_same_bytes_other_key_other_bytes():
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(3))
    a = fp8comm.quantize(x, rounding="stochastic", rounding_key=1)
    b = fp8comm.quantize(x, rounding="stochastic", rounding_key=1)
    c = fp8comm.quantize(x, rounding="stochastic", rounding_key=2)
    top = fp8comm.quantize(x, rounding="stochastic", rounding_key=(1 << 64) - 1)
    assert torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8))
    for other in (c, top):
        assert not torch.equal(a[0].view(torch.uint8), other[0].view(torch.uint8))
        assert torch.equal(a[1].view(torch.uint8), other[1].view(torch.uint8))  # the scales do not change


def test_segments_of_one_call_draw_different_bits():
    x = torch.randn(64, generator=torch.Generator().manual_seed(4))
    seg = fp8comm.segment_bytes(64, 32)
    out = torch.empty(2 * seg, dtype=torch.uint8)
    fp8comm.quantize_segments(x.repeat(2), out, 2, 64, rounding="stochastic", rounding_key=9)
    assert not torch.equal(out[:seg], out[seg:])


def test_nearest_is_todays_output_whatever_the_key():
    x = torch.randn(4099, generator=torch.Generator().manual_seed(5)) * 10.0 ** torch.randint(-8, 8, (4099,))
    for fp8_dtype in FP8:
        default = fp8comm.quantize(x, fp8_dtype=fp8_dtype)
        keyed = fp8comm.quantize(x, fp8_dtype=fp8_dtype, rounding="nearest", rounding_key=12345)
        ref_codes, ref_scales = reference.quantize(x, 32, fp8_dtype)
        assert torch.equal(default[0].view(torch.uint8), keyed[0].view(torch.uint8))
        assert torch.equal(default[0].view(torch.uint8), ref_codes.view(torch.uint8).flatten()[: x.numel()])


@pytest.mark.parametrize("bad", ["up", "Stochastic", ""])
def test_unknown_rounding_is_refused_naming_the_op(bad):
    with pytest.raises(ValueError, match=f"fp8comm.quantize: rounding must be 'nearest' or 'stochastic', got '{bad}'"):
        fp8comm.quantize(torch.ones(32), rounding=bad)
    with pytest.raises(ValueError, match="rounding_key must fit 64 bits"):
        fp8comm.quantize(torch.ones(32), rounding="stochastic", rounding_key=1 << 64)
    with pytest.raises(ValueError, match="dequant_sum writes no FP8 codes"):
        fp8comm.dequant_sum(torch.zeros(fp8comm.segment_bytes(32), dtype=torch.uint8), torch.empty(32), 1, 32,
                            rounding="stochastic")


# ---------------------------------------------------------------- every path
@contextlib.contextmanager
def kernels(level: str, threads: int | None = None):
    """The CPU codec with the scalar loops, the AVX2 or the AVX-512 kernels,
    and optionally `threads` threads; settings restored."""
    old = (_C.cpu_simd_enabled(), _C.cpu_avx512_enabled(), _C.cpu_threads())
    _C.set_cpu_simd(False)
    _C.set_cpu_avx512(False)
    try:
        if level != "scalar":
            _C.set_cpu_simd(True)
        if level == "avx512":
            _C.set_cpu_avx512(True)
        if threads:
            _C.set_cpu_threads(threads)
        yield
    finally:
        _C.set_cpu_simd(old[0])
        _C.set_cpu_avx512(old[1])
        _C.set_cpu_threads(old[2])


LEVELS = ["scalar"] + (["avx2"] if HAS_AVX2 else []) + (["avx512"] if HAS_AVX512 else [])


def nasty(n, dtype, seed):
    """Magnitudes over many decades in runs of 16 (so blocks hold FP8
    subnormals after scaling), with Inf, NaN, -0 and near-maximal values."""
    gen = torch.Generator().manual_seed(seed)
    lo, hi = (-9, 3) if dtype == torch.float16 else (-40, 30)
    runs = (n + 15) // 16
    scale = 10.0 ** (torch.rand(runs, generator=gen, dtype=torch.float64) * (hi - lo) + lo)
    x = torch.randn(n, generator=gen, dtype=torch.float64) * scale.repeat_interleave(16)[:n]
    x *= torch.where(torch.rand(n, generator=gen) < 0.3, 1e-4, 1.0).double()  # subnormal after scaling
    x = x.to(dtype)
    if n >= 64:
        at = torch.randperm(n, generator=gen)[:5]
        x[at[0]], x[at[1]], x[at[2]], x[at[3]] = math.inf, -math.nan, -0.0, torch.finfo(dtype).max
        x[at[4]] = torch.finfo(dtype).max * 0.999
    return x


def wire_run(op, x, P, m, block_size, fp8_dtype, key):
    seg = seg_bytes(m, block_size, fp8_dtype)
    out = torch.full((P * seg,), 0xA5, dtype=torch.uint8)
    kw = dict(block_size=block_size, **fmt_kw(fp8_dtype), rounding="stochastic", rounding_key=key)
    if op == "quantize_segments":
        fp8comm.quantize_segments(x, out, P, m, premul=0.75, **kw)
    else:  # the sum of P pieces (x quantized to nearest) and an own addend, re-quantized into one segment
        pieces = torch.empty(P * seg, dtype=torch.uint8)
        fp8comm.quantize_segments(x, pieces, P, m, block_size=block_size, **fmt_kw(fp8_dtype))
        out = out[:seg]
        fp8comm.dequant_sum_requantize(pieces, out, P, m, post_div=2, own=x[:m].flip(0), own_premul=0.5, **kw)
    return out


CASES = [(n, P, block, fp8, dtype) for (n, P, block) in
         [(1, 1, 32), (31, 1, 32), (33, 2, 32), (8 * 32 * 3 + 17, 3, 32), (4096 + 5, 1, 32), (700, 2, 16),
          (777, 2, 64), (500, 3, 48)]
         for fp8 in FORMATS for dtype in DTYPES]


@pytest.mark.parametrize("op", ["quantize_segments", "dequant_sum_requantize"])
@pytest.mark.parametrize("n,P,block_size,fp8_dtype,dtype", CASES,
                         ids=[f"{c[0]}x{c[1]}-b{c[2]}-{name(c[3])}-{name(c[4])}" for c in CASES])
def test_every_cpu_path_writes_the_same_bytes(op, n, P, block_size, fp8_dtype, dtype):
    m = (n + P - 1) // P
    x = nasty(n, dtype, seed=n * 7 + P)
    results = {}
    for level in LEVELS:
        with kernels(level):
            results[level] = wire_run(op, x, P, m, block_size, fp8_dtype, key=0xC0FFEE + n)
    for level, got in results.items():
        assert torch.equal(got, results["scalar"]), f"{level} differs from the scalar loops"
    if n >= 256:  # another key changes them (Gaussian data: most values lie between two codes)
        y = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(dtype)
        with kernels(LEVELS[-1]):
            assert not torch.equal(wire_run(op, y, P, m, block_size, fp8_dtype, key=1),
                                   wire_run(op, y, P, m, block_size, fp8_dtype, key=2))


@pytest.mark.parametrize("fp8_dtype", FORMATS, ids=name)
def test_thread_count_does_not_change_the_bytes(fp8_dtype):
    x = nasty(300_000, torch.float32, seed=11)
    results = []
    for level in LEVELS:
        for threads in (1, 4):
            with kernels(level, threads):
                results.append(fp8comm.quantize(x, **fmt_kw(fp8_dtype), rounding="stochastic", rounding_key=77))
    for codes, scales in results[1:]:
        assert torch.equal(codes.view(torch.uint8), results[0][0].view(torch.uint8))
        assert torch.equal(scales.view(torch.uint8), results[0][1].view(torch.uint8))


# ---------------------------------------------------------------- collectives
# Scenarios run on every rank of the pool (module level: the ranks import this module).
BIASED = 1.0 + 0.3 * 0.125  # 0.3 of an E4M3 step above a code at any power-of-two scale: nearest rounds down


def all_reduce_runs(rounding: str, seed: int, calls: int = 12, n: int = 4096):
    """`calls` all_reduces of BIASED on a fresh fp8gloo group; returns the results."""
    group = dist.new_group(backend="fp8gloo",
                           pg_options=fp8comm.Options(min_numel=1024, rounding=rounding, rounding_seed=seed))
    out = []
    for _ in range(calls):
        t = torch.full((n,), BIASED)
        t[::7] *= 1.5  # not one value everywhere; also just above a code
        dist.all_reduce(t, group=group)
        out.append(t)
    stats = fp8comm.get_stats(group)
    dist.destroy_process_group(group)
    return torch.stack(out), stats["calls_compressed"], ctx().world


POOLS = [PoolSpec(3, "gloo", timeout_s=60)]


def test_stochastic_all_reduce_is_bitwise_equal_reproducible_and_unbiased(pool):
    first = pool.run(all_reduce_runs, "stochastic", 5)
    again = pool.run(all_reduce_runs, "stochastic", 5)
    other = pool.run(all_reduce_runs, "stochastic", 6)
    nearest = pool.run(all_reduce_runs, "nearest", 5)
    results, compressed, world = first[0]
    assert compressed == results.shape[0], "every all_reduce must take the compressed path"
    for rank, (r, _, _) in enumerate(first):
        assert torch.equal(r, results), f"rank {rank} differs from rank 0"
    assert torch.equal(again[0][0], results), "the same seed must give the same bytes"
    assert not torch.equal(other[0][0], results), "another seed must give other bytes"
    assert not torch.equal(results[0], results[1]), "each call must draw new bits"
    t = torch.full((results.shape[1],), BIASED, dtype=torch.float64)
    t[::7] *= 1.5
    exact = world * t
    sr_bias = (results.double() - exact).mean().abs().item()
    rne_bias = (nearest[0][0].double() - exact).mean().abs().item()
    assert rne_bias > 0.01 * BIASED, rne_bias  # the input is one nearest rounds with a bias
    assert sr_bias < rne_bias / 10, (sr_bias, rne_bias)


def reduce_scatter_of_one_value(n: int = 4096):
    """reduce_scatter, stochastic, of the same constant on every rank: the
    distinct values of this rank's output."""
    group = dist.new_group(backend="fp8gloo", pg_options=fp8comm.Options(min_numel=1024, rounding="stochastic"))
    out = torch.empty(n)
    dist.reduce_scatter_tensor(out, torch.full((n * ctx().world,), BIASED), group=group)
    dist.destroy_process_group(group)
    return torch.unique(out).tolist()


def test_ranks_round_independently(pool):
    """Each rank's stochastic rounding draws its own bits (the rank is in the
    key): ranks that round the same value the same way everywhere would add
    their errors coherently (P times one error, not its square-root growth).
    On the same input, ranks whose bits were the same would give every
    element the same sum (2 values: all up or all down); independent ranks give
    the mixed sums in between too."""
    for rank, values in enumerate(pool.run(reduce_scatter_of_one_value)):
        assert len(values) > 2, f"rank {rank}: every element summed to one of {values}: the ranks drew the same bits"
