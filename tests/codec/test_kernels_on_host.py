"""The CUDA kernels, run on the host: csrc/codec/codec_cuda.cu and
csrc/linear/cast_cuda.cu compiled by the host C++ compiler against the SIMT
emulator of tests/simt (every CUDA thread a fiber; shuffles and __syncthreads
are barriers; a barrier that can never complete, or a misaligned vector
access, aborts) equal the CPU codec and the CPU cast twin bit for bit, NaN
bits included. So CI machines without a GPU run the very kernel code that
test_codec_cuda.py and test_fused_cast_cuda.py run on one.

Inputs are views at 0-3 elements into larger buffers whose other elements are
the dtype's largest finite value (a read past an end changes a scale), and
outputs are views into buffers of a fill pattern that both sides must leave
untouched. Skipped only without a C++ compiler."""
import ctypes
import hashlib
import itertools
import math
import os
import pathlib
import random
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
import torch

import fp8comm
from tests.support import REPO_ROOT

ROOT = REPO_ROOT
SIMT = ROOT / "tests" / "support" / "simt"
UNITS = ("codec_host.cpp", "codec_tiled_host.cpp", "cast_host.cpp", "cast_tiled_host.cpp", "selftest_host.cpp")
# -ffp-contract=off as in setup.py: the bytes must not depend on FMA contraction.
FLAGS = ["-std=c++17", "-O2", "-fPIC", "-ffp-contract=off", "-fno-trapping-math", "-Wall", "-Wno-unknown-pragmas",
         "-Wno-class-memaccess", f"-I{SIMT}", f"-I{ROOT / 'csrc'}"]


def find_compiler():
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        path = shutil.which(name) if name else None
        if path:
            return path
    return None


CXX = find_compiler()
if CXX is None:
    pytest.skip("needs a C++ compiler (g++, c++, clang++ or $CXX) to build the emulated kernels",
                allow_module_level=True)

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FP8 = [E4M3, E5M2]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
ELEM = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}  # fp8comm::ElemType
CAST_FORMAT = {E4M3: 0, E5M2: 1}  # fp8comm::Fp8Dtype (the linear casts)
FORMAT = {"e4m3": 0, "e5m2": 1, "mxfp4": 2, "nvfp4": 3}  # fp8comm::WireFormat (the codec)
FP8_FORMATS = ["e4m3", "e5m2"]
CODE_BITS = {fmt: fp8comm.codec.wire_format_code_bits(fmt) for fmt in FORMAT}
# Bytes of a segment's segment scale (NVFP4: a float32 before its block scales)
HEAD = {fmt: fp8comm.codec.wire_format_info(fmt).segment_scale_bytes for fmt in FORMAT}
# B / 16 a power of two <= 32: the shuffle kernel; the others: the warp kernel
BLOCKS = [16, 32, 64, 128, 256, 512, 48, 80, 1024, 4096]
TYPES = list(itertools.product(DTYPES, FP8))  # the casts'
ROUNDS = 2  # draws per (block size, dtype, format) and operation


def name(dtype):
    return str(dtype).split(".")[-1]
FILL = 0xA5  # what output buffers hold around the views written


# ------------------------------------------------------------------ build
def build_library():
    """The emulated kernels as a shared library, cached by a hash of the
    sources, the compiler and the flags."""
    h = hashlib.sha256(" ".join([CXX, *FLAGS]).encode())
    h.update(subprocess.run([CXX, "--version"], capture_output=True).stdout)
    for d in ("csrc/codec", "csrc/linear", "tests/support/simt"):
        for p in sorted((ROOT / d).iterdir()):
            if p.suffix in (".h", ".cuh", ".cu") or d == "tests/support/simt":
                h.update(p.name.encode() + p.read_bytes())
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "fp8comm" / "simt"
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:  # no writable home
        cache = pathlib.Path(tempfile.gettempdir()) / "fp8comm-simt"
        cache.mkdir(parents=True, exist_ok=True)
    lib = cache / f"kernels-{h.hexdigest()[:24]}.so"
    if lib.exists():
        return lib
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        objs = [os.path.join(tmp, unit + ".o") for unit in UNITS]
        jobs = [subprocess.Popen([CXX, *FLAGS, "-c", str(SIMT / unit), "-o", obj], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True) for unit, obj in zip(UNITS, objs)]
        for unit, job in zip(UNITS, jobs):
            out = job.communicate()[0]
            assert job.returncode == 0, f"compiling tests/support/simt/{unit} for the host failed:\n{out}"
        so = os.path.join(tmp, "kernels.so")
        link = subprocess.run([CXX, "-shared", *objs, "-o", so], capture_output=True, text=True)
        assert link.returncode == 0, f"linking the emulated kernels failed:\n{link.stderr}"
        os.replace(so, lib)
    stale = time.time() - 86400  # builds of older sources; a day's grace for another checkout's run
    for old in cache.glob("kernels-*.so"):
        if old != lib and old.stat().st_mtime < stale:
            old.unlink(missing_ok=True)
    return lib


class Codes(ctypes.Structure):
    """codec_host.cpp's HostCodes: fp8comm::BlockCodes with 64-bit fields."""
    _fields_ = [("scales", ctypes.c_void_p), ("codes", ctypes.c_void_p)] + [
        (name, ctypes.c_int64)
        for name in ("stride", "num_segments", "segment_numel", "capacity", "scale_padding", "block_size", "format",
                     "rounding")] + [("rounding_key", ctypes.c_uint64), ("first_segment", ctypes.c_int64)]


