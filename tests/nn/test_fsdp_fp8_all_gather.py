"""The FSDP2 FP8 all-gather of Fp8Linear weights (fp8comm/nn/fsdp.py): the
gathered bytes are the unsharded cast's bytes, the model computes bitwise what
it computes without the extension, the all-gather moves 1 byte per weight
element while norms and embeddings stay exact, state_dicts stay plain, rowwise
stays exact, and models with wrapped weights train under DDP and FSDP1.
Multi-rank cases run on 2 (and 3) real processes over fp8gloo."""
from __future__ import annotations

import copy
import inspect
import io
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import fp8comm
from tests.support.harness import DistPool, PoolSpec, ctx
from tests.support.scenarios import fsdp as S
from tests.support.stats import calls as stats_calls
from fp8comm.nn import Fp8AllGatherWeight, Fp8Linear, Fp8WeightCast, convert_to_fp8
from fp8comm.nn.linear import scaled_mm_cpu
from fp8comm.nn.scaling import cast_to_fp8


# ---------------------------------------------------------------- scenarios
# Run on every rank of the pool: module-level, the ranks import this module.
# scenarios/fsdp.py's tiny decoder (shared) under FSDP2, DDP and FSDP1 on the
# fp8 group, with what each forward saw of its weights.

def _capture(model):
    """Forward pre-hooks recording the weight each module sees in forward:
    Fp8Linear weights as (kind, fp8 bytes, inverse scale) or the plain
    tensor; norms and the embedding as the tensor."""
    seen, handles = {}, []
    for fqn, mod in model.named_modules():
        if isinstance(mod, (Fp8Linear, S.RMSNorm, nn.Embedding)):
            def hook(m, args, fqn=fqn):
                if fqn in seen:
                    return
                w = m.weight
                if isinstance(w, Fp8WeightCast):
                    seen[fqn] = ("fp8", w._data.detach().view(torch.uint8).clone(), w._inv_scale.clone())
                else:
                    seen[fqn] = ("hp", w.detach().clone(), None)
            handles.append(mod.register_forward_pre_hook(hook))
    return seen, handles


_COMPRESS_ALL = {}


def fsdp2_run(ext: bool, recipe: str = "tensorwise", steps: int = 3, mp: str | None = None,
              precompute: bool = False, linear: str = "fp8", plain_backend: bool = False,
              compress_all: bool = False):
    """FSDP2 (fully_shard per block, then the root) on the fp8 group (or plain
    gloo, or an fp8gloo group compressing all_gather too). Returns the
    reference full weights, what a no-grad forward gathered (captured weights,
    output, comm stats), the training losses, the stats of the training, and
    the state_dict after it."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    c = ctx()
    pg = c.gloo if plain_backend else c.group
    if compress_all:
        if "pg" not in _COMPRESS_ALL:
            _COMPRESS_ALL["pg"] = dist.new_group(backend="fp8gloo",
                                                 pg_options=fp8comm.Options(compress="all", min_numel=1024))
        pg = _COMPRESS_ALL["pg"]
    model = S.build(linear, recipe, fp8_all_gather=ext)
    full = {k: v.detach().clone() for k, v in model.state_dict().items()}
    mesh = DeviceMesh.from_group(pg, "cpu")
    kwargs = {"mesh": mesh}
    if mp:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=getattr(torch, mp))
    for block in model.blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = S.batches(c.rank, steps + 1)
    fp8comm.nn.reset_linear_stats()
    if precompute:
        fp8comm.precompute_fp8_scales_for_fsdp(model)

    # one forward, no grad: what the all-gathers carry
    seen, handles = _capture(model)
    if not plain_backend:
        fp8comm.reset_stats(pg)
    with torch.no_grad():
        out0 = model(data[-1][:, :-1]).detach().clone()
    fwd_stats = None if plain_backend else fp8comm.get_stats(pg)
    for h in handles:
        h.remove()
    precast_calls = fp8comm.nn.linear_stats()["weight_precast_calls"]

    if not plain_backend:
        fp8comm.reset_stats(pg)
    losses = []
    for step in range(steps):
        loss = S._loss(model, data[step])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if precompute:
            fp8comm.precompute_fp8_scales_for_fsdp(model)
        losses.append(S._global_mean(loss))
    train_stats = None if plain_backend else fp8comm.get_stats(pg)

    sd = model.state_dict()
    sd_types = {k: (type(v).__name__, type(v._local_tensor).__name__) for k, v in sd.items()}
    sd_full = {k: v.full_tensor() for k, v in sd.items()}
    weight_types = {fqn: type(m.weight._local_tensor).__name__ for fqn, m in model.named_modules()
                    if isinstance(m, Fp8Linear)}
    return {
        "full": full, "seen": seen, "out0": out0, "fwd_stats": fwd_stats, "precast_calls": precast_calls,
        "losses": losses, "train_stats": train_stats, "sd_types": sd_types, "sd_full": sd_full,
        "weight_types": weight_types,
    }


def stale_precompute_is_not_used():
    """precompute, then change the weights in place without precomputing
    again: the next all-gather must cast with the new amax."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    c = ctx()
    model = S.build("fp8", fp8_all_gather=True)
    mesh = DeviceMesh.from_group(c.group, "cpu")
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    assert fp8comm.precompute_fp8_scales_for_fsdp(model) == len(S.fp8_fqns())
    with torch.no_grad():
        for fqn in S.fp8_fqns():
            model.get_submodule(fqn).weight.mul_(3.0)  # amax x3: a stale scale would saturate
    seen, handles = _capture(model)
    fp8comm.reset_stats(c.group)
    with torch.no_grad():
        model(S.batches(c.rank, 1)[0][:, :-1])
    stats = fp8comm.get_stats(c.group)
    ok = {}
    for fqn in S.fp8_fqns():
        full_w = model.get_submodule(fqn).weight.full_tensor()
        data, inv = cast_to_fp8(full_w, torch.float8_e4m3fn, rowwise=False)
        _, got, got_inv = seen[fqn]
        ok[fqn] = torch.equal(got, data.view(torch.uint8)) and torch.equal(got_inv, inv)
    return ok, stats


