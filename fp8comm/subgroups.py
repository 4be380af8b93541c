"""Splitting fp8 groups: :func:`split` runs when torch splits an fp8 group
(``ProcessGroupFp8::split``), and :func:`install` makes ``new_group`` under
eager init split from an fp8 world's NCCL transport. How and why: DESIGN.md,
"Subgroups".
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
        group = backend.create(device, creation, fp8_options, inner=inner)
    return group


def _nccl_of_fp8_backends(get_split_source):
    """torch's _get_split_source, answering an fp8 backend's NCCL transport
    for the fp8 backend itself (None where its transport is not NCCL). Its
    arguments pass through as given: torch 2.15 added the requested backend
    (and answers None when it is not the parent's)."""

    def split_source(pg, *args, **kwargs):
        source = get_split_source(pg, *args, **kwargs)
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
