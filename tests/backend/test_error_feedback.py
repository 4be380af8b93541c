"""Error feedback (DESIGN.md, "Error feedback"): the residual a compressed
all_reduce / reduce_scatter keeps is what the wire dropped of each input
element, so that result = exact reduction of (input + old residual) minus the
reduction of the new residuals, flat and in the inter_node scope, for SUM /
AVG / PREMUL_SUM, FP32 and BF16 tensors and residuals, and under stochastic
rounding; with a zero residual
the call is bitwise the call without one; an exact call leaves zeros; bad
residuals are refused where they enter. Through the DDP hook and FSDP2: on a
constant-gradient toy the accumulated error stays bounded with it and grows
without it; the residual survives DDP's bucket rebuild, is dropped with a
warning when a size changes, is saved and restored by parameter name, and is
counted in get_stats."""
from __future__ import annotations

import gc
import warnings

import pytest
import torch
import torch.distributed as dist

import fp8comm
import fp8comm.fsdp
import fp8comm.functional as F
import fp8comm.hooks
from tests.support.harness import PoolSpec, ctx
from tests.support.inputs import same_bits

PLAIN = {"fp8gloo": "gloo", "fp8ncclsim": "ncclsim"}
NUMEL = 4096 + 96  # per rank segment: several blocks and chunks, not a power of two


# ---------------------------------------------------------------- scenarios
# Run on every rank of the pool: module-level, the ranks import this module.

def _plain_group():
    return dist.new_group(list(range(ctx().world)), backend=PLAIN[dist.get_backend()])


def _gather(t: torch.Tensor) -> torch.Tensor:
    """Every rank's `t`, stacked, exactly (the pool's plain gloo group)."""
    out = [torch.empty_like(t) for _ in range(ctx().world)]
    dist.all_gather(out, t.contiguous(), group=ctx().gloo)
    return torch.stack(out)


