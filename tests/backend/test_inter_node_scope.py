"""The inter_node scope (DESIGN.md, "Topology") on CPU processes grouped into
simulated nodes (FP8COMM_LOCAL_SIZE): 4 ranks as 2 nodes x 2, 6 as 3 x 2
and 6 as 2 x 3 on fp8gloo, 4 as 2 x 2 on fp8ncclsim (fp8nccl's path).

Every compressed collective and form is bitwise equal to a model built from
plain pieces (the node's exact sum, then the flat compressed collective
among the ranks that share a local index), so an element is quantized only
on the hop between nodes; all_reduce ends bitwise equal on every rank; the
exact ops stay exact; stats split the bytes by where they go."""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

import fp8comm
from tests.support import ops
from tests.support.harness import PoolSpec, ctx
from tests.support.inputs import rank_input, same_bits
from tests.support.ops import FAMILIES
from tests.support.reference import sqnr_db
from tests.support.scenarios import chunk_plan
from tests.support.torch_features import NO_GLOO_LIST_ALL_TO_ALL, gloo_has_list_all_to_all


# ---------------------------------------------------------------- scenarios
# Run on every rank of the pool: module-level, the ranks import this module.
# The pool's group runs with FP8COMM_SCOPE=inter_node and FP8COMM_LOCAL_SIZE=L,
# so ranks [bL, (b+1)L) are node b. Each compressed op is compared with a
# model built from plain pieces: the node's exact sum over a gloo group of
# the node's ranks, then the flat compressed collective (an fp8 group in
# scope "all") among the ranks that share a local index, then an exact
# gather inside the node. The design promises bitwise equality with it.

_GROUPS: dict = {}


def local_size() -> int:
    return int(os.environ["FP8COMM_LOCAL_SIZE"])


