"""Per-process-group options (DESIGN.md, "Options").

Pass an :class:`Options` as ``pg_options`` to ``init_process_group`` or
``new_group``; fields left as ``None`` take the ``FP8COMM_*`` environment
variables, then the defaults below.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Iterable

import torch

COMPRESSIBLE_OPS = ("all_reduce", "reduce_scatter", "all_gather")
DEFAULT_BLOCK_SIZE = 32
DEFAULT_FP8_DTYPE = "e4m3"
DEFAULT_COMPRESS = ("all_reduce", "reduce_scatter")
# Per-rank element count below which collectives pass through exactly.
# Chosen from bench/comm.py on fp8gloo (2 ranks, this repo's CPU machine):
# see docs/performance.md, "Where compression pays". It also keeps scalars and
# small tensors (loss, grad norm, found_inf) exact.
DEFAULT_MIN_NUMEL = 16384

_FP8_NAMES = {"e4m3": "e4m3", "e5m2": "e5m2", torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}


@dataclasses.dataclass
class Options:
    """Options of one fp8nccl / fp8gloo process group.

    block_size: elements per FP8 block, a multiple of 16 in [16, 4096].
    fp8_dtype: ``"e4m3"`` / ``torch.float8_e4m3fn`` or ``"e5m2"`` / ``torch.float8_e5m2``.
    min_numel: per-rank element count below which a collective passes through exactly.
    compress: which of all_reduce, reduce_scatter, all_gather are compressed
        (a list, or a comma-separated string; "all" or "none").
    """

    block_size: int | None = None
    fp8_dtype: str | torch.dtype | None = None
    min_numel: int | None = None
    compress: str | Iterable[str] | None = None

    def resolved(self) -> "Options":
        """A copy with every field filled from the environment or the defaults,
        and checked."""
        block_size = self.block_size
        if block_size is None:
            block_size = _env_int("FP8COMM_BLOCK_SIZE", DEFAULT_BLOCK_SIZE)
        if not isinstance(block_size, int) or not (16 <= block_size <= 4096 and block_size % 16 == 0):
            raise ValueError(f"fp8comm.Options: block_size must be a multiple of 16 in [16, 4096], got {block_size!r}")

        fp8 = self.fp8_dtype if self.fp8_dtype is not None else os.environ.get("FP8COMM_FP8_DTYPE", DEFAULT_FP8_DTYPE)
        key = fp8.lower() if isinstance(fp8, str) else fp8
        if key not in _FP8_NAMES:
            where = " (from FP8COMM_FP8_DTYPE)" if self.fp8_dtype is None else ""
            raise ValueError(
                "fp8comm.Options: fp8_dtype must be 'e4m3' / torch.float8_e4m3fn or 'e5m2' / "
                f"torch.float8_e5m2, got {fp8!r}{where}"
            )

        min_numel = self.min_numel
        if min_numel is None:
            min_numel = _env_int("FP8COMM_MIN_NUMEL", DEFAULT_MIN_NUMEL)
        if not isinstance(min_numel, int) or min_numel < 0:
            raise ValueError(f"fp8comm.Options: min_numel must be an int >= 0, got {min_numel!r}")

        compress = self.compress
        from_env = compress is None
        if from_env:
            compress = os.environ.get("FP8COMM_COMPRESS", ",".join(DEFAULT_COMPRESS))
        ops = _parse_ops(compress, "FP8COMM_COMPRESS" if from_env else "fp8comm.Options.compress")
        return Options(block_size=block_size, fp8_dtype=_FP8_NAMES[key], min_numel=min_numel, compress=ops)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"fp8comm: environment variable {name} must be an integer, got {raw!r}") from None


def _parse_ops(value, where: str) -> tuple[str, ...]:
    items = [s.strip() for s in value.split(",")] if isinstance(value, str) else [str(s).strip() for s in value]
    items = [s for s in items if s]
    if items == ["all"]:
        return COMPRESSIBLE_OPS
    if items in (["none"], []):
        return ()
    unknown = [s for s in items if s not in COMPRESSIBLE_OPS]
    if unknown:
        raise ValueError(f"{where}: unknown op(s) {unknown}; choose from {list(COMPRESSIBLE_OPS)}, 'all' or 'none'")
    return tuple(op for op in COMPRESSIBLE_OPS if op in items)