def _input(rank: int, n: int, dtype, step: int) -> torch.Tensor:
    """Gaussian values whose blocks span magnitudes (so the wire drops something everywhere)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(n, generator=g) * torch.logspace(-3, 1, n).roll(137 * rank)
    return x.to(dtype)


def _reduce_op(name: str, rank: int):
    if name == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(0.75), 0.75
    return getattr(dist.ReduceOp, name), (1.0 / ctx().world if name == "AVG" else 1.0)


def residual_is_what_the_wire_dropped(op: str, dtype_name: str, reduce_name: str, residual_dtype: str,
                                      options: dict) -> dict:
    c = ctx()
    dtype, rdtype = getattr(torch, dtype_name), getattr(torch, residual_dtype)
    plain = _plain_group()
    reduce_op, factor = _reduce_op(reduce_name, c.rank)
    residual = torch.zeros(NUMEL * c.world, dtype=rdtype)
    report = {}
    for step in range(2):  # the second step starts from the first one's residual
        x = _input(c.rank, NUMEL * c.world, dtype, step)
        fed = (x.clone().add_(residual)).double()  # what the call reduces: the input plus the old residual
        if op == "all_reduce":
            out = x.clone()
            F.all_reduce(out, reduce_op, group=plain, options=fp8comm.Options(**options), residual=residual)
        else:
            out = torch.empty(NUMEL, dtype=dtype)
            F.reduce_scatter_tensor(out, x, reduce_op, group=plain, options=fp8comm.Options(**options),
                                    residual=residual)
        exact = _gather(fed).sum(0) * factor
        kept = _gather(residual.double()).sum(0) * factor
        if op == "reduce_scatter_tensor":
            exact = exact[c.rank * NUMEL:(c.rank + 1) * NUMEL]
            kept = kept[c.rank * NUMEL:(c.rank + 1) * NUMEL]
            own = residual[c.rank * NUMEL:(c.rank + 1) * NUMEL]
            report[f"own_zero_{step}"] = bool((own == 0).all())
        got = out.double()
        norm = exact.norm().item()
        report[f"dropped_{step}"] = (got - exact).norm().item() / norm      # the quantization error
        report[f"identity_{step}"] = (got - (exact - kept)).norm().item() / norm  # what the residual misses
        report[f"nonzero_{step}"] = bool((residual != 0).any())
    return report


def zero_residual_is_bitwise_no_residual(op: str, options: dict) -> dict:
    c = ctx()
    plain = _plain_group()
    x = _input(c.rank, NUMEL * c.world, torch.float32, 0)
    outs = []
    for residual in (None, torch.zeros(x.numel())):
        if op == "all_reduce":
            out = x.clone()
            F.all_reduce(out, group=plain, options=fp8comm.Options(**options), residual=residual)
        else:
            out = torch.empty(NUMEL)
            F.reduce_scatter_tensor(out, x.clone(), group=plain, options=fp8comm.Options(**options),
                                    residual=residual)
        outs.append(out)
    return {"same": same_bits(outs[0], outs[1])}


def exact_call_leaves_zeros() -> dict:
    plain = _plain_group()
    t = torch.ones(64)
    residual = torch.full((64,), 0.25)
    F.all_reduce(t, group=plain, options=fp8comm.Options(min_numel=1024), residual=residual)  # too small: exact
    return {"zeros": bool((residual == 0).all()), "result": t[0].item()}


def async_residual() -> dict:
    c = ctx()
    plain = _plain_group()
    x = _input(c.rank, NUMEL * c.world, torch.float32, 0)
    sync_r, async_r = torch.zeros(x.numel()), torch.zeros(x.numel())
    a, b = x.clone(), x.clone()
    F.all_reduce(a, group=plain, residual=sync_r)
    work = F.all_reduce(b, group=plain, async_op=True, residual=async_r)
    work.wait()
    return {"same": same_bits(a, b) and same_bits(sync_r, async_r)}


class _Constant(torch.nn.Module):
    """Parameters whose gradients are the same every step (rank-dependent),
    used in another order than they were registered (so DDP's bucket rebuild
    after the first step reorders its buckets)."""

    def __init__(self, rank: int, sizes=(3000, 2500, 3500)):
        super().__init__()
        self.a = torch.nn.Parameter(torch.zeros(sizes[0]))
        self.b = torch.nn.Parameter(torch.zeros(sizes[1]))
        self.c = torch.nn.Parameter(torch.zeros(sizes[2]))
        for i, p in enumerate((self.a, self.b, self.c)):
            self.register_buffer(f"g{i}", _input(rank, p.numel(), torch.float32, 10 + i))

    def forward(self):
        return (self.c * self.g2).sum() + (self.a * self.g0).sum() + (self.b * self.g1).sum()


def _ddp(model, state):
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(model, process_group=ctx().gloo, bucket_cap_mb=0.01)
    ddp.register_comm_hook(state, fp8comm.hooks.fp8_compress_hook)
    return ddp


def constant_gradient_toy(error_feedback, steps: int = 40) -> dict:
    """The sum of DDP's averaged gradients over the steps against the exact
    sum: relative error after 5 steps and after `steps`."""
    c = ctx()
    model = _Constant(c.rank)
    state = fp8comm.hooks.Fp8HookState(group=c.gloo, options=fp8comm.Options(min_numel=1024),
                                       error_feedback=error_feedback)
    ddp = _ddp(model, state)
    params = [model.a, model.b, model.c]
    exact = [_gather(g.double()).mean(0) for g in (model.g0, model.g1, model.g2)]
    total = [torch.zeros_like(e) for e in exact]
    errors = {}
    for step in range(1, steps + 1):
        ddp.zero_grad()
        ddp().backward()
        for t, p in zip(total, params):
            t += p.grad.double()
        if step in (5, steps):
            num = sum((t - step * e).norm() ** 2 for t, e in zip(total, exact)) ** 0.5
            den = sum((step * e).norm() ** 2 for e in exact) ** 0.5
            errors[step] = (num / den).item()
    return {"early": errors[5], "late": errors[steps], "bytes": fp8comm.get_stats(c.gloo).get("error_feedback_bytes"),
            "state_bytes": state.residual_bytes()}


def _recording_hook(seen: dict, layouts: dict, names: dict, step_of: list):
    """fp8_compress_hook that first records each parameter's residual as the
    hook finds it (seen[step][name]) and each bucket's parameters."""

    def hook(state, bucket):
        residual = state._bucket_residual(bucket, ctx().gloo)
        layout = fp8comm.hooks._layout(bucket)
        layouts.setdefault(step_of[0], []).append(tuple(names[k] for k, _, _ in layout))
        for key, offset, numel in layout:
            seen.setdefault(step_of[0], {})[names[key]] = residual[offset:offset + numel].clone()
        return fp8comm.hooks.fp8_compress_hook(state, bucket)

    return hook


def _recorded_ddp(model, state, seen, layouts, step_of):
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(model, process_group=ctx().gloo, bucket_cap_mb=0.01)
    ddp.register_comm_hook(state, _recording_hook(seen, layouts, {id(p): n for n, p in model.named_parameters()},
                                                  step_of))
    return ddp


