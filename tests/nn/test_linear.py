"""Fp8Linear and convert_to_fp8 on the CPU (torch._scaled_mm's CPU path)."""
import dataclasses
import warnings

import pytest
import torch
import torch.nn as nn

import fp8comm
from tests.support.reference import sqnr_db
from fp8comm.nn import RECIPES as RECIPE_TABLE
from fp8comm.nn import Fp8Linear, convert_to_fp8

RECIPES = ["tensorwise", "rowwise"]
WITH_DELAYED = RECIPES + ["delayed"]  # tests/nn/test_delayed_scaling.py covers its history


def fp64_reference(x, weight, bias, grad_out):
    """Output and gradients of x @ W^T + b in FP64."""
    x64 = x.detach().double().requires_grad_()
    w64 = weight.detach().double().requires_grad_()
    b64 = bias.detach().double().requires_grad_() if bias is not None else None
    y = torch.nn.functional.linear(x64, w64, b64)
    y.backward(grad_out.double())
    return y, x64.grad, w64.grad


def run_fp8(recipe, dtype, shape=(4, 64, 256), out_features=512, bias=True, seed=0):
    torch.manual_seed(seed)
    layer = Fp8Linear(shape[-1], out_features, bias=bias, recipe=recipe, dtype=dtype)
    x = torch.randn(*shape, dtype=dtype, requires_grad=True)
    y = layer(x)
    grad_out = torch.randn_like(y)
    y.backward(grad_out)
    return layer, x, y, grad_out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("recipe", WITH_DELAYED)
def test_output_and_gradients_against_fp64(recipe, dtype):
    fp8comm.nn.reset_linear_stats()
    layer, x, y, grad_out = run_fp8(recipe, dtype)
    y_ref, dx_ref, dw_ref = fp64_reference(x, layer.weight, layer.bias, grad_out)
    assert y.dtype == dtype and x.grad.dtype == dtype and layer.weight.grad.dtype == dtype
    assert sqnr_db(y_ref, y) >= 18.0
    assert sqnr_db(dx_ref, x.grad) >= 17.0
    assert sqnr_db(dw_ref, layer.weight.grad) >= 17.0
    assert fp8comm.nn.linear_stats()["fp8_calls"] == 1 and fp8comm.nn.linear_stats()["fallback_calls"] == 0


@pytest.mark.parametrize("recipe", WITH_DELAYED)
def test_bias_gradient_is_exact(recipe):
    layer, x, y, grad_out = run_fp8(recipe, torch.float32)
    assert torch.equal(layer.bias.grad, grad_out.reshape(-1, grad_out.shape[-1]).sum(0))


@pytest.mark.parametrize("recipe", WITH_DELAYED)
def test_it_really_is_fp8(recipe):
    """The error is that of FP8, not of a high-precision GEMM that passed through."""
    layer, x, y, grad_out = run_fp8(recipe, torch.float32)
    y_ref, _, _ = fp64_reference(x, layer.weight, layer.bias, grad_out)
    assert sqnr_db(y_ref, y) < 40.0


def test_rowwise_keeps_a_row_an_outlier_would_crush():
    torch.manual_seed(0)
    x = torch.randn(32, 64)
    x[0] *= 1e6  # one huge row: tensorwise pushes the rest below E4M3 subnormals
    results = {}
    for recipe in RECIPES:
        layer = Fp8Linear(64, 32, bias=False, recipe=recipe)
        with torch.no_grad():
            layer.weight.copy_(torch.randn(32, 64))
            y = layer(x)
        ref = x.double() @ layer.weight.double().t()
        results[recipe] = sqnr_db(ref[1:], y[1:])
    assert results["rowwise"] > results["tensorwise"] + 10


