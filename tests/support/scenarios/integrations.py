"""Scenarios for tests/integrations/test_compile.py and
tests/integrations/test_checkpoint.py (run on every rank of a DistPool; see
tests/support/harness.py): torch.compile over functional collectives and FSDP2 on an
fp8gloo group, and torch.distributed.checkpoint of an FSDP2 FP8 model.

The models are scenarios/fsdp.py's tiny decoder, so these scenarios reuse its
build(), batches() and loss.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

import fp8comm
from tests.support.scenarios import fsdp as S
from tests.support.harness import ctx

_GROUPS: dict = {}

N = 4096  # elements per rank: above the group's min_numel (1024), a multiple of the block size


def compress_all_group():
    """An fp8gloo group that compresses all_gather too, created once per pool."""
    if "all" not in _GROUPS:
        _GROUPS["all"] = dist.new_group(backend="fp8gloo", pg_options=fp8comm.Options(compress="all", min_numel=1024))
    return _GROUPS["all"]


def _inputs(rank: int):
    gen = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(N, generator=gen), torch.randn(N, 8, generator=gen)


def _funcol_step(x, m, group):
    """Each functional collective once, with compute around them that is exact
    in FP32 (scaling by powers of two, adding small integers), so eager and
    compiled graphs must agree bit for bit."""
    import torch.distributed._functional_collectives as funcol

    # all_gather_tensor / reduce_scatter_tensor warn that *_single is their new
    # name; these are the names compiled code (DTensor, torchtitan) uses.
    ar = funcol.all_reduce(x * 2.0, "sum", group)
    ag = funcol.all_gather_tensor(m * 0.5, 0, group)
    rs = funcol.reduce_scatter_tensor(ag, "sum", 0, group)
    return ar + 1.0, ag, rs * 4.0


def funcol_eager_and_compiled(backend: str = "inductor"):
    """Runs _funcol_step eagerly, then compiled with ``backend``; returns the
    outputs, the stats after each and the gloo reference (exact results: the
    compressed ones must differ from them, proving FP8 was on the wire)."""
    import warnings

    import torch._dynamo

    warnings.filterwarnings("ignore", category=FutureWarning, module=__name__)
    c = ctx()
    group = compress_all_group()
    x, m = _inputs(c.rank)
    fp8comm.reset_stats(group)
    eager = [t.clone() for t in _funcol_step(x, m, group)]
    eager_stats = fp8comm.get_stats(group)

    torch._dynamo.reset()
    compiled_fn = torch.compile(_funcol_step, backend=backend, fullgraph=True)
    fp8comm.reset_stats(group)
    compiled = [t.clone() for t in compiled_fn(x, m, group)]
    compiled_stats = fp8comm.get_stats(group)

    exact = [t.clone() for t in _funcol_step(x, m, c.gloo)]
    return {"eager": eager, "compiled": compiled, "exact": exact,
            "eager_stats": eager_stats, "compiled_stats": compiled_stats}


def fsdp2_compiled_training(steps: int = 3, backend: str = "inductor"):
    """FSDP2 (fully_shard per block, then the root) over the fp8gloo group,
    Fp8Linear block layers, every block compiled with torch.compile
    (``backend``) as torchtitan does; ``steps`` AdamW steps. Returns the
    global mean losses, the eager run's losses for the same data, the group's
    stats of the compiled run and fp8comm.nn's counters."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    import torch._dynamo

    c = ctx()
    out = {}
    for mode in ("eager", "compiled"):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        model = S.build("fp8")
        mesh = DeviceMesh.from_group(c.group, "cpu")
        for i, block in enumerate(model.blocks):
            if mode == "compiled":
                block.compile(backend=backend)
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        fp8comm.reset_stats(c.group)
        fp8comm.nn.reset_linear_stats()
        losses = S.train_losses(model, opt, c.rank, steps)
        out[mode] = {"losses": losses, "stats": fp8comm.get_stats(c.group), "nn": fp8comm.nn.linear_stats(),
                     "frames": dict(torch._dynamo.utils.counters["frames"]),
                     "graph_breaks": dict(torch._dynamo.utils.counters["graph_break"])}
    return out


# ------------------------------------------------------------------ checkpoints
def _fsdp2_model(linear: str, fp8_all_gather: bool):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    c = ctx()
    model = S.build(linear, fp8_all_gather=fp8_all_gather)
    mesh = DeviceMesh.from_group(c.group, "cpu")
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=3e-3)


