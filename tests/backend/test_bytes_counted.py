"""Stats count the bytes the transports sent (csrc/algorithms/transport.h,
route.h), and they are the bytes the stats formulas gave before
(tests/support/bytes_oracle.py): every compressed collective in every form,
in both scopes, on fp8gloo and fp8ncclsim (fp8nccl's path), over 4 ranks as
2 simulated nodes x 2, so bytes split between the node and the others.

The sizes cut a call into one chunk and into several over gloo (1M elements
a chunk in all), with a last block and a last chunk cut short.

A call that passes through counts nccl-tests' bus volume of the plain
collective (bytes_oracle.plain), broadcast and reduce included, on the root
and on the other ranks."""
from __future__ import annotations

import os
from typing import NamedTuple

import torch

import fp8comm
from tests.support import bytes_oracle, ops
from tests.support.harness import PoolSpec, ctx
from tests.support.inputs import rank_input
from tests.support.ops import FAMILIES


# ---------------------------------------------------------------- scenarios
# Run on every rank of the pool: module-level, the ranks import this module.
# The pool's ranks are simulated nodes (FP8COMM_LOCAL_SIZE=L): each compressed
# collective in each form, with the bytes the group's stats counted for it
# and the bytes the old stats formulas give (tests/support/bytes_oracle.py).

class Compared(NamedTuple):
    case: str  # op, dtype and per-rank numels
    counted: tuple  # (intra, inter) from fp8comm.get_stats (passthrough: and the uncompressed bytes)
    formula: tuple  # (intra, inter) from bytes_oracle


def _wire(group) -> bytes_oracle.Wire:
    backend = group._get_backend(torch.device("cpu"))
    return bytes_oracle.Wire(backend.transport_traits("cpu")["chunk_numel"], backend.block_size,
                             lambda m: backend.wire_segment_bytes(m, "cpu"))


