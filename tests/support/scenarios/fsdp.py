"""The tiny decoder that the FSDP, DDP, DeviceMesh, torch.compile and
checkpoint tests train on every rank of a DistPool (shared:
tests/nn/test_fsdp_fp8_all_gather.py, tests/integrations/test_device_mesh.py,
test_compile.py and test_checkpoint.py; each module's scenarios sit beside
its tests).

The model: an embedding, blocks of (RMSNorm, up, down) with the block
linears converted to Fp8Linear, a final norm and an nn.Linear head. Every
run builds it from the same seed, so each rank also holds the whole
unsharded model it started from, the reference for bitwise checks.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import fp8comm
from tests.support.harness import ctx

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
