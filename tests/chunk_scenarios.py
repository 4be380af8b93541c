"""Scenarios for tests/test_allreduce_chunks.py (run on every rank of a DistPool)."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

import fp8comm
from dist_harness import ctx

PAIR_ENV = "FP8COMM_PAIR_ALLREDUCE"  # the opt-in two-rank exchange (DESIGN.md, "Algorithms")
CHUNK = 1 << 21  # csrc/backend/compressed_algorithms.cpp, cpu_chunk_elements()


def rank_input(rank: int, n: int, dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 7919 + rank)
    x = torch.randn(n, generator=gen)
    x[::1001] *= 1e4  # blocks of different scales
    x[7::50_000] = float("inf") if seed % 2 else float("nan")
    return x.to(dtype)


def pairwise(world: int, dtype) -> bool:
    """Whether the backend's all_reduce takes the two-rank exchange."""
    return world == 2 and dtype in (torch.float32, torch.complex64) and os.environ.get(PAIR_ENV) == "1"


def pair_chunk_model(inputs, post_div: int, block: int) -> torch.Tensor:
    """DESIGN.md's two-rank all_reduce of one chunk: each rank quantizes its
    whole chunk once, both add the two decoded pieces in rank order."""
    n = inputs[0].numel()
    m = -(-n // block) * block
    S = fp8comm.segment_bytes(m, block)
    pieces = torch.empty(2 * S, dtype=torch.uint8)
    for r, x in enumerate(inputs):
        fp8comm.quantize_segments(x, pieces[r * S:(r + 1) * S], 1, m, block_size=block)
    out = torch.empty(n, dtype=inputs[0].dtype)
    fp8comm.dequant_sum(pieces, out, 2, m, block_size=block, post_div=post_div)
    return out


def one_chunk_model(inputs, world: int, post_div: int, block: int) -> torch.Tensor:
    """DESIGN.md's all_reduce of one chunk, in Python, from every rank's input.
    Two ranks, float32: pair_chunk_model. Otherwise each rank quantizes the
    other ranks' segments, each owner adds their pieces to its own segment
    (exact) and re-quantizes the sum, every rank decodes every segment."""
    if pairwise(world, inputs[0].dtype):
        return pair_chunk_model(inputs, post_div, block)
    n = inputs[0].numel()
    m = -(-(-(-n // world)) // block) * block
    S = fp8comm.segment_bytes(m, block)
    sent = []
    for x in inputs:
        buf = torch.empty(world * S, dtype=torch.uint8)
        fp8comm.quantize_segments(x, buf, world, m, block_size=block)
        sent.append(buf)
    gathered = torch.empty(world * S, dtype=torch.uint8)
    for owner in range(world):
        pieces = torch.cat([sent[r][owner * S:(owner + 1) * S] for r in range(world) if r != owner])
        own = inputs[owner][owner * m:(owner + 1) * m]
        fp8comm.dequant_sum_requantize(pieces, gathered[owner * S:(owner + 1) * S], world - 1, m, block_size=block,
                                       post_div=post_div, own=own)
    out = torch.empty(n, dtype=inputs[0].dtype)
    fp8comm.dequantize_segments(gathered, out, world, m, block_size=block)
    return out


def chunked_model(n: int, dtype, world: int, seed: int, post_div: int, block: int = 32) -> torch.Tensor:
    """The all_reduce cut as the backend cuts it: chunks of CHUNK elements
    rounded up to whole segments (P of them; one for the two-rank exchange),
    each chunk reduced alone."""
    inputs = [rank_input(r, n, dtype, seed) for r in range(world)]
    unit = (1 if pairwise(world, dtype) else world) * block
    chunk = -(-CHUNK // unit) * unit
    return torch.cat([one_chunk_model([x[at:at + chunk] for x in inputs], world, post_div, block)
                      for at in range(0, n, chunk)])


def chunked_all_reduce(n: int, dtype, seed: int = 0, avg: bool = False, cols: int = 1):
    """The all_reduce of a tensor of n elements (shaped [n / cols, cols])."""
    c = ctx()
    x = rank_input(c.rank, n, dtype, seed).view(-1, cols)
    before = fp8comm.get_stats(c.group)["calls_compressed"]
    dist.all_reduce(x, op=dist.ReduceOp.AVG if avg else dist.ReduceOp.SUM, group=c.group)
    compressed = fp8comm.get_stats(c.group)["calls_compressed"] - before
    expect = chunked_model(n, dtype, c.world, seed, c.world if avg else 1)
    return x.reshape(-1), expect, compressed