def fsdp2_constant_gradient_toy(error_feedback, steps: int = 40) -> dict:
    """As constant_gradient_toy, through FSDP2 on the plain gloo mesh with
    fp8comm.fsdp's reduce-scatter: FSDP2's averaged gradients summed over the
    steps against the exact sum."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    c = ctx()
    model = _Constant(c.rank)
    exact = [_gather(g.double()).mean(0) for g in (model.g0, model.g1, model.g2)]
    fully_shard(model, mesh=DeviceMesh.from_group(c.gloo, "cpu"))
    fp8comm.fsdp.compress_communication(model, options=fp8comm.Options(min_numel=1024), error_feedback=error_feedback)
    params = [model.a, model.b, model.c]
    total = [torch.zeros_like(e) for e in exact]
    errors = {}
    for step in range(1, steps + 1):
        model.zero_grad()
        model().backward()
        for t, p in zip(total, params):
            t += p.grad.full_tensor().double()
        if step in (5, steps):
            num = sum((t - step * e).norm() ** 2 for t, e in zip(total, exact)) ** 0.5
            den = sum((step * e).norm() ** 2 for e in exact) ** 0.5
            errors[step] = (num / den).item()
    return {"early": errors[5], "late": errors[steps]}


def residual_survives_bucket_rebuild() -> dict:
    """Each parameter's residual at its bucket's first call of step 2 (after
    DDP rebuilt its buckets) is the one step 1 left for that parameter."""
    c = ctx()
    model = _Constant(c.rank)
    state = fp8comm.hooks.Fp8HookState(group=c.gloo, options=fp8comm.Options(min_numel=1024), error_feedback=True)
    seen, layouts, step_of = {}, {}, [0]
    ddp = _recorded_ddp(model, state, seen, layouts, step_of)
    left = None
    for step in range(2):
        step_of[0] = step
        ddp.zero_grad()
        ddp().backward()
        if step == 0:
            left = state.state_dict(model)["residuals"]
    kept = all(torch.equal(seen[1][name], left[name]) for name in left)
    return {"rebuilt": layouts[0] != layouts[1], "kept": kept, "nonzero": all(bool(v.any()) for v in left.values()),
            "params": sorted(left)}


def hook_state_dict_roundtrip() -> dict:
    """Residuals saved from one DDP and loaded into a fresh model and state
    (as after a restart) are the ones its buckets start from, whatever its
    bucket layout."""
    c = ctx()
    model = _Constant(c.rank)
    options = fp8comm.Options(min_numel=1024)
    state = fp8comm.hooks.Fp8HookState(group=c.gloo, options=options, error_feedback=torch.bfloat16)
    ddp = _ddp(model, state)
    for _ in range(2):
        ddp.zero_grad()
        ddp().backward()
    saved = state.state_dict(ddp)
    model2 = _Constant(c.rank)
    state2 = fp8comm.hooks.Fp8HookState(group=c.gloo, options=options, error_feedback=torch.bfloat16)
    state2.load_state_dict(saved, model2)
    seen, layouts, step_of = {}, {}, [0]
    ddp2 = _recorded_ddp(model2, state2, seen, layouts, step_of)
    ddp2.zero_grad()
    ddp2().backward()
    restored = all(torch.equal(seen[0][name], saved["residuals"][name]) for name in saved["residuals"])
    errors = []
    try:
        fp8comm.hooks.Fp8HookState(error_feedback=True).load_state_dict(saved, model2)
    except ValueError as e:
        errors.append(str(e))
    try:
        fp8comm.hooks.Fp8HookState(error_feedback=torch.bfloat16).load_state_dict(saved, torch.nn.Linear(2, 2))
    except ValueError as e:
        errors.append(str(e))
    return {"restored": restored, "nonzero": all(bool(v.any()) for v in saved["residuals"].values()),
            "dtype": str(saved["error_feedback"]), "errors": errors, "names": sorted(saved["residuals"])}


def size_change_drops_with_warning() -> dict:
    c = ctx()
    comm = fp8comm.fsdp.Fp8ReduceScatter(fp8comm.Options(min_numel=1024), error_feedback=True)
    caught = []
    for n in (NUMEL, NUMEL, 2 * NUMEL):
        x = _input(c.rank, n * c.world, torch.float32, 0)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            comm(torch.empty(n), x, c.gloo, dist.ReduceOp.SUM)
        caught.append([str(m.message) for m in w])
    return {"caught": caught, "kept": comm.residuals.nbytes()}


def fsdp2_error_feedback(error_feedback, steps: int = 3) -> dict:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    from tests.support.scenarios import fsdp as S

    c = ctx()
    gc.collect()  # the models of earlier calls (FSDP modules hold cycles), so stats count this one's residuals
    model = S.build("fp8")
    mesh = DeviceMesh.from_group(c.gloo, "cpu")
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    fp8comm.fsdp.compress_communication(model, options=fp8comm.Options(min_numel=1024),
                                        error_feedback=error_feedback)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = S.train_losses(model, opt, c.rank, steps)
    unsharded = sum(p.numel() for p in model.parameters())  # the DTensors' global sizes
    stats = fp8comm.get_stats(c.gloo)
    return {"losses": losses, "bytes": stats.get("error_feedback_bytes"), "unsharded": unsharded}


# ---------------------------------------------------------------- tests

POOLS = [
    PoolSpec(2, "fp8gloo", id="flat-2"),
    PoolSpec(3, "fp8gloo", id="flat-3"),
    PoolSpec(4, "fp8gloo", env={"FP8COMM_LOCAL_SIZE": "2"}, id="nodes-2x2", attrs={"scope": "inter_node"}),
    PoolSpec(3, "fp8ncclsim", id="ncclsim-3"),
    PoolSpec(4, "fp8ncclsim", env={"FP8COMM_LOCAL_SIZE": "2"}, id="ncclsim-nodes-2x2",
             attrs={"scope": "inter_node"}),
]


def _options(pool, **extra) -> dict:
    return {"min_numel": 1024, "scope": getattr(pool, "scope", "all"), **extra}


@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter_tensor"])
@pytest.mark.parametrize("reduce", ["SUM", "AVG", "PREMUL_SUM"])
@pytest.mark.parametrize("dtype,residual_dtype", [("float32", "float32"), ("bfloat16", "float32"),
                                                  ("float32", "bfloat16")])
def test_residual_is_what_the_wire_dropped(pool, op, reduce, dtype, residual_dtype):
    # What the residual misses is the FP32 / BF16 rounding of sums and of the
    # residual itself: far below what the wire drops (E4M3: a few percent).
    misses = {"float32": 1e-5, "bfloat16": 5e-3}
    bound = max(misses[dtype], misses[residual_dtype])
    for r in pool.run(residual_is_what_the_wire_dropped, op, dtype, reduce, residual_dtype, _options(pool)):
        for step in range(2):
            assert r[f"dropped_{step}"] > 5e-3, r
            assert r[f"identity_{step}"] < bound, r
            assert r[f"nonzero_{step}"], r
            if op == "reduce_scatter_tensor":
                assert r[f"own_zero_{step}"], r


@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter_tensor"])
def test_residual_under_stochastic_rounding(pool, op):
    # The residual decodes the bytes written, whichever way they were rounded.
    for r in pool.run(residual_is_what_the_wire_dropped, op, "float32", "SUM", "float32",
                      _options(pool, rounding="stochastic", wire_format="e5m2")):
        for step in range(2):
            assert r[f"dropped_{step}"] > 5e-3 and r[f"identity_{step}"] < 1e-5, r


@pytest.mark.pools("flat-3", "nodes-2x2", "ncclsim-nodes-2x2")
@pytest.mark.parametrize("wire_format", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter_tensor"])
def test_residual_of_the_4_bit_wire(pool, op, rounding, wire_format):
    # The 4-bit formats drop far more (a tenth of the signal); the identity holds as tightly.
    for r in pool.run(residual_is_what_the_wire_dropped, op, "float32", "SUM", "float32",
                      _options(pool, rounding=rounding, wire_format=wire_format)):
        for step in range(2):
            assert r[f"dropped_{step}"] > 5e-2 and r[f"identity_{step}"] < 1e-5, r


@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter_tensor"])
def test_zero_residual_is_bitwise_no_residual(pool, op):
    for r in pool.run(zero_residual_is_bitwise_no_residual, op, _options(pool)):
        assert r["same"], r


@pytest.mark.pools("flat-2")
def test_an_exact_call_leaves_zeros(pool):
    for r in pool.run(exact_call_leaves_zeros):
        assert r == {"zeros": True, "result": 2 * 1.25}, r


@pytest.mark.pools("flat-3")
def test_async_residual_is_the_sync_one(pool):
    for r in pool.run(async_residual):
        assert r["same"], r


@pytest.mark.pools("flat-2", "flat-3")
def test_constant_gradient_error_bounded_with_feedback_grows_without(pool):
    without = pool.run(constant_gradient_toy, False)
    with_ef = pool.run(constant_gradient_toy, True)
    for r in without:
        # No feedback: the same rounding every step, so the relative error stays put
        # and the absolute error grows with the steps.
        assert r["late"] > 0.5 * r["early"] and r["early"] > 1e-3, r
        assert r["bytes"] is None and r["state_bytes"] == 0, r
    for r, base in zip(with_ef, without):
        # Feedback: the absolute error is one step's residual at most, so the
        # relative one falls like 1 / steps.
        assert r["late"] < 0.25 * r["early"], r
        assert r["late"] < 0.1 * base["late"], (r, base)
        assert r["bytes"] == r["state_bytes"] == 4 * (3000 + 2500 + 3500), r


@pytest.mark.pools("flat-2", "flat-3")
def test_fsdp2_constant_gradient_error_bounded_with_feedback(pool):
    without = pool.run(fsdp2_constant_gradient_toy, False)
    with_ef = pool.run(fsdp2_constant_gradient_toy, True)
    for r, base in zip(with_ef, without):
        assert base["late"] > 0.5 * base["early"] and base["early"] > 1e-3, base
        assert r["late"] < 0.25 * r["early"] and r["late"] < 0.1 * base["late"], (r, base)


@pytest.mark.pools("flat-2", "flat-3")
def test_residual_survives_bucket_rebuild(pool):
    for r in pool.run(residual_survives_bucket_rebuild):
        assert r["rebuilt"], r  # else this test proves nothing
        assert r["kept"] and r["nonzero"], r
        assert r["params"] == ["a", "b", "c"], r


@pytest.mark.pools("flat-2")
def test_hook_state_dict_roundtrip(pool):
    for r in pool.run(hook_state_dict_roundtrip):
        assert r["restored"] and r["nonzero"], r
        assert r["names"] == ["a", "b", "c"] and r["dtype"] == "torch.bfloat16", r
        assert "saved with error_feedback=torch.bfloat16" in r["errors"][0], r
        assert "the model has no parameters named ['a', 'b', 'c']" in r["errors"][1], r


@pytest.mark.pools("flat-2")
def test_size_change_drops_with_a_warning(pool):
    for r in pool.run(size_change_drops_with_warning):
        assert r["caught"][0] == [] and r["caught"][1] == [], r
        assert len(r["caught"][2]) == 1, r
        assert "changed from 8384 elements on cpu to 16768" in r["caught"][2][0], r
        assert "residual is dropped" in r["caught"][2][0], r
        assert r["kept"] == 4 * 2 * NUMEL * 2, r


@pytest.mark.pools("flat-2")
def test_fsdp2_error_feedback_memory_in_stats(pool):
    f32 = pool.run(fsdp2_error_feedback, True)
    bf16 = pool.run(fsdp2_error_feedback, torch.bfloat16)
    for r, h in zip(f32, bf16):
        assert all(map(lambda v: v == v, r["losses"])), r  # trains, finite
        assert r["bytes"] >= 4 * r["unsharded"], r  # one FP32 value per (padded) gradient element
        assert h["bytes"] * 2 == r["bytes"], (r, h)


def test_bad_residuals_are_refused_where_they_enter():
    import fp8comm.functional as Fn

    t = torch.ones(8)
    with pytest.raises(ValueError, match=r"error_feedback must be False, True .*got 'yes'"):
        fp8comm.hooks.Fp8HookState(error_feedback="yes")
    with pytest.raises(ValueError, match=r"error_feedback applies to the gradients' reduce-scatter"):
        fp8comm.fsdp.compress_communication(torch.nn.Linear(2, 2), reduce_scatter=False, error_feedback=True)
    checks = [
        (dict(residual=torch.zeros(7)), ValueError, r"residual has 7 elements but the tensor has 8"),
        (dict(residual=torch.zeros(8, dtype=torch.float16)), ValueError, r"contiguous float32 or bfloat16"),
        (dict(residual=torch.zeros(16)[::2]), ValueError, r"not contiguous"),
        (dict(residual=torch.zeros(8), op=dist.ReduceOp.MAX), ValueError, r"needs a sum \(SUM, AVG, PREMUL_SUM\)"),
    ]
    for kwargs, error, message in checks:
        with pytest.raises(error, match=message):
            Fn._feed_back(kwargs["residual"], t, kwargs.get("op", dist.ReduceOp.SUM), "all_reduce", "tensor")
    with pytest.raises(TypeError, match=r"needs a floating-point tensor, got torch.int64"):
        Fn._feed_back(torch.zeros(8), torch.ones(8, dtype=torch.long), dist.ReduceOp.SUM, "all_reduce", "tensor")
    assert torch.equal(t, torch.ones(8))  # nothing added before a refusal