@pytest.mark.parametrize("in_f,out_f,tokens", [(100, 64, 32), (64, 100, 32), (64, 64, 7)])
def test_fallback_shapes_equal_nn_linear_and_are_counted(in_f, out_f, tokens):
    fp8comm.nn.reset_linear_stats()
    torch.manual_seed(0)
    ref = nn.Linear(in_f, out_f)
    layer = Fp8Linear.from_linear(ref)
    x = torch.randn(tokens, in_f, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        y = layer(x)
    y_ref = ref(x2)
    g = torch.randn_like(y)
    y.backward(g)
    ref_w_grad = ref.weight.grad.clone()
    ref.weight.grad = None
    y_ref.backward(g)
    assert torch.equal(y, y_ref) and torch.equal(x.grad, x2.grad)
    assert torch.equal(ref_w_grad, ref.weight.grad)  # same parameter object: grads accumulate identically
    stats = fp8comm.nn.linear_stats()
    assert stats["fallback_calls"] == 1 and stats["fallback_reasons"] == {"dims not multiples of 16": 1}


def test_fallback_warns_once():
    from fp8comm.nn import linear as linear_mod

    linear_mod._warned.discard("dtype torch.float64")
    layer = Fp8Linear(32, 32, dtype=torch.float64)
    x = torch.randn(16, 32, dtype=torch.float64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        layer(x)
        layer(x)
    assert sum("dtype torch.float64" in str(w.message) for w in caught) == 1
    assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))


def test_state_dict_round_trip_both_ways():
    torch.manual_seed(0)
    ref = nn.Linear(64, 48)
    layer = Fp8Linear(64, 48, recipe="rowwise")
    assert set(layer.state_dict()) == set(ref.state_dict()) == {"weight", "bias"}
    layer.load_state_dict(ref.state_dict())
    assert torch.equal(layer.weight, ref.weight) and torch.equal(layer.bias, ref.bias)
    back = nn.Linear(64, 48)
    back.load_state_dict(layer.state_dict())
    assert torch.equal(back.weight, ref.weight)


def test_from_linear_shares_parameters():
    ref = nn.Linear(32, 16, bias=False)
    layer = Fp8Linear.from_linear(ref, recipe="rowwise")
    assert layer.weight is ref.weight and layer.bias is None
    assert layer.recipe.name == "rowwise" and "recipe=rowwise" in repr(layer)


def test_unknown_recipe():
    with pytest.raises(ValueError, match="unknown FP8 recipe 'blockwise'"):
        Fp8Linear(16, 16, recipe="blockwise")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.big = nn.Linear(2048, 8192)
        self.small = nn.Linear(64, 64)
        self.odd = nn.Linear(4100, 8192)
        self.seq = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32))


def test_convert_default_rule():
    model = convert_to_fp8(Net())
    assert type(model.big) is Fp8Linear  # large: gains on an H100
    assert type(model.small) is nn.Linear  # too small to gain
    assert type(model.odd) is nn.Linear  # 4100 is not a multiple of 16
    assert type(model.seq[0]) is nn.Linear


def test_convert_with_filter_and_in_place():
    net = Net()
    model = convert_to_fp8(net, recipe="rowwise", module_filter_fn=lambda mod, fqn: fqn != "seq.2")
    assert model is net
    assert all(type(getattr(model, n)) is Fp8Linear for n in ("big", "small", "odd"))
    assert type(model.seq[0]) is Fp8Linear and type(model.seq[2]) is nn.Linear
    assert model.seq[0].recipe.name == "rowwise"
    converted_again = convert_to_fp8(model, module_filter_fn=lambda mod, fqn: True)
    assert type(converted_again.seq[2]) is Fp8Linear and converted_again.seq[0].recipe.name == "rowwise"


def test_convert_a_bare_linear():
    lin = nn.Linear(32, 32)
    out = convert_to_fp8(lin, module_filter_fn=lambda m, f: True)
    assert type(out) is Fp8Linear and out.weight is lin.weight


def test_no_grad_inference_and_3d_inputs():
    layer = Fp8Linear(64, 32)
    with torch.no_grad():
        y = layer(torch.randn(2, 3, 16, 64))
    assert y.shape == (2, 3, 16, 32) and not y.requires_grad


