"""The fused FP8 casts on CUDA (csrc/linear/cast_cuda.cu, and the tiled set
cast_cuda_tiled.cu: every test runs on both, FP8COMM_CUDA_CAST) equal their
CPU twin bit for bit, and torch's eager cast on CUDA; Fp8Linear with the fused casts
computes bitwise what it computes with the eager chain (FP8COMM_FUSED_CAST=0)
(marked cuda; skipped without a GPU or without fp8comm's CUDA kernels). The
CUDA default of FP8COMM_FUSED_CAST rests on this file (docs/fp8_linear.md)."""
import math

import pytest
import torch

import fp8comm
from fp8comm.nn import Fp8Linear
from fp8comm.nn import scaling
from fp8comm.nn.scaling import eager_cast_fp8

pytestmark = pytest.mark.cuda

if not (torch.cuda.is_available() and fp8comm._C.has_cuda):
    pytest.skip("needs a GPU and fp8comm built with CUDA", allow_module_level=True)

from tests.nn.test_fused_cast import NAN_CODE, NAN_SCALE, bits, same_bits, special_tensors, wide  # noqa: E402

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FP8 = [E4M3, E5M2]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
RECIPES = [False, True]
# tile edges (64), vector widths (16 elements), one row / column, odd strides, large
SHAPES = [(1, 1), (1, 17), (3, 5), (16, 16), (7, 33), (64, 64), (65, 63), (100, 37), (129, 200), (1, 4096),
          (4096, 1), (2048, 48), (48, 2048), (1000, 1000), (4096, 4112), (8192, 1024)]
# every flag combination the operator takes
MODES = [(True, False), (True, True), (False, True)]


@pytest.fixture(autouse=True, params=["legacy", "tiled"])
def cuda_cast(request, monkeypatch):
    """Every test on both CUDA cast kernel sets (FP8COMM_CUDA_CAST, read at
    every call): cast_cuda.cu's and cast_cuda_tiled.cu's, the same bytes."""
    monkeypatch.setenv("FP8COMM_CUDA_CAST", request.param)
    assert fp8comm._C.cuda_cast() == request.param
    return request.param


def op(x, fp8_dtype, rowwise, with_data, with_t, amax=None):
    return torch.ops.fp8comm.cast_fp8(x, fp8_dtype, rowwise, with_data, with_t, amax)


def assert_bitwise(gpu, cpu, what):
    for name, g, c in zip(("data", "inv_scale", "data_t", "inv_scale_t"), gpu, cpu):
        assert g.device.type == "cuda" and g.shape == c.shape and g.dtype == c.dtype, (what, name)
        assert torch.equal(bits(g.cpu()), bits(c)), (what, name)


def assert_as_eager(got, ref, what):
    for name, g, r in zip(("data", "inv_scale", "data_t", "inv_scale_t"), got, ref):
        if r is None:
            continue
        nan_bits = NAN_CODE if g.element_size() == 1 else NAN_SCALE
        assert g.shape == r.shape and same_bits(g.cpu(), r.cpu(), nan_bits), (what, name)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("rowwise", RECIPES)
@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernels_equal_the_cpu_twin_and_eager_cuda(dtype, fp8_dtype, rowwise, shape):
    x = wide(shape, dtype, seed=shape[0] + shape[1])
    xg = x.cuda()
    for with_data, with_t in MODES:
        assert_bitwise(op(xg, fp8_dtype, rowwise, with_data, with_t), op(x, fp8_dtype, rowwise, with_data, with_t),
                       (shape, with_data, with_t))
    got = op(xg, fp8_dtype, rowwise, True, True)
    assert_as_eager(got, eager_cast_fp8(xg, fp8_dtype, rowwise, with_transpose=True), shape)


@pytest.mark.parametrize("rowwise", RECIPES)
@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("dtype", DTYPES)
def test_special_values(dtype, fp8_dtype, rowwise):
    for name, x in special_tensors(dtype).items():
        for with_data, with_t in MODES:
            assert_bitwise(op(x.cuda(), fp8_dtype, rowwise, with_data, with_t),
                           op(x, fp8_dtype, rowwise, with_data, with_t), (name, with_data, with_t))
        got = op(x.cuda(), fp8_dtype, rowwise, True, True)
        assert_as_eager(got, eager_cast_fp8(x.cuda(), fp8_dtype, rowwise, with_transpose=True), name)


@pytest.mark.parametrize("fp8_dtype", FP8)
def test_given_amax(fp8_dtype):
    x = wide((300, 520), torch.float32, seed=11)
    for amax in (3 * x.abs().amax(), x.abs().amax() / 2, torch.tensor(0.0), torch.tensor(math.inf),
                 torch.tensor(1e-30), torch.tensor(3.3e38)):
        for with_data, with_t in MODES:
            assert_bitwise(op(x.cuda(), fp8_dtype, False, with_data, with_t, amax.cuda()),
                           op(x, fp8_dtype, False, with_data, with_t, amax), amax)