def load_plain_checkpoint_into_fsdp2(sd_full: dict):
    """A checkpoint of a plain model (full tensors) loaded into an FSDP2 model
    whose Fp8Linear weights are all-gathered as FP8: its forward must equal
    that of an unsharded plain-nn.Linear model holding the same values run
    through Fp8Linear."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import distribute_tensor

    c = ctx()
    model = S.build("fp8", fp8_all_gather=True)
    torch.manual_seed(123)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()  # anything but the checkpoint
    mesh = DeviceMesh.from_group(c.group, "cpu")
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    sharded = {k: distribute_tensor(v, mesh, [torch.distributed.tensor.Shard(0)]) for k, v in sd_full.items()}
    model.load_state_dict(sharded)
    types = {fqn: type(model.get_submodule(fqn).weight._local_tensor).__name__ for fqn in S.fp8_fqns()}
    x = S.batches(c.rank, 1)[0][:, :-1]
    with torch.no_grad():
        out = model(x)
    ref = S.build("fp8", fp8_all_gather=False)
    ref.load_state_dict(sd_full)
    with torch.no_grad():
        out_ref = ref(x)
    return types, torch.equal(out, out_ref)


def ddp_run(ext: bool, steps: int = 4):
    """DDP over the fp8 group; Fp8Linear weights optionally wrapped for the FP8
    all-gather (unused by DDP)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    c = ctx()
    model = S.build("fp8", fp8_all_gather=ext)
    wrapped = [isinstance(model.get_submodule(f).weight, Fp8AllGatherWeight) for f in S.fp8_fqns()]
    ddp = DDP(model, process_group=c.group)
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-3)
    fp8comm.reset_stats(c.group)
    losses = S.train_losses(ddp, opt, c.rank, steps)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return wrapped, losses, flat, fp8comm.get_stats(c.group)