def _model_groups(backend: str):
    """(flat fp8 group among this rank's local index, gloo group of this
    rank's node, flat fp8 group over every rank); every rank creates all."""
    if backend not in _GROUPS:
        c, L = ctx(), local_size()
        nodes = [list(range(b * L, (b + 1) * L)) for b in range(c.world // L)]
        flat = lambda: fp8comm.Options(scope="all", min_numel=0, compress="all")  # noqa: E731
        inter = [dist.new_group([node[l] for node in nodes], backend=backend, pg_options=flat()) for l in range(L)]
        intra = [dist.new_group(node, backend="gloo") for node in nodes]
        world = dist.new_group(backend=backend, pg_options=flat())
        _GROUPS[backend] = (inter[c.rank % L], intra[c.rank // L], world)
    return _GROUPS[backend]


def _premultiplied(x: torch.Tensor, reduce_kind: str, factor: float) -> torch.Tensor:
    return x.mul(factor) if reduce_kind == "premul_sum" else x.clone()


def _node_sum(x: torch.Tensor, intra) -> torch.Tensor:
    """The node's ranks' tensors added in rank order, as the exact
    reduce_scatter inside a node adds each segment's pieces."""
    pieces = [torch.empty_like(x) for _ in range(local_size())]
    dist.all_gather(pieces, x, group=intra)
    total = pieces[0] + pieces[1]
    for piece in pieces[2:]:
        total += piece
    return total


def _all_reduce_model(x, inter, intra, reduce_kind, factor):
    """The node's exact sum, chunk l through the flat all_reduce among local index l."""
    L, n = local_size(), x.numel()
    node_sum = _node_sum(_premultiplied(x, reduce_kind, factor), intra)
    k = -(-n // L)
    padded = x.new_zeros(L * k)
    padded[:n] = node_sum
    local = ctx().rank % L
    chunk = padded[local * k:(local + 1) * k].clone()
    dist.all_reduce(chunk, group=inter)
    chunks = [torch.empty_like(chunk) for _ in range(L)]
    dist.all_gather(chunks, chunk, group=intra)
    return torch.cat(chunks)[:n]


def _reduce_scatter_model(x, inter, intra, reduce_kind, factor):
    """The node's exact sum; the segments of the ranks with this local index
    (one per node) through the flat reduce_scatter among them."""
    c, L = ctx(), local_size()
    nodes, k = c.world // L, x.numel() // c.world
    node_sum = _node_sum(_premultiplied(x, reduce_kind, factor), intra)
    local = c.rank % L
    chunk = torch.cat([node_sum[(b * L + local) * k:(b * L + local + 1) * k] for b in range(nodes)])
    out = x.new_zeros(k)
    dist.reduce_scatter_tensor(out, chunk, group=inter)
    return out


def compressed_case(name: str, n: int, dtype, reduce_kind: str = "sum", factor: float = 0.37, tensors: int = 1):
    """Runs op `name` on the pool's group (inter_node scope) with `tensors`
    inputs of n elements per rank; returns this rank's outputs, the model's,
    the SQNR against FP64 and the stats."""
    c = ctx()
    family = FAMILIES[name]
    inter, intra, world = _model_groups(dist.get_backend(c.group))
    per_rank = n * c.world if family == "reduce_scatter" else n
    xs = [rank_input(c.rank, per_rank, dtype, seed=i + 1) for i in range(tensors)]
    op = ops.reduce_op(reduce_kind, factor)
    fp8comm.reset_stats(c.group)
    got = ops.run(name, ops.Call(c.group, c.rank, c.world, op=op), [x.clone() for x in xs])
    stats = fp8comm.get_stats(c.group)
    everyone = [[rank_input(r, per_rank, dtype, seed=i + 1).double() for r in range(c.world)] for i in range(tensors)]
    premul = factor if reduce_kind == "premul_sum" else 1.0
    divide = c.world if reduce_kind == "avg" else 1
    if family == "all_reduce":
        reference = [sum(inputs) * premul / divide for inputs in everyone]
        if name == "all_reduce_coalesced":
            whole = _all_reduce_model(torch.cat(xs), inter, intra, reduce_kind, factor)
            model = list(whole.split([x.numel() for x in xs]))
        else:
            model = [_all_reduce_model(x, inter, intra, reduce_kind, factor) for x in xs]
    elif family == "reduce_scatter":
        reference = [sum(inputs)[c.rank * n:(c.rank + 1) * n] * premul / divide for inputs in everyone]
        model = [_reduce_scatter_model(x, inter, intra, reduce_kind, factor) for x in xs]
    else:
        reference = [torch.cat(inputs) for inputs in everyone]
        model = []
        for x in xs:
            out = x.new_zeros(n * c.world)
            dist.all_gather_into_tensor(out, x, group=world)
            model.append(out)
    flat = lambda ts: torch.cat([t.reshape(-1) for t in ts])  # noqa: E731
    return {
        "result": flat(got),
        "model": flat(model) if reduce_kind != "avg" else None,
        "sqnr": sqnr_db(flat(reference), flat(got)),
        "stats": stats,
    }


def exact_case(name: str, n: int, dtype):
    """Op `name` on the pool's group and on the plain gloo group: the outputs."""
    c = ctx()
    xs = [rank_input(c.rank, n * c.world, dtype, seed=3)]
    got = ops.run(name, ops.Call(c.group, c.rank, c.world), [x.clone() for x in xs])
    plain = ops.run(name, ops.Call(c.gloo, c.rank, c.world), [x.clone() for x in xs])
    return [g.clone() for g in got], [p.clone() for p in plain]


def one_node_group(n: int):
    """A group of node 0's ranks in the inter_node scope: it passes through
    exactly. Returns (result equals gloo's bitwise, stats) on its members."""
    c, L = ctx(), local_size()
    ranks = list(range(L))
    group = dist.new_group(ranks, backend=dist.get_backend(c.group),
                           pg_options=fp8comm.Options(scope="inter_node", min_numel=0, compress="all"))
    plain = dist.new_group(ranks, backend="gloo")
    if c.rank not in ranks:
        return None
    x = rank_input(c.rank, n, torch.float32)
    expected = x.clone()
    dist.all_reduce(x, group=group)
    dist.all_reduce(expected, group=plain)
    return torch.equal(x, expected), fp8comm.get_stats(group)


def uneven_nodes_group():
    """A group of L + 1 ranks (a whole node and one rank of the next) in the
    inter_node scope: its members' creation raises. Returns the error text."""
    c, L = ctx(), local_size()
    try:
        dist.new_group(list(range(L + 1)), backend=dist.get_backend(c.group),
                       pg_options=fp8comm.Options(scope="inter_node"))
    except ValueError as e:
        return str(e)
    return None


def flat_scope_split(n: int):
    """all_reduce on a scope-"all" group over the simulated nodes: its bytes
    split by the share of peers on this rank's node."""
    c = ctx()
    group = _model_groups(dist.get_backend(c.group))[2]
    fp8comm.reset_stats(group)
    dist.all_reduce(rank_input(c.rank, n, torch.float32), group=group)
    return fp8comm.get_stats(group)


# -------------------------------------------------------------------- tests

# E4M3 with 32-element blocks over 2-3 nodes: one quantization on the way
# between nodes (reduce_scatter, all_gather), two for all_reduce.
MIN_SQNR_DB = {"all_reduce": 25.0, "reduce_scatter": 28.0, "all_gather": 28.0}


# (backend, nodes, ranks per node). On gloo the exact phases inside a node
# are all_to_alls summed here in rank order; on fp8ncclsim, NCCL's own
# reduce_scatter (gloo's underneath, which adds two pieces as a + b too).
POOLS = [
    PoolSpec(nodes * local, backend, pg_options={"min_numel": 1024, "compress": "all"},
             env={"FP8COMM_SCOPE": "inter_node", "FP8COMM_LOCAL_SIZE": str(local)},
             id=f"{backend}-{nodes}x{local}", attrs={"nodes": nodes, "local": local})
    for backend, nodes, local in [("fp8gloo", 2, 2), ("fp8gloo", 3, 2), ("fp8gloo", 2, 3), ("fp8ncclsim", 2, 2)]
]


def check_compressed(results, name, reduce_kind="sum"):
    family = FAMILIES[name]
    for rank, r in enumerate(results):
        if r["model"] is not None:
            assert same_bits(r["result"], r["model"]), f"rank {rank}: {name} differs from the by-node model"
        assert r["sqnr"] >= MIN_SQNR_DB[family], (rank, r["sqnr"])
        stats = r["stats"]
        assert stats["calls_compressed"] >= 1 and stats["calls_passthrough"] == 0, stats
        assert stats["bytes_sent"] == stats["bytes_sent_intra_node"] + stats["bytes_sent_inter_node"]
        assert stats["bytes_sent_inter_node"] > 0 and stats["bytes_sent_intra_node"] > 0, stats
    if family == "all_reduce":
        for rank, r in enumerate(results):
            assert same_bits(r["result"], results[0]["result"]), f"rank {rank} ended with other bits than rank 0"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [4096, 100_003])
def test_all_reduce_is_the_node_sum_through_one_flat_all_reduce(pool, n, dtype):
    check_compressed(pool.run(compressed_case, "all_reduce", n, dtype), "all_reduce")


# Several of the hop's chunks (about 1M elements each over gloo; one 16M
# chunk over NCCL) per rank, so the node's phases overlap the hop chunk by
# chunk: with the tensor read in place (n divisible by the node's ranks) and
# through a padded copy.
@pytest.mark.parametrize("n", [4_500_000, 4_500_001])
def test_all_reduce_over_several_chunks(pool, n):
    check_compressed(pool.run(compressed_case, "all_reduce", n, torch.float32), "all_reduce")


# all_gather's hop runs about 1M / N elements of each input per chunk (gloo).
@pytest.mark.parametrize("name", ["all_gather_tensor", "all_gather_list"])
def test_all_gather_over_several_chunks(pool, name):
    check_compressed(pool.run(compressed_case, name, 1_100_003, torch.float32), name)


def ceil_div(a, b):
    return -(-a // b)


def hop_chunks(pool, chunk_numel, segment_numel):
    """Chunks of the hop's collective among the N nodes over segments of
    `segment_numel` elements per rank (chunk_plan.h: whole 32-element blocks)."""
    per_rank = ceil_div(ceil_div(chunk_numel, pool.nodes), 32) * 32
    return ceil_div(segment_numel, per_rank)


@pytest.mark.parametrize("op,numel", [("all_reduce", 2_200_001), ("reduce_scatter", 600_001),
                                      ("all_gather", 600_001)])
def test_node_phases_take_the_hops_chunk_plan(pool, op, numel):
    """One chunk plan for both node transports, from the group transport's
    traits (1M elements over gloo, 16M over NCCL): all_reduce's node
    reduce_scatter and all_gather, and all_gather's node all_gather, run
    once per chunk of the hop; reduce_scatter's node phase runs once, before
    it. The group's own transport is not used."""
    results = pool.run(chunk_plan.counted, op, numel, torch.float32)
    for r in results:
        assert r.chunk_numel == {"fp8gloo": 1 << 20, "fp8ncclsim": 1 << 24}[pool.backend]
        if op == "all_reduce":
            hop = hop_chunks(pool, r.chunk_numel, ceil_div(ceil_div(numel, pool.local), pool.nodes))
            expected = {"group": 0, "inter": 2 * hop, "intra": 2 * hop}
        else:
            hop = hop_chunks(pool, r.chunk_numel, numel)
            expected = {"group": 0, "inter": hop, "intra": hop if op == "all_gather" else 1}
        assert r.calls == expected, (op, r.calls)
        assert r.outcome.sqnr_db >= MIN_SQNR_DB[op]


# BF16 rounds the premultiplied inputs, so its bits show how the factor was
# applied (in FP32, rounded once, as the model does).
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("reduce_kind", ["avg", "premul_sum"])
def test_all_reduce_avg_and_premul_sum(pool, reduce_kind, dtype):
    results = pool.run(compressed_case, "all_reduce", 30_000, dtype, reduce_kind)
    check_compressed(results, "all_reduce", reduce_kind)


@pytest.mark.parametrize("name", [n for n in FAMILIES if n != "all_reduce"])
def test_every_form_matches_the_by_node_model(pool, name):
    tensors = 2 if name.endswith("coalesced") else 1
    check_compressed(pool.run(compressed_case, name, 4096, torch.float32, tensors=tensors), name)


# The node phase reads a flat input's segments where they lie, but a
# PREMUL_SUM factor (like a list input, above) goes through a staging copy.
@pytest.mark.parametrize("reduce_kind", ["avg", "premul_sum"])
def test_reduce_scatter_avg_and_premul_sum(pool, reduce_kind):
    results = pool.run(compressed_case, "reduce_scatter_tensor", 4096, torch.bfloat16, reduce_kind)
    check_compressed(results, "reduce_scatter_tensor", reduce_kind)


@pytest.mark.parametrize("name", ["broadcast", "reduce", "all_to_all_single", "all_to_all"])
def test_exact_ops_stay_exact(pool, name):
    if name == "all_to_all" and not gloo_has_list_all_to_all():
        pytest.skip(NO_GLOO_LIST_ALL_TO_ALL)
    for got, plain in pool.run(exact_case, name, 1000, torch.float32):
        assert all(same_bits(g, p) for g, p in zip(got, plain))


def test_all_reduce_bytes_between_nodes(pool):
    """By node, an all_reduce of n FP32 elements sends 2 (L-1) n/L x 4 bytes
    inside the node and the flat compressed all_reduce of n/L elements among
    the nodes between them: fewer bytes between nodes than the flat algorithm
    sends there."""
    n = 1 << 16
    by_node = pool.run(compressed_case, "all_reduce", n, torch.float32)
    flat = pool.run(flat_scope_split, n)
    world = pool.nodes * pool.local
    for r, f in zip(by_node, flat):
        assert r["stats"]["bytes_sent_intra_node"] == 2 * (pool.local - 1) * -(-n // pool.local) * 4
        assert r["stats"]["bytes_sent_inter_node"] < f["bytes_sent_inter_node"]
        # Flat scope: bytes split by the share of peers on this node.
        assert f["bytes_sent_intra_node"] == f["bytes_sent"] * (pool.local - 1) // (world - 1)


def test_a_group_on_one_node_passes_through_exactly(pool):
    for result in pool.run(one_node_group, 50_000):
        if result is None:
            continue
        exact, stats = result
        assert exact
        assert stats["calls_compressed"] == 0 and stats["calls_passthrough"] == 1
        assert stats["bytes_sent_inter_node"] == 0


def test_nodes_of_different_sizes_are_refused_at_creation(pool):
    errors, L = pool.run(uneven_nodes_group), pool.local
    for rank in range(L + 1):
        assert errors[rank] is not None and "same number of this group's ranks on every node" in errors[rank]
        assert f"{L} on ranks 0-{L - 1}, 1 on ranks {L}-{2 * L - 1}" in errors[rank], errors[rank]
