"""Which ranks of a process group share a node: each rank names its node at
group creation (the naming rule: DESIGN.md, "Topology").
"""
from __future__ import annotations

import dataclasses
import os
import socket

from . import _C


def node_name(global_rank: int) -> str:
    """This process's node, as every rank of its groups names it."""
    size = _C.env_positive_int("FP8COMM_LOCAL_SIZE") or _local_world_size()
    if size:
        return f"ranks {global_rank // size * size}-{global_rank // size * size + size - 1}"
    return f"host {socket.gethostname()}"


def _local_world_size() -> int | None:
    """torchrun's LOCAL_WORLD_SIZE (ranks per node), or None when unset."""
    value = os.environ.get("LOCAL_WORLD_SIZE", "")
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"fp8comm: LOCAL_WORLD_SIZE={value!r} must be a positive integer (ranks per node)")
    return int(value)


@dataclasses.dataclass(frozen=True)
class Topology:
    """The nodes of one group: ``node_of[r]`` and ``local_of[r]`` for every
    group rank r (nodes numbered by their lowest rank, local ranks in group
    rank order)."""

    node_of: tuple[int, ...]
    local_of: tuple[int, ...]

    @classmethod
    def from_names(cls, names: list[str]) -> "Topology":
        index: dict[str, int] = {}
        counts: list[int] = []
        node_of, local_of = [], []
        for name in names:
            if name not in index:
                index[name] = len(counts)
                counts.append(0)
            node_of.append(index[name])
            local_of.append(counts[index[name]])
            counts[index[name]] += 1
        return cls(tuple(node_of), tuple(local_of))

    @property
    def nodes(self) -> int:
        return max(self.node_of) + 1

    def ranks_on(self, node: int) -> list[int]:
        return [r for r, n in enumerate(self.node_of) if n == node]

    @property
    def uniform(self) -> bool:
        """Every node holds the same number of this group's ranks."""
        sizes = {len(self.ranks_on(n)) for n in range(self.nodes)}
        return len(sizes) == 1

    @property
    def local_size(self) -> int:
        return len(self.ranks_on(self.node_of[0]))

    def rank_at(self, node: int, local: int) -> int:
        return self.ranks_on(node)[local]