def fsdp1_run(which: str, steps: int = 8):
    """FSDP1 (FullyShardedDataParallel, use_orig_params=True): "fp8" =
    Fp8Linear with FP8-all-gather weights over the fp8 group, "plain" =
    nn.Linear over gloo."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    c = ctx()
    model = S.build("fp8" if which == "fp8" else "plain", fp8_all_gather=which == "fp8")
    wrapped = [isinstance(model.get_submodule(f).weight, Fp8AllGatherWeight) for f in S.fp8_fqns()]
    pg = c.group if which == "fp8" else c.gloo
    fsdp = FSDP(model, process_group=pg, use_orig_params=True, device_id=torch.device("cpu"))
    opt = torch.optim.AdamW(fsdp.parameters(), lr=1e-2)
    if which == "fp8":
        fp8comm.reset_stats(pg)
        fp8comm.nn.reset_linear_stats()
    losses = S.train_losses(fsdp, opt, c.rank, steps)
    stats = fp8comm.get_stats(pg) if which == "fp8" else None
    fp8_calls = fp8comm.nn.linear_stats()["fp8_calls"] if which == "fp8" else 0
    return wrapped, losses, stats, fp8_calls


def count_forward_casts(ext: bool, recipe: str = "tensorwise"):
    """One no-grad forward of the FSDP2 model: every FP8 cast it makes, as
    (kind, shape): "shard" for the all-gather's casts of a weight shard (with
    the whole weight's amax), "weight" for a cast of a weight an Fp8Linear
    holds in its forward, "input" for the rest; through scaling.cast_fp8 and
    the delayed recipe's cast alike. Also the FP8 bytes each Fp8Linear's
    weight arrived as (their data_ptr) and the weight operand each forward
    GEMM got."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    from fp8comm.nn import delayed as D
    from fp8comm.nn import linear as L
    from fp8comm.nn import scaling as SC

    c = ctx()
    model = S.build("fp8", recipe, fp8_all_gather=ext)
    mesh = DeviceMesh.from_group(c.group, "cpu")
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    casts, arrived, gemm_weights, held = [], [], [], set()
    cast, dcast, mm = SC.cast_fp8, D.DelayedState.cast, L._mm

    def kind(x, kwargs):
        if kwargs.get("amax") is not None:
            return "shard"
        return "weight" if x.data_ptr() in held else "input"

    def counting_cast(x, *args, **kwargs):
        casts.append((kind(x, kwargs), tuple(x.shape)))
        return cast(x, *args, **kwargs)

    def counting_dcast(self, x, *args, **kwargs):
        casts.append((kind(x, kwargs), tuple(x.shape)))
        return dcast(self, x, *args, **kwargs)

    def recording_mm(a, b, *args, **kwargs):
        gemm_weights.append(b.data_ptr())
        return mm(a, b, *args, **kwargs)

    def pre_hook(mod, args):
        w = mod.weight
        # The running module's weight alone: an unsharded weight freed after its
        # forward leaves its address to a later layer's activations.
        held.clear()
        held.add(w._data.data_ptr() if isinstance(w, Fp8WeightCast) else w.data_ptr())
        arrived.append(w._data.data_ptr() if isinstance(w, Fp8WeightCast) else None)

    handles = [m.register_forward_pre_hook(pre_hook) for m in model.modules() if isinstance(m, Fp8Linear)]
    SC.cast_fp8 = L.cast_fp8 = counting_cast
    D.DelayedState.cast = counting_dcast
    L._mm = recording_mm
    try:
        with torch.no_grad():
            model(S.batches(c.rank, 1)[0][:, :-1])
    finally:
        SC.cast_fp8 = L.cast_fp8 = cast
        D.DelayedState.cast = dcast
        L._mm = mm
        for h in handles:
            h.remove()
    weight_shapes = [tuple(model.get_submodule(fqn).weight.shape) for fqn in S.fp8_fqns()]
    return casts, arrived, gemm_weights, weight_shapes


# -------------------------------------------------------------------- tests

E4M3 = torch.float8_e4m3fn


# min_numel 1024: the gradient reduce-scatters of this small model are FP8-compressed
POOLS = [PoolSpec(2, "fp8gloo", pg_options={"min_numel": 1024})]


@pytest.fixture(scope="module")
def runs(pool):
    """Scenario results by arguments, computed once per module."""
    cache = {}

    def get(**kwargs):
        bound = inspect.signature(fsdp2_run).bind(**kwargs)
        bound.apply_defaults()  # runs(ext=True) and runs(ext=True, mp=None) are one run
        key = tuple(sorted(bound.arguments.items()))
        if key not in cache:
            cache[key] = pool.run(fsdp2_run, **kwargs)
        return cache[key]

    return get


