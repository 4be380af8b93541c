"""Which fp8 backends serve a process group: its own ProcessGroupFp8 (an
fp8nccl / fp8gloo group), and those fp8comm.functional made over a plain
group's backend (DESIGN.md, "Any group"). Backend creation, stats, uncompressed
blocks and fp8comm.functional all ask here, so none of them imports another
to find out.
"""
from __future__ import annotations

import weakref

import torch
import torch.distributed as dist

from . import _C

# fp8comm.functional's compressors: {group: {key: ProcessGroupFp8}}, for the group's life.
_COMPRESSORS: "weakref.WeakKeyDictionary[dist.ProcessGroup, dict]" = weakref.WeakKeyDictionary()


def compressor(group: dist.ProcessGroup, key, make):
    """The compressor of ``group`` under ``key``, made by ``make(number)``
    (number: how many the group had before) the first time."""
    made = _COMPRESSORS.setdefault(group, {})
    if key not in made:
        made[key] = make(len(made))
    return made[key]


def compressors(group=None) -> list:
    """The ProcessGroupFp8 objects fp8comm.functional made for ``group`` (default: the world)."""
    pg = group if group is not None else (dist.distributed_c10d._get_default_group() if dist.is_initialized()
                                          else None)
    return list(_COMPRESSORS.get(pg, {}).values()) if pg is not None else []


def fp8_backends(group=None, functional: bool = True) -> list:
    """The distinct ProcessGroupFp8 objects behind ``group`` (default: the
    world): its own, and (``functional``) those fp8comm.functional made over
    its backends."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    found = compressors(pg) if functional else []
    for device in ("cpu", "cuda"):
        try:
            backend = pg._get_backend(torch.device(device))
        except RuntimeError:
            continue
        if isinstance(backend, _C.ProcessGroupFp8) and not any(backend is b for b in found):
            found.append(backend)
    return found


def fp8_groups() -> list:
    """Every live process group of this process with an fp8 backend or an
    fp8comm.functional compressor, each as (group, its fp8 backends); a
    backend shared by several group objects is listed under the first."""
    if not dist.is_initialized():
        return []
    groups = list(dist.distributed_c10d._world.pg_map)
    groups += [g for g in _COMPRESSORS.keys() if not any(g is h for h in groups)]
    found, seen = [], []
    for pg in groups:
        backends = [b for b in fp8_backends(pg) if not any(b is s for s in seen)]
        if backends:
            seen += backends
            found.append((pg, backends))
    return found
