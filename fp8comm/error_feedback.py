"""Error feedback (DESIGN.md, "Error feedback"): the residuals a DDP hook or
an FSDP2 comm keeps between steps. A compressed call with ``residual=``
(fp8comm.functional) adds the residual to its input and overwrites it with
what the wire dropped of each element, so the next call puts this step's
quantization error back into its result instead of losing it.

One ``Residuals`` per hook state or FSDP comm holds one residual per key (a
DDP bucket, an FSDP parameter group), in float32 or, to halve the memory,
bfloat16. ``fp8comm.get_stats(group)["error_feedback_bytes"]`` counts them.
"""
from __future__ import annotations

import warnings
import weakref

import torch
import torch.distributed as dist

DTYPES = (torch.float32, torch.bfloat16)

# The Residuals objects that have kept something for a group (stats).
_HOLDERS: "weakref.WeakKeyDictionary[dist.ProcessGroup, weakref.WeakSet]" = weakref.WeakKeyDictionary()


def residual_dtype(error_feedback, where: str) -> torch.dtype | None:
    """The residual dtype an ``error_feedback=`` argument asks for: False /
    None: none; True: float32; torch.float32 or torch.bfloat16 as given."""
    if error_feedback is None or error_feedback is False:
        return None
    if error_feedback is True:
        return torch.float32
    if error_feedback in DTYPES:
        return error_feedback
    raise ValueError(f"{where}: error_feedback must be False, True (a float32 residual) or torch.float32 / "
                     f"torch.bfloat16, got {error_feedback!r}")


def bytes_kept(group) -> int:
    """The bytes of the error-feedback residuals kept for ``group`` in this process."""
    return sum(r.nbytes() for r in _HOLDERS.get(group, ()))


def tracks(group) -> bool:
    """Whether any error-feedback residual has been kept for ``group``."""
    return any(True for _ in _HOLDERS.get(group, ()))


class Residuals:
    """Residuals by key, each the size of the input it belongs to. ``where``
    names the owner in messages."""

    def __init__(self, dtype: torch.dtype, where: str):
        if dtype not in DTYPES:
            raise ValueError(f"{where}: the error-feedback residual must be float32 or bfloat16, got {dtype}")
        self.dtype = dtype
        self.where = where
        self._kept: dict = {}

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._kept.values())

    def get(self, key):
        return self._kept.get(key)

    def keep(self, key, residual: torch.Tensor, group) -> None:
        self._kept[key] = residual
        _HOLDERS.setdefault(group, weakref.WeakSet()).add(self)

    def drop(self, key, why: str) -> None:
        """Forgets ``key``'s residual, saying why (the quantization error it
        held is not fed back)."""
        if self._kept.pop(key, None) is not None:
            self.warn_dropped(key, why)

    def warn_dropped(self, what, why: str) -> None:
        warnings.warn(f"{self.where}: error feedback of {what}: {why}; its residual is dropped and starts again "
                      "from zero", stacklevel=4)

    def for_input(self, key, input: torch.Tensor, group) -> torch.Tensor:
        """``key``'s residual for an input like ``input``: the one kept when
        its size, device are the same, else zeros (with a warning when one of
        another size is dropped)."""
        kept = self._kept.get(key)
        if kept is not None and (kept.numel() != input.numel() or kept.device != input.device):
            self.drop(key, f"the input changed from {kept.numel()} elements on {kept.device} to "
                           f"{input.numel()} on {input.device}")
            kept = None
        if kept is None:
            kept = torch.zeros(input.numel(), dtype=self.dtype, device=input.device)
            self.keep(key, kept, group)
        return kept

    def forget(self, key) -> None:
        """Drops ``key``'s residual without a word (its values live on elsewhere)."""
        self._kept.pop(key, None)

    def clear(self) -> None:
        self._kept.clear()
