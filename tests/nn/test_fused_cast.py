"""The fused FP8 casts (torch.ops.fp8comm.cast_fp8, csrc/linear/) on the CPU:
the twin of the CUDA kernels equals the eager torch chain it replaces bit for
bit, writes the transposes the backward GEMMs need, traces under
torch.compile, rejects bad input; and Fp8Linear computes bitwise what it
computed with the eager casts, saving only FP8 copies of activations."""
import math

import pytest
import torch
import torch.nn as nn

import fp8comm
from fp8comm.nn import Fp8Linear, Fp8WeightCast
from fp8comm.nn import linear as linear_mod
from fp8comm.nn.linear import scaled_mm_cpu
from fp8comm.nn import scaling
from fp8comm.nn.scaling import cast_fp8, cast_to_fp8, cast_with_amax, eager_cast_fp8
from tests.support import REPO_ROOT

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FP8 = [E4M3, E5M2]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
RECIPES = [False, True]  # rowwise
SHAPES = [(1, 1), (1, 17), (3, 5), (16, 16), (7, 33), (64, 64), (65, 63), (100, 37), (257, 130), (1, 4096),
          (2048, 48), (48, 2048)]
NAN_CODE = 0x7F  # every NaN the fused cast writes (E4M3 and E5M2)
NAN_SCALE = 0x7FFFFFFF  # every NaN scale


def bits(t):
    """Raw bits (uint8 / int16 / int32), so -0 and NaN signs count."""
    t = t.contiguous()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def same_bits(got, ref, nan_bits):
    """Bit for bit, except that the eager chain's NaNs carry whatever sign and
    payload torch's kernel paths gave them (cast_math.h): there, NaN must be NaN,
    and ours must be the canonical one."""
    ng, nr = torch.isnan(got.float()), torch.isnan(ref.float())
    g, r = bits(got), bits(ref)
    return (torch.equal(ng, nr) and torch.equal(g[~ng], r[~nr])
            and bool((g[ng] == (nan_bits if nan_bits < 0x80000000 else nan_bits - (1 << 32))).all()))


def assert_same_cast(got, ref, what=""):
    for name, g, r in zip(("data", "inv_scale", "data_t", "inv_scale_t"), got, ref):
        assert (g is None) == (r is None), (what, name)
        if g is None:
            continue
        assert g.dtype == r.dtype and g.shape == r.shape and g.is_contiguous(), (what, name, g.shape, r.shape)
        assert same_bits(g, r, NAN_CODE if g.element_size() == 1 else NAN_SCALE), (what, name)


def wide(shape, dtype, seed=0):
    """Random values over ~20 decades, rows and columns of different magnitudes."""
    gen = torch.Generator().manual_seed(seed)
    m, k = shape
    x = torch.randn(m, k, generator=gen)
    x *= torch.logspace(-6, 6, k)[torch.randperm(k, generator=gen)]
    x *= torch.logspace(-4, 4, m)[torch.randperm(m, generator=gen)].unsqueeze(1)
    return x.to(dtype)


# ------------------------------------------------------------------ the bytes
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("rowwise", RECIPES)
@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cast_equals_the_eager_chain(dtype, fp8_dtype, rowwise, shape):
    x = wide(shape, dtype, seed=shape[0] * 1000 + shape[1])
    ref = eager_cast_fp8(x, fp8_dtype, rowwise, with_transpose=True)
    assert_same_cast(cast_fp8(x, fp8_dtype, rowwise, with_transpose=True), ref)
    # each output alone is the same as with the other
    assert_same_cast(cast_fp8(x, fp8_dtype, rowwise), ref._replace(data_t=None, inv_scale_t=None))
    assert_same_cast(cast_fp8(x, fp8_dtype, rowwise, with_data=False, with_transpose=True),
                     ref._replace(data=None, inv_scale=None))


