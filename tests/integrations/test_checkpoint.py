"""Checkpoints stay neutral: convert_to_fp8 changes no
state_dict key, shape, dtype or tensor type, so a checkpoint of an FP8 model
is a checkpoint of the plain model. torch.distributed.checkpoint (DCP)
round-trips an FSDP2 FP8 model over fp8gloo (2 processes) with its optimizer,
bit for bit, and its checkpoints load into the unconverted model and back,
sharded (DCP) and unsharded (torch.load(weights_only=True))."""
from __future__ import annotations

import io

import pytest
import torch

import fp8comm
from fp8comm.nn import Fp8Linear
from tests.support.harness import PoolSpec, ctx
from tests.support.scenarios import fsdp as S


# ---------------------------------------------------------------- scenarios
# Run on every rank of the pool: module-level, the ranks import this module.
# torch.distributed.checkpoint of an FSDP2 FP8 model (scenarios/fsdp.py's
# tiny decoder) over the fp8gloo group.

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


# -------------------------------------------------------------------- tests


def _signature(sd):
    return [(k, tuple(v.shape), v.dtype, type(v)) for k, v in sd.items()]


@pytest.mark.parametrize("recipe,fp8_all_gather", [("tensorwise", False), ("tensorwise", True), ("rowwise", False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_convert_to_fp8_keeps_state_dict_keys_shapes_dtypes(recipe, fp8_all_gather, dtype):
    plain = S.build("plain").to(dtype)
    converted = S.build("plain").to(dtype)
    fp8comm.convert_to_fp8(converted, recipe=recipe, fp8_all_gather=fp8_all_gather,
                           module_filter_fn=lambda mod, fqn: fqn.startswith("blocks."))
    assert sum(isinstance(m, Fp8Linear) for m in converted.modules()) == len(S.fp8_fqns())  # it converted
    sd = converted.state_dict()
    assert _signature(sd) == _signature(plain.state_dict())
    assert all(type(v) is torch.Tensor for v in sd.values())
    assert all(torch.equal(v, plain.state_dict()[k]) for k, v in sd.items())

    # torch.save of the FP8 model -> weights_only load into the plain model, and back
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    target = S.build("plain").to(dtype)
    with torch.no_grad():
        for p in target.parameters():
            p.zero_()
    target.load_state_dict(torch.load(buf, weights_only=True), strict=True)
    assert all(torch.equal(v, sd[k]) for k, v in target.state_dict().items())

    with torch.no_grad():
        for p in target.parameters():
            p.mul_(2)
    buf = io.BytesIO()
    torch.save(target.state_dict(), buf)
    buf.seek(0)
    converted.load_state_dict(torch.load(buf, weights_only=True), strict=True)
    assert all(torch.equal(v, target.state_dict()[k]) for k, v in converted.state_dict().items())
    assert _signature(converted.state_dict()) == _signature(plain.state_dict())


POOLS = [PoolSpec(2, "fp8gloo", pg_options={"min_numel": 1024})]


@pytest.mark.parametrize("fp8_all_gather", [False, True])
def test_dcp_round_trips_fsdp2_fp8_model_and_loads_into_plain(pool, tmp_path, fp8_all_gather):
    results = pool.run(dcp_round_trip, str(tmp_path), fp8_all_gather, timeout=300)
    for r in results:
        assert r["sd_types"] == ["Tensor"]  # DTensor shards of plain tensors: nothing FP8-specific saved
        assert r["fp8_types"] == ["Fp8Linear"] and r["plain_types"] == ["Linear"]
        assert r["loaded_equal"], "the FP8 model reloaded different weights"
        assert r["resumed"] == r["continued"], "training resumed from the checkpoint diverged"
        assert r["resumed_equal"]
        assert r["plain_loaded_equal"], "the plain model loaded different weights"
        assert r["back_equal"], "the plain model's checkpoint did not load back into the FP8 model"
        assert r["stats"]["calls_compressed"] > 0  # the training ran on FP8 reduce-scatters

    # unsharded: DCP -> one torch.save file -> weights_only load into a plain, unconverted model
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(tmp_path / "fp8"), str(tmp_path / "fp8.pt"))
    ckpt = torch.load(tmp_path / "fp8.pt", weights_only=True)
    plain = S.build("plain")
    plain.load_state_dict(ckpt["model"], strict=True)
    saved = results[0]["saved"]
    assert all(torch.equal(v, saved[k]) for k, v in plain.state_dict().items())
    assert set(ckpt["optim"]["state"]) == set(saved)  # AdamW state for every parameter, by FQN
