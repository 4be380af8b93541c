"""The delayed recipe of Fp8Linear (fp8comm/nn/delayed.py): the scale each
cast uses is the one its amax history gives (Transformer Engine's
DelayedScaling: amax_history_len, amax_compute_algo, margin), this step's
amax is recorded, saturation is counted, the history lives in the module's
state so a checkpoint resumes bit for bit, and ranks agree on it."""
from __future__ import annotations

import dataclasses
import io

import pytest
import torch
import torch.nn as nn

import fp8comm
from fp8comm.nn import RECIPES, Fp8Linear, convert_to_fp8, linear_stats, reset_linear_stats
from fp8comm.nn.linear import scaled_mm_cpu
from tests.support.harness import PoolSpec

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
E4M3_MAX, E5M2_MAX = 448.0, 57344.0


def delayed(**fields):
    return dataclasses.replace(RECIPES["delayed"], **fields)


def manual_cast(x, dtype, scale):
    """The cast the delayed recipe promises: saturate(x * scale), as torch ops."""
    limit = torch.finfo(dtype).max
    return (x.float() * scale).clamp(-limit, limit).to(dtype)


def manual_forward(x, w, scale_x, scale_w):
    scale_x, scale_w = torch.as_tensor(scale_x, dtype=torch.float32), torch.as_tensor(scale_w, dtype=torch.float32)
    xq, wq = manual_cast(x, E4M3, scale_x), manual_cast(w, E4M3, scale_w)
    return scaled_mm_cpu(xq, wq.t(), scale_x.reciprocal(), scale_w.reciprocal(), x.dtype)


def own_scale(t, limit=E4M3_MAX, margin=0):
    """The current-scaling scale of t (as the first cast takes it), float32 arithmetic."""
    return (limit * 2.0 ** -margin) / t.detach().abs().amax().float()


# ------------------------------------------------------------------ recipe
def test_the_recipe_is_transformer_engines_delayed_scaling():
    r = RECIPES["delayed"]
    assert (r.input_dtype, r.weight_dtype, r.grad_output_dtype) == (E4M3, E4M3, E5M2)  # HYBRID
    assert (r.amax_history_len, r.amax_compute_algo, r.margin, r.rowwise) == (1024, "max", 0, False)
    assert r.delayed and not RECIPES["tensorwise"].delayed
    assert repr(Fp8Linear(16, 16, recipe="delayed")).endswith("recipe=delayed)")


@pytest.mark.fast
@pytest.mark.parametrize("fields,match", [
    ({"amax_compute_algo": "mean"}, "amax_compute_algo must be 'max' or 'most_recent'"),
    ({"amax_history_len": 0}, "amax_history_len must be an int >= 1"),
    ({"margin": -1}, "margin must be an int >= 0"),
    ({"rowwise": True}, "delayed scaling is tensorwise"),
    ({"scaling": "later"}, "scaling must be 'current' or 'delayed'"),
])
def test_bad_recipe_fields_are_refused(fields, match):
    with pytest.raises(ValueError, match=match):
        delayed(**fields)


# ------------------------------------------------------------ the scales
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_first_step_is_the_tensorwise_step(dtype):
    """Nothing recorded yet: each operand takes its own amax, the bytes of
    current scaling, so output and gradients equal tensorwise's bitwise."""
    torch.manual_seed(0)
    cur = Fp8Linear(64, 32, recipe="tensorwise", dtype=dtype)
    dly = Fp8Linear(64, 32, recipe="delayed", dtype=dtype)
    dly.load_state_dict(cur.state_dict())
    x = torch.randn(16, 64, dtype=dtype)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = cur(xa), dly(xb)
    assert torch.equal(ya, yb)
    g = torch.randn_like(ya)
    ya.backward(g)
    yb.backward(g)
    assert torch.equal(xa.grad, xb.grad) and torch.equal(cur.weight.grad, dly.weight.grad)
    # and it recorded this step's amaxes: input, weight, grad_output
    expect = torch.stack([x.abs().amax(), dly.weight.abs().amax(), g.abs().amax()]).float()
    assert torch.equal(dly.fp8_amax_history[0], expect)
    assert dly.fp8_amax_count.tolist() == [1, 1, 1]


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("margin", [0, 2])
def test_each_cast_uses_the_scale_its_history_gives(algo, margin):
    """History of 3: the input's magnitude changes every step; each forward
    must equal the GEMM of operands cast with the history's scale (the
    window's max or its newest amax, 2**margin below fp8_max)."""
    torch.manual_seed(1)
    layer = Fp8Linear(64, 32, bias=False, recipe=delayed(amax_history_len=3, amax_compute_algo=algo, margin=margin))
    base = torch.randn(16, 64)
    w = layer.weight.detach()
    seen = []
    scaled_max = E4M3_MAX * 2.0 ** -margin
    for step, mag in enumerate([1.0, 4.0, 0.5, 0.25, 0.25, 2.0]):
        x = base * mag
        if step == 0:
            sx, sw = own_scale(x, margin=margin), own_scale(w, margin=margin)
        else:
            window = seen[-3:]
            a = max(window) if algo == "max" else window[-1]
            sx, sw = scaled_max / torch.tensor(a), scaled_max / w.abs().amax()
        with torch.no_grad():
            y = layer(x)
        assert torch.equal(y, manual_forward(x, w, sx, sw)), step
        seen.append(x.abs().amax().item())
        newest_first = list(reversed(seen[-3:])) + [0.0] * (3 - len(seen[-3:]))
        assert layer.fp8_amax_history[:, 0].tolist() == pytest.approx(newest_first, rel=0, abs=0)


