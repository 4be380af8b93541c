"""State dicts are exact (DESIGN.md, "State dicts are exact").

A checkpoint must hold the weights bit for bit, whatever ``Options.compress``
says of all_gather: the functions through which torch and DeepSpeed gather a
full state dict (or summon full parameters) run inside an *exact scope*
(csrc/backend/exact_scope.h), in which every call the thread makes on any fp8
group passes through to the inner backend untouched. Training's own parameter
all-gathers, outside those functions, stay compressed.

The scope is not collective (unlike ``fp8comm.uncompressed``): the wrapped
functions are collectives, entered by every rank at the same point, so every
rank opens the scope at the same call.

``install()`` wraps, once per process, when the first fp8 group is created:

- ``DTensor.full_tensor`` (user code, FSDP2 / TP state dicts);
- ``torch.distributed._state_dict_utils._gather_state_dict`` wherever a torch
  module bound it (``get_state_dict`` / ``get_model_state_dict`` /
  ``get_optimizer_state_dict`` with ``full_state_dict=True``, FSDP1's
  optimizer state dicts);
- FSDP1: the flat-parameter all-gather while its handle summons full
  parameters (``FULL_STATE_DICT``, ``summon_full_params``) and its gradient
  gather, and ``_optim_state_dict`` (``FSDP.optim_state_dict``);
- DeepSpeed, when it is imported: ZeRO-3's consolidated 16-bit state dict
  (``save_16bit_model``).

A name a torch release lacks is skipped (``installed()`` lists what was
wrapped); tests/integrations/test_state_dict_exact.py runs on every torch CI
builds, so a path that moved fails there.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import sys

from . import _C

_WRAPPED = "fp8comm_exact"  # marks a wrapper, so install() is idempotent
_installed: list[str] = []


@contextlib.contextmanager
def exact_scope():
    """Every call this thread makes on an fp8 group inside passes through
    exactly. Internal: open it only around code every rank runs at the same
    point (a collective function)."""
    _C.enter_exact_scope()
    try:
        yield
    finally:
        _C.leave_exact_scope()


def _exact(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with exact_scope():
            return fn(*args, **kwargs)

    setattr(wrapper, _WRAPPED, True)
    return wrapper


def _wrap_attribute(owner, name: str, make_wrapper, label: str) -> None:
    fn = getattr(owner, name, None)
    if fn is None or getattr(fn, _WRAPPED, False):
        return
    setattr(owner, name, make_wrapper(fn))
    _installed.append(label)


def _wrap_function_everywhere(module_name: str, name: str, modules: tuple[str, ...]) -> None:
    """Wraps `module_name.name` and every binding of that same function in
    `modules` (modules that imported it by name hold their own reference)."""
    try:
        home = importlib.import_module(module_name)
    except ImportError:
        return
    original = getattr(home, name, None)
    if original is None:
        return
    if getattr(original, _WRAPPED, False):
        original = original.__wrapped__
    wrapper = _exact(original)
    bound = []  # imported first: importing one of them binds `name` as it is now
    for mod_name in (module_name, *modules):
        try:
            bound.append(importlib.import_module(mod_name))
        except ImportError:
            continue
    for mod in bound:
        if getattr(mod, name, None) is original:
            setattr(mod, name, wrapper)
            _installed.append(f"{mod.__name__}.{name}")


def _exact_while_summoning(fn):
    """FlatParamHandle methods: exact while the handle summons full
    parameters (state dicts, summon_full_params), compressed in training."""
    from torch.distributed.fsdp._common_utils import HandleTrainingState

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        if self._training_state == HandleTrainingState.SUMMON_FULL_PARAMS:
            with exact_scope():
                return fn(self, *args, **kwargs)
        return fn(self, *args, **kwargs)

    setattr(wrapper, _WRAPPED, True)
    return wrapper


def _install_torch() -> None:
    from torch.distributed.tensor import DTensor

    _wrap_attribute(DTensor, "full_tensor", _exact, "DTensor.full_tensor")
    _wrap_function_everywhere(
        "torch.distributed._state_dict_utils", "_gather_state_dict",
        ("torch.distributed.checkpoint.state_dict", "torch.distributed.fsdp._optim_utils"))
    _wrap_function_everywhere(
        "torch.distributed.fsdp._optim_utils", "_optim_state_dict",
        ("torch.distributed.fsdp.fully_sharded_data_parallel",))
    try:
        from torch.distributed.fsdp._flat_param import FlatParamHandle
    except ImportError:
        return
    for method in ("_all_gather_flat_param", "unshard_grad"):
        _wrap_attribute(FlatParamHandle, method, _exact_while_summoning, f"FlatParamHandle.{method}")


def _install_deepspeed() -> None:
    if "deepspeed" not in sys.modules:
        return
    try:
        from deepspeed.runtime.engine import DeepSpeedEngine
    except ImportError:
        return
    _wrap_attribute(DeepSpeedEngine, "_zero3_consolidated_16bit_state_dict", _exact,
                    "DeepSpeedEngine._zero3_consolidated_16bit_state_dict")


def install() -> None:
    """Wraps the state-dict gathers of torch (and DeepSpeed, if imported);
    safe to call more than once."""
    _install_torch()
    _install_deepspeed()


def installed() -> list[str]:
    """What install() wrapped in this process."""
    return list(_installed)
