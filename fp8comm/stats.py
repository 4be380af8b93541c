"""Communication counters (DESIGN.md, "Stats")."""
from __future__ import annotations

import torch
import torch.distributed as dist

from . import _C

STAT_KEYS = (
    "bytes_sent",
    "bytes_sent_intra_node",
    "bytes_sent_inter_node",
    "bytes_sent_uncompressed",
    "calls_compressed",
    "calls_passthrough",
)


def fp8_backends(group=None) -> list:
    """The distinct ProcessGroupFp8 objects behind ``group`` (default: the world)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    found = []
    for device in ("cpu", "cuda"):
        try:
            backend = pg._get_backend(torch.device(device))
        except RuntimeError:
            continue
        if isinstance(backend, _C.ProcessGroupFp8) and not any(backend is b for b in found):
            found.append(backend)
    return found


def get_stats(group=None) -> dict:
    """Counters of the fp8 backend(s) of ``group``: ``bytes_sent`` (what this rank
    sends to peers under the standard algorithm volumes: all_gather (P-1)*in,
    reduce_scatter and all_to_all (P-1)/P*in, all_reduce 2(P-1)/P*in; the
    inter_node scope's algorithms as they send), split into
    ``bytes_sent_intra_node`` (to ranks on this rank's node) and
    ``bytes_sent_inter_node``; ``bytes_sent_uncompressed`` (the same calls sent as they were),
    ``calls_compressed``, ``calls_passthrough``, and ``per_op``:
    ``{op: {"compressed": n, "passthrough": n}}``. Raises if the group has no
    fp8 backend."""
    backends = fp8_backends(group)
    if not backends:
        raise ValueError("fp8comm.get_stats: this process group has no fp8nccl / fp8gloo backend")
    totals = {key: 0 for key in STAT_KEYS}
    per_op: dict = {}
    for backend in backends:
        for key, value in backend.stats().items():
            if key in totals:
                totals[key] += value
            else:
                op, kind = key.rsplit(".", 1)
                per_op.setdefault(op, {"compressed": 0, "passthrough": 0})[kind] += value
    totals["per_op"] = per_op
    return totals


def reset_stats(group=None) -> None:
    """Zeroes the counters of the fp8 backend(s) of ``group``."""
    backends = fp8_backends(group)
    if not backends:
        raise ValueError("fp8comm.reset_stats: this process group has no fp8nccl / fp8gloo backend")
    for backend in backends:
        backend.reset_stats()