@pytest.mark.parametrize("dtype", DTYPES)
def test_misaligned_and_strided_inputs(dtype):
    """Views whose rows do not start on 16 bytes: the kernels fall back from
    16-byte accesses (the operator makes them contiguous, but an odd column
    count still misaligns every row but the first)."""
    base = wide((333, 1031), dtype, seed=3)
    for x in (base, base[:, 1:], base[5:, 3:700], base.t(), base[::3, ::2]):
        for rowwise in RECIPES:
            for with_data, with_t in MODES:
                assert_bitwise(op(x.cuda(), E4M3, rowwise, with_data, with_t),
                               op(x, E4M3, rowwise, with_data, with_t), (x.shape, rowwise))


def test_many_rows_and_grid_stride():
    """More tiles and rows than the grid has blocks: the grid-stride loops."""
    x = wide((65536 + 3, 160), torch.bfloat16, seed=4)
    for rowwise in RECIPES:
        for with_data, with_t in MODES:
            assert_bitwise(op(x.cuda(), E4M3, rowwise, with_data, with_t),
                           op(x, E4M3, rowwise, with_data, with_t), rowwise)


@pytest.mark.parametrize("dtype,cols", [(torch.bfloat16, 14336), (torch.float32, 20000), (torch.float32, 40000)])
def test_long_rows(dtype, cols):
    """Rowwise rows of Llama-3-8B's widest operand and longer: the tiled set
    holds up to 1024 x 8 runs of 16 bytes a row in registers (4 or 8 runs a
    thread) and hands longer rows to cast_cuda.cu's row kernel."""
    x = wide((5, cols), dtype, seed=cols)
    for with_data, with_t in MODES:
        assert_bitwise(op(x.cuda(), E4M3, True, with_data, with_t), op(x, E4M3, True, with_data, with_t), cols)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fp8_dtype", FP8)
def test_scaled_cast_equals_the_cpu_twin(dtype, fp8_dtype):
    """The delayed recipe's cast (cast_fp8_scaled: a given scale, the amax
    recorded in the same pass; always the tiled kernels): the CPU twin's bytes,
    inverse scales and amax, special values included, with the transpose."""
    limit = torch.finfo(fp8_dtype).max
    for what, x in list(special_tensors(dtype).items()) + [("wide", wide((300, 517), dtype, seed=9))]:
        x = x.to(dtype)
        own = x.float().abs().amax().item()
        own = own if math.isfinite(own) and own > 0 else 1.0
        for scale in (limit / own * 4, limit / own / 3, 2.0 ** -5, 0.0):
            s = torch.tensor(scale, dtype=torch.float32)
            for with_data, with_t in MODES:
                cpu = torch.ops.fp8comm.cast_fp8_scaled(x, fp8_dtype, s, with_data, with_t)
                gpu = torch.ops.fp8comm.cast_fp8_scaled(x.cuda(), fp8_dtype, s.cuda(), with_data, with_t)
                assert_bitwise(gpu[:4], cpu[:4], (what, scale))
                assert torch.equal(bits(gpu[4].cpu()), bits(cpu[4])) or (gpu[4].isnan() and cpu[4].isnan()), what


def test_runs_on_the_current_stream_and_device():
    x = wide((512, 768), torch.bfloat16, seed=6).cuda()
    ref = op(x, E4M3, True, True, True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        got = op(x, E4M3, True, True, True)
    torch.cuda.current_stream().wait_stream(s)
    assert_bitwise(got, tuple(t.cpu() for t in ref), "side stream")


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_fp8_linear_fused_equals_eager(recipe, monkeypatch):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 GEMMs need compute capability 8.9")

    def run(fused):
        monkeypatch.setenv(scaling.FUSED_CAST_ENV, "1" if fused else "0")
        torch.manual_seed(0)
        layer = Fp8Linear(1024, 2048, recipe=recipe, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(4, 256, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        y = layer(x)
        y.backward(torch.randn_like(y))
        return y, x.grad, layer.weight.grad, layer.bias.grad

    for a, b in zip(run(True), run(False)):
        assert torch.equal(bits(a), bits(b))


def test_fp8_linear_compiles_with_the_fused_cast(monkeypatch):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 GEMMs need compute capability 8.9")
    monkeypatch.setenv(scaling.FUSED_CAST_ENV, "1")
    torch.manual_seed(0)
    model = torch.nn.Sequential(Fp8Linear(256, 512), torch.nn.GELU(), Fp8Linear(512, 256)).cuda()
    x = torch.randn(64, 256, device="cuda")
    eager = model(x)
    out = torch.compile(model, backend="aot_eager")(x)
    out.sum().backward()
    assert torch.equal(out, eager)