def test_autocast_bf16():
    layer = Fp8Linear(64, 32)
    x = torch.randn(16, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    assert sqnr_db(x.double() @ layer.weight.double().t() + layer.bias.double(), y) >= 18


def test_torch_compile_aot_eager():
    torch.manual_seed(0)
    model = nn.Sequential(Fp8Linear(64, 64), nn.GELU(), Fp8Linear(64, 32))
    x = torch.randn(32, 64)
    eager = model(x)
    compiled = torch.compile(model, backend="aot_eager")
    out = compiled(x)
    out.sum().backward()
    assert torch.allclose(out, eager, rtol=0, atol=0)
    assert model[0].weight.grad is not None


# ---------------------------------------------------------------- the CPU GEMM
# On CPUs with AMX torch sends an FP8 _scaled_mm to oneDNN, whose FP8 matmul
# there is a reference loop, ~1000x slower than torch's emulated kernel; there
# Fp8Linear runs the emulated kernel's steps itself (fp8comm/nn/linear.py,
# scaled_mm_cpu). On other CPUs the first test holds trivially; the second
# checks the steps against torch on every CPU.
def _onednn_fp8_calls(capfd, fn):
    """oneDNN primitives run by fn() with an FP8 operand (its verbose log names them f8_e4m3 / f8_e5m2)."""
    capfd.readouterr()
    with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
        fn()
    lines = capfd.readouterr().out.splitlines()
    return [line for line in lines if line.startswith("onednn_verbose") and ",exec," in line and ":f8_e" in line]


@pytest.mark.parametrize("recipe", WITH_DELAYED)
def test_cpu_gemms_never_reach_onednn(recipe, capfd):
    assert torch.backends.mkldnn.enabled
    calls = _onednn_fp8_calls(capfd, lambda: run_fp8(recipe, torch.float32, shape=(64, 64), out_features=32))
    assert calls == []
    assert torch.backends.mkldnn.enabled  # nothing global was switched


# (operand B's format, rowwise): tensorwise's forward, its E5M2 gradient GEMMs, rowwise
SCALED_MM_CASES = pytest.mark.parametrize("b_dtype,rowwise", [(torch.float8_e4m3fn, False),
                                                              (torch.float8_e5m2, False),
                                                              (torch.float8_e4m3fn, True)])


def scaled_mm_operands(b_dtype, rowwise):
    torch.manual_seed(0)
    a = (3 * torch.randn(48, 96)).to(torch.float8_e4m3fn)
    b = (3 * torch.randn(160, 96)).to(b_dtype).t()
    sa, sb = (torch.rand(48, 1) + 0.5, torch.rand(1, 160) + 0.5) if rowwise else (torch.tensor(0.37), torch.tensor(1.7))
    return a, b, sa, sb


@SCALED_MM_CASES
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_emulated_steps_are_torch_scaled_mm_bit_for_bit(b_dtype, rowwise, out_dtype):
    """The steps scaled_mm_cpu runs on AMX CPUs, under torch.compile and for
    rowwise scales where torch's CPU kernel has none equal torch._scaled_mm's
    emulated kernel (oneDNN off for the reference, in this single-threaded
    test only), eagerly and traced."""
    from fp8comm.nn.linear import _torch_scaled_mm_cpu_takes_rowwise, emulated_scaled_mm, scaled_mm_cpu

    a, b, sa, sb = scaled_mm_operands(b_dtype, rowwise)
    with torch.backends.mkldnn.flags(enabled=False):
        if rowwise and not _torch_scaled_mm_cpu_takes_rowwise():
            pytest.skip(f"torch {torch.__version__}'s CPU _scaled_mm has no rowwise scaling, so no reference "
                        "here; test_scaled_mm_cpu_is_the_emulated_steps still runs")
        reference = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype)
    steps = emulated_scaled_mm(a, b, sa, sb, out_dtype)
    traced = torch.compile(scaled_mm_cpu, backend="eager", fullgraph=True)(a, b, sa, sb, out_dtype)
    assert reference.dtype == out_dtype and torch.equal(steps, reference) and torch.equal(traced, reference)


@SCALED_MM_CASES
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_scaled_mm_cpu_is_the_emulated_steps(b_dtype, rowwise, out_dtype):
    """Whichever path scaled_mm_cpu takes here (torch._scaled_mm, or the steps
    where torch's CPU kernel lacks rowwise scaling or is oneDNN's), eager or
    traced, its result is the emulated steps' bit for bit."""
    from fp8comm.nn.linear import emulated_scaled_mm, scaled_mm_cpu

    a, b, sa, sb = scaled_mm_operands(b_dtype, rowwise)
    steps = emulated_scaled_mm(a, b, sa, sb, out_dtype)
    eager = scaled_mm_cpu(a, b, sa, sb, out_dtype)
    traced = torch.compile(scaled_mm_cpu, backend="eager", fullgraph=True)(a, b, sa, sb, out_dtype)
    assert steps.dtype == out_dtype and torch.equal(eager, steps) and torch.equal(traced, steps)