def test_saturation_is_counted_and_saturates():
    """most_recent over 1 step: an input 4x the last one's amax overflows the
    history's range; its elements saturate to +-448 and the cast is counted."""
    torch.manual_seed(2)
    layer = Fp8Linear(64, 32, bias=False, recipe=delayed(amax_history_len=1, amax_compute_algo="most_recent"))
    x = torch.randn(16, 64)
    w = layer.weight.detach()
    reset_linear_stats()
    with torch.no_grad():
        layer(x)
        assert linear_stats()["saturated_casts"] == 0
        y = layer(4 * x)
    stats = linear_stats()
    assert stats["saturated_casts"] == 1 and stats["delayed_casts"] == 4
    sx = E4M3_MAX / x.abs().amax()
    xq = manual_cast(4 * x, E4M3, sx)
    assert xq.float().abs().amax() == E4M3_MAX and (4 * x * sx).abs().amax() > E4M3_MAX
    assert torch.equal(y, manual_forward(4 * x, w, sx, E4M3_MAX / w.abs().amax()))
    with torch.no_grad():
        layer(4 * x)  # the history caught up: no saturation, though amax * (448 / amax) may round past 448
    assert linear_stats()["saturated_casts"] == 1


@pytest.mark.parametrize("dtype,threshold", [(E4M3, 464.0), (E5M2, 61440.0)])
def test_a_product_that_still_rounds_to_fp8_max_is_not_a_saturation(dtype, threshold):
    from fp8comm.nn.delayed import cast_with_scale, saturation_threshold

    assert saturation_threshold(dtype) == threshold
    limit = torch.finfo(dtype).max
    for top, saturated in [(limit, 0), (threshold - 1, 0), (threshold + 8, 1), (float("inf"), 1)]:
        x = torch.tensor([[top, 1.0]])
        data, _, _, sat = cast_with_scale(x, dtype, torch.tensor(1.0))
        assert sat.item() == saturated, top
        assert data.float()[0, 0].item() == limit  # in every case the largest element lands on fp8_max


def test_zero_and_nan_amaxes_keep_the_scale():
    """An all-zero input or a NaN gives no usable amax: the scale stays (TE's
    rule), the NaN is recorded as 0, and the next cast is as before."""
    torch.manual_seed(3)
    layer = Fp8Linear(64, 32, bias=False, recipe=delayed(amax_history_len=2, amax_compute_algo="most_recent"))
    x = torch.randn(16, 64)
    with torch.no_grad():
        layer(x)
        scale = layer.fp8_scale[0].clone()
        layer(torch.zeros_like(x))
        assert torch.equal(layer.fp8_scale[0], scale)
        bad = x.clone()
        bad[0, 0] = float("nan")
        layer(bad)
    assert torch.equal(layer.fp8_scale[0], scale)
    assert layer.fp8_amax_history[0, 0].item() == 0.0


def test_eval_mode_reads_the_history_and_records_nothing():
    torch.manual_seed(4)
    fresh = Fp8Linear(64, 32, recipe="delayed").eval()
    cur = Fp8Linear(64, 32, recipe="tensorwise")
    cur.load_state_dict(fresh.state_dict())
    x = torch.randn(16, 64)
    with torch.no_grad():
        assert torch.equal(fresh(x), cur(x))  # nothing recorded: current scaling, every call
        assert fresh.fp8_amax_count.tolist() == [0, 0, 0]
        trained = Fp8Linear(64, 32, recipe="delayed")
        trained.load_state_dict(fresh.state_dict())
        trained(x)
        trained(2 * x)
        trained.eval()
        before = {k: v.clone() for k, v in trained.state_dict().items()}
        trained(3 * x)
    assert all(torch.equal(v, trained.state_dict()[k]) for k, v in before.items())


