"""Scenarios for tests/backend/test_cpu_threads.py (run on every rank of a DistPool)."""
from __future__ import annotations

import torch.distributed as dist

import fp8comm
from fp8comm import _C


def codec_threads(pg_options: dict | None = None) -> int:
    """The CPU codec's thread count after creating one more fp8gloo group."""
    opts = fp8comm.Options(**pg_options) if pg_options else None
    dist.new_group(backend="fp8gloo", pg_options=opts)
    return _C.cpu_threads()


def threads_now() -> dict:
    return {"threads": _C.cpu_threads(), "cores": _C.available_cores()}
