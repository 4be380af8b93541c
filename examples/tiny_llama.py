"""A Llama-style decoder (RMSNorm, rotary attention, SwiGLU) and a byte-level
text stream built from the Python standard library's own source files, which
exist on every machine, so the examples train on real text without a download.
"""
from __future__ import annotations

import dataclasses
import glob
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass
class ModelConfig:
    vocab: int = 256  # bytes
    dim: int = 256
    layers: int = 4
    heads: int = 4
    hidden: int = 0  # SwiGLU width; 0 -> 8/3 * dim rounded up to a multiple of 64
    max_seq: int = 256

    def __post_init__(self):
        if self.hidden == 0:
            self.hidden = int(math.ceil(8 * self.dim / 3 / 64) * 64)
        if self.dim % self.heads:
            raise ValueError(f"dim ({self.dim}) must be divisible by heads ({self.heads})")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rotary_tables(head_dim: int, seq: int, device, base: float = 10000.0):
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)
    return angles.cos(), angles.sin()


def apply_rotary(x, cos, sin):
    # x: [batch, heads, seq, head_dim]; rotate pairs (even, odd).
    x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.heads = cfg.heads
        self.head_dim = cfg.dim // cfg.heads
        self.wq = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x, cos, sin):
        b, s, d = x.shape

        def split(t):
            return t.view(b, s, self.heads, self.head_dim).transpose(1, 2)

        q = apply_rotary(split(self.wq(x)), cos, sin)
        k = apply_rotary(split(self.wk(x)), cos, sin)
        v = split(self.wv(x))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, d))


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.w2 = nn.Linear(cfg.hidden, cfg.dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.dim)
        self.mlp = SwiGLU(cfg)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class TinyLlama(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, tokens):
        cos, sin = rotary_tables(self.cfg.dim // self.cfg.heads, tokens.shape[1], tokens.device)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(self.norm(x))


def stdlib_bytes(limit_bytes: int = 32 << 20) -> torch.Tensor:
    """The standard library's .py sources, concatenated in a fixed order, as uint8."""
    root = os.path.dirname(os.__file__)
    chunks, total = [], 0
    for path in sorted(glob.glob(os.path.join(root, "*.py"))):
        with open(path, "rb") as f:
            data = f.read()
        chunks.append(data)
        total += len(data)
        if total >= limit_bytes:
            break
    return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8)


class ByteBatches:
    """Random windows of the text: each rank draws its own (seeded by rank and
    step), a held-out tail for evaluation is never trained on."""

    def __init__(self, text: torch.Tensor, seq: int, batch: int, rank: int, seed: int = 0):
        self.seq, self.batch = seq, batch
        split = int(len(text) * 0.98)
        self.train, self.held_out = text[:split].long(), text[split:].long()
        self.gen = torch.Generator().manual_seed(seed * 1000 + rank)

    def _windows(self, data, starts):
        idx = starts[:, None] + torch.arange(self.seq + 1)[None, :]
        w = data[idx]
        return w[:, :-1], w[:, 1:]

    def next(self):
        starts = torch.randint(0, len(self.train) - self.seq - 1, (self.batch,), generator=self.gen)
        return self._windows(self.train, starts)

    def eval_batch(self):
        starts = torch.linspace(0, len(self.held_out) - self.seq - 2, self.batch).long()
        return self._windows(self.held_out, starts)

    def eval_batches(self, count: int, rank: int, world: int):
        """`count` batches of held-out windows for `rank`: count * batch * world
        windows evenly spaced over the held-out tail, rank r taking every
        world-th, so the ranks together evaluate each window once. count 0:
        as many full batches as fit the tail without overlapping windows."""
        per_step = self.batch * world
        if count == 0:
            count = max(1, (len(self.held_out) - 1) // (self.seq + 1) // per_step)
        starts = torch.linspace(0, len(self.held_out) - self.seq - 2, count * per_step).long()[rank::world]
        return [self._windows(self.held_out, starts[i * self.batch:(i + 1) * self.batch]) for i in range(count)]
