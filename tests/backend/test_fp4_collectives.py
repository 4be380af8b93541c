"""The 4-bit formats on the wire of the compressed collectives
(Options(wire_format="mxfp4" or "nvfp4"), here through FP8COMM_WIRE_FORMAT):
the same flat and by-node algorithms as the FP8 formats, on fp8gloo and on
fp8ncclsim (fp8nccl's path). In the inter_node scope only the hop between
nodes is 4-bit and the node phases stay exact: the result equals the by-node
model bit for bit, the bytes inside a node are the uncompressed ones, and the
bytes between nodes are the 4-bit wire's. Flat, every output is within the
documented bound (tests/support/bounds.py with the format's half step),
all_reduce and all_gather results are bitwise equal on every rank, and the
stats count the format's bits per element (4.25 for MXFP4, 4.5 for NVFP4) plus
the segment padding."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import fp8comm
from tests.backend.test_bytes_counted import compare_all
from tests.backend.test_inter_node_scope import compressed_case
from tests.support.bounds import bound_violations
from tests.support.harness import PoolSpec, ctx
from tests.support.inputs import rank_input, same_bits
from tests.support import ops
from tests.support.ops import FAMILIES

# SQNR against FP64 of Gaussian inputs with MXFP4 between nodes (one
# quantization per piece; all_reduce also re-quantizes the sum).
MIN_SQNR_DB = {"all_reduce": 14.0, "reduce_scatter": 16.0, "all_gather": 17.0}
FORMATS = ("mxfp4", "nvfp4")
BITS = {"mxfp4": 4 + 8 / 32, "nvfp4": 4 + 8 / 16}  # a code and its share of a block scale

POOLS = [
    PoolSpec(4, backend, pg_options={"min_numel": 1024, "compress": "all"},
             env={"FP8COMM_WIRE_FORMAT": fmt, "FP8COMM_SCOPE": "inter_node", "FP8COMM_LOCAL_SIZE": "2"},
             id=f"{backend}-2x2-inter_node-{fmt}", attrs={"scope": "inter_node", "nodes": 2, "local": 2, "fmt": fmt})
    for backend in ("fp8gloo", "fp8ncclsim") for fmt in FORMATS
] + [
    PoolSpec(3, backend, pg_options={"min_numel": 1024, "compress": "all"},
             env={"FP8COMM_WIRE_FORMAT": fmt, "FP8COMM_SCOPE": "all", "FP8COMM_LOCAL_SIZE": "1"},
             id=f"{backend}-3-flat-{fmt}", attrs={"scope": "all", "fmt": fmt})
    for backend in ("fp8gloo", "fp8ncclsim") for fmt in FORMATS
]
INTER_NODE = [p.id for p in POOLS if p.attrs["scope"] == "inter_node"]
FLAT = [p.id for p in POOLS if p.attrs["scope"] == "all"]


# ---------------------------------------------------------------- scenarios
def flat_case(name: str, n: int, dtype, reduce_kind: str):
    """Op `name` on the pool's group (flat scope) with n elements per rank:
    (this rank's output, bound violations, stats)."""
    c = ctx()
    family = FAMILIES[name]
    factor = 0.37
    per_rank = n * c.world if family == "reduce_scatter" else n
    x = rank_input(c.rank, per_rank, dtype, seed=3)
    out, stats = ops.run_counted(name, c.group, c.rank, c.world, x, ops.reduce_op(reduce_kind, factor))
    premul = factor if reduce_kind == "premul_sum" else 1.0
    ys = [rank_input(r, per_rank, dtype, seed=3).float() * premul for r in range(c.world)]
    div = c.world if reduce_kind == "avg" else 1
    backend = c.group._get_backend(torch.device("cpu"))
    violations = bound_violations(family, ys, out.reshape(-1), div, backend.block_size, backend.wire_format, c.rank)
    return out, violations, stats


# -------------------------------------------------------------------- tests
@pytest.mark.pools(*INTER_NODE)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name,n", [("all_reduce", 100_003), ("reduce_scatter_tensor", 4096),
                                    ("all_gather_tensor", 4096), ("all_reduce_coalesced", 5000)])