def assert_bytes_of_unsharded_cast(result, dtype=None):
    for fqn in S.fp8_fqns():
        full_w = result["full"][fqn + ".weight"]
        if dtype is not None:
            full_w = full_w.to(dtype)
        data, inv_scale = cast_to_fp8(full_w, E4M3, rowwise=False)
        kind, got, got_inv = result["seen"][fqn]
        assert kind == "fp8", fqn
        assert torch.equal(got, data.view(torch.uint8)), fqn
        assert torch.equal(got_inv, inv_scale), fqn


# ------------------------------------------------------------ the FP8 bytes
@pytest.mark.parametrize("mp,precompute", [(None, False), (None, True), ("bfloat16", False)])
def test_gathered_bytes_equal_the_unsharded_cast(runs, mp, precompute):
    """Same global amax -> same scale -> same bytes as cast_to_fp8 of the whole
    weight (in FSDP2's param_dtype under mixed precision), on every rank."""
    results = runs(ext=True, mp=mp, precompute=precompute)
    for r in results:
        assert_bytes_of_unsharded_cast(r, getattr(torch, mp) if mp else None)
        assert r["precast_calls"] == len(S.fp8_fqns())  # the forward used them without casting again


@pytest.mark.parametrize("recipe", ["tensorwise", "delayed"])
def test_forward_pays_no_cast_of_the_gathered_weight(pool, recipe):
    """With the FP8 all-gather, each forward GEMM's weight operand is the
    gathered FP8 bytes themselves, and the forward casts no weight: the only
    weight casts are of the shards (half a weight each, in the all-gather).
    The control: with the exact all-gather each whole weight is cast once."""
    layers = len(S.fp8_fqns())
    for ext_run, base_run in zip(pool.run(count_forward_casts, True, recipe),
                                 pool.run(count_forward_casts, False, recipe)):
        casts, arrived, gemm_weights, weight_shapes = ext_run
        assert None not in arrived and len(arrived) == layers
        assert gemm_weights == arrived  # the bytes as they arrived, one forward GEMM each
        assert [c for c in casts if c[0] == "weight"] == []
        assert sorted(shape for k, shape in casts if k == "shard") == sorted((r // 2, k) for r, k in weight_shapes)
        assert len([c for c in casts if c[0] == "input"]) == layers
        casts, arrived, gemm_weights, weight_shapes = base_run
        assert arrived == [None] * layers
        assert sorted(shape for k, shape in casts if k == "weight") == sorted(weight_shapes)
        assert len([c for c in casts if c[0] == "input"]) == layers and len(casts) == 2 * layers


def test_uneven_shards_three_ranks():
    """3 ranks: 128 and 64 rows do not split evenly; the padded shards still
    give the unsharded cast's bytes, and the output equals the plain all-gather's."""
    p = DistPool(3, backend="fp8gloo", pg_options={"min_numel": 1024})
    try:
        ext = p.run(fsdp2_run, ext=True, steps=1)
        base = p.run(fsdp2_run, ext=False, steps=1)
    finally:
        p.close()
    for r, b in zip(ext, base):
        assert_bytes_of_unsharded_cast(r)
        assert torch.equal(r["out0"], b["out0"])
        assert r["losses"] == b["losses"]


def test_stale_precomputed_scale_is_not_used(pool):
    for ok, stats in pool.run(stale_precompute_is_not_used):
        assert all(ok.values()), ok
        assert stats["per_op"]["all_reduce"]["passthrough"] == len(S.fp8_fqns())  # fell back to its own amax


# ------------------------------------------------- same model, same numbers
def test_forward_bitwise_equal_with_and_without_the_extension(runs):
    ext, base = runs(ext=True), runs(ext=False)
    for r, b in zip(ext, base):
        assert all(r["seen"][f][0] == "fp8" for f in S.fp8_fqns())
        assert all(b["seen"][f][0] == "hp" for f in S.fp8_fqns())  # the baseline really gathered high precision
        assert torch.equal(r["out0"], b["out0"])


@pytest.mark.parametrize("mp", [None, "bfloat16"])
def test_forward_bitwise_equal_under_mixed_precision(runs, mp):
    ext, base = runs(ext=True, mp=mp), runs(ext=False, mp=mp)
    for r, b in zip(ext, base):
        assert torch.equal(r["out0"], b["out0"])


@pytest.mark.parametrize("precompute", [False, True])
def test_training_matches_the_plain_all_gather(runs, precompute):
    """Same casts in forward and backward, so training is the same: losses
    match (here bitwise), and the weight gradients reached the sharded
    high-precision weights (they moved, identically)."""
    ext, base = runs(ext=True, precompute=precompute), runs(ext=False)
    for r, b in zip(ext, base):
        assert r["losses"] == b["losses"]  # "close" holds trivially: they are equal
        for fqn in S.fp8_fqns():
            key = fqn + ".weight"
            assert not torch.equal(r["sd_full"][key], r["full"][key])
            assert torch.equal(r["sd_full"][key], b["sd_full"][key])
        assert r["losses"][-1] < r["losses"][0]


def test_gradients_are_reduce_scattered_in_fp8(runs):
    for r in runs(ext=True):
        rs = r["train_stats"]["per_op"]["reduce_scatter_tensor"]
        assert rs["compressed"] == 3 * 3  # 3 steps x (2 blocks + root), all compressed by fp8gloo
        assert rs["passthrough"] == 0


# ------------------------------------------------------------- bytes moved
def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def expected_forward_bytes(full: dict, world: int, ext: bool) -> int:
    """Bytes one rank sends in one forward (all_gather sends (P-1) x its input):
    per FSDP group the padded shards of its parameters, 1 byte per element for
    FP8-gathered weights, 4 for every other (FP32) parameter; plus one 4-byte
    all_reduce MAX of the amax per FP8 weight (counted 2(P-1)/P x 4)."""
    fp8_keys = {f + ".weight" for f in S.fp8_fqns()}
    total = 0
    for key, t in full.items():
        rows = -(-t.shape[0] // world)
        per_rank = rows * _numel(t.shape[1:])
        total += (world - 1) * per_rank * (1 if ext and key in fp8_keys else 4)
    if ext:
        total += len(fp8_keys) * 2 * (world - 1) * 4 // world
    return total


def test_all_gather_moves_one_byte_per_weight_element(runs):
    ext, base = runs(ext=True), runs(ext=False)
    for r, b in zip(ext, base):
        fs, bs = r["fwd_stats"], b["fwd_stats"]
        assert fs["bytes_sent"] == expected_forward_bytes(r["full"], 2, ext=True)
        assert bs["bytes_sent"] == expected_forward_bytes(b["full"], 2, ext=False)
        # one all-gather per FSDP group, passed through (FP8 bytes travel as bytes);
        # one all_reduce (MAX of amaxes) per FP8 weight
        calls = stats_calls(fs)
        assert calls["all_gather_into_tensor"] == {"compressed": 0, "passthrough": S.BLOCKS + 1}
        assert calls["all_reduce"] == {"compressed": 0, "passthrough": len(S.fp8_fqns())}
        assert fs["per_op"]["all_reduce"]["passthrough_reasons"] == {"reduce op": len(S.fp8_fqns())}
        fp8_elems = sum(r["full"][f + ".weight"].numel() for f in S.fp8_fqns())
        assert bs["bytes_sent"] - fs["bytes_sent"] == 3 * fp8_elems // 2 - len(S.fp8_fqns()) * 4


def test_precompute_takes_one_all_reduce_per_step(runs):
    r0 = runs(ext=True, precompute=True)[0]
    assert "all_reduce" not in r0["fwd_stats"]["per_op"]  # the forward used the precomputed amaxes
    assert r0["train_stats"]["per_op"]["all_reduce"]["passthrough"] == 3  # one per step, for all four weights
    no_pre = runs(ext=True)[0]
    # without: one per weight per all-gather (forward and the backward re-gather of each block)
    assert no_pre["train_stats"]["per_op"]["all_reduce"]["passthrough"] == 3 * 2 * len(S.fp8_fqns())


def test_norms_and_embeddings_stay_exact(runs):
    for r in runs(ext=True):
        for fqn, (kind, got, _) in r["seen"].items():
            if fqn in S.fp8_fqns():
                continue
            assert kind == "hp"
            assert torch.equal(got, r["full"][fqn + ".weight"]), fqn


def test_mixed_groups_pass_through_even_with_all_gather_compression(runs):
    """compress=all on the group: a block group (FP8 weights + FP32 norm and
    bias) travels as one uint8 buffer, which the backend passes through, so
    its norm is still exact; the root group (no FP8 weight) is compressed."""
    for r in runs(ext=True, compress_all=True):
        assert_bytes_of_unsharded_cast(r)
        for i in range(S.BLOCKS):
            kind, got, _ = r["seen"][f"blocks.{i}.norm"]
            assert torch.equal(got, r["full"][f"blocks.{i}.norm.weight"])
        assert not torch.equal(r["seen"]["embed"][1], r["full"]["embed.weight"])  # FP8 blocks: compression was on
        ag = stats_calls(r["fwd_stats"])["all_gather_into_tensor"]
        assert ag == {"compressed": 1, "passthrough": S.BLOCKS}
        assert r["fwd_stats"]["per_op"]["all_gather_into_tensor"]["passthrough_reasons"] == {"dtype": S.BLOCKS}


# -------------------------------------------------------------- state_dict
def test_state_dict_is_plain_and_round_trips(runs, pool):
    r, b = runs(ext=True)[0], runs(ext=False)[0]
    assert set(r["sd_types"]) == set(b["sd_types"]) == set(S.build("plain").state_dict())
    assert all(types == ("DTensor", "Tensor") for types in r["sd_types"].values())
    assert all(t == "Fp8AllGatherWeight" for t in r["weight_types"].values())  # the parameters stay wrapped
    plain = S.build("plain")  # nn.Linear, no FSDP: loads the FSDP2 + FP8 all-gather checkpoint
    plain.load_state_dict(r["sd_full"])
    for k, v in plain.state_dict().items():
        assert torch.equal(v, r["sd_full"][k])
    # and back: that checkpoint into an FSDP2 model with the extension
    for types, same in pool.run(load_plain_checkpoint_into_fsdp2, plain.state_dict()):
        assert set(types.values()) == {"Fp8AllGatherWeight"}
        assert same


# ----------------------------------------------------------------- rowwise
def test_rowwise_keeps_the_exact_all_gather(runs):
    with pytest.warns(UserWarning, match="tensorwise recipe only"):
        model = S.build("fp8", recipe="rowwise", fp8_all_gather=True)
    assert not any(isinstance(model.get_submodule(f).weight, Fp8AllGatherWeight) for f in S.fp8_fqns())
    ext, base = runs(ext=True, recipe="rowwise"), runs(ext=False, recipe="rowwise")
    for r, b in zip(ext, base):
        assert all(r["seen"][f][0] == "hp" for f in S.fp8_fqns())
        assert r["fwd_stats"]["bytes_sent"] == expected_forward_bytes(r["full"], 2, ext=False)
        assert torch.equal(r["out0"], b["out0"])
        assert r["losses"] == b["losses"]


# ------------------------------------------------------------ DDP and FSDP1
def test_ddp_trains_the_same_with_wrapped_weights(pool):
    ext, base = pool.run(ddp_run, True), pool.run(ddp_run, False)
    for (wrapped, losses, flat, stats), (_, b_losses, b_flat, _) in zip(ext, base):
        assert all(wrapped)
        assert losses == b_losses and torch.equal(flat, b_flat)
        assert stats["per_op"]["all_reduce"]["compressed"] > 0  # DDP's gradient buckets went FP8
    assert torch.equal(ext[0][2], ext[1][2])  # replicas identical


def test_fsdp1_trains_and_tracks_nn_linear_over_gloo(pool):
    fp8 = pool.run(fsdp1_run, "fp8")
    plain = pool.run(fsdp1_run, "plain")
    (wrapped, losses, stats, fp8_calls), (_, base, _, _) = fp8[0], plain[0]
    assert all(wrapped) and fp8_calls > 0
    assert stats["per_op"]["reduce_scatter_tensor"]["compressed"] > 0
    assert losses[-1] < 0.97 * losses[0]  # it learns
    tail, base_tail = sum(losses[-3:]) / 3, sum(base[-3:]) / 3
    assert abs(tail - base_tail) <= 0.02 * base_tail, (losses, base)


# ------------------------------------------------------ one process, no FSDP
def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 32))


def test_wrapped_weights_behave_as_plain_tensors_without_fsdp():
    a = convert_to_fp8(_mlp(), module_filter_fn=lambda m, f: True)
    b = convert_to_fp8(_mlp(), module_filter_fn=lambda m, f: True, fp8_all_gather=True)
    assert isinstance(b[0].weight, Fp8AllGatherWeight) and isinstance(b[0].weight, nn.Parameter)
    b.to("cpu")  # module._apply keeps the wrapper
    assert isinstance(b[0].weight, Fp8AllGatherWeight)
    oa, ob = torch.optim.AdamW(a.parameters(), lr=1e-2), torch.optim.AdamW(b.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        x = torch.randn(32, 64, generator=gen)
        ya, yb = a(x), b(x)
        assert torch.equal(ya, yb)
        ya.square().mean().backward()
        yb.square().mean().backward()
        assert type(b[0].weight.grad) is torch.Tensor and torch.equal(a[0].weight.grad, b[0].weight.grad)
        oa.step()
        ob.step()
        oa.zero_grad()
        ob.zero_grad()
    assert torch.equal(a[0].weight, b[0].weight._tensor)
    # state_dict: same keys, plain tensors; loads both ways; torch.load(weights_only=True) takes it
    sd = b.state_dict()
    assert list(sd) == list(a.state_dict()) and all(type(v) is torch.Tensor for v in sd.values())
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    plain = _mlp()
    plain.load_state_dict(torch.load(buf, weights_only=True))
    assert torch.equal(plain[0].weight, a[0].weight)
    c = convert_to_fp8(_mlp(), module_filter_fn=lambda m, f: True, fp8_all_gather=True)
    c.load_state_dict(a.state_dict())
    assert isinstance(c[0].weight, Fp8AllGatherWeight) and torch.equal(c[0].weight._tensor, a[0].weight)
    # .data reads and writes the plain tensor inside; deepcopy keeps the wrapper
    c[0].weight.data.mul_(2)
    assert torch.equal(c[0].weight._tensor, 2 * a[0].weight)
    c[0].weight.data = torch.zeros(128, 64)
    assert torch.equal(c[0].weight._tensor, torch.zeros(128, 64)) and c[0].weight.shape == (128, 64)
    assert isinstance(copy.deepcopy(c)[0].weight, Fp8AllGatherWeight)


def test_fp8_weight_cast_feeds_the_gemm_and_dequantizes_elsewhere():
    from fp8comm.nn.scaling import cast_with_amax

    torch.manual_seed(0)
    w = torch.randn(32, 64)
    # bytes that use a third of the E4M3 range: casting them again would rescale (and round) them
    data, inv = cast_with_amax(w, E4M3, 3 * w.abs().amax())
    layer = Fp8Linear(64, 32, bias=False)
    layer.weight = nn.Parameter(Fp8WeightCast(data, inv, torch.float32))
    x = torch.randn(16, 64)
    fp8comm.nn.reset_linear_stats()
    y = layer(x)
    xq, xs = cast_to_fp8(x, E4M3, rowwise=False)
    assert torch.equal(y, scaled_mm_cpu(xq, data.t(), xs, inv, torch.float32))
    recast = Fp8Linear(64, 32, bias=False)
    recast.weight = nn.Parameter(layer.weight.dequantize())
    assert not torch.equal(y, recast(x))  # the bytes went in as they were, not cast again
    assert fp8comm.nn.linear_stats()["weight_precast_calls"] == 1
    y.sum().backward()
    assert type(layer.weight.grad) is torch.Tensor and layer.weight.grad.shape == (32, 64)
    # a fallback GEMM (7 tokens) uses the dequantized weight, and its gradient still arrives
    layer.weight.grad = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y7 = layer(x[:7])
    assert torch.equal(y7, x[:7] @ (data.float() * inv).t())
    y7.sum().backward()
    assert torch.equal(layer.weight.grad, x[:7].sum(0).expand(32, 64))
    with pytest.raises(RuntimeError, match="FP8-gathered weight"):
        layer.weight.data.add_(1)
    rowwise = Fp8Linear(64, 32, bias=False, recipe="rowwise")
    rowwise.weight = layer.weight
    with pytest.raises(RuntimeError, match="tensorwise recipe only"):
        rowwise(x)