@pytest.fixture(scope="module")
def lib_path():
    return build_library()


@pytest.fixture(scope="module")
def lib(lib_path):
    lib = ctypes.CDLL(str(lib_path))
    p, i64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    codes = ctypes.POINTER(Codes)
    signatures = {
        "simt_wire_segments": (None, [p, i64, i64, i64, i64, codes]),
        "simt_quantize": (ctypes.c_int, [p, i64, i64, f32, p, codes]),
        "simt_dequantize": (ctypes.c_int, [codes, p, i64, i64]),
        "simt_dequant_sum": (ctypes.c_int, [codes, i64, p, i64, i64, f32, p, i64, p, i64, i64]),
        "simt_dequant_sum_requantize": (ctypes.c_int, [codes, i64, p, i64, i64, f32, p, i64, codes]),
        "simt_cast": (ctypes.c_int, [p, i64, i64, i64, i64, i64, p, p, p, p, p, p]),
        "simt_tiled_cast": (ctypes.c_int, [p, i64, i64, i64, i64, i64, p, p, p, p, p, p]),
        "simt_tiled_cast_scaled": (ctypes.c_int, [p, i64, i64, i64, i64, p, p, p, p, p, p, p]),
        "simt_cast_workspace_words": (i64, [i64, i64, i64]),
        "simt_selftest": (ctypes.c_int, [ctypes.c_char_p, p, p, p, p, i64]),
        "simt_take_launches": (ctypes.c_char_p, []),
        "simt_float2_to_fp8x2": (ctypes.c_uint16, [i64, f32, f32]),
        "simt_fp8x2_to_float2": (None, [i64, ctypes.c_uint16, p]),
    }
    for op in ("quantize", "dequantize", "dequant_sum", "dequant_sum_requantize"):
        signatures[f"simt_tiled_{op}"] = signatures[f"simt_{op}"]
    for name, (restype, argtypes) in signatures.items():
        getattr(lib, name).restype = restype
        getattr(lib, name).argtypes = argtypes
    return lib


class Launchers:
    """The codec launchers of one CUDA kernel set, emulated: codec_cuda.cu's
    (prefix simt_) or codec_cuda_tiled.cu's (simt_tiled_), same arguments."""

    def __init__(self, lib, prefix):
        for op in ("quantize", "dequantize", "dequant_sum", "dequant_sum_requantize"):
            setattr(self, op, getattr(lib, prefix + op))


@pytest.fixture(scope="module")
def kernels(lib):
    """The kernel set the codec tests run (test_tiled_kernels_on_host.py runs them on the other)."""
    return Launchers(lib, "simt_")


def wire(lib, segments, num_segments, m, block_size, fmt):
    c = Codes()
    lib.simt_wire_segments(segments.data_ptr(), num_segments, m, block_size, FORMAT[fmt], ctypes.byref(c))
    return c


def flat(scales, codes, n, block_size, fmt):
    """The layout of fp8comm.quantize's (codes, scales): codec_ops.cpp's flat_codes.
    `scales` starts with the segment scale's bytes, if the format has one."""
    return Codes(scales.data_ptr() + HEAD[fmt], codes.data_ptr(), 0, 1, n, n, 0, block_size, FORMAT[fmt])


def code_bytes(n, fmt):
    """Bytes holding n codes (4-bit codes two per byte, an odd count's last byte half used)."""
    return n if CODE_BITS[fmt] == 8 else (n + 1) // 2


# ------------------------------------------------------------------ data
def bits(t):
    """Raw bits, so NaN payloads and -0 count."""
    t = t.contiguous()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def assert_same_bits(emulated, cpu, what):
    e, c = bits(emulated).flatten(), bits(cpu).flatten()
    assert e.shape == c.shape, (what, e.shape, c.shape)
    bad = (e != c).nonzero().flatten()
    if bad.numel():
        i = bad[0].item()
        mask = (1 << (8 * e.element_size())) - 1
        nan = ""
        if emulated.dtype.is_floating_point and emulated.element_size() > 1:
            if torch.isnan(emulated.flatten()[bad].float()).all() and torch.isnan(cpu.flatten()[bad].float()).all():
                nan = " (NaN bits only)"
        raise AssertionError(f"{what}: {bad.numel()} of {e.numel()} elements differ{nan}, the first at {i}: "
                             f"emulated kernel {e[i].item() & mask:#x}, CPU {c[i].item() & mask:#x}")


NAN_BITS = {torch.float32: [0x7FC00001, -0x3ED4B55B, 0x7F800001, -0x007FFFFF, -1],  # +-quiet, signalling, all ones
            torch.bfloat16: [0x7FC1, -0x3F, 0x7F81, -0x7F, -1],
            torch.float16: [0x7E01, -0x1FF, 0x7C01, -0x3FF, -1]}