def test_between_nodes_is_4_bit_and_inside_is_exact(pool, name, n, dtype):
    family = FAMILIES[name]
    tensors = 2 if name.endswith("coalesced") else 1
    results = pool.run(compressed_case, name, n, dtype, tensors=tensors)
    for rank, r in enumerate(results):
        assert same_bits(r["result"], r["model"]), f"rank {rank}: {name} differs from the by-node model"
        assert r["sqnr"] >= MIN_SQNR_DB[family], (rank, r["sqnr"])
        assert r["stats"]["calls_compressed"] >= 1 and r["stats"]["calls_passthrough"] == 0
    if family == "all_reduce":
        assert all(same_bits(r["result"], results[0]["result"]) for r in results)


@pytest.mark.pools(*INTER_NODE)
@pytest.mark.parametrize("reduce_kind", ["avg", "premul_sum"])
def test_between_nodes_avg_and_premul_sum(pool, reduce_kind):
    results = pool.run(compressed_case, "all_reduce", 30_000, torch.bfloat16, reduce_kind)
    for r in results:
        assert r["sqnr"] >= MIN_SQNR_DB["all_reduce"], r["sqnr"]
        if r["model"] is not None:
            assert same_bits(r["result"], r["model"])


@pytest.mark.pools(*FLAT)
@pytest.mark.parametrize("name,reduce_kind", [(name, kind) for name in ("all_reduce", "reduce_scatter_tensor")
                                               for kind in ("sum", "avg", "premul_sum")] + [("all_gather_tensor", "sum")])
def test_flat_outputs_are_within_the_bound(pool, name, reduce_kind):
    results = pool.run(flat_case, name, 20_011, torch.float32, reduce_kind)
    for out, violations, stats in results:
        assert violations.ok, violations
        assert stats["calls_compressed"] == 1
    if not name.startswith("reduce_scatter"):
        assert all(same_bits(out, results[0][0]) for out, _, _ in results)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_stats_count_the_4_bit_wire(pool, dtype):
    """The bytes counted are the formulas' over the format's segment layout,
    and an FP32 all_reduce sends BITS / 32 of the uncompressed bytes (plus the
    segment scale and the 16-byte padding of each segment's scales)."""
    cases = [("all_reduce", [5_003], dtype), ("reduce_scatter_tensor", [5_003], dtype),
             ("all_gather_tensor", [5_003], dtype), ("all_reduce", [1_000_003], torch.float32)]
    for rank, compared in enumerate(pool.run(compare_all, pool.scope, cases)):
        for c in compared:
            assert c.counted == c.formula, (rank, c.case, c.counted, c.formula)
    n = 1 << 20
    stats = pool.run(all_reduce_stats, n)[0]
    if pool.scope == "all":
        fp32 = stats["bytes_sent_uncompressed"]
        assert BITS[pool.fmt] / 32 <= stats["bytes_sent"] / fp32 <= BITS[pool.fmt] / 32 + 0.002, stats
    else:  # the hop's flat all_reduce of n / local elements among the nodes, 4-bit
        fp32 = 2 * (pool.nodes - 1) / pool.nodes * (n // pool.local) * 4
        bits = BITS[pool.fmt]
        assert bits / 32 <= stats["bytes_sent_inter_node"] / fp32 <= bits / 32 + 0.002, stats
        assert stats["bytes_sent_intra_node"] == 2 * (pool.local - 1) * (n // pool.local) * 4  # exact inside


def all_reduce_stats(n: int):
    c = ctx()
    x = rank_input(c.rank, n, torch.float32, seed=9)
    fp8comm.reset_stats(c.group)
    dist.all_reduce(x, group=c.group)
    return fp8comm.get_stats(c.group)
