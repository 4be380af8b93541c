"""Backends that let CPU machines run the paths fp8nccl takes on GPUs
(DESIGN.md, "Testing strategy"). Not for training.

- ``fp8ncclsim``: CPU tensors over torch's gloo wrapped to behave as
  ProcessGroupNCCL does (csrc/testing/nccl_like_backend.h): fp8comm gives it
  NCCL's traits, so the compressed algorithms take fp8nccl's exact path
  (no segment headers, in-place all_gather, NCCL's chunk size, AVG and
  PREMUL_SUM passed to the transport), and synchronous calls return no Work.
- ``fp8gloocuda``: CUDA tensors over torch's gloo, for several ranks sharing
  one GPU, where NCCL refuses two ranks on one device.

Call :func:`register` (any number of times) before creating a group.
"""
from __future__ import annotations

import torch.distributed as dist

from . import _C, backend


def _create_ncclsim(dist_backend_opts, pg_options):
    return backend._create(
        "cpu", dist_backend_opts, pg_options,
        make_transport=lambda opts: _C.NcclLikeBackend(backend._gloo_transport(opts)),
    )


def _create_gloocuda(dist_backend_opts, pg_options):
    return backend._create("cuda", dist_backend_opts, pg_options, make_transport=backend._gloo_transport)


def register() -> None:
    """Registers fp8ncclsim (CPU) and fp8gloocuda (CUDA); safe to call more than once."""
    for name, creator, device in (("fp8ncclsim", _create_ncclsim, "cpu"), ("fp8gloocuda", _create_gloocuda, "cuda")):
        if name.upper() not in dist.Backend._plugins:
            dist.Backend.register_backend(name, creator, extended_api=True, devices=[device])
