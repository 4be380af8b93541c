"""Splitting fp8 groups (DESIGN.md, "Subgroups").

torch creates subgroups by splitting their parent where the parent's backend
can split: ``torch.distributed.split_group`` and, under eager init
(``init_process_group(..., device_id=...)``), DeviceMesh's dimension groups.
Its C++ ``ProcessGroup::splitGroup`` calls ``ProcessGroupFp8::split`` on every
rank of the parent, which runs :func:`split` below (installed by
:func:`install` when fp8comm is imported):

- every inner transport is split, on every rank of the parent and in one
  order (NCCL's split is collective over the parent's communicator: ranks
  outside the new group take part with a no-color split), each with options
  of its own kind;
- on the members, the new group is created from those transports exactly as
  the creator creates any fp8 group (``backend._create``: options agreed by
  every rank through the store, CPU threads sized), with the fp8 options
  torch passed, or the parent's where torch passed another backend's.

Under eager init, ``new_group`` splits too: it asks ``_get_split_source`` for
the default group's backend when that backend can split, hands it to a new
NCCL group as the communicator to split from (``split_from``) and has the
ranks outside the new group call its ``perform_nocolor_split``; both are
ProcessGroupNCCL's. :func:`install` therefore makes torch see the NCCL
transport of an fp8 default group there (none for other transports, which
need no split), and fp8nccl's creator splits its NCCL transport from it.
"""
from __future__ import annotations

import copy

import torch.distributed as dist

from . import _C, backend
from .options import Options


def _transport_options(inner, timeout, group_name: str):
    """A copy of ``inner``'s own options for its split, with the split's
    timeout and name: torch's NCCL split needs ProcessGroupNCCL.Options, and
    gloo's falls back to its defaults (and their timeout) for any other kind."""
    own = _C.transport_options(inner)
    if dist.is_gloo_available() and isinstance(own, dist.ProcessGroupGloo._Options):
        options = dist.ProcessGroupGloo._Options()
        options._devices = own._devices
        options._threads = own._threads
    else:
        options = copy.deepcopy(own)
    options._timeout = timeout
    options.group_name = group_name
    return options


def split(parent, store, ranks: list[int], options):
    """ProcessGroupFp8.split: the new ProcessGroupFp8 on a rank in ``ranks``
    (sorted ranks of ``parent``), None elsewhere."""
    timeout, group_name = options._timeout, options.group_name
    transports = [(device, parent.transport(device)) for device in ("cpu", "cuda")]
    split_transports = [
        (device, _C.split_transport(inner, store, ranks, _transport_options(inner, timeout, group_name)))
        for device, inner in transports if inner is not None
    ]
    if parent.rank() not in ranks:
        return None
    creation = dist.distributed_c10d._DistributedBackendOptions()
    creation.store = store
    creation.group_rank = ranks.index(parent.rank())
    creation.group_size = len(ranks)
    creation.timeout = timeout
    creation.group_id = group_name
    creation.global_ranks_in_group = list(_C.transport_options(split_transports[0][1]).global_ranks_in_group)
    fp8_options = options if isinstance(options, Options) else parent.options
    group = None
    for device, inner in split_transports:
        group = backend._create(device, creation, fp8_options, inner=inner)
    return group


def _nccl_of_fp8_backends(get_split_source):
    """torch's _get_split_source, answering an fp8 backend's NCCL transport
    for the fp8 backend itself (None where its transport is not NCCL)."""

    def split_source(pg):
        source = get_split_source(pg)
        if isinstance(source, _C.ProcessGroupFp8):
            inner = source.transport("cuda")
            return inner if dist.is_nccl_available() and isinstance(inner, dist.ProcessGroupNCCL) else None
        return source

    split_source.fp8comm_wraps = get_split_source
    return split_source


def install() -> None:
    """Makes ProcessGroupFp8.split run :func:`split`, and torch split new
    NCCL groups from an fp8 default group's NCCL transport; once per process."""
    _C._set_splitter(split)
    c10d = dist.distributed_c10d
    if not hasattr(c10d._get_split_source, "fp8comm_wraps"):
        c10d._get_split_source = _nccl_of_fp8_backends(c10d._get_split_source)
