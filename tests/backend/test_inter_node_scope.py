"""The inter_node scope (DESIGN.md, "Topology") on CPU processes grouped into
simulated nodes (FP8COMM_LOCAL_SIZE): 4 ranks as 2 nodes x 2, 6 as 3 x 2
and 6 as 2 x 3 on fp8gloo, 4 as 2 x 2 on fp8ncclsim (fp8nccl's path).

Every compressed collective and form is bitwise equal to a model built from
plain pieces (the node's exact sum, then the flat compressed collective
among the ranks that share a local index), so an element is quantized only
on the hop between nodes; all_reduce ends bitwise equal on every rank; the
exact ops stay exact; stats split the bytes by where they go."""
import pytest
import torch

from tests.support.harness import PoolSpec
from tests.support.inputs import same_bits
from tests.support.scenarios import chunk_plan
from tests.support.scenarios import topology as ts
from tests.support.torch_features import NO_GLOO_LIST_ALL_TO_ALL, gloo_has_list_all_to_all

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
    family = ts.FAMILIES[name]
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
    check_compressed(pool.run(ts.compressed_case, "all_reduce", n, dtype), "all_reduce")


# Several of the hop's chunks (about 1M elements each over gloo; one 16M
# chunk over NCCL) per rank, so the node's phases overlap the hop chunk by
# chunk: with the tensor read in place (n divisible by the node's ranks) and
# through a padded copy.
@pytest.mark.parametrize("n", [4_500_000, 4_500_001])
def test_all_reduce_over_several_chunks(pool, n):
    check_compressed(pool.run(ts.compressed_case, "all_reduce", n, torch.float32), "all_reduce")


# all_gather's hop runs about 1M / N elements of each input per chunk (gloo).
@pytest.mark.parametrize("name", ["all_gather_tensor", "all_gather_list"])
def test_all_gather_over_several_chunks(pool, name):
    check_compressed(pool.run(ts.compressed_case, name, 1_100_003, torch.float32), name)


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
    results = pool.run(ts.compressed_case, "all_reduce", 30_000, dtype, reduce_kind)
    check_compressed(results, "all_reduce", reduce_kind)


@pytest.mark.parametrize("name", [n for n in ts.FAMILIES if n != "all_reduce"])
def test_every_form_matches_the_by_node_model(pool, name):
    tensors = 2 if name.endswith("coalesced") else 1
    check_compressed(pool.run(ts.compressed_case, name, 4096, torch.float32, tensors=tensors), name)


# The node phase reads a flat input's segments where they lie, but a
# PREMUL_SUM factor (like a list input, above) goes through a staging copy.
@pytest.mark.parametrize("reduce_kind", ["avg", "premul_sum"])
def test_reduce_scatter_avg_and_premul_sum(pool, reduce_kind):
    results = pool.run(ts.compressed_case, "reduce_scatter_tensor", 4096, torch.bfloat16, reduce_kind)
    check_compressed(results, "reduce_scatter_tensor", reduce_kind)


@pytest.mark.parametrize("name", ["broadcast", "reduce", "all_to_all_single", "all_to_all"])
def test_exact_ops_stay_exact(pool, name):
    if name == "all_to_all" and not gloo_has_list_all_to_all():
        pytest.skip(NO_GLOO_LIST_ALL_TO_ALL)
    for got, plain in pool.run(ts.exact_case, name, 1000, torch.float32):
        assert all(same_bits(g, p) for g, p in zip(got, plain))


def test_all_reduce_bytes_between_nodes(pool):
    """By node, an all_reduce of n FP32 elements sends 2 (L-1) n/L x 4 bytes
    inside the node and the flat compressed all_reduce of n/L elements among
    the nodes between them: fewer bytes between nodes than the flat algorithm
    sends there."""
    n = 1 << 16
    by_node = pool.run(ts.compressed_case, "all_reduce", n, torch.float32)
    flat = pool.run(ts.flat_scope_split, n)
    world = pool.nodes * pool.local
    for r, f in zip(by_node, flat):
        assert r["stats"]["bytes_sent_intra_node"] == 2 * (pool.local - 1) * -(-n // pool.local) * 4
        assert r["stats"]["bytes_sent_inter_node"] < f["bytes_sent_inter_node"]
        # Flat scope: bytes split by the share of peers on this node.
        assert f["bytes_sent_intra_node"] == f["bytes_sent"] * (pool.local - 1) // (world - 1)


def test_a_group_on_one_node_passes_through_exactly(pool):
    for result in pool.run(ts.one_node_group, 50_000):
        if result is None:
            continue
        exact, stats = result
        assert exact
        assert stats["calls_compressed"] == 0 and stats["calls_passthrough"] == 1
        assert stats["bytes_sent_inter_node"] == 0


def test_nodes_of_different_sizes_are_refused_at_creation(pool):
    errors, L = pool.run(ts.uneven_nodes_group), pool.local
    for rank in range(L + 1):
        assert errors[rank] is not None and "same number of this group's ranks on every node" in errors[rank]
        assert f"{L} on ranks 0-{L - 1}, 1 on ranks {L}-{2 * L - 1}" in errors[rank], errors[rank]