@pytest.mark.parametrize("rowwise", RECIPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_large(dtype, rowwise):
    x = wide((1531, 2304), dtype, seed=7)
    for fp8_dtype in FP8:
        assert_same_cast(cast_fp8(x, fp8_dtype, rowwise, with_transpose=True),
                         eager_cast_fp8(x, fp8_dtype, rowwise, with_transpose=True))


def test_the_scale_is_reciprocal_times_max_not_a_division():
    """torch computes `fp8_max / amax` as amax.reciprocal() * fp8_max (two
    roundings). With an amax where that differs from the division, the fused
    cast still gives the eager bytes and inverse scale."""
    amax = torch.tensor(3.0)  # fl(1/3) * 448 != fl(448/3)
    assert (448.0 / amax).item() != torch.tensor(448.0).div(amax).item()
    x = torch.tensor([[3.0, -1.0, 0.3, 2.9990234]])
    assert_same_cast(cast_fp8(x, E4M3, False, with_transpose=True),
                     eager_cast_fp8(x, E4M3, False, with_transpose=True))
    assert bits(cast_fp8(x, E4M3, False).inv_scale) == bits((448.0 / amax).reciprocal())


def special_tensors(dtype):
    """Named [rows, cols] tensors of values the scale and the cast treat specially."""
    info = torch.finfo(dtype)
    tiny = info.smallest_normal
    sub = tiny / 4 if dtype != torch.bfloat16 else 2.0 ** -130  # subnormals of dtype
    gen = torch.Generator().manual_seed(3)

    def base(m=19, k=40):
        return torch.randn(m, k, generator=gen)

    cases = {"zeros": torch.zeros(19, 40), "negative zeros": -torch.zeros(5, 33)}
    x = base()
    x[2] = 0.0
    x[4, ::3] = -0.0
    cases["zero rows and -0"] = x
    cases["below eps (amax clamps)"] = base() * 1e-20 if dtype == torch.float32 else torch.full((3, 17), sub)
    cases["subnormals"] = torch.full((6, 21), sub) * torch.arange(1, 22)
    x = base()
    x[:, 5] = sub
    x[7] *= 1e-30 if dtype == torch.float32 else 1e-3
    cases["subnormal elements in normal rows"] = x
    cases["huge"] = base() * (1e37 if dtype == torch.float32 else info.max / 8)
    x = base()
    x[1, 1] = info.max
    x[3, 3] = -info.max
    cases["max of dtype"] = x
    x = base()
    x[2, 7] = math.inf
    x[5, 0] = -math.inf
    cases["inf"] = x
    x = base()
    x[1, 2] = math.nan
    x[6, 39] = -math.nan
    cases["nan"] = x
    x = base()
    x[0, 0], x[0, 1], x[3, 3], x[9, 9] = math.nan, math.inf, -math.inf, math.nan
    x[10] = math.inf
    cases["nan and inf"] = x
    x = base()
    x[:, 4] = math.inf  # columns of Inf (rowwise data_t: a column scale of 0)
    x[:, 8] = math.nan
    cases["inf and nan columns"] = x
    # values on FP8 rounding ties after scaling: amax 448 gives scale 1
    ties = torch.tensor([448.0, 0.5 * (256 + 288), 0.5 * (1 + 1.125), 2.0 ** -9 * 1.5, 2.0 ** -10, 3 * 2.0 ** -11,
                         -(2.0 ** -9) * 2.5, 232.0, 240.0, 464.0 / 2, 13.0, -6.5, 0.0009765625])
    cases["rounding ties"] = ties.reshape(1, -1).repeat(3, 1)
    return {name: t.to(dtype) for name, t in cases.items()}


@pytest.mark.parametrize("rowwise", RECIPES)
@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("dtype", DTYPES)
def test_special_values(dtype, fp8_dtype, rowwise):
    for name, x in special_tensors(dtype).items():
        got = cast_fp8(x, fp8_dtype, rowwise, with_transpose=True)
        ref = eager_cast_fp8(x, fp8_dtype, rowwise, with_transpose=True)
        assert_same_cast(got, ref, name)


def test_nan_and_inf_give_what_the_gemm_needs():
    """A NaN makes its whole tensor (row) NaN; an Inf makes the scale 0, so
    finite values cast to signed zeros and the Inf itself to NaN."""
    x = torch.tensor([[1.0, -2.0, math.inf, 0.5], [1.0, 2.0, 3.0, math.nan]])
    data, inv, _, _ = cast_fp8(x, E4M3, rowwise=True)
    assert torch.isnan(data[1].float()).all() and torch.isnan(inv[1]).all()
    assert bits(data[0]).tolist() == [0x00, 0x80, NAN_CODE, 0x00] and inv[0].item() == math.inf
    data, inv, _, _ = cast_fp8(x, E5M2, rowwise=False)
    assert torch.isnan(data.float()).all() and torch.isnan(inv)


@pytest.mark.parametrize("fp8_dtype", FP8)
def test_given_amax(fp8_dtype):
    """The FSDP2 FP8 all-gather's cast: a shard with the whole weight's amax."""
    x = wide((48, 80), torch.float32, seed=11)
    for amax in (3 * x.abs().amax(), x.abs().amax() / 2, torch.tensor(0.0), torch.tensor(math.inf),
                 torch.tensor(1e-30), torch.tensor(3.3e38)):
        ref = eager_cast_fp8(x, fp8_dtype, False, with_transpose=True, amax=amax)
        assert_same_cast(cast_fp8(x, fp8_dtype, False, with_transpose=True, amax=amax), ref, amax)
        data, inv = cast_with_amax(x, fp8_dtype, amax)
        assert same_bits(data, ref.data, NAN_CODE) and same_bits(inv, ref.inv_scale, NAN_SCALE)
    y = x.clone()
    y[3, 3] = math.nan  # as fsdp.py sends it: the amax of a NaN weight is Inf
    amax = torch.tensor(math.inf)
    assert_same_cast(cast_fp8(y, fp8_dtype, False, amax=amax), eager_cast_fp8(y, fp8_dtype, False, amax=amax))


def test_transposes():
    x = wide((37, 90), torch.bfloat16, seed=5)
    t = cast_fp8(x, E4M3, False, with_transpose=True)
    assert torch.equal(bits(t.data_t), bits(t.data.t().contiguous())) and torch.equal(t.inv_scale_t, t.inv_scale)
    r = cast_fp8(x, E4M3, True, with_transpose=True)
    xt = cast_fp8(x.t().contiguous(), E4M3, True)  # the cast of x^T, scaled per row of x^T
    assert torch.equal(bits(r.data_t), bits(xt.data)) and torch.equal(r.inv_scale_t, xt.inv_scale)
    assert r.inv_scale.shape == (37, 1) and r.inv_scale_t.shape == (90, 1)


def test_non_contiguous_inputs():
    base = wide((64, 130), torch.float32, seed=9)
    for x in (base.t(), base[:, 1:], base[::2], base[3:40, 5:77]):
        for rowwise in RECIPES:
            assert_same_cast(cast_fp8(x, E4M3, rowwise, with_transpose=True),
                             eager_cast_fp8(x.contiguous(), E4M3, rowwise, with_transpose=True))


def test_empty_tensors():
    op = torch.ops.fp8comm.cast_fp8
    x = torch.zeros(0, 32)
    d, i, dt, it = op(x, E4M3, True, True, True)
    assert d.shape == (0, 32) and i.shape == (0, 1) and dt.shape == (32, 0) and it.shape == (32, 1)
    ref = eager_cast_fp8(torch.zeros(1, 1), E4M3, False)
    assert torch.equal(it, ref.inv_scale.expand(32, 1))  # empty columns: amax 0
    d, i, dt, it = op(torch.zeros(5, 0), E5M2, False, True, True)
    assert d.shape == (5, 0) and dt.shape == (0, 5) and i.shape == () and i.item() == it.item() > 0


def test_outputs_not_asked_for_are_empty():
    x = torch.randn(16, 32)
    d, i, dt, it = torch.ops.fp8comm.cast_fp8(x, E4M3, False)
    assert d.shape == (16, 32) and i.shape == () and dt.shape == (0,) and it.shape == (0,)
    d, i, dt, it = torch.ops.fp8comm.cast_fp8(x, E4M3, True, with_data=False, with_transpose=True)
    assert d.shape == (0,) and i.shape == (0,) and dt.shape == (32, 16) and it.shape == (32, 1)
    c = cast_fp8(x, E4M3, True, with_data=False, with_transpose=True)
    assert c.data is None and c.inv_scale is None


def test_bad_input():
    op = torch.ops.fp8comm.cast_fp8
    x = torch.randn(16, 32)
    cases = [
        ((torch.randn(32), E4M3, False), "must be 2-D"),
        ((torch.randn(2, 16, 32), E4M3, False), "must be 2-D"),
        ((x.double(), E4M3, False), "float32, bfloat16 or float16 tensor, got Double"),
        ((x.to(torch.int32), E4M3, False), "float32, bfloat16 or float16"),
        ((x, torch.float16, False), "fp8_dtype must be torch.float8_e4m3fn or torch.float8_e5m2"),
        ((x, E4M3, False, False, False), "nothing to do"),
        ((x, E4M3, True, True, False, torch.tensor(1.0)), "amax can only be given to the tensorwise cast"),
        ((x, E4M3, False, True, False, torch.ones(2)), "amax must be one float32 element"),
        ((x, E4M3, False, True, False, torch.tensor(1.0, dtype=torch.float64)), "amax must be one float32"),
    ]
    for args, msg in cases:
        with pytest.raises(RuntimeError, match=msg):
            op(*args)


# ------------------------------------------------------------------ tracing
def test_fake_kernel_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = torch.ops.fp8comm.cast_fp8
    with FakeTensorMode():
        x = torch.empty(24, 40, dtype=torch.bfloat16)
        for rowwise in RECIPES:
            for with_data, with_t in ((True, False), (True, True), (False, True)):
                d, i, dt, it = op(x, E5M2, rowwise, with_data, with_t)
                assert d.shape == ((24, 40) if with_data else (0,)) and d.dtype == E5M2
                assert i.shape == (((24, 1) if rowwise else ()) if with_data else (0,)) and i.dtype == torch.float32
                assert dt.shape == ((40, 24) if with_t else (0,)) and dt.dtype == E5M2
                assert it.shape == (((40, 1) if rowwise else ()) if with_t else (0,))


def test_opcheck():
    """Schema, fake kernel and real kernel agree (torch.library.opcheck)."""
    op = torch.ops.fp8comm.cast_fp8.default
    x = wide((32, 48), torch.bfloat16)
    for args in ((x, E4M3, False, True, True), (x, E5M2, True, True, True), (x, E4M3, True, False, True),
                 (x.float(), E4M3, False, True, False, torch.tensor(7.0))):
        torch.library.opcheck(op, args)


@pytest.mark.parametrize("rowwise", RECIPES)
def test_torch_compile_fullgraph(rowwise):
    def f(x):
        c = cast_fp8(x, E4M3, rowwise, with_transpose=True)
        return c.data, c.inv_scale, c.data_t, c.inv_scale_t

    x = wide((48, 64), torch.bfloat16, seed=2)
    compiled = torch.compile(f, fullgraph=True, backend="eager")
    assert_same_cast(compiled(x), eager_cast_fp8(x, E4M3, rowwise, with_transpose=True))


# ------------------------------------------------------------------ device gate
def test_fused_cast_gate(monkeypatch):
    """CPU always; CUDA unless FP8COMM_FUSED_CAST=0 or the build has no CUDA
    kernels; no other device."""
    monkeypatch.delenv(scaling.FUSED_CAST_ENV, raising=False)
    monkeypatch.setattr(scaling._C, "has_cuda", True)
    assert scaling.fused_cast_enabled(torch.device("cpu"))
    assert scaling.fused_cast_enabled(torch.device("cuda"))
    assert not scaling.fused_cast_enabled(torch.device("meta"))
    monkeypatch.setenv(scaling.FUSED_CAST_ENV, "0")
    assert not scaling.fused_cast_enabled(torch.device("cuda"))
    assert scaling.fused_cast_enabled(torch.device("cpu"))
    monkeypatch.setenv(scaling.FUSED_CAST_ENV, "1")
    assert scaling.fused_cast_enabled(torch.device("cuda"))
    monkeypatch.setattr(scaling._C, "has_cuda", False)
    assert not scaling.fused_cast_enabled(torch.device("cuda"))


def test_the_cpu_path_calls_the_operator(monkeypatch):
    calls = []
    real = torch.ops.fp8comm.cast_fp8

    class Spy:
        def __call__(self, *args):
            calls.append(args[1:])
            return real(*args)

    monkeypatch.setattr(torch.ops.fp8comm, "cast_fp8", Spy(), raising=False)
    layer = Fp8Linear(32, 16)
    layer(torch.randn(16, 32, requires_grad=True)).sum().backward()
    # forward: x and W (each with its transpose); backward: dy with its transpose
    assert calls == [(E4M3, False, True, True, None), (E4M3, False, True, True, None),
                     (E5M2, False, True, True, None)]


# ------------------------------------------------------------------ Fp8Linear
class OldFp8Matmul(torch.autograd.Function):
    """Fp8Linear's GEMMs as they were before the fused casts (eager chains,
    .t().contiguous() copies), the reference for bitwise comparisons."""

    @staticmethod
    def forward(ctx, x2d, weight, recipe, grad_enabled, state=None):
        assert state is None  # current scaling: the delayed recipe came later
        def cast(t, dtype, rowwise):
            c = eager_cast_fp8(t, dtype, rowwise)
            return c.data, c.inv_scale

        ctx.cast = cast
        xq, xs = cast(x2d, recipe.input_dtype, recipe.rowwise)
        wq, ws = cast(weight, recipe.weight_dtype, recipe.rowwise)
        out = linear_mod._mm(xq, wq.t(), xs, ws.t() if recipe.rowwise else ws, x2d.dtype, recipe.rowwise,
                             recipe.fast_accum_output)
        if recipe.rowwise:
            ctx.save_for_backward(x2d, weight)
        else:
            ctx.save_for_backward(xq, xs, wq, ws)
        ctx.recipe = recipe
        ctx.dtypes = (x2d.dtype, weight.dtype)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        recipe, cast, _mm = ctx.recipe, ctx.cast, linear_mod._mm
        x_dtype, w_dtype = ctx.dtypes
        go = grad_out.contiguous()
        if not recipe.rowwise:
            xq, xs, wq, ws = ctx.saved_tensors
            gq, gs = cast(go, recipe.grad_output_dtype, False)
            grad_x = _mm(gq, wq.t().contiguous().t(), gs, ws, x_dtype, False, recipe.fast_accum_grad_input)
            grad_w = _mm(gq.t().contiguous(), xq.t().contiguous().t(), gs, xs, w_dtype, False,
                         recipe.fast_accum_grad_weight)
        else:
            x2d, weight = ctx.saved_tensors
            gq, gs = cast(go, recipe.grad_output_dtype, True)
            wtq, wts = cast(weight.t(), recipe.weight_dtype, True)
            grad_x = _mm(gq, wtq.t(), gs, wts.t(), x_dtype, True, recipe.fast_accum_grad_input)
            gtq, gts = cast(go.t(), recipe.grad_output_dtype, True)
            xtq, xts = cast(x2d.t(), recipe.input_dtype, True)
            grad_w = _mm(gtq, xtq.t(), gts, xts.t(), w_dtype, True, recipe.fast_accum_grad_weight)
        return grad_x, grad_w, None, None, None


def run_layer(recipe, dtype, shape, out_features, matmul, x_grad=True, w_grad=True, seed=0):
    torch.manual_seed(seed)
    layer = Fp8Linear(shape[-1], out_features, recipe=recipe, dtype=dtype)
    layer.weight.requires_grad_(w_grad)
    x = (torch.randn(*shape) * 3).to(dtype).requires_grad_(x_grad)
    grad = torch.randn(*shape[:-1], out_features).to(dtype)
    saved = linear_mod._Fp8Matmul
    linear_mod._Fp8Matmul = matmul
    try:
        y = layer(x)
        y.backward(grad)
    finally:
        linear_mod._Fp8Matmul = saved
    return y, x.grad, layer.weight.grad, layer.bias.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_fp8_linear_is_bitwise_unchanged(recipe, dtype):
    for shape, out_f in (((4, 16, 64), 48), ((32, 128), 256), ((48, 32), 16)):
        for x_grad, w_grad in ((True, True), (False, True), (True, False)):
            new = run_layer(recipe, dtype, shape, out_f, linear_mod._Fp8Matmul, x_grad, w_grad)
            old = run_layer(recipe, dtype, shape, out_f, OldFp8Matmul, x_grad, w_grad)
            for name, a, b in zip(("out", "dx", "dW", "db"), new, old):
                assert (a is None) == (b is None), name
                assert a is None or torch.equal(bits(a), bits(b)), (recipe, dtype, shape, x_grad, w_grad, name)


def saved_tensors_of(layer, x):
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = layer(x)
    return y, saved


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_backward_saves_fp8_activations(recipe):
    """No high-precision copy of x is kept for backward: tensorwise keeps FP8
    x^T and W^T (and two scalars); rowwise FP8 x^T with its column scales, and
    the weight parameter itself."""
    torch.manual_seed(0)
    layer = Fp8Linear(64, 32, recipe=recipe, bias=False)
    x = torch.randn(48, 64, dtype=torch.float32, requires_grad=True)
    y, saved = saved_tensors_of(layer, x)
    big = [t for t in saved if t.numel() > 64]
    fp8 = [t for t in big if t.dtype in (E4M3, E5M2)]
    if recipe == "tensorwise":
        assert len(big) == 2 and [t.shape for t in fp8] == [(64, 48), (64, 32)]
    else:
        assert [t.shape for t in fp8] == [(64, 48)]
        hp = [t for t in big if t.dtype == torch.float32]
        assert len(hp) == 1 and hp[0].data_ptr() == layer.weight.data_ptr()  # the parameter, no copy
    assert not any(t.dtype == x.dtype and t.shape == x.shape for t in saved)
    y.sum().backward()
    assert x.grad is not None and layer.weight.grad is not None


def test_no_grad_saves_nothing_and_casts_no_transposes(monkeypatch):
    calls = []
    real = torch.ops.fp8comm.cast_fp8
    monkeypatch.setattr(torch.ops.fp8comm, "cast_fp8", lambda *a: calls.append(a[3:5]) or real(*a), raising=False)
    layer = Fp8Linear(64, 32, recipe="rowwise")
    with torch.no_grad():
        _, saved = saved_tensors_of(layer, torch.randn(16, 64))
    assert saved == [] and calls == [(True, False), (True, False)]


def test_precast_weight_gradients():
    """An FSDP2-gathered FP8 weight (Fp8WeightCast): dx uses the transpose of its
    bytes, dW reaches it; both equal the GEMMs on the same bytes."""
    torch.manual_seed(0)
    w = torch.randn(32, 64)
    data, inv = cast_with_amax(w, E4M3, 2 * w.abs().amax())
    layer = Fp8Linear(64, 32, bias=False)
    layer.weight = nn.Parameter(Fp8WeightCast(data, inv, torch.float32))
    x = torch.randn(16, 64, requires_grad=True)
    y = layer(x)
    g = torch.randn_like(y)
    y.backward(g)
    gq, gs = cast_to_fp8(g, E5M2, rowwise=False)
    xq, xs = cast_to_fp8(x.detach(), E4M3, rowwise=False)
    dx = scaled_mm_cpu(gq, data.t().contiguous().t(), gs, inv, torch.float32)
    dw = scaled_mm_cpu(gq.t().contiguous(), xq.t().contiguous().t(), gs, xs, torch.float32)
    assert torch.equal(x.grad, dx) and torch.equal(layer.weight.grad, dw)


def test_fsdp_helper_uses_the_operator_bytes():
    """cast_with_amax (the FSDP2 FP8 all-gather's shard cast) with the shard's
    own amax gives cast_to_fp8's bytes."""
    w = wide((40, 64), torch.float32, seed=1)
    data, inv = cast_with_amax(w, E4M3, w.abs().amax())
    d2, i2 = cast_to_fp8(w, E4M3, rowwise=False)
    assert torch.equal(bits(data), bits(d2)) and torch.equal(inv, i2)
    assert fp8comm.nn.scaling.fused_cast_enabled(w.device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fp8", [E4M3, E5M2])
def test_scaled_cast_is_the_delayed_recipes_chain(dtype, fp8):
    """cast_fp8_scaled (the delayed recipe's one-pass cast, fp8comm/nn/delayed.py)
    gives cast_with_scale's torch chain: the bytes (NaN canonical), 1 / scale
    and x's amax, for special inputs and scales that saturate, are exact
    powers of two or 0; the transpose holds the same bytes."""
    from fp8comm.nn.delayed import cast_with_scale

    limit = torch.finfo(fp8).max
    for what, x in special_tensors(dtype).items():
        x = x.to(dtype)
        own = x.float().abs().amax().item()
        finite_own = own if math.isfinite(own) and own > 0 else 1.0
        for scale in (limit / finite_own * 4, limit / finite_own / 3, 2.0 ** -5, 0.0):
            scale = torch.tensor(scale, dtype=torch.float32)
            data, inv, data_t, inv_t, amax = torch.ops.fp8comm.cast_fp8_scaled(x, fp8, scale, True, True)
            want, want_inv, want_amax, _ = cast_with_scale(x, fp8, scale)
            assert same_bits(data, want, NAN_CODE), (what, scale)
            assert same_bits(data_t, want.t().contiguous(), NAN_CODE), (what, scale)
            assert torch.equal(bits(inv), bits(want_inv)) and torch.equal(bits(inv_t), bits(want_inv)), what
            assert same_bits(amax, want_amax, NAN_SCALE) or (amax.isnan() and want_amax.isnan()), (what, amax)
        only_t = torch.ops.fp8comm.cast_fp8_scaled(x, fp8, torch.tensor(0.5), False, True)
        assert only_t[0].numel() == 0 and only_t[1].numel() == 0, what
        assert same_bits(only_t[2], cast_with_scale(x, fp8, torch.tensor(0.5))[0].t().contiguous(), NAN_CODE), what


def test_scaled_cast_errors_and_empty_inputs():
    x = torch.randn(4, 6)
    with pytest.raises(RuntimeError, match="scale must be one float32 element"):
        torch.ops.fp8comm.cast_fp8_scaled(x, E4M3, torch.tensor([1.0, 2.0]), True, False)
    with pytest.raises(RuntimeError, match="scale must be one float32 element"):
        torch.ops.fp8comm.cast_fp8_scaled(x, E4M3, torch.tensor(1.0, dtype=torch.float64), True, False)
    with pytest.raises(RuntimeError, match="nothing to do"):
        torch.ops.fp8comm.cast_fp8_scaled(x, E4M3, torch.tensor(1.0), False, False)
    data, inv, data_t, inv_t, amax = torch.ops.fp8comm.cast_fp8_scaled(torch.empty(0, 5), E4M3, torch.tensor(4.0),
                                                                      True, True)
    assert data.shape == (0, 5) and data_t.shape == (5, 0) and inv.item() == inv_t.item() == 0.25
    assert amax.item() == 0.0
    # A NaN scale of any NaN bits: the inverse is the canonical NaN (cast_math.h), as on CUDA.
    for nan_bits in (0x7FC00000, -0x00400000, -0x003FFFFF):  # 0xFFC00000, 0xFFC00001 as int32
        scale = torch.tensor([nan_bits], dtype=torch.int32).view(torch.float32).reshape(())
        data, inv, _, _, _ = torch.ops.fp8comm.cast_fp8_scaled(x, E4M3, scale, True, False)
        assert bits(inv).item() == 0x7FFFFFFF and bool((data.view(torch.uint8) == 0x7F).all()), hex(nan_bits)


def test_cuda_cast_choice(monkeypatch):
    """FP8COMM_CUDA_CAST names the CUDA cast kernel set, read at every call
    (legacy by default, until a GPU has timed both); another value is an error
    naming the two."""
    monkeypatch.delenv("FP8COMM_CUDA_CAST", raising=False)
    assert fp8comm._C.cuda_cast() == "legacy"
    monkeypatch.setenv("FP8COMM_CUDA_CAST", "tiled")
    assert fp8comm._C.cuda_cast() == "tiled"
    monkeypatch.setenv("FP8COMM_CUDA_CAST", "fast")
    with pytest.raises(ValueError, match="FP8COMM_CUDA_CAST must be 'legacy' or 'tiled', got 'fast'"):
        fp8comm._C.cuda_cast()


def test_cast_bench_quick(tmp_path):
    """bench/linear.py --casts-only runs and reports both timings per cast."""
    import json
    import os
    import subprocess
    import sys

    root = str(REPO_ROOT)
    path = tmp_path / "casts.json"
    out = subprocess.run([sys.executable, "bench/linear.py", "--casts-only", "--quick", "--json", str(path)],
                         capture_output=True, text=True, timeout=300, cwd=root,
                         env={**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(path.read_text())
    assert result["rows"] == [] and result["fused_cast"] is True
    modes = {(r["recipe"], r["outputs"]) for r in result["casts"]}
    assert modes == {("tensorwise", "data"), ("tensorwise", "data+transpose"), ("rowwise", "data"),
                     ("rowwise", "data+transpose"), ("rowwise", "transpose")}
    for r in result["casts"]:
        assert r["eager_s"] > 0 and r["fused_s"] > 0 and r["floor_gb_per_s"] > 0 and r["cast_set"] is None
        # the bytes the kernels move: the input once per pass, the outputs once
        assert r["moved_gb_per_s"] > r["floor_gb_per_s"] and r["input_passes"] == 2


def test_cast_bench_counts_the_passes_of_each_kernel_set():
    """The bytes bench/linear.py counts per CUDA cast set: the tiled rowwise
    cast without the transpose reads x once, every other cast twice."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_linear", REPO_ROOT / "bench" / "linear.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.input_passes("tiled", "rowwise", False) == 1
    assert {bench.input_passes(s, r, t) for s in (None, "legacy", "tiled") for r in ("tensorwise", "rowwise")
            for t in (False, True) if (s, r, t) != ("tiled", "rowwise", False)} == {2}