# ---------------------------------------------------------------- fast accumulation
def with_fast_accum(recipe, output, grad_input, grad_weight):
    return dataclasses.replace(RECIPE_TABLE[recipe], fast_accum_output=output, fast_accum_grad_input=grad_input,
                               fast_accum_grad_weight=grad_weight)


@pytest.mark.parametrize("recipe", WITH_DELAYED)
def test_fast_accum_defaults_are_torchaos(recipe):
    """torchao's Float8LinearConfig: gemm_config_output fast, the gradient GEMMs not."""
    r = RECIPE_TABLE[recipe]
    assert (r.fast_accum_output, r.fast_accum_grad_input, r.fast_accum_grad_weight) == (True, False, False)


@pytest.mark.parametrize("recipe", WITH_DELAYED)
def test_other_fast_accum_is_accepted_and_leaves_cpu_results_unchanged(recipe):
    custom = with_fast_accum(recipe, False, True, True)
    model = convert_to_fp8(nn.Sequential(nn.Linear(64, 48)), recipe=custom, module_filter_fn=lambda m, f: True)
    assert type(model[0]) is Fp8Linear and model[0].recipe is custom
    layer, x, y, _ = run_fp8(custom, torch.float32)
    layer_ref, x_ref, y_ref, _ = run_fp8(recipe, torch.float32)
    assert layer.recipe is custom
    assert torch.equal(y, y_ref) and torch.equal(x.grad, x_ref.grad)
    assert torch.equal(layer.weight.grad, layer_ref.weight.grad)


# The three GEMMs of run_fp8(shape=(32, 64), out_features=48), told apart by
# their output shape: y [M, N], dx [M, K], dW [N, K].
GEMM_BY_OUTPUT_SHAPE = {(32, 48): "output", (32, 64): "grad_input", (48, 64): "grad_weight"}


@pytest.mark.parametrize("flags", [(True, False, False), (False, True, True), (False, False, True)])
@pytest.mark.parametrize("recipe", WITH_DELAYED)
def test_cuda_gemm_passes_each_gemms_fast_accum(recipe, flags, monkeypatch):
    """The CUDA GEMM (scaled_mm_cuda) hands torch._scaled_mm the flag of each
    GEMM. Without a GPU: CPU tensors take the CUDA call, and torch._scaled_mm
    records its arguments before running torch's own CPU kernel (which accepts
    use_fast_accum and ignores it), or the emulated steps for rowwise scales
    where that kernel has none."""
    from fp8comm.nn import linear as linear_mod

    real_scaled_mm = torch._scaled_mm
    calls = {}

    def recording_scaled_mm(a, b, **kwargs):
        calls[GEMM_BY_OUTPUT_SHAPE[(a.shape[0], b.shape[1])]] = (kwargs["use_fast_accum"], kwargs["out_dtype"])
        if kwargs["scale_a"].numel() != 1 and not linear_mod._CPU_SCALED_MM_TAKES_ROWWISE:
            return linear_mod.emulated_scaled_mm(a, b, kwargs["scale_a"], kwargs["scale_b"], kwargs["out_dtype"])
        return real_scaled_mm(a, b, **kwargs)

    monkeypatch.setitem(linear_mod._GEMMS, "cpu", linear_mod.scaled_mm_cuda)
    monkeypatch.setattr(torch, "_scaled_mm", recording_scaled_mm)
    run_fp8(with_fast_accum(recipe, *flags), torch.float32, shape=(32, 64), out_features=48)
    gemm_dtype = torch.bfloat16 if recipe == "rowwise" else torch.float32  # CUDA's rowwise GEMMs: bf16 only
    assert calls == {name: (flag, gemm_dtype) for name, flag in zip(("output", "grad_input", "grad_weight"), flags)}
