"""The bytes a compressed collective sends, computed independently of the
transport that counts them (csrc/algorithms/route.h): a formula per
collective over the chunk plan, the oracle that the counted bytes in stats
must equal.

`wire` describes one group: its transport's chunk_numel (elements of one
chunk, all ranks' segments together), its block size, and the bytes of a
wire segment of m elements (header included where the transport has one).
"""
from __future__ import annotations

from typing import Callable, NamedTuple


class Wire(NamedTuple):
    chunk_numel: int
    block_size: int
    segment_bytes: Callable[[int], int]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def per_rank_chunk(P: int, wire: Wire) -> int:
    """Elements of each rank's segment per chunk: whole blocks, about chunk_numel / P."""
    return ceil_div(ceil_div(wire.chunk_numel, P), wire.block_size) * wire.block_size


def all_reduce(P: int, wire: Wire, numel: int) -> int:
    """Each chunk of P * per_rank_chunk elements: P - 1 pieces sent, then this rank's sum to P - 1 ranks."""
    step = P * per_rank_chunk(P, wire)
    segment = lambda n: ceil_div(ceil_div(n, P), wire.block_size) * wire.block_size  # noqa: E731
    return sum(2 * (P - 1) * wire.segment_bytes(segment(min(step, numel - b))) for b in range(0, numel, step))


def reduce_scatter(P: int, wire: Wire, output_numel: int) -> int:
    """Each chunk of every rank's segment: one piece to each of the P - 1 others."""
    step = per_rank_chunk(P, wire)
    return sum((P - 1) * wire.segment_bytes(min(step, output_numel - b)) for b in range(0, output_numel, step))


def all_gather(P: int, wire: Wire, input_numel: int) -> int:
    """Each chunk of this rank's input: to each of the P - 1 others."""
    return reduce_scatter(P, wire, input_numel)


FLAT = {"all_reduce": all_reduce, "reduce_scatter": reduce_scatter, "all_gather": all_gather}


def evenly(bytes_sent: int, world: int, ranks_on_my_node: int) -> tuple[int, int]:
    """(intra, inter): the flat algorithms send evenly to every peer."""
    if world == 1:
        return 0, 0
    intra = bytes_sent * (ranks_on_my_node - 1) // (world - 1)
    return intra, bytes_sent - intra


def flat(family: str, world: int, ranks_on_my_node: int, wire: Wire, numel: int) -> tuple[int, int]:
    """(intra, inter) of the flat algorithm of `family` over `numel` elements
    (all_reduce: the tensor's; reduce_scatter: the output's; all_gather: the input's)."""
    return evenly(FLAT[family](world, wire, numel), world, ranks_on_my_node)


def by_node(family: str, nodes: int, local: int, wire: Wire, numel: int, element_size: int) -> tuple[int, int]:
    """(intra, inter) of the by-node algorithm: the exact phases inside the
    node, then the flat compressed one among the nodes."""
    if family == "all_reduce":
        k = ceil_div(numel, local)
        return 2 * (local - 1) * k * element_size, all_reduce(nodes, wire, k)
    return (local - 1) * nodes * numel * element_size, FLAT[family](nodes, wire, numel)


def all_to_all(world: int, rank: int, wire: Wire, send_numels: list, element_size: int, on_my_node,
               exact_inside: bool) -> tuple[int, int]:
    """(intra, inter) of a compressed all_to_all: the split sizes' all_gather
    (2P int64s to each of the P - 1 others, spread evenly as the flat
    algorithms' bytes are), then each non-empty slice for a peer as one wire
    segment, or, to a rank on this node when `exact_inside` (the inter_node
    scope), as its exact bytes padded to 16; this rank's own never travels."""
    ranks_on_my_node = sum(1 for r in range(world) if on_my_node(r))
    intra, inter = evenly((world - 1) * 2 * world * 8, world, ranks_on_my_node)
    for r, n in enumerate(send_numels):
        if r == rank or n == 0:
            continue
        inside = on_my_node(r)
        sent = -(-n * element_size // 16) * 16 if inside and exact_inside else wire.segment_bytes(n)
        if inside:
            intra += sent
        else:
            inter += sent
    return intra, inter


# What a passthrough call counts: nccl-tests' bus volume of the plain
# collective (its busBw x time), on every rank, roots included (DESIGN.md,
# "Stats"), for `payload` bytes (all_reduce, broadcast, reduce: the tensor;
# reduce_scatter, scatter: the output; all_gather, gather: the input;
# all_to_all: the input less this rank's own slice; send: the tensor).
# nccl-tests' bus factors: all_reduce 2(P-1)/P of the tensor; all_gather,
# reduce_scatter, gather, scatter and all_to_all (P-1)/P of all ranks'
# payloads; broadcast, reduce and send/recv 1 (the sender counts a send).
PLAIN = {
    "all_reduce": lambda P, b: 2 * (P - 1) * b // P,
    "reduce_scatter": lambda P, b: (P - 1) * b,
    "all_gather": lambda P, b: (P - 1) * b,
    "gather": lambda P, b: (P - 1) * b,
    "scatter": lambda P, b: (P - 1) * b,
    "all_to_all": lambda P, b: b,
    "broadcast": lambda P, b: b,
    "reduce": lambda P, b: b,
    "send": lambda P, b: b,
    "recv": lambda P, b: 0,
    "barrier": lambda P, b: 0,
}


def plain(kind: str, world: int, payload: int) -> int:
    """Bytes this rank counts for a plain `kind` collective (a key of PLAIN)
    of `payload` bytes in a group of `world` ranks; a group of one sends none."""
    return 0 if world == 1 else PLAIN[kind](world, payload)
