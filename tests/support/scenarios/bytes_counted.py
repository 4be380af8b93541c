"""Scenarios for tests/backend/test_bytes_counted.py (run on every rank of
a DistPool over simulated nodes, FP8COMM_LOCAL_SIZE=L): each compressed
collective in each form, with the bytes the group's stats counted for it
and the bytes the old stats formulas give (tests/support/bytes_oracle.py)."""
from __future__ import annotations

import os
from typing import NamedTuple

import torch

import fp8comm
from tests.support import bytes_oracle, ops
from tests.support.harness import ctx
from tests.support.inputs import rank_input
from tests.support.scenarios.topology import FAMILIES


class Compared(NamedTuple):
    case: str  # op, dtype and per-rank numels
    counted: tuple  # (intra, inter) from fp8comm.get_stats
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
