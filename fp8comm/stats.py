"""Communication counters, and the quantization error where a group tracks it
(DESIGN.md, "Stats")."""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from . import _C, error_feedback

STAT_KEYS = (
    "bytes_sent",
    "bytes_sent_intra_node",
    "bytes_sent_inter_node",
    "bytes_sent_uncompressed",
    "calls_compressed",
    "calls_passthrough",
)
ERROR_KEYS = ("signal_energy", "noise_energy", "quantized_values")


def fp8_backends(group=None, functional: bool = True) -> list:
    """The distinct ProcessGroupFp8 objects behind ``group`` (default: the
    world): its own, and (``functional``) those fp8comm.functional made over
    its backends."""
    from .functional import compressors

    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    found = list(compressors(pg)) if functional else []
    for device in ("cpu", "cuda"):
        try:
            backend = pg._get_backend(torch.device(device))
        except RuntimeError:
            continue
        if isinstance(backend, _C.ProcessGroupFp8) and not any(backend is b for b in found):
            found.append(backend)
    return found


def sqnr_db(signal_energy: float, noise_energy: float) -> float | None:
    """10 log10(signal / noise): inf when nothing was lost, None without signal."""
    if signal_energy <= 0.0:
        return None
    if noise_energy <= 0.0:
        return math.inf
    return 10.0 * math.log10(signal_energy / noise_energy)


def _nothing_measured() -> dict:
    return {"signal_energy": 0.0, "noise_energy": 0.0, "quantized_values": 0}


def _with_sqnr(energies: dict) -> dict:
    return {**energies, "sqnr_db": sqnr_db(energies["signal_energy"], energies["noise_energy"])}


def get_stats(group=None) -> dict:
    """Counters of the fp8 backend(s) of ``group``: ``bytes_sent`` (what this rank
    sends to peers: for a compressed call what its transports sent, for a
    passthrough call the ring volumes; DESIGN.md, "Stats"), split into
    ``bytes_sent_intra_node`` (to ranks on this rank's node) and
    ``bytes_sent_inter_node``; ``bytes_sent_uncompressed`` (the same calls sent as they were),
    ``calls_compressed``, ``calls_passthrough``, and ``per_op``:
    ``{op: {"compressed": n, "passthrough": n}}``. Raises if the group has no
    fp8 backend.

    Where the group tracks the quantization error (``Options(track_error=True)``
    / ``FP8COMM_TRACK_ERROR=1``), ``sqnr_db`` is the SQNR of every value this
    rank quantized since the last reset, and each ``per_op`` entry adds its
    own ``sqnr_db``, ``signal_energy`` (sum of x^2), ``noise_energy`` (sum of
    (x - decoded x)^2) and ``quantized_values`` (finite values measured);
    ``sqnr_db`` is None while nothing has been measured. Without tracking
    these keys are absent.

    Where error feedback keeps residuals for the group (fp8comm.hooks,
    fp8comm.fsdp), ``error_feedback_bytes`` is their memory in this process."""
    backends = fp8_backends(group)
    if not backends:
        raise ValueError("fp8comm.get_stats: this process group has no fp8nccl / fp8gloo backend and no "
                         "fp8comm.functional call has run on it")
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
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if error_feedback.tracks(pg):
        totals["error_feedback_bytes"] = error_feedback.bytes_kept(pg)
    tracking = [b for b in backends if b.track_error]
    if tracking:
        errors = {op: _nothing_measured() for op in per_op}
        for backend in tracking:
            for op, values in backend.quantization_errors().items():
                for key, value in zip(ERROR_KEYS, values):
                    errors.setdefault(op, _nothing_measured())[key] += value
        for op, entry in per_op.items():
            entry.update(_with_sqnr(errors[op]))
        total = {key: sum((e[key] for e in errors.values()), start) for key, start in _nothing_measured().items()}
        totals["sqnr_db"] = _with_sqnr(total)["sqnr_db"]
    return totals


def reset_stats(group=None) -> None:
    """Zeroes the counters (and the measured error) of the fp8 backend(s) of ``group``."""
    backends = fp8_backends(group)
    if not backends:
        raise ValueError("fp8comm.reset_stats: this process group has no fp8nccl / fp8gloo backend")
    for backend in backends:
        backend.reset_stats()
