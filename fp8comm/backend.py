"""Registers the fp8nccl (CUDA) and fp8gloo (CPU) backends with torch.distributed.

Each creator builds the inner transport exactly as torch builds its own nccl /
gloo backends, then wraps it in the C++ ProcessGroupFP8 (DESIGN.md, "Layers").
"""
from __future__ import annotations

import torch.distributed as dist

from . import _C
from .options import Options

BACKENDS = {"fp8gloo": "cpu", "fp8nccl": "cuda"}


def _options_of(pg_options) -> Options:
    if pg_options is None:
        return Options().resolved()
    if not isinstance(pg_options, Options):
        raise TypeError(
            f"fp8comm: pg_options must be fp8comm.Options, got {type(pg_options).__name__}; "
            "pass fp8comm.Options(...) to init_process_group / new_group"
        )
    return pg_options.resolved()


def _gloo_transport(opts):
    if not dist.is_gloo_available():
        raise RuntimeError("fp8gloo needs torch.distributed with gloo, which this torch build lacks")
    inner = dist.ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    inner.options.global_ranks_in_group = opts.global_ranks_in_group
    inner.options.group_name = opts.group_id
    return inner


def _nccl_transport(opts):
    if not dist.is_nccl_available():
        raise RuntimeError("fp8nccl needs torch.distributed with NCCL (a CUDA build of torch)")
    nccl_opts = dist.ProcessGroupNCCL.Options()
    nccl_opts.is_high_priority_stream = False
    nccl_opts._timeout = opts.timeout
    nccl_opts.global_ranks_in_group = opts.global_ranks_in_group
    nccl_opts.group_name = opts.group_id
    return dist.ProcessGroupNCCL(opts.store, opts.group_rank, opts.group_size, nccl_opts)


def _create(device: str, dist_backend_opts, pg_options):
    options = _options_of(pg_options)
    inner = _gloo_transport(dist_backend_opts) if device == "cpu" else _nccl_transport(dist_backend_opts)
    # torch only does this for backends it names "gloo" / "nccl".
    inner._set_sequence_number_for_group()
    return _C.attach_or_create(
        dist_backend_opts.store,
        dist_backend_opts.group_rank,
        dist_backend_opts.group_size,
        dist_backend_opts.group_id,
        device,
        inner,
        block_size=options.block_size,
        fp8_format=options.fp8_dtype,
        min_numel=options.min_numel,
        compress_allreduce="all_reduce" in options.compress,
        compress_reduce_scatter="reduce_scatter" in options.compress,
        compress_allgather="all_gather" in options.compress,
    )


def _create_fp8gloo(dist_backend_opts, pg_options):
    return _create("cpu", dist_backend_opts, pg_options)


def _create_fp8nccl(dist_backend_opts, pg_options):
    return _create("cuda", dist_backend_opts, pg_options)


def register() -> None:
    """Registers both backends; safe to call more than once."""
    creators = {"fp8gloo": _create_fp8gloo, "fp8nccl": _create_fp8nccl}
    for name, device in BACKENDS.items():
        if name.upper() in dist.Backend._plugins:
            continue
        dist.Backend.register_backend(name, creators[name], extended_api=True, devices=[device])
