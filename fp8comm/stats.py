"""Communication counters, and the quantization error where a group tracks it
(DESIGN.md, "Stats")."""
from __future__ import annotations

import math

import torch.distributed as dist

from . import error_feedback
from .registry import fp8_backends, fp8_groups

STAT_KEYS = (
    "bytes_sent",
    "bytes_sent_intra_node",
    "bytes_sent_inter_node",
    "bytes_sent_uncompressed",
    "calls_compressed",
    "calls_passthrough",
)
ERROR_KEYS = ("signal_energy", "noise_energy", "quantized_values")


def sqnr_db(signal_energy: float, noise_energy: float) -> float | None:
    """10 log10(signal / noise): inf when nothing was lost, None without signal."""
    if signal_energy <= 0.0:
        return None
    if noise_energy <= 0.0:
        return math.inf
    return 10.0 * math.log10(signal_energy / noise_energy)


def _nothing_measured() -> dict:
    return {"signal_energy": 0.0, "noise_energy": 0.0, "quantized_values": 0}


def _zeros() -> dict:
    return {**{key: 0 for key in STAT_KEYS}, "per_op": {}}


def _add(into: dict, more: dict) -> dict:
    """Adds the counters of ``more`` into ``into`` (per_op and passthrough
    reasons key by key); SQNR is recomputed from the sums (_with_sqnr)."""
    for key, value in more.items():
        if isinstance(value, dict):
            _add(into.setdefault(key, {}), value)
        elif key != "sqnr_db":
            into[key] = into.get(key, 0) + value
    return into


def _with_sqnr(stats: dict, tracked: bool) -> dict:
    """Where the error is ``tracked``: each op's sqnr_db and sqnr_db over all
    ops, every op carrying the energies (zero where none was measured), so
    that no absent key reads as a measurement."""
    per_op = stats["per_op"]
    if not tracked:
        return stats
    total = _nothing_measured()
    for entry in per_op.values():
        for key, zero in _nothing_measured().items():
            entry.setdefault(key, zero)
            total[key] += entry[key]
        entry["sqnr_db"] = sqnr_db(entry["signal_energy"], entry["noise_energy"])
    stats["sqnr_db"] = sqnr_db(total["signal_energy"], total["noise_energy"])
    return stats


def _of_group(pg, backends: list) -> dict:
    stats = _zeros()
    for backend in backends:
        _add(stats, backend.stats())
    if error_feedback.tracks(pg):
        stats["error_feedback_bytes"] = error_feedback.bytes_kept(pg)
    tracking = [b for b in backends if b.track_error]
    if tracking:
        measured = {op: _nothing_measured() for op in stats["per_op"]}
        for backend in tracking:
            for op, values in backend.quantization_errors().items():
                _add(measured.setdefault(op, _nothing_measured()), dict(zip(ERROR_KEYS, values)))
        for op, energies in measured.items():
            stats["per_op"].setdefault(op, {}).update(energies)
    return _with_sqnr(stats, bool(tracking))


def _describe(pg) -> dict:
    """The group's name, description and global ranks (None for a group torch does not list)."""
    try:
        ranks = dist.get_process_group_ranks(pg)
    except (KeyError, RuntimeError, ValueError):
        ranks = None
    return {"name": pg.group_name, "desc": getattr(pg, "group_desc", ""), "ranks": ranks}


def get_stats(group=None) -> dict:
    """This rank's communication counters.

    ``get_stats(group)``: those of ``group``'s fp8 backend(s) (its own
    fp8gloo / fp8nccl backend and the compressors fp8comm.functional made
    over it); zeros for a group with neither. ``get_stats()``: the totals
    over every fp8 group of this process (the default group, new_group,
    split and DeviceMesh groups, groups a framework made for itself), with
    ``groups``: one entry per such group, its ``name``, ``desc`` and global
    ``ranks`` beside its own counters, so that one call shows where the
    traffic went. (Only the default group's: ``get_stats(dist.group.WORLD)``.)

    Counters: ``bytes_sent`` (what this rank sends to peers: for a compressed
    call what its transports sent, for a passthrough call nccl-tests' bus
    volume of the plain collective, broadcast and reduce included; DESIGN.md,
    "Stats"), split into ``bytes_sent_intra_node`` (to ranks on this rank's
    node) and ``bytes_sent_inter_node``; ``bytes_sent_uncompressed`` (the
    same calls sent as they were), ``calls_compressed``,
    ``calls_passthrough``, and ``per_op``: ``{op: {"compressed": n,
    "passthrough": n, "bytes_sent": ..., "bytes_sent_intra_node": ...,
    "bytes_sent_inter_node": ..., "bytes_sent_uncompressed": ...,
    "passthrough_reasons": {reason: n}}}``, where each passthrough call is
    counted under why it passed through (``fp8comm._C.passthrough_reasons()``
    lists them: "below min_numel", "dtype", "reduce op", "op not in
    compress", ...).

    Where a group tracks the quantization error (``Options(track_error=True)``
    / ``FP8COMM_TRACK_ERROR=1``), ``sqnr_db`` is the SQNR of every value this
    rank quantized since the last reset, and each ``per_op`` entry adds its
    own ``sqnr_db``, ``signal_energy`` (sum of x^2), ``noise_energy`` (sum of
    (x - decoded x)^2) and ``quantized_values`` (finite values measured);
    ``sqnr_db`` is None while nothing has been measured. Without tracking
    these keys are absent.

    Where error feedback keeps residuals for a group (fp8comm.hooks,
    fp8comm.fsdp), ``error_feedback_bytes`` is their memory in this process."""
    if group is not None:
        return _of_group(group, fp8_backends(group))
    totals, groups = _zeros(), []
    for pg, backends in fp8_groups():
        stats = _of_group(pg, backends)
        _add(totals, stats)
        groups.append({**_describe(pg), **stats})
    totals = _with_sqnr(totals, any("sqnr_db" in g for g in groups))
    totals["groups"] = groups
    return totals


def reset_stats(group=None) -> None:
    """Zeroes the counters (and the measured error) of ``group``'s fp8
    backend(s); without a group, of every fp8 group of this process (what
    ``get_stats()`` adds up). A group without one has nothing to reset."""
    backends = fp8_backends(group) if group is not None else [b for _, bs in fp8_groups() for b in bs]
    for backend in backends:
        backend.reset_stats()
