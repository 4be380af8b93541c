"""A DDP communication hook with fp8comm's compressed all_reduce, for DDP on
a plain nccl / gloo group (DESIGN.md, "Any group"):

    ddp.register_comm_hook(fp8comm.hooks.Fp8HookState(), fp8comm.hooks.fp8_compress_hook)

It divides each bucket by the group's size and all-reduces it as DDP's
default hook does, with fp8comm.functional.all_reduce: DDP with it equals DDP
over an fp8 group with the same options bitwise.
"""
# No `from __future__ import annotations`: DDP checks the hook's annotations as objects.
import torch
import torch.distributed as dist

from . import functional
from .options import Options


class Fp8HookState:
    """What fp8_compress_hook needs: the group (None: DDP's, the default
    group) and the options (None: the FP8COMM_* environment). Pickles without
    its group, as torch's hook states do (a restored state takes the default
    group)."""

    __slots__ = ("group", "options")

    def __init__(self, group: dist.ProcessGroup | None = None, options: Options | None = None):
        if options is not None and not isinstance(options, Options):
            raise TypeError(f"fp8comm.hooks.Fp8HookState: options must be fp8comm.Options, got "
                            f"{type(options).__name__}")
        self.group = group
        self.options = options

    def __getstate__(self):
        return {"options": self.options}

    def __setstate__(self, state):
        self.group = None
        self.options = state["options"]


def fp8_compress_hook(state: Fp8HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The bucket's mean over the group, all-reduced compressed."""
    group = state.group if state.group is not None else dist.distributed_c10d._get_default_group()
    tensor = bucket.buffer()
    tensor.div_(group.size())
    work = functional.all_reduce(tensor, group=group, async_op=True, options=state.options)
    return work.get_future().then(lambda _: tensor)
