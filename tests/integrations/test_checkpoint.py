"""Checkpoints stay neutral: convert_to_fp8 changes no
state_dict key, shape, dtype or tensor type, so a checkpoint of an FP8 model
is a checkpoint of the plain model. torch.distributed.checkpoint (DCP)
round-trips an FSDP2 FP8 model over fp8gloo (2 processes) with its optimizer,
bit for bit, and its checkpoints load into the unconverted model and back,
sharded (DCP) and unsharded (torch.load(weights_only=True))."""
import io

import pytest
import torch

import fp8comm
from fp8comm.nn import Fp8Linear
from tests.support.harness import PoolSpec
from tests.support.scenarios import fsdp as S
from tests.support.scenarios import integrations as I


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
    results = pool.run(I.dcp_round_trip, str(tmp_path), fp8_all_gather, timeout=300)
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