def nasty(n, dtype, gen, finite=False):
    """Runs of 16 of one magnitude over many decades (within dtype's range),
    with NaNs of every kind, +-Inf (not when `finite`), -0, subnormals and
    near-maximal values."""
    lo, hi = (-9, 3) if dtype == torch.float16 else (-42, 30)
    runs = (n + 15) // 16
    scale = 10.0 ** (torch.rand(runs, generator=gen, dtype=torch.float64) * (hi - lo) + lo)
    x = (torch.randn(n, generator=gen, dtype=torch.float64) * scale.repeat_interleave(16)[:n]).to(dtype)
    if n >= 8:
        big = 3e4 if dtype == torch.float16 else 3e38
        at = torch.randperm(n, generator=gen)[: max(6, n // 100)]
        x[at[2]], x[at[3]] = -0.0, big
        x[at[4]] = torch.finfo(dtype).tiny / 4  # subnormal
        if not finite:
            x[at[0]], x[at[1]] = math.inf, -math.inf
            pattern = NAN_BITS[dtype]
            for k, j in enumerate(at[5:].tolist()):
                bits(x)[j] = pattern[k % len(pattern)]
    return x


# Elements in front of every view, more than the largest block: an access a
# block or more before a view lands in its buffer (a mismatch, not a crash).
# A multiple of 16 bytes for every element size, so `offset` alone sets the
# view's alignment.
GUARD = 4112


def embed(x, offset):
    """x as a view at GUARD + `offset` elements into a larger buffer of the
    dtype's largest finite value: a read past either end changes a block's scale."""
    start = GUARD + offset
    buf = torch.full((start + x.numel() + 40,), torch.finfo(x.dtype).max, dtype=x.dtype)
    buf[start:start + x.numel()] = x
    return buf[start:start + x.numel()]


def filled(n, dtype, offset, room=40):
    """(outer, view): a buffer of FILL bytes and n elements of it from GUARD +
    `offset`, `room` more elements after it (what a kernel that ignores n could
    write), GUARD before it (what a kernel with a block index too low could)."""
    start = GUARD + offset
    outer = torch.empty((start + n + room) * torch.tensor([], dtype=dtype).element_size(), dtype=torch.uint8)
    outer = outer.fill_(FILL).view(dtype)
    return outer, outer[start:start + n]


def outers(n, dtype, offset, room=40):
    """Two equal filled buffers (CPU, emulated) with their views."""
    cpu, cpu_view = filled(n, dtype, offset, room)
    emu, emu_view = filled(n, dtype, offset, room)
    return cpu, cpu_view, emu, emu_view


def expected(n, dtype, offset, values):
    outer, view = filled(n, dtype, offset)
    view.copy_(values.view(dtype))
    return outer


def premul_args(premul, on_device):
    """(scalar, pointer, keep-alive) for a launcher: the device-pointer form
    gets a scalar that must be ignored."""
    if not on_device:
        return premul, None, None
    t = torch.tensor([premul], dtype=torch.float32)
    return 99.0, t.data_ptr(), t


# ------------------------------------------------------------------ cases
def pick_m(rng, block_size):
    """Segment sizes: within one chunk, around a block, whole chunks, a few blocks."""
    return rng.choice([rng.randint(1, 40), max(1, block_size + rng.randint(-20, 20)),
                       16 * rng.randint(1, 3 * block_size // 16), rng.randint(1, 3 * block_size)])


def codec_cases(kind):
    """Every block size with every (dtype, format); the rest drawn with a fixed
    seed (one per format family, so adding a format leaves the others' cases)."""
    cases = []
    for formats, rng in ((FP8_FORMATS, random.Random(kind)), (["mxfp4"], random.Random(kind + " mxfp4")),
                         (["nvfp4"], random.Random(kind + " nvfp4"))):
        cases += draw_cases(kind, rng, formats)
    return cases


def draw_cases(kind, rng, formats):
    """A format that requires one block size (NVFP4: 16) gets as many rounds as
    the others get block sizes, and segments of up to some thousand elements
    too: several warps then share a segment's amax (codec_cuda.cu, "segment
    scales")."""
    cases = []
    required = fp8comm.codec.wire_format_info(formats[0]).block_size
    blocks, rounds = ([required], ROUNDS * 4) if required else (BLOCKS, ROUNDS)
    for _, block_size, (dtype, fmt) in itertools.product(range(rounds), blocks, itertools.product(DTYPES, formats)):
        P = rng.randint(1, 5)
        m = pick_m(rng, block_size) if not required or rng.random() < 0.6 else rng.randint(500, 2500)
        c = dict(block_size=block_size, dtype=dtype, fmt=fmt, P=P, m=m, seed=rng.randrange(1 << 30),
                 src_off=rng.randint(0, 3), dst_off=rng.randint(0, 3), premul=rng.choice([1.0, 0.75, -2.0, 0.1, 3e-5]),
                 on_device=rng.random() < 0.5, post_div=rng.randint(1, P + 1), random_codes=rng.random() < 0.5)
        c["n"] = rng.choice([P * m, max(0, P * m - rng.randint(1, m)), rng.randint(0, P * m)])  # short last segment
        c["own"] = kind == "sum" and rng.random() < 0.7 or kind == "requantize" and rng.random() < 0.7
        c["pieces"] = rng.randint(0 if c["own"] else 1, 5)
        c["own_numel"] = m - rng.randint(0, min(m, 50))
        c["own_dtype"] = dtype if kind == "sum" else rng.choice(DTYPES)
        c["out_numel"] = rng.choice([m, rng.randint(1, m)])
        # the 4-bit formats mark a whole block NaN for one non-finite input: half
        # their cases have none, so large blocks get finite scales too
        c["finite"] = CODE_BITS[fmt] == 4 and rng.random() < 0.5
        cases.append(pytest.param(c, id=f"{name(dtype)}-{fmt}-B{block_size}-P{P}-m{m}-n{c['n']}"))
    return cases


# MXFP4's random scales: ordinary ones, the extremes (E2M1 subnormal results,
# 6 * 2^127 overflowing to Inf) and E8M0's NaN, the scale of its non-finite blocks.
MXFP4_SCALES = torch.tensor([*range(110, 150), 1, 2, 3, 4, 253, 254, 255, 255, 255, 255], dtype=torch.uint8)
# NVFP4's: E4M3 bytes, ordinary ones (0x38 is 1.0), subnormal, the largest
# (448), zero, negative ones and E4M3's NaNs (0x7F: the scale of non-finite
# blocks); and segment scales: powers of two over their whole range
# [2^-117, 2^117], so products reach float32 subnormals and overflow to Inf.
NVFP4_SCALES = torch.tensor([*range(0x28, 0x50), 0x01, 0x07, 0x00, 0x7E, 0x7E, 0xB8, 0xC4, 0x7F, 0x7F, 0xFF],
                            dtype=torch.uint8)
NVFP4_SEGMENT_EXPONENTS = [-117, -117, -100, -30, -8, 0, 0, 3, 40, 110, 117, 117]


def pieces_for(c, gen, num):
    """`num` wire segments at c's dst offset into a filled buffer: the codes of
    nasty data, or random codes (every NaN and Inf code; MXFP4: every code,
    NaN and extreme scales) with random scales (padding zero, as on the wire)."""
    B, m, fmt = c["block_size"], c["m"], c["fmt"]
    S, nb, head = fp8comm.segment_bytes(m, B, wire_format=fmt), math.ceil(m / B), HEAD[fmt]
    _, segs = filled(num * S, torch.uint8, c["dst_off"])
    if num and c["random_codes"]:
        codes_at = S - code_bytes(nb * B, fmt)
        for r in range(num):
            seg = segs[r * S:(r + 1) * S].zero_()
            if fmt in ("mxfp4", "nvfp4"):
                table = MXFP4_SCALES if fmt == "mxfp4" else NVFP4_SCALES
                seg[head:head + nb] = table[torch.randint(0, table.numel(), (nb,), generator=gen)]
            else:
                seg[:nb] = torch.randint(110, 150, (nb,), generator=gen, dtype=torch.uint8)
            if head:
                e = NVFP4_SEGMENT_EXPONENTS[torch.randint(0, len(NVFP4_SEGMENT_EXPONENTS), (1,), generator=gen).item()]
                seg[:head] = torch.tensor([2.0 ** e], dtype=torch.float32).view(torch.uint8)
            codes = torch.randint(0, 256, (code_bytes(m, fmt),), generator=gen, dtype=torch.uint8)
            if m % 2 and CODE_BITS[fmt] == 4:
                codes[-1] &= 0xF  # element m, padding, is a zero code
            seg[codes_at:codes_at + codes.numel()] = codes
    elif num:
        x = nasty(num * m, torch.float32, gen, c["finite"])
        fp8comm.quantize_segments(x, segs, num, m, block_size=B, wire_format=fmt)
    return segs


# ------------------------------------------------------------------ codec
@pytest.mark.parametrize("c", codec_cases("quantize"))
def test_quantize_segments(lib, kernels, c):
    gen = torch.Generator().manual_seed(c["seed"])
    B, P, m, n, fmt, dtype = c["block_size"], c["P"], c["m"], c["n"], c["fmt"], c["dtype"]
    x = embed(nasty(n, dtype, gen, c["finite"]), c["src_off"])
    S = fp8comm.segment_bytes(m, B, wire_format=fmt)
    cpu, cpu_view, emu, emu_view = outers(P * S, torch.uint8, c["dst_off"])
    premul = torch.tensor(c["premul"]) if c["on_device"] else c["premul"]
    fp8comm.quantize_segments(x, cpu_view, P, m, block_size=B, wire_format=fmt, premul=premul)
    scalar, pointer, _keep = premul_args(c["premul"], c["on_device"])
    layout = wire(lib, emu_view, P, m, B, fmt)
    assert kernels.quantize(x.data_ptr(), ELEM[dtype], n, scalar, pointer, ctypes.byref(layout)) == 0
    assert_same_bits(emu, cpu, "wire segments")


@pytest.mark.parametrize("c", codec_cases("flat"))
def test_quantize_and_dequantize_flat(lib, kernels, c):
    """fp8comm.quantize / dequantize's layout (scales apart from the codes, no
    padding), codes and scales read and written at odd addresses."""
    gen = torch.Generator().manual_seed(c["seed"])
    B, n, fmt, dtype = c["block_size"], c["n"], c["fmt"], c["dtype"]
    x = embed(nasty(n, dtype, gen, c["finite"]), c["src_off"])
    codes, scales, *segment_scale = fp8comm.quantize(x, block_size=B, wire_format=fmt)
    nb, nc = scales.numel(), code_bytes(n, fmt)
    assert codes.numel() == nc
    head = torch.cat([t.view(torch.uint8) for t in segment_scale]) if segment_scale else torch.empty(0, dtype=torch.uint8)
    assert head.numel() == HEAD[fmt]
    _, _, emu_codes, emu_codes_view = outers(nc, torch.uint8, c["dst_off"])
    _, _, emu_scales, emu_scales_view = outers(HEAD[fmt] + nb, torch.uint8, 3 - c["dst_off"])
    layout = flat(emu_scales_view, emu_codes_view, n, B, fmt)
    assert kernels.quantize(x.data_ptr(), ELEM[dtype], n, 1.0, None, ctypes.byref(layout)) == 0
    assert_same_bits(emu_codes, expected(nc, torch.uint8, c["dst_off"], codes.view(torch.uint8)), "codes")
    assert_same_bits(emu_scales, expected(HEAD[fmt] + nb, torch.uint8, 3 - c["dst_off"],
                                          torch.cat([head, scales.view(torch.uint8)])), "scales")

    back = fp8comm.dequantize(codes, scales, *segment_scale, wire_format=fmt, block_size=B, dtype=dtype, numel=n)
    _, _, emu, emu_view = outers(n, dtype, c["src_off"])
    assert kernels.dequantize(ctypes.byref(layout), emu_view.data_ptr(), ELEM[dtype], n) == 0
    assert_same_bits(emu, expected(n, dtype, c["src_off"], back), "decoded")


@pytest.mark.parametrize("c", codec_cases("dequantize"))
def test_dequantize_segments(lib, kernels, c):
    gen = torch.Generator().manual_seed(c["seed"])
    B, P, m, fmt, dtype = c["block_size"], c["P"], c["m"], c["fmt"], c["dtype"]
    segs = pieces_for(c, gen, P)
    n = min(c["n"], P * m)
    cpu, cpu_view, emu, emu_view = outers(n, dtype, c["src_off"], room=P * m - n + 40)
    fp8comm.dequantize_segments(segs, cpu_view, P, m, block_size=B, wire_format=fmt)
    assert kernels.dequantize(ctypes.byref(wire(lib, segs, P, m, B, fmt)), emu_view.data_ptr(), ELEM[dtype], n) == 0
    assert_same_bits(emu, cpu, "decoded")


def own_args(c, gen):
    """(own view or None, ctypes arguments for the launcher, keep-alive). An
    own addend of no elements is present (torch gives it a null data_ptr)."""
    if not c["own"]:
        return None, (0, None, 0, 0, 1.0, None), None
    own = embed(nasty(c["own_numel"], c["own_dtype"], gen, c["finite"]), c["src_off"])
    scalar, pointer, keep = premul_args(c["premul"], c["on_device"])
    return own, (1, own.data_ptr(), ELEM[c["own_dtype"]], own.numel(), scalar, pointer), keep


@pytest.mark.parametrize("c", codec_cases("sum"))
def test_dequant_sum(lib, kernels, c):
    gen = torch.Generator().manual_seed(c["seed"])
    B, m, fmt, dtype, num = c["block_size"], c["m"], c["fmt"], c["dtype"], c["pieces"]
    segs = pieces_for(c, gen, num)
    own, own_c, _keep = own_args(c, gen)
    n = c["out_numel"]
    cpu, cpu_view, emu, emu_view = outers(n, dtype, 3 - c["src_off"], room=m - n + 40)
    fp8comm.dequant_sum(segs, cpu_view, num, m, block_size=B, wire_format=fmt, post_div=c["post_div"], own=own,
                        own_premul=c["premul"])
    rc = kernels.dequant_sum(ctypes.byref(wire(lib, segs, num, m, B, fmt)), *own_c, c["post_div"],
                              emu_view.data_ptr(), ELEM[dtype], n)
    assert rc == 0
    assert_same_bits(emu, cpu, "sum")


@pytest.mark.parametrize("c", codec_cases("requantize"))
def test_dequant_sum_requantize(lib, kernels, c):
    gen = torch.Generator().manual_seed(c["seed"])
    B, m, fmt, num = c["block_size"], c["m"], c["fmt"], c["pieces"]
    segs = pieces_for(c, gen, num)
    own, own_c, _keep = own_args(c, gen)
    S = fp8comm.segment_bytes(m, B, wire_format=fmt)
    cpu, cpu_view, emu, emu_view = outers(S, torch.uint8, 3 - c["dst_off"])
    fp8comm.dequant_sum_requantize(segs, cpu_view, num, m, block_size=B, wire_format=fmt, post_div=c["post_div"],
                                   own=own, own_premul=c["premul"])
    rc = kernels.dequant_sum_requantize(ctypes.byref(wire(lib, segs, num, m, B, fmt)), *own_c, c["post_div"],
                                         ctypes.byref(wire(lib, emu_view, 1, m, B, fmt)))
    assert rc == 0
    assert_same_bits(emu, cpu, "re-quantized segment")


def kernels_launched(lib):
    """The emulated kernels launched since the last call, by name."""
    return [line.split("<")[0] for line in lib.simt_take_launches().decode().splitlines()]


@pytest.mark.fast
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "odd-address"])
def test_segment_scale_passes(lib, aligned):
    """NVFP4's segment scales (codec_cuda.cu, "segment scales"): with the
    segment headers 4-byte aligned, several warps share a segment's amax
    through atomics (a clear, the amax and a g kernel before the quantize);
    at an odd address one warp per segment stores g itself. Both write the CPU
    codec's bytes, for a quantize and a sum + re-quantize, with segments of
    very different magnitudes and one of zeros (g = 1); a format without a
    segment scale launches its quantize kernel alone."""
    gen = torch.Generator().manual_seed(11)
    P, m, B, fmt = 4, 3000, 16, "nvfp4"
    off = 0 if aligned else 1
    magnitude = torch.tensor([1e-30, 0.0, 1.0, 1e25]).repeat_interleave(m)
    x = embed(torch.randn(P * m - 5, generator=gen) * magnitude[:P * m - 5], 1)
    S = fp8comm.segment_bytes(m, B, wire_format=fmt)
    cpu, cpu_view, emu, emu_view = outers(P * S, torch.uint8, off)
    fp8comm.quantize_segments(x, cpu_view, P, m, block_size=B, wire_format=fmt, premul=0.75)
    lib.simt_take_launches()
    assert lib.simt_quantize(x.data_ptr(), ELEM[x.dtype], x.numel(), 0.75, None,
                             ctypes.byref(wire(lib, emu_view, P, m, B, fmt))) == 0
    passes = ["clear_segment_amax_kernel", "segment_amax_kernel", "segment_scale_kernel"] if aligned else \
        ["segment_amax_kernel"]
    assert kernels_launched(lib) == passes + ["quantize_shuffle_kernel"]
    assert_same_bits(emu, cpu, "wire segments")
    heads = cpu_view.view(P, S)[:, :4].contiguous().view(torch.float32).flatten().tolist()
    assert len(set(heads)) == P and heads[1] == 1.0, heads  # a g of each segment's own

    own = embed(nasty(m, torch.bfloat16, gen, finite=True), 2)
    cpu, cpu_view, emu, emu_view = outers(S, torch.uint8, off)
    pieces = torch.empty(P * S, dtype=torch.uint8)
    fp8comm.quantize_segments(x, pieces, P, m, block_size=B, wire_format=fmt)
    fp8comm.dequant_sum_requantize(pieces, cpu_view, P, m, block_size=B, wire_format=fmt, post_div=P, own=own,
                                   own_premul=-2.0)
    assert lib.simt_dequant_sum_requantize(ctypes.byref(wire(lib, pieces, P, m, B, fmt)), 1, own.data_ptr(),
                                           ELEM[own.dtype], own.numel(), -2.0, None, P,
                                           ctypes.byref(wire(lib, emu_view, 1, m, B, fmt))) == 0
    assert kernels_launched(lib) == passes + ["quantize_shuffle_kernel"]
    assert_same_bits(emu, cpu, "re-quantized segment")

    e4m3 = torch.empty(P * fp8comm.segment_bytes(m, B), dtype=torch.uint8)
    assert lib.simt_quantize(x.data_ptr(), ELEM[x.dtype], x.numel(), 1.0, None,
                             ctypes.byref(wire(lib, e4m3, P, m, B, "e4m3"))) == 0
    assert kernels_launched(lib) == ["quantize_shuffle_kernel"]


def test_mismatched_own_dtype_is_an_error(lib, kernels):
    segs = torch.zeros(fp8comm.segment_bytes(64, 32), dtype=torch.uint8)
    own = torch.zeros(64, dtype=torch.bfloat16)
    out = torch.empty(64, dtype=torch.float32)
    rc = kernels.dequant_sum(ctypes.byref(wire(lib, segs, 1, 64, 32, "e4m3")), 1, own.data_ptr(), ELEM[own.dtype], 64,
                              1.0, None, 1, out.data_ptr(), ELEM[out.dtype], 64)
    assert rc == 1  # cudaErrorInvalidValue, as dequant_sum_cuda returns it


# ------------------------------------------------------------------ casts
# one element, one row / column, tile edges (64), more tiles and rows than the capped grid covers
SHAPES = [(1, 1), (1, 17), (3, 5), (16, 16), (7, 33), (33, 64), (64, 64), (65, 63), (100, 37), (129, 70), (2, 300),
          (200, 130)]
MODES = [(True, False), (True, True), (False, True)]  # (with_data, with_transpose)


def wide(shape, dtype, gen):
    """Rows and columns of different magnitudes over ~20 decades."""
    m, k = shape
    x = torch.randn(m, k, generator=gen)
    x *= torch.logspace(-6, 6, k)[torch.randperm(k, generator=gen)]
    x *= torch.logspace(-4, 4, m)[torch.randperm(m, generator=gen)].unsqueeze(1)
    return x.to(dtype)


def cast_cases():
    rng = random.Random("cast")
    cases = []
    for i, (rowwise, shape, cast_set) in enumerate(itertools.product([False, True], SHAPES, CAST_SETS)):
        dtype, fp8 = TYPES[i % len(TYPES)]
        special = ["none", "inf", "nan"][i % 3] if shape[0] * shape[1] > 4 else "none"
        c = dict(rowwise=rowwise, shape=shape, dtype=dtype, fp8=fp8, special=special, seed=rng.randrange(1 << 30),
                 src_off=rng.randint(0, 3), dst_off=rng.randint(0, 3), cast_set=cast_set)
        cases.append(pytest.param(c, id=f"{cast_set}-{'rowwise' if rowwise else 'tensorwise'}-{shape[0]}x{shape[1]}-"
                                        f"{name(dtype)}-{name(fp8)}-{special}"))
    return cases


# The CUDA cast kernel sets (FP8COMM_CUDA_CAST): cast_cuda.cu's launcher and cast_cuda_tiled.cu's.
CAST_SETS = {"legacy": "simt_cast", "tiled": "simt_tiled_cast"}


def cast_both(lib, x, fp8, rowwise, with_data, with_t, src_off, dst_off, amax=None, cast_set="legacy"):
    """The CPU twin's four outputs, and the emulated kernels' (of `cast_set`)
    written at odd offsets into filled buffers, compared bit for bit, fill
    included."""
    M, K = x.shape
    cpu = torch.ops.fp8comm.cast_fp8(x, fp8, rowwise, with_data, with_t, amax)
    xs = embed(x.flatten(), src_off)
    sizes = (M * K if with_data else 0, (M if rowwise else 1) if with_data else 0, M * K if with_t else 0,
             (K if rowwise else 1) if with_t else 0)
    kinds = (torch.uint8, torch.float32, torch.uint8, torch.float32)
    bufs = [filled(n, kind, (dst_off + k) % 4) for k, (n, kind) in enumerate(zip(sizes, kinds))]
    words = lib.simt_cast_workspace_words(M, K, rowwise)
    workspace = torch.randint(-(1 << 31), 1 << 31, (words,), dtype=torch.int32)  # any contents
    ptrs = [view.data_ptr() if n else None for (_, view), n in zip(bufs, sizes)]
    rc = getattr(lib, CAST_SETS[cast_set])(xs.data_ptr(), ELEM[x.dtype], M, K, CAST_FORMAT[fp8], rowwise, *ptrs,
                                           amax.data_ptr() if amax is not None else None, workspace.data_ptr())
    assert rc == 0
    for k, (name, (outer, _), n, kind) in enumerate(zip(("data", "inv_scale", "data_t", "inv_scale_t"), bufs, sizes,
                                                        kinds)):
        want = cpu[k].flatten().view(kind) if n else torch.empty(0, dtype=kind)
        assert_same_bits(outer, expected(n, kind, (dst_off + k) % 4, want), (name, with_data, with_t))


@pytest.mark.parametrize("c", cast_cases())
def test_cast(lib, c):
    gen = torch.Generator().manual_seed(c["seed"])
    x = wide(c["shape"], c["dtype"], gen)
    if c["special"] != "none":
        flat_x = x.view(-1)
        at = torch.randperm(flat_x.numel(), generator=gen)[:3]
        flat_x[at[0]], flat_x[at[1]] = -0.0, torch.finfo(c["dtype"]).tiny / 4
        flat_x[at[2]] = math.inf if c["special"] == "inf" else math.nan
    for with_data, with_t in MODES:
        cast_both(lib, x, c["fp8"], c["rowwise"], with_data, with_t, c["src_off"], c["dst_off"],
                  cast_set=c["cast_set"])


@pytest.mark.parametrize("cast_set", CAST_SETS)
@pytest.mark.parametrize("fp8", FP8, ids=name)
def test_cast_with_given_amax(lib, fp8, cast_set):
    gen = torch.Generator().manual_seed(7)
    x = wide((37, 70), torch.float32, gen)
    top = x.abs().amax()
    for k, amax in enumerate([3 * top, top / 2, torch.tensor(0.0), torch.tensor(math.inf), torch.tensor(1e-30),
                              torch.tensor(3.3e38), torch.tensor(math.nan)]):
        for with_data, with_t in MODES:
            cast_both(lib, x, fp8, False, with_data, with_t, k % 4, (k + 1) % 4, amax.reshape(1).float(),
                      cast_set=cast_set)


# ------------------------------------------------------------------ the emulator itself
def test_emulator_shuffles_and_grid_stride(lib):
    """Positive controls: xor shuffles exchange the right lanes, a grid capped
    at 3 blocks visits every item once, warp and block reductions are right."""
    for lane_mask in (1, 2, 5, 16, 31):
        out = torch.zeros(128, dtype=torch.int32)
        assert lib.simt_selftest(b"xor", out.data_ptr(), None, None, None, lane_mask) == 0
        t = torch.arange(128)
        assert torch.equal(out, (1000 * ((t % 64) ^ lane_mask)).int())
    n = 20_000
    data = torch.randint(0, 1 << 30, (n,), dtype=torch.int32)
    visits, amax, grid = (torch.zeros(k, dtype=torch.int32) for k in (n, 1, 1))
    ptrs = (data.data_ptr(), visits.data_ptr(), amax.data_ptr(), grid.data_ptr())
    assert lib.simt_selftest(b"reduce", *ptrs, n) == 0
    assert grid.item() == 3 and bool((visits == 1).all()) and amax.item() == data.max().item()
    # a launch of no blocks is a launch error, as on a GPU (cudaErrorInvalidConfiguration)
    assert lib.simt_selftest(b"empty_grid", *ptrs, n) == 9


def test_emulator_reports_an_access_out_of_bounds(lib, capfd):
    """A fault inside a kernel abandons the launch, which returns
    cudaErrorIllegalAddress as on a GPU; the emulator goes on working."""
    data, out = torch.zeros(128, dtype=torch.int32), torch.zeros(128, dtype=torch.int32)
    assert lib.simt_selftest(b"out_of_bounds", data.data_ptr(), out.data_ptr(), None, None, 0) == 700
    err = capfd.readouterr().err
    assert "simt: kernel out_of_bounds_kernel: segmentation fault" in err and "block 0, thread 40" in err, err
    assert lib.simt_selftest(b"xor", out.data_ptr(), None, None, None, 1) == 0
    assert torch.equal(out[:4], torch.tensor([1000, 0, 3000, 2000], dtype=torch.int32))


@pytest.mark.parametrize("name,message", [
    ("misaligned_load", "misaligned_load_kernel: misaligned 16-byte load (__ldg)"),
    ("misaligned_store", "misaligned_store_kernel: misaligned 16-byte vector store (uint4)"),
    ("exit_before_shuffle", "warp 1: lanes 0-4 at __shfl_xor_sync selftest_host.cpp:25; lane 5 exited"),
    ("divergent_shuffle", "warp 0: lanes 0-15 at __shfl_xor_sync selftest_host.cpp:31; lanes 16-31 at __shfl_xor_sync "
                          "selftest_host.cpp:33"),
    ("divergent_sync", "warp 2: lanes 0-31 at __syncthreads selftest_host.cpp:42"),
])
def test_emulator_aborts_on_broken_rules(lib_path, name, message):
    """A misaligned vector access and a barrier that can never complete abort
    with a message naming the kernel and the place; never a hang."""
    code = ("import ctypes, sys\n"
            "lib = ctypes.CDLL(sys.argv[1])\n"
            "f = lib.simt_selftest\n"
            "f.argtypes = [ctypes.c_char_p] + [ctypes.c_void_p] * 4 + [ctypes.c_int64]\n"
            "buf = ctypes.create_string_buffer(4096)\n"
            "p = (ctypes.addressof(buf) + 15) // 16 * 16\n"
            "f(sys.argv[2].encode(), p, p + 1024, None, None, 0)\n")
    run = subprocess.run([sys.executable, "-c", code, str(lib_path), name], capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and message in run.stderr, (run.returncode, run.stderr)


# ------------------------------------------------------------------ stochastic rounding
def stochastic(layout, key):
    """The layout quantizing with stochastic rounding keyed `key` (rounding.h)."""
    layout.rounding, layout.rounding_key = 1, key
    return layout


@pytest.mark.parametrize("c", codec_cases("stochastic quantize")[::2])
def test_quantize_segments_stochastic(lib, kernels, c):
    """Stochastic rounding's bits are a hash of the key, the segment and the
    element's index in it: the kernels' threads and chunks draw the CPU's bits."""
    gen = torch.Generator().manual_seed(c["seed"])
    B, P, m, n, fmt, dtype = c["block_size"], c["P"], c["m"], c["n"], c["fmt"], c["dtype"]
    x = embed(nasty(n, dtype, gen, c["finite"]), c["src_off"])
    S = fp8comm.segment_bytes(m, B, wire_format=fmt)
    cpu, cpu_view, emu, emu_view = outers(P * S, torch.uint8, c["dst_off"])
    premul = torch.tensor(c["premul"]) if c["on_device"] else c["premul"]
    key = c["seed"] * 0x9E3779B97F4A7C15 % (1 << 64)
    fp8comm.quantize_segments(x, cpu_view, P, m, block_size=B, wire_format=fmt, premul=premul, rounding="stochastic",
                              rounding_key=key)
    scalar, pointer, _keep = premul_args(c["premul"], c["on_device"])
    layout = stochastic(wire(lib, emu_view, P, m, B, fmt), key)
    assert kernels.quantize(x.data_ptr(), ELEM[dtype], n, scalar, pointer, ctypes.byref(layout)) == 0
    assert_same_bits(emu, cpu, "wire segments")


@pytest.mark.parametrize("c", codec_cases("stochastic requantize")[::2])
def test_dequant_sum_requantize_stochastic(lib, kernels, c):
    gen = torch.Generator().manual_seed(c["seed"])
    B, m, fmt, num = c["block_size"], c["m"], c["fmt"], c["pieces"]
    segs = pieces_for(c, gen, num)
    own, own_c, _keep = own_args(c, gen)
    S = fp8comm.segment_bytes(m, B, wire_format=fmt)
    cpu, cpu_view, emu, emu_view = outers(S, torch.uint8, 3 - c["dst_off"])
    key = (c["seed"] << 20) + 12345
    fp8comm.dequant_sum_requantize(segs, cpu_view, num, m, block_size=B, wire_format=fmt, post_div=c["post_div"],
                                   own=own, own_premul=c["premul"], rounding="stochastic", rounding_key=key)
    rc = kernels.dequant_sum_requantize(ctypes.byref(wire(lib, segs, num, m, B, fmt)), *own_c, c["post_div"],
                                         ctypes.byref(stochastic(wire(lib, emu_view, 1, m, B, fmt), key)))
    assert rc == 0
    assert_same_bits(emu, cpu, "re-quantized segment")
