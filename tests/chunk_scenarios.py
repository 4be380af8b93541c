"""Scenarios for tests/test_allreduce_chunks.py (run on every rank of a DistPool)."""
from __future__ import annotations

import torch
import torch.distributed as dist

import fp8comm
from dist_harness import ctx

CHUNK = 1 << 21  # csrc/backend/compressed_algorithms.cpp, cpu_chunk_elements()


def rank_input(rank: int, n: int, dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 7919 + rank)
    x = torch.randn(n, generator=gen)
    x[::1001] *= 1e4  # blocks of different scales
    x[7::50_000] = float("inf") if seed % 2 else float("nan")
    return x.to(dtype)


def unchunked_model(n: int, dtype, world: int, seed: int, post_div: int, block: int = 32) -> torch.Tensor:
    """The all_reduce algorithm of DESIGN.md run in one piece, in Python, on
    every rank's input: quantize P segments per rank, each rank's segment
    summed and re-quantized, every segment decoded."""
    m = -(-(-(-n // world)) // block) * block
    S = fp8comm.segment_bytes(m, block)
    sent = []
    for r in range(world):
        buf = torch.empty(world * S, dtype=torch.uint8)
        fp8comm.quantize_segments(rank_input(r, n, dtype, seed), buf, world, m, block_size=block)
        sent.append(buf)
    gathered = torch.empty(world * S, dtype=torch.uint8)
    for owner in range(world):
        pieces = torch.cat([sent[r][owner * S:(owner + 1) * S] for r in range(world)])
        fp8comm.dequant_sum_requantize(pieces, gathered[owner * S:(owner + 1) * S], world, m, block_size=block,
                                       post_div=post_div)
    out = torch.empty(n, dtype=dtype)
    fp8comm.dequantize_segments(gathered, out, world, m, block_size=block)
    return out


def chunked_all_reduce(n: int, dtype, seed: int = 0, avg: bool = False, cols: int = 1):
    """The all_reduce of a tensor of n elements (shaped [n / cols, cols])."""
    c = ctx()
    x = rank_input(c.rank, n, dtype, seed).view(-1, cols)
    before = fp8comm.get_stats(c.group)["calls_compressed"]
    dist.all_reduce(x, op=dist.ReduceOp.AVG if avg else dist.ReduceOp.SUM, group=c.group)
    compressed = fp8comm.get_stats(c.group)["calls_compressed"] - before
    expect = unchunked_model(n, dtype, c.world, seed, c.world if avg else 1)
    return x.reshape(-1), expect, compressed
