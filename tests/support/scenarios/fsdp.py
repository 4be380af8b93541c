"""Scenarios for the FSDP2 FP8 all-gather of Fp8Linear weights (run on every
rank of a DistPool; see tests/support/harness.py and tests/nn/test_fsdp_fp8_all_gather.py).

The model is a tiny decoder: an embedding, blocks of (RMSNorm, up, down) with
the block linears converted to Fp8Linear, a final norm and an nn.Linear head.
Every run builds it from the same seed, so each rank also holds the whole
unsharded model it started from, the reference for bitwise checks.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import fp8comm
from tests.support.harness import ctx
from fp8comm.nn import Fp8AllGatherWeight, Fp8Linear, Fp8WeightCast
from fp8comm.nn.scaling import cast_to_fp8

VOCAB, DIM, HIDDEN, BLOCKS = 96, 64, 128, 2
BATCH, SEQ = 4, 16  # 64 tokens per rank: every GEMM dim a multiple of 16


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(dim))  # not all ones: bitwise checks mean something

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(x) * self.weight


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = RMSNorm(DIM)
        self.up = nn.Linear(DIM, HIDDEN, bias=False)
        self.down = nn.Linear(HIDDEN, DIM)
        with torch.no_grad():  # rows of growing magnitude: each shard has its own amax
            for lin in (self.up, self.down):
                lin.weight.mul_(torch.linspace(0.25, 1.0, lin.out_features)[:, None])

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.norm = RMSNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def build(linear: str = "fp8", recipe: str = "tensorwise", fp8_all_gather: bool = False):
    """Net from seed 0; linear "fp8" converts the block linears, "plain" keeps nn.Linear."""
    torch.manual_seed(0)
    model = Net()
    if linear == "fp8":
        fp8comm.convert_to_fp8(model, recipe=recipe, module_filter_fn=lambda mod, fqn: fqn.startswith("blocks."),
                               fp8_all_gather=fp8_all_gather)
    return model


def fp8_fqns():
    return [f"blocks.{i}.{n}" for i in range(BLOCKS) for n in ("up", "down")]


def batches(rank: int, steps: int):
    """Sequences a bigram model can learn: t[i+1] = (5 t[i] + 1) mod VOCAB,
    from random starts, one token in eight replaced by noise."""
    gen = torch.Generator().manual_seed(100 + rank)
    out = []
    for _ in range(steps):
        seq = torch.empty(BATCH, SEQ + 1, dtype=torch.long)
        seq[:, 0] = torch.randint(0, VOCAB, (BATCH,), generator=gen)
        for i in range(SEQ):
            seq[:, i + 1] = (5 * seq[:, i] + 1) % VOCAB
        noise = torch.rand(BATCH, SEQ + 1, generator=gen) < 0.125
        seq[noise] = torch.randint(0, VOCAB, (int(noise.sum()),), generator=gen)
        out.append(seq)
    return out


def _loss(model, seq):
    logits = model(seq[:, :-1])
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), seq[:, 1:].reshape(-1))


def _global_mean(loss) -> float:
    v = loss.detach().float().reshape(1).clone()
    dist.all_reduce(v, group=ctx().gloo)
    return v.item() / ctx().world


def train_losses(model, opt, rank: int, steps: int) -> list[float]:
    """`steps` optimizer steps on this rank's batches; the global mean loss of each."""
    losses = []
    for seq in batches(rank, steps):
        loss = _loss(model, seq)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(_global_mean(loss))
    return losses


def _capture(model):
    """Forward pre-hooks recording the weight each module sees in forward:
    Fp8Linear weights as (kind, fp8 bytes, inverse scale) or the plain
    tensor; norms and the embedding as the tensor."""
    seen, handles = {}, []
    for fqn, mod in model.named_modules():
        if isinstance(mod, (Fp8Linear, RMSNorm, nn.Embedding)):
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
    model = build(linear, recipe, fp8_all_gather=ext)
    full = {k: v.detach().clone() for k, v in model.state_dict().items()}
    mesh = DeviceMesh.from_group(pg, "cpu")
    kwargs = {"mesh": mesh}
    if mp:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=getattr(torch, mp))
    for block in model.blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = batches(c.rank, steps + 1)
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
        loss = _loss(model, data[step])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if precompute:
            fp8comm.precompute_fp8_scales_for_fsdp(model)
        losses.append(_global_mean(loss))
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
    model = build("fp8", fp8_all_gather=True)
    mesh = DeviceMesh.from_group(c.group, "cpu")
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    assert fp8comm.precompute_fp8_scales_for_fsdp(model) == len(fp8_fqns())
    with torch.no_grad():
        for fqn in fp8_fqns():
            model.get_submodule(fqn).weight.mul_(3.0)  # amax x3: a stale scale would saturate
    seen, handles = _capture(model)
    fp8comm.reset_stats(c.group)
    with torch.no_grad():
        model(batches(c.rank, 1)[0][:, :-1])
    stats = fp8comm.get_stats(c.group)
    ok = {}
    for fqn in fp8_fqns():
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
    model = build("fp8", fp8_all_gather=True)
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
    types = {fqn: type(model.get_submodule(fqn).weight._local_tensor).__name__ for fqn in fp8_fqns()}
    x = batches(c.rank, 1)[0][:, :-1]
    with torch.no_grad():
        out = model(x)
    ref = build("fp8", fp8_all_gather=False)
    ref.load_state_dict(sd_full)
    with torch.no_grad():
        out_ref = ref(x)
    return types, torch.equal(out, out_ref)


def ddp_run(ext: bool, steps: int = 4):
    """DDP over the fp8 group; Fp8Linear weights optionally wrapped for the FP8
    all-gather (unused by DDP)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    c = ctx()
    model = build("fp8", fp8_all_gather=ext)
    wrapped = [isinstance(model.get_submodule(f).weight, Fp8AllGatherWeight) for f in fp8_fqns()]
    ddp = DDP(model, process_group=c.group)
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-3)
    fp8comm.reset_stats(c.group)
    losses = []
    for seq in batches(c.rank, steps):
        loss = _loss(ddp, seq)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(_global_mean(loss))
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return wrapped, losses, flat, fp8comm.get_stats(c.group)


def fsdp1_run(which: str, steps: int = 8):
    """FSDP1 (FullyShardedDataParallel, use_orig_params=True): "fp8" =
    Fp8Linear with FP8-all-gather weights over the fp8 group, "plain" =
    nn.Linear over gloo."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    c = ctx()
    model = build("fp8" if which == "fp8" else "plain", fp8_all_gather=which == "fp8")
    wrapped = [isinstance(model.get_submodule(f).weight, Fp8AllGatherWeight) for f in fp8_fqns()]
    pg = c.group if which == "fp8" else c.gloo
    fsdp = FSDP(model, process_group=pg, use_orig_params=True, device_id=torch.device("cpu"))
    opt = torch.optim.AdamW(fsdp.parameters(), lr=1e-2)
    if which == "fp8":
        fp8comm.reset_stats(pg)
        fp8comm.nn.reset_linear_stats()
    losses = []
    for seq in batches(c.rank, steps):
        loss = _loss(fsdp, seq)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(_global_mean(loss))
    stats = fp8comm.get_stats(pg) if which == "fp8" else None
    fp8_calls = fp8comm.nn.linear_stats()["fp8_calls"] if which == "fp8" else 0
    return wrapped, losses, stats, fp8_calls
