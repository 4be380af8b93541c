"""A DDP communication hook with fp8comm's compressed all_reduce, for DDP on
a plain nccl / gloo group (DESIGN.md, "Any group"):

    ddp.register_comm_hook(fp8comm.hooks.Fp8HookState(), fp8comm.hooks.fp8_compress_hook)

It divides each bucket by the group's size and all-reduces it as DDP's
default hook does, with fp8comm.functional.all_reduce: DDP with it equals DDP
over an fp8 group with the same options bitwise. With ``error_feedback`` it
keeps what the wire dropped of each gradient element and adds it to the next
step's gradient (DESIGN.md, "Error feedback").
"""
# No `from __future__ import annotations`: DDP checks the hook's annotations as objects.
import torch
import torch.distributed as dist

from . import functional
from .error_feedback import Residuals, residual_dtype
from .options import Options

_WHERE = "fp8comm.hooks.Fp8HookState"


class Fp8HookState:
    """What fp8_compress_hook needs: the group (None: DDP's, the default
    group), the options (None: the FP8COMM_* environment) and error feedback
    (False; True: a float32 residual; torch.bfloat16: half the memory).

    The residual is kept per parameter, so it survives DDP's bucket rebuild;
    a parameter whose size changed loses its residual, with a warning.
    ``state_dict(model)`` / ``load_state_dict(state, model)`` save and restore
    it by parameter name. Pickles without its group and residuals, as torch's
    hook states do (a restored state takes the default group)."""

    __slots__ = ("group", "options", "error_feedback", "residuals", "_layouts", "_by_param", "_seen")

    def __init__(self, group: dist.ProcessGroup | None = None, options: Options | None = None,
                 error_feedback=False):
        if options is not None and not isinstance(options, Options):
            raise TypeError(f"{_WHERE}: options must be fp8comm.Options, got {type(options).__name__}")
        self.group = group
        self.options = options
        self.error_feedback = residual_dtype(error_feedback, _WHERE)
        self.residuals = Residuals(self.error_feedback, _WHERE) if self.error_feedback is not None else None
        self._layouts = {}   # bucket index -> ((parameter id, offset, numel), ...) of its kept residual
        self._by_param = {}  # parameter id -> its part of a kept residual
        self._seen = set()   # bucket indices of this step so far

    def __getstate__(self):
        return {"options": self.options, "error_feedback": self.error_feedback}

    def __setstate__(self, state):
        self.__init__(None, state["options"], state.get("error_feedback") or False)

    # ---- error feedback
    def _bucket_residual(self, bucket: dist.GradBucket, group) -> torch.Tensor:
        """The bucket's residual, laid out like its buffer. A new layout (the
        first step, DDP's bucket rebuild, a loaded state) takes each
        parameter's part from wherever it was kept."""
        buffer = bucket.buffer()
        layout = _layout(bucket)
        index = bucket.index()
        self._seen.add(index)
        kept = self.residuals.get(index)
        if kept is not None and self._layouts.get(index) == layout:
            return kept
        fresh = torch.zeros(buffer.numel(), dtype=self.error_feedback, device=buffer.device)
        for key, offset, numel in layout:
            old = self._by_param.get(key)
            if old is not None and old.numel() != numel:
                self._by_param.pop(key)
                self.residuals.warn_dropped(f"bucket {index}", f"a parameter changed from {old.numel()} elements to "
                                                            f"{numel}")
            elif old is not None:
                fresh[offset:offset + numel].copy_(old)
        for key, offset, numel in layout:
            self._by_param[key] = fresh[offset:offset + numel]
        self.residuals.keep(index, fresh, group)
        self._layouts[index] = layout
        return fresh

    def _end_of_step(self) -> None:
        """After the last bucket of a step: forget the buckets this step did
        not have (a rebuild into fewer) and the parts of parameters no bucket
        holds any more, so that their memory is freed."""
        for index in [i for i in self._layouts if i not in self._seen]:
            del self._layouts[index]
            self.residuals.forget(index)
        live = {key for layout in self._layouts.values() for key, _, _ in layout}
        for key in [k for k in self._by_param if k not in live]:
            del self._by_param[key]
        self._seen.clear()

    def residual_bytes(self) -> int:
        """Bytes of the residuals this state keeps."""
        return self.residuals.nbytes() if self.residuals is not None else 0

    def state_dict(self, model: torch.nn.Module) -> dict:
        """The error-feedback residuals by ``model``'s parameter names (the
        module DDP wraps, or DDP itself)."""
        names = _parameter_names(model)
        residuals = {names[key]: part.clone() for key, part in self._by_param.items() if key in names}
        return {"error_feedback": self.error_feedback, "residuals": residuals}

    def load_state_dict(self, state: dict, model: torch.nn.Module) -> None:
        """Restores residuals saved by state_dict onto ``model``'s parameters
        of the same names and sizes; used from the next bucket on."""
        if state.get("error_feedback") != self.error_feedback:
            raise ValueError(f"{_WHERE}.load_state_dict: the state was saved with error_feedback="
                             f"{state.get('error_feedback')}, this state has {self.error_feedback}; "
                             "make the hook state with the same error_feedback")
        by_name = {name: key for key, name in _parameter_names(model).items()}
        unknown = sorted(set(state["residuals"]) - set(by_name))
        if unknown:
            raise ValueError(f"{_WHERE}.load_state_dict: the model has no parameters named {unknown[:5]}; "
                             "pass the model the state was saved from")
        self.residuals.clear()
        self._layouts.clear()
        self._by_param = {by_name[name]: part.to(self.error_feedback) for name, part in state["residuals"].items()}


def _layout(bucket: dist.GradBucket) -> tuple:
    """(parameter id, offset in the buffer, numel) of each of the bucket's parameters."""
    buffer = bucket.buffer()
    base = buffer.storage_offset()
    out, offset = [], 0
    for p, g in zip(bucket.parameters(), bucket.gradients()):
        shares = g.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
        at = g.storage_offset() - base if shares else offset
        out.append((id(p), at, g.numel()))
        offset = at + g.numel()
    return tuple(out)


def _parameter_names(model: torch.nn.Module) -> dict:
    """id(parameter) -> its name, without DDP's "module." prefix."""
    names = {}
    for name, p in model.named_parameters():
        names[id(p)] = name[len("module."):] if isinstance(model, torch.nn.parallel.DistributedDataParallel) else name
    return names


def fp8_compress_hook(state: Fp8HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The bucket's mean over the group, all-reduced compressed (with the
    bucket's residual added first, under error feedback)."""
    group = state.group if state.group is not None else dist.distributed_c10d._get_default_group()
    tensor = bucket.buffer()
    tensor.div_(group.size())
    residual = state._bucket_residual(bucket, group) if state.residuals is not None else None
    work = functional.all_reduce(tensor, group=group, async_op=True, options=state.options, residual=residual)
    if residual is not None and bucket.is_last():
        state._end_of_step()
    return work.get_future().then(lambda _: tensor)