# -------------------------------------------------------------- checkpoint
def _model(recipe):
    torch.manual_seed(5)
    m = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64), nn.GELU(), nn.Linear(64, 32))
    return convert_to_fp8(m, recipe=recipe, module_filter_fn=lambda mod, fqn: True)


def _train(model, opt, steps, start):
    losses = []
    for step in range(start, start + steps):
        gen = torch.Generator().manual_seed(1000 + step)
        x = torch.randn(32, 64, generator=gen) * (1 + step % 3)  # magnitudes move: the history matters
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


RESUME_RECIPE = delayed(amax_history_len=4)  # shorter than the run: rows drop out


def test_checkpoint_mid_training_resumes_bit_for_bit():
    """Train 8 steps; or train 4, save model and optimizer, load both into
    fresh objects, train 4 more: every loss, parameter and history equal."""
    ref = _model(RESUME_RECIPE)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    ref_losses = _train(ref, ref_opt, 8, 0)

    a = _model(RESUME_RECIPE)
    a_opt = torch.optim.AdamW(a.parameters(), lr=1e-2)
    losses = _train(a, a_opt, 4, 0)
    buf = io.BytesIO()
    torch.save({"model": a.state_dict(), "opt": a_opt.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    assert "0.fp8_amax_history" in ckpt["model"]

    b = _model(RESUME_RECIPE)
    b_opt = torch.optim.AdamW(b.parameters(), lr=1e-2)
    b.load_state_dict(ckpt["model"])
    b_opt.load_state_dict(ckpt["opt"])
    losses += _train(b, b_opt, 4, 4)
    assert losses == ref_losses
    for (k, v), (k2, v2) in zip(ref.state_dict().items(), b.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k

    # the control: the same checkpoint without its histories does not resume the run
    c = _model(RESUME_RECIPE)
    c_opt = torch.optim.AdamW(c.parameters(), lr=1e-2)
    c.load_state_dict({k: v for k, v in ckpt["model"].items() if "fp8_" not in k})
    c_opt.load_state_dict(ckpt["opt"])
    assert _train(c, c_opt, 4, 4) != ref_losses[4:]


def test_state_dicts_load_both_ways():
    plain = nn.Linear(64, 32)
    layer = Fp8Linear(64, 32, recipe="delayed")
    layer.load_state_dict(plain.state_dict())  # strict: the history starts fresh
    assert layer.fp8_amax_count.tolist() == [0, 0, 0] and torch.equal(layer.weight, plain.weight)
    with torch.no_grad():
        layer(torch.randn(16, 64))
    Fp8Linear(64, 32, recipe="tensorwise").load_state_dict(layer.state_dict())  # strict: ignored there
    resumed = Fp8Linear(64, 32, recipe="delayed")
    resumed.load_state_dict(layer.state_dict())
    assert resumed._fp8_recorded == [True, True, False]  # the host's flags follow the loaded counts
    short = Fp8Linear(64, 32, recipe=delayed(amax_history_len=16))
    with pytest.raises(RuntimeError, match=r"amax_history_len=1024 to resume it"):
        short.load_state_dict(layer.state_dict())


def test_meta_init_then_to_empty_then_reset_gives_a_fresh_history():
    """torchtitan's way: build on meta, to_empty (uninitialized memory), then
    initialize; reset_parameters (or reset_fp8_state) clears the history."""
    with torch.device("meta"):
        layer = Fp8Linear(64, 32, recipe="delayed")
    layer.to_empty(device="cpu")
    with torch.no_grad():
        layer.fp8_amax_history.fill_(7.0)  # what to_empty's memory may hold
    layer.reset_parameters()
    assert not layer.fp8_amax_history.any() and layer.fp8_amax_count.tolist() == [0, 0, 0]
    assert layer.fp8_scale.tolist() == [1.0, 1.0, 1.0] and layer._fp8_recorded == [False] * 3
    cur = Fp8Linear(64, 32, recipe="tensorwise")
    cur.load_state_dict(layer.state_dict())
    x = torch.randn(16, 64)
    assert torch.equal(layer(x), cur(x))


def test_convert_to_fp8_delayed_and_a_module_wide_dtype_change():
    model = _model("delayed")
    layers = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    assert len(layers) == 3 and all(m.recipe.name == "delayed" for m in layers)
    assert all(m.fp8_amax_history.device.type == "cpu" and m.fp8_amax_history.shape == (1024, 3) for m in layers)
    model.to(torch.bfloat16)  # converts the float buffers too: refused where it would go wrong
    with pytest.raises(TypeError, match="must stay float32"):
        model(torch.randn(16, 64, dtype=torch.bfloat16))


def test_delayed_casts_are_counted_and_tensorwise_ones_are_not():
    reset_linear_stats()
    x = torch.randn(16, 64, requires_grad=True)
    Fp8Linear(64, 32, recipe="tensorwise")(x).sum().backward()
    assert linear_stats()["delayed_casts"] == 0
    Fp8Linear(64, 32, recipe="delayed")(x).sum().backward()
    assert linear_stats()["delayed_casts"] == 3 and linear_stats()["fp8_calls"] == 2
    fp8comm.nn.reset_linear_stats()
    assert linear_stats()["delayed_casts"] == 0 and linear_stats()["saturated_casts"] == 0


# --------------------------------------------------------- across ranks
# Run on every rank of the pool (module-level: the ranks import this module).
# Each rank trains on its own batches, so its activations' and gradients'
# amaxes differ from the other rank's; its weights are the same everywhere.

def train_on_ranks(wrapper: str, reduce_amax: bool, fp8_all_gather: bool = False, steps: int = 3):
    """scenarios/fsdp.py's decoder with the delayed recipe under FSDP2 or DDP
    on the fp8 group: each Fp8Linear's history after `steps` steps, the
    losses, and linear_stats."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    from tests.support.harness import ctx
    from tests.support.scenarios import fsdp as S  # noqa: N812

    c = ctx()
    model = S.build("fp8", delayed(amax_history_len=8, reduce_amax=reduce_amax), fp8_all_gather=fp8_all_gather)
    if wrapper == "fsdp2":
        mesh = DeviceMesh.from_group(c.group, "cpu")
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        trained = model
    else:
        trained = DDP(model, process_group=c.group)
    reset_linear_stats()
    losses = S.train_losses(trained, torch.optim.AdamW(trained.parameters(), lr=3e-3), c.rank, steps)
    hist = {fqn: model.get_submodule(fqn).fp8_amax_history.clone() for fqn in S.fp8_fqns()}
    return hist, losses, linear_stats()


POOLS = [PoolSpec(2, "fp8gloo", pg_options={"min_numel": 1024})]


@pytest.mark.parametrize("wrapper", ["fsdp2", "ddp"])
def test_reduced_amaxes_give_every_rank_the_same_history(pool, wrapper):
    (h0, losses, stats), (h1, _, _) = pool.run(train_on_ranks, wrapper, True)
    for fqn, hist in h0.items():
        assert torch.equal(hist, h1[fqn]), fqn
        assert (hist[:3] > 0).all() and (hist[3:] == 0).all()  # 3 steps recorded, newest first
    assert losses[-1] < losses[0] and stats["fallback_calls"] == 0


def test_unreduced_amaxes_stay_per_rank_but_weights_agree(pool):
    """reduce_amax=False under FSDP2 (which leaves buffers alone): each rank
    keeps its own activation and gradient histories; the weight column still
    agrees, the gathered weight being the same on every rank."""
    (h0, _, _), (h1, _, _) = pool.run(train_on_ranks, "fsdp2", False)
    for fqn, hist in h0.items():
        assert not torch.equal(hist[:, 0], h1[fqn][:, 0]), fqn
        assert not torch.equal(hist[:, 2], h1[fqn][:, 2]), fqn
        assert torch.equal(hist[:, 1], h1[fqn][:, 1]), fqn


def test_fp8_all_gather_weights_arrive_cast_and_record_no_weight_amax(pool):
    """Under the FP8 all-gather the weight comes cast by the all-gather (the
    whole weight's current scale): nothing is recorded in its column."""
    for hist, losses, stats in pool.run(train_on_ranks, "fsdp2", True, fp8_all_gather=True):
        assert stats["weight_precast_calls"] == stats["fp8_calls"] > 0
        for fqn, h in hist.items():
            assert (h[:, 1] == 0).all() and (h[:3, 0] > 0).all() and (h[:3, 2] > 0).all(), fqn
        assert losses[-1] < losses[0]


@pytest.mark.full  # compiling takes tens of seconds
def test_compiled_layer_equals_eager_and_keeps_the_same_history():
    torch.manual_seed(6)
    eager = Fp8Linear(64, 32, recipe=delayed(amax_history_len=2))
    plain = Fp8Linear(64, 32, recipe=delayed(amax_history_len=2))
    plain.load_state_dict(eager.state_dict())
    compiled = torch.compile(plain)
    for step in range(3):
        x = torch.randn(16, 64) * (1 + step)
        ya, yb = eager(x), compiled(x)
        ya.sum().backward()
        yb.sum().backward()
        assert torch.equal(ya, yb) and torch.equal(eager.weight.grad, plain.weight.grad), step
        assert torch.equal(eager.fp8_amax_history, plain.fp8_amax_history), step
        assert torch.equal(eager.fp8_scale, plain.fp8_scale), step
