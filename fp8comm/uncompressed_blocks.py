"""Blocks of collectives that run uncompressed (DESIGN.md, "Uncompressed blocks").

    with fp8comm.uncompressed(group):  # every rank of `group` enters here, at the same point
        evaluate(model)                 # its collectives on `group` pass through exactly
"""
from __future__ import annotations

import datetime

from .registry import fp8_backends


def _as_timedelta(timeout) -> datetime.timedelta | None:
    if timeout is None or isinstance(timeout, datetime.timedelta):
        return timeout
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        return datetime.timedelta(seconds=timeout)
    raise TypeError(f"fp8comm.uncompressed: timeout must be a datetime.timedelta or seconds, got {timeout!r}")


class uncompressed:  # noqa: N801  (used as a function: `with fp8comm.uncompressed():`)
    """Inside the block every collective on ``group`` (default: the default
    group) passes through fp8comm untouched: the result is bitwise the inner
    NCCL / gloo backend's, and ``get_stats`` counts the call as passed through.
    For final evaluations and metrics that must be exact.

    Entering and leaving are collective: every rank of the group must do both
    at the same point of its calls on the group; a rank that waits longer than
    ``timeout`` (a timedelta or seconds; default the store's) raises, naming
    the ranks that did not come. Blocks nest; only ``group`` changes. The
    rest (exceptions, threads, cost): DESIGN.md, "Uncompressed blocks".
    """

    def __init__(self, group=None, timeout=None):
        self._group = group
        self._timeout = _as_timedelta(timeout)
        self._open: list[list] = []  # per open block: the backends it switched

    def __enter__(self):
        switched = []
        try:
            for backend in fp8_backends(self._group):
                backend.enter_uncompressed(self._timeout)
                switched.append(backend)
        except BaseException:
            for backend in reversed(switched):
                backend.leave_uncompressed(together=False)
            raise
        self._open.append(switched)
        return self

    def __exit__(self, exc_type, exc, tb):
        error = None
        for backend in reversed(self._open.pop()):
            try:
                backend.leave_uncompressed(together=exc_type is None, timeout=self._timeout)
            except Exception as e:  # noqa: BLE001  (every backend is restored first)
                error = error or e
        if error is not None:
            raise error
        return False