def _train(model, opt, data) -> list:
    losses = []
    for seq in data:
        loss = S._loss(model, seq)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(S._global_mean(loss))
    return losses


def _full(model) -> dict:
    return {k: v.full_tensor() for k, v in model.state_dict().items()}


def dcp_round_trip(ckpt_dir: str, fp8_all_gather: bool):
    """An FSDP2 FP8 model (Fp8Linear blocks, optionally the FP8 all-gather)
    over the fp8gloo group:

    1. trains 2 steps, saves model and optimizer with
       torch.distributed.checkpoint (``<ckpt_dir>/fp8``), trains 2 more;
    2. a fresh FP8 model (other seed) loads the checkpoint and trains the same
       2 steps: its losses and weights must equal those of step 1 bit for bit;
    3. a plain model (nn.Linear, no convert_to_fp8), FSDP2 over plain gloo,
       loads the FP8 checkpoint (the weights must equal the saved ones), trains
       1 step and saves ``<ckpt_dir>/plain``; a fresh FP8 model loads that
       back and must hold the plain model's weights.

    Returns the facts for the test to assert, and the stats of the fp8 group."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    c = ctx()
    data = S.batches(c.rank, 4)
    fp8comm.reset_stats(c.group)

    model, opt = _fsdp2_model("fp8", fp8_all_gather)
    _train(model, opt, data[:2])
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=f"{ckpt_dir}/fp8")
    saved = _full(model)
    sd_types = sorted({type(v._local_tensor).__name__ for v in model.state_dict().values()})
    continued = _train(model, opt, data[2:])
    after = _full(model)

    torch.manual_seed(7)
    model2, opt2 = _fsdp2_model("fp8", fp8_all_gather)
    with torch.no_grad():
        for p in model2.parameters():
            p.normal_()  # anything but the checkpoint
    msd2, osd2 = get_state_dict(model2, opt2)
    state = {"model": msd2, "optim": osd2}
    dcp.load(state, checkpoint_id=f"{ckpt_dir}/fp8")
    set_state_dict(model2, opt2, model_state_dict=state["model"], optim_state_dict=state["optim"])
    loaded_equal = all(torch.equal(v, saved[k]) for k, v in _full(model2).items())
    resumed = _train(model2, opt2, data[2:])
    resumed_equal = all(torch.equal(v, after[k]) for k, v in _full(model2).items())

    # into the plain model (its own gloo FSDP2 group), and back
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    plain = S.build("plain")
    plain_types = sorted({type(m).__name__ for m in plain.modules() if isinstance(m, torch.nn.Linear)})
    gloo_mesh = DeviceMesh.from_group(c.gloo, "cpu")
    for block in plain.blocks:
        fully_shard(block, mesh=gloo_mesh)
    fully_shard(plain, mesh=gloo_mesh)
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=3e-3)
    psd, posd = get_state_dict(plain, plain_opt)
    pstate = {"model": psd, "optim": posd}
    dcp.load(pstate, checkpoint_id=f"{ckpt_dir}/fp8")
    set_state_dict(plain, plain_opt, model_state_dict=pstate["model"], optim_state_dict=pstate["optim"])
    plain_loaded_equal = all(torch.equal(v, saved[k]) for k, v in _full(plain).items())
    _train(plain, plain_opt, data[2:3])
    psd, posd = get_state_dict(plain, plain_opt)
    dcp.save({"model": psd, "optim": posd}, checkpoint_id=f"{ckpt_dir}/plain")
    plain_after = _full(plain)

    model3, opt3 = _fsdp2_model("fp8", fp8_all_gather)
    msd3, osd3 = get_state_dict(model3, opt3)
    state3 = {"model": msd3, "optim": osd3}
    dcp.load(state3, checkpoint_id=f"{ckpt_dir}/plain")
    set_state_dict(model3, opt3, model_state_dict=state3["model"], optim_state_dict=state3["optim"])
    back_equal = all(torch.equal(v, plain_after[k]) for k, v in _full(model3).items())
    fp8_types = sorted({type(model3.get_submodule(f)).__name__ for f in S.fp8_fqns()})
    return {
        "sd_types": sd_types, "loaded_equal": loaded_equal, "continued": continued, "resumed": resumed,
        "resumed_equal": resumed_equal, "plain_types": plain_types, "plain_loaded_equal": plain_loaded_equal,
        "back_equal": back_equal, "fp8_types": fp8_types, "saved": saved if c.rank == 0 else None,
        "stats": fp8comm.get_stats(c.group),
    }
