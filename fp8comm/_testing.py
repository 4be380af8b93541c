"""Test backends: CPU processes run the paths fp8nccl takes on GPUs
(DESIGN.md, "Testing strategy"). Private: for fp8comm's tests, not for
training.

- ``fp8ncclsim``: ProcessGroupFp8 on CPU tensors over the fp8ncclsim
  transport (csrc/testing/ncclsim_transport.h), torch's gloo made to behave
  as ProcessGroupNCCL does; its node transports are fp8ncclsim transports
  too. It is named "nccl", so fp8comm gives it NCCL's traits
  (csrc/algorithms/transport_traits.h) and the compressed algorithms take
  fp8nccl's exact path. It reduces AVG and PREMUL_SUM with fp8comm's own
  emulation around gloo's SUM, and returns no Work for a synchronous call.
- ``ncclsim``: the fp8ncclsim transport alone, a plain group that stands
  for a plain ``nccl`` group (fp8comm.functional, fsdp and hooks over it).
- ``fp8gloocuda``: CUDA tensors over torch's gloo, for several ranks sharing
  one GPU, where NCCL refuses two ranks on one device.

Call :func:`register` (any number of times) before creating a group.
"""
from __future__ import annotations

import torch.distributed as dist

from . import _C, backend


def _ncclsim_transport(opts):
    return _C._NcclSimTransport(backend.gloo_transport(opts))


def _create_ncclsim(dist_backend_opts, pg_options):
    return backend.create("cpu", dist_backend_opts, pg_options, make_transport=_ncclsim_transport)


def _create_plain_ncclsim(dist_backend_opts, pg_options):
    transport = _ncclsim_transport(dist_backend_opts)
    transport._set_sequence_number_for_group()
    return transport


def _create_gloocuda(dist_backend_opts, pg_options):
    return backend.create("cuda", dist_backend_opts, pg_options, make_transport=backend.gloo_transport)


def register() -> None:
    """Registers fp8ncclsim and ncclsim (CPU) and fp8gloocuda (CUDA); safe to call more than once."""
    backend.NODE_TRANSPORT_MAKERS[_C._NcclSimTransport] = _ncclsim_transport
    for name, creator, device in (("fp8ncclsim", _create_ncclsim, "cpu"), ("ncclsim", _create_plain_ncclsim, "cpu"),
                                  ("fp8gloocuda", _create_gloocuda, "cuda")):
        if name.upper() not in dist.Backend._plugins:
            dist.Backend.register_backend(name, creator, extended_api=True, devices=[device])