def _formula(scope: str, family: str, numel: int, element_size: int, wire) -> tuple:
    c, local = ctx(), int(os.environ["FP8COMM_LOCAL_SIZE"])
    if scope == "inter_node":
        return bytes_oracle.by_node(family, c.world // local, local, wire, numel, element_size)
    return bytes_oracle.flat(family, c.world, local, wire, numel)


def compare(scope: str, name: str, numels: list, dtype) -> Compared:
    """Runs op `name` once with one input per entry of `numels` (elements per
    rank: all_reduce's tensor, reduce_scatter's output, all_gather's input)."""
    c, family = ctx(), FAMILIES[name]
    xs = [rank_input(c.rank, k * c.world if family == "reduce_scatter" else k, dtype, seed=i + 1)
          for i, k in enumerate(numels)]
    fp8comm.reset_stats(c.group)
    ops.run(name, ops.Call(c.group, c.rank, c.world), xs)
    stats = fp8comm.get_stats(c.group)
    assert stats["calls_compressed"] >= 1 and stats["calls_passthrough"] == 0, stats
    wire, element_size = _wire(c.group), xs[0].element_size()
    # all_reduce_coalesced is one all_reduce of the concatenation; the other
    # coalesced forms are one collective per pair.
    parts = [sum(numels)] if name == "all_reduce_coalesced" else numels
    formulas = [_formula(scope, family, k, element_size, wire) for k in parts]
    formula = (sum(f[0] for f in formulas), sum(f[1] for f in formulas))
    counted = (stats["bytes_sent_intra_node"], stats["bytes_sent_inter_node"])
    return Compared(f"{name} {dtype} {numels}", counted, formula)


def compare_all(scope: str, cases: list) -> list:
    """compare(scope, *case) for every case, in one visit to the ranks."""
    return [compare(scope, *case) for case in cases]


# A passthrough call of each kind: (ops name, the op's name in stats, the
# bytes_oracle.PLAIN kind, elements per rank, dtype, reduce op). Each passes
# through for a reason of its own: no compressed form, the reduce op, the
# dtype, its size, all_to_all not in compress="all".
PASSTHROUGH = [
    ("broadcast", "broadcast", "broadcast", 3000, torch.float32, "sum"),
    ("reduce", "reduce", "reduce", 3000, torch.float32, "sum"),
    ("gather", "gather", "gather", 3000, torch.float32, "sum"),
    ("scatter", "scatter", "scatter", 3000, torch.float32, "sum"),
    ("send_recv", "send", "send", 3000, torch.float32, "sum"),
    ("barrier", "barrier", "barrier", 0, torch.float32, "sum"),
    ("all_reduce", "all_reduce", "all_reduce", 3000, torch.float32, "max"),
    ("all_reduce", "all_reduce", "all_reduce", 100, torch.bfloat16, "sum"),
    ("all_gather_tensor", "all_gather_into_tensor", "all_gather", 3000, torch.int32, "sum"),
    ("reduce_scatter_tensor", "reduce_scatter_tensor", "reduce_scatter", 3000, torch.int64, "sum"),
    ("all_to_all_single", "all_to_all", "all_to_all", 3000, torch.float32, "sum"),
]


def _passthrough_inputs(name: str, numel: int, dtype, world: int) -> list:
    if name == "scatter":
        return [torch.ones(numel, dtype=dtype) for _ in range(world)]
    if name in ("reduce_scatter_tensor", "all_to_all_single"):
        return [torch.ones(numel * world, dtype=dtype)]
    return [torch.ones(numel, dtype=dtype)]


def _payload(name: str, xs: list, rank: int, world: int) -> int:
    """The payload bytes_oracle.plain takes for this rank's call."""
    x = xs[0]
    if name == "reduce_scatter_tensor":
        return x.numel() // world * x.element_size()
    if name == "all_to_all_single":
        return x.numel() // world * (world - 1) * x.element_size()
    if name == "send_recv":
        return x.numel() * x.element_size() if rank == 0 else 0
    return x.numel() * x.element_size()


def compare_passthrough() -> list:
    """Every PASSTHROUGH call once, with root 1 (so rank 0 is not the root):
    (case, counted, volume) from the op's own per_op entry."""
    c, local = ctx(), int(os.environ["FP8COMM_LOCAL_SIZE"])
    found = []
    for name, op, kind, numel, dtype, reduce_op in PASSTHROUGH:
        xs = _passthrough_inputs(name, numel, dtype, c.world)
        fp8comm.reset_stats(c.group)
        ops.run(name, ops.Call(c.group, c.rank, c.world, op=ops.reduce_op(reduce_op), root=1), xs)
        stats = fp8comm.get_stats(c.group)
        if name == "send_recv" and c.rank not in (0, 1):
            assert stats["per_op"] == {}, stats
            continue
        if name == "send_recv" and c.rank == 1:
            op, kind = "recv", "recv"
        entry = stats["per_op"][op]
        assert entry["passthrough"] == sum(entry["passthrough_reasons"].values()) >= 1, entry
        counted = (entry["bytes_sent_intra_node"], entry["bytes_sent_inter_node"], entry["bytes_sent_uncompressed"])
        plain = bytes_oracle.plain(kind, c.world, _payload(name, xs, c.rank, c.world))
        found.append(Compared(f"{name} {op} {dtype} {numel} {reduce_op}", counted,
                              (*bytes_oracle.evenly(plain, c.world, local), plain)))
    return found


# -------------------------------------------------------------------- tests

# Elements per rank of each input: a few blocks and a partial one; and
# several gloo chunks both flat (all ranks' segments of a chunk: 2^18
# elements each over 4 ranks) and by node (2^19 each over the 2 nodes; all_reduce's
# hop carries 1/2 of the tensor).
SMALL = 5_003
LARGE = {"all_reduce": 2_200_001, "reduce_scatter": 600_001, "all_gather": 600_001}


def cases():
    for name, family in FAMILIES.items():
        tensors = 2 if name.endswith("coalesced") else 1
        for dtype in (torch.float32, torch.bfloat16):
            yield name, [SMALL + 37 * i for i in range(tensors)], dtype
        yield name, [LARGE[family] + 37 * i for i in range(tensors)], torch.float32


POOLS = [PoolSpec(4, backend, pg_options={"min_numel": 1024, "compress": "all"},
                  env={"FP8COMM_SCOPE": scope, "FP8COMM_LOCAL_SIZE": "2"}, id=f"{backend}-{scope}",
                  attrs={"scope": scope})
         for backend in ("fp8gloo", "fp8ncclsim") for scope in ("all", "inter_node")]


def test_stats_are_the_bytes_the_formulas_gave(pool):
    results = pool.run(compare_all, pool.scope, list(cases()), timeout=600)
    for rank, compared in enumerate(results):
        for c in compared:
            assert c.counted == c.formula, (rank, c.case, c.counted, c.formula)
            assert c.formula[0] > 0 and c.formula[1] > 0, (rank, c.case)


def test_passthrough_calls_count_the_plain_bus_volume(pool):
    """broadcast and reduce count on the root and the other ranks alike, as
    every passthrough op counts nccl-tests' bus volume of the plain call."""
    for rank, compared in enumerate(pool.run(compare_passthrough)):
        for c in compared:
            assert c.counted == c.formula, (rank, c.case, c.counted, c.formula)
        kinds = {c.case.split()[1] for c in compared}
        assert {"broadcast", "reduce", "gather", "scatter", "all_to_all"} <= kinds, kinds
        assert all(c.formula[2] > 0 for c in compared if c.case.split()[1] in ("broadcast", "reduce")), compared
