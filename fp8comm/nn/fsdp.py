"""The FP8 all-gather of Fp8Linear weights under FSDP2 (docs/fp8_linear.md).

Without it, FSDP2 all-gathers a weight in its own dtype (4 or 2 bytes per
element) and Fp8Linear then casts the whole gathered weight to FP8 on every
rank. With it, every rank casts only its shard, with the scale of the whole
weight, and the all-gather moves those FP8 bytes (1 byte per element); the
forward GEMM consumes them as they arrive, and the backward GEMM reuses them
transposed. The weight is quantized once, not twice, and the bytes are the
very bytes ``cast_to_fp8(full_weight, e4m3, rowwise=False)`` gives, because
the scale comes from the amax of the whole weight: an all_reduce MAX of the
shards' amaxes, which passes through the fp8 backends exactly.

Two tensor subclasses, both used through FSDP2's all-gather extension
(``fsdp_pre_all_gather`` / ``fsdp_post_all_gather``, which FSDP2 looks up on
the local tensor of a sharded parameter):

- :class:`Fp8AllGatherWeight` wraps the high-precision weight (the whole
  weight before ``fully_shard``, the local shard after). Every ordinary op
  (optimizer steps, copies, ``.data``, state_dict, load_state_dict) runs on the
  plain tensor inside; state_dict values are that plain tensor, so checkpoints
  load both ways.
- :class:`Fp8WeightCast` is what FSDP2 installs as the unsharded weight: the
  gathered FP8 bytes and their inverse scale. Fp8Linear recognizes it and does
  not cast the weight again. Any other op on it (a fallback GEMM, a weight tied
  to another module) sees the dequantized weight.

Tensorwise recipe only. The rowwise recipe needs the weight cast along rows in
the forward and along columns in the backward (dx = dy @ W contracts over the
rows of W); the row-cast bytes cannot give the column cast without a second
quantization of already-rounded values, so rowwise weights keep FSDP2's exact
all-gather (convert_to_fp8 does not wrap them).
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.distributed.tensor import DTensor

from ..codec import E4M3
from .scaling import cast_with_amax

_aten = torch.ops.aten

# Ops whose result is a view of the weight (shares its storage) or a copy of
# it: the result stays an Fp8AllGatherWeight, so FSDP2's sharding (chunk, pad,
# narrow, view, copy) and module.to() keep the subclass on the local shard.
_HP_VIEWS = {
    _aten.detach.default,
    _aten.alias.default,
    _aten.slice.Tensor,
    _aten.view.default,
    _aten.as_strided.default,
    _aten.split.Tensor,
    _aten.split_with_sizes.default,
}
_HP_COPIES = {
    _aten.empty_like.default,
    _aten.new_zeros.default,
    _aten.new_empty.default,
    _aten._to_copy.default,
    _aten._pin_memory.default,
    _aten.clone.default,
}

# Views of the gathered FP8 weight that keep it FP8 (FSDP2 applies as_strided;
# nn.Parameter applies detach).
_KEEP_FP8 = {
    _aten.detach.default,
    _aten.alias.default,
    _aten.view.default,
    _aten.as_strided.default,
}


def _returns_self(func) -> bool:
    """An in-place op (``add_``, ``copy_``...) that returns the tensor it wrote."""
    schema = func._schema
    if not schema.arguments or not schema.returns:
        return False
    alias = schema.arguments[0].alias_info
    return alias is not None and alias.is_write


class _Precomputed:
    """The amax precompute_fp8_scales_for_fsdp found for a weight, shared by
    every alias of the weight's storage (the FSDP2 shard, its padded flat
    view, ``.data``...). Any write through one of them clears it, and so does a
    move of the storage's version counter, so a stale amax is never used."""

    __slots__ = ("amax", "version")

    def __init__(self):
        self.amax = None
        self.version = -1


class Fp8AllGatherWeight(torch.Tensor):
    """A high-precision Fp8Linear weight (or its FSDP2 shard) that FSDP2
    all-gathers as tensorwise FP8 (module docstring).

    ``fp8_dtype``: the FP8 format of the gathered weight (the recipe's
    weight format, E4M3).
    """

    _tensor: torch.Tensor
    _fp8_dtype: torch.dtype
    _pre: _Precomputed

    @staticmethod
    def __new__(cls, tensor: torch.Tensor, fp8_dtype: torch.dtype = E4M3, _pre=None):
        return torch.Tensor._make_wrapper_subclass(
            cls,
            tensor.size(),
            strides=tensor.stride(),
            storage_offset=tensor.storage_offset(),
            dtype=tensor.dtype,
            layout=tensor.layout,
            device=tensor.device,
            requires_grad=tensor.requires_grad,
        )

    def __init__(self, tensor: torch.Tensor, fp8_dtype: torch.dtype = E4M3, _pre=None):
        if isinstance(tensor, Fp8AllGatherWeight):
            tensor = tensor._tensor
        self._tensor = tensor
        self._fp8_dtype = fp8_dtype
        self._pre = _pre if _pre is not None else _Precomputed()

    def __repr__(self):
        return f"Fp8AllGatherWeight({self._tensor!r}, fp8_dtype={self._fp8_dtype})"

    # ``param.data = t`` replaces the plain tensor inside (FSDP1 and
    # nn.Module._apply point parameters at new storage this way).
    @property
    def data(self):
        return torch._C.TensorBase.data.__get__(self)

    @data.setter
    def data(self, new: torch.Tensor):
        if not isinstance(new, Fp8AllGatherWeight):
            new = Fp8AllGatherWeight(new, self._fp8_dtype)
        torch._C.TensorBase.data.__set__(self, new)
        self._tensor = new._tensor
        self._pre = new._pre

    # Storage checks (FSDP1's use_orig_params compares storages) see the
    # storage of the plain tensor inside.
    def untyped_storage(self):
        return self._tensor.untyped_storage()

    def data_ptr(self):
        return self._tensor.data_ptr()

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        wrappers = []

        def unwrap(t):
            wrappers.append(t)
            return t._tensor

        plain_args, plain_kwargs = pytree.tree_map_only(cls, unwrap, (args, kwargs))
        out = func(*plain_args, **plain_kwargs)
        if func._schema.is_mutable:
            for w in wrappers:  # a write through any alias: the precomputed amax is stale
                w._pre.amax = None
        if _returns_self(func):
            return args[0]  # the wrapper whose inner tensor was written
        src = wrappers[0]
        if func in _HP_VIEWS:
            return pytree.tree_map_only(torch.Tensor, lambda t: cls(t, src._fp8_dtype, src._pre), out)
        if func in _HP_COPIES:
            return pytree.tree_map_only(torch.Tensor, lambda t: cls(t, src._fp8_dtype), out)
        return out

    def __tensor_flatten__(self):
        return ["_tensor"], self._fp8_dtype

    @staticmethod
    def __tensor_unflatten__(inner_tensors, fp8_dtype, outer_size, outer_stride):
        return Fp8AllGatherWeight(inner_tensors["_tensor"], fp8_dtype)

    # ------------------------------------------------------ FSDP2 extension
    def fsdp_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
        """Casts this rank's shard to FP8 with the scale of the whole weight.
        Returns ((fp8 shard, padded to FSDP2's shard size),) and the inverse
        scale as metadata."""
        hp = self._tensor
        param_dtype = getattr(mp_policy, "param_dtype", None) or hp.dtype
        # As without the extension: FSDP2 would gather the weight in param_dtype
        # and Fp8Linear would cast that; rounding to param_dtype first keeps the
        # FP8 bytes identical (a no-op without mixed precision).
        x32 = hp.to(param_dtype).float()
        rows = math.ceil(outer_size[0] / mesh.size()) if outer_size[0] else 0
        if x32.size(0) < rows:  # uneven sharding: FSDP2 wants the padded shard size
            padded = x32.new_zeros((rows, *x32.shape[1:]))
            padded[: x32.size(0)] = x32
            x32 = padded
        amax = self._whole_amax(mesh, param_dtype)
        data, inv_scale = cast_with_amax(x32, self._fp8_dtype, amax)
        return (data,), (inv_scale,)

    def fsdp_post_all_gather(self, all_gather_outputs, metadata, param_dtype, *, out=None):
        """The gathered FP8 bytes as the unsharded weight: an Fp8WeightCast that
        advertises ``param_dtype``; FSDP2 frees and refills ``data``."""
        (data,) = all_gather_outputs
        (inv_scale,) = metadata
        if out is not None:  # FSDP2 refilled data in place: only the scale is new
            _local(out)._inv_scale = inv_scale
            return None
        return Fp8WeightCast(data, inv_scale, param_dtype), (data,)

    # ------------------------------------------------------------ helpers
    def _local_amax(self, param_dtype) -> torch.Tensor:
        """amax of the shard as float32. Rounding commutes with max(|.|), so
        rounding this amax to param_dtype equals the amax of the rounded
        shard; an empty shard gives 0; NaN gives +inf, which MAX keeps."""
        hp = self._tensor
        if hp.numel() == 0:
            return torch.zeros((), dtype=torch.float32, device=hp.device)
        amax = hp.detach().to(param_dtype).float().abs().amax()
        return torch.nan_to_num(amax, nan=math.inf)

    def _whole_amax(self, mesh, param_dtype) -> torch.Tensor:
        pre = self._pre
        if pre.amax is not None and pre.version == self._tensor._version:
            return pre.amax.to(param_dtype).float()  # the precompute reduced float32 amaxes
        amax = self._local_amax(param_dtype)
        if mesh.size() > 1:
            dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=mesh.get_group())
        return amax


class Fp8WeightCast(torch.Tensor):
    """The unsharded weight FSDP2 builds from the FP8 all-gather: ``_data``
    (FP8, the weight's shape) and ``_inv_scale`` (float32 scalar), advertised
    as ``dtype`` (FSDP2's param_dtype). Fp8Linear feeds them to the GEMMs
    directly; any other op sees the dequantized weight (``dequantize()``)."""

    _data: torch.Tensor
    _inv_scale: torch.Tensor

    @staticmethod
    def __new__(cls, data: torch.Tensor, inv_scale: torch.Tensor, dtype: torch.dtype):
        return torch.Tensor._make_wrapper_subclass(
            cls,
            data.size(),
            strides=data.stride(),
            storage_offset=data.storage_offset(),
            dtype=dtype,
            layout=data.layout,
            device=data.device,
            requires_grad=False,
        )

    def __init__(self, data: torch.Tensor, inv_scale: torch.Tensor, dtype: torch.dtype):
        self._data = data
        self._inv_scale = inv_scale

    def __repr__(self):
        return f"Fp8WeightCast(data={self._data!r}, inv_scale={self._inv_scale!r}, dtype={self.dtype})"

    def dequantize(self) -> torch.Tensor:
        """The weight the FP8 bytes stand for, in this tensor's dtype (plain tensor)."""
        with torch.no_grad():
            return (self._data.float() * self._inv_scale).to(self.dtype)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _KEEP_FP8:
            self = args[0]
            data = func(self._data, *args[1:], **kwargs)
            return cls(data, self._inv_scale, self.dtype)
        if _returns_self(func) and isinstance(args[0], cls):
            raise RuntimeError(
                f"fp8comm: {func} would write into an FP8-gathered weight; FSDP2 rebuilds it from the "
                "high-precision shard at every all-gather, so write into the sharded parameter instead"
            )
        plain_args, plain_kwargs = pytree.tree_map_only(cls, lambda t: t.dequantize(), (args, kwargs))
        return func(*plain_args, **plain_kwargs)

    def __tensor_flatten__(self):
        return ["_data", "_inv_scale"], self.dtype

    @staticmethod
    def __tensor_unflatten__(inner_tensors, dtype, outer_size, outer_stride):
        return Fp8WeightCast(inner_tensors["_data"], inner_tensors["_inv_scale"], dtype)


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local tensor of a DTensor (FSDP2 with TP), else ``t``."""
    return t._local_tensor if isinstance(t, DTensor) else t


def wrap_weight(linear: nn.Module, fp8_dtype: torch.dtype = E4M3) -> None:
    """Makes ``linear.weight`` an Fp8AllGatherWeight (before ``fully_shard``).
    The parameter object is replaced; its values are shared, not copied."""
    w = linear.weight
    if isinstance(w, Fp8AllGatherWeight) or isinstance(_local(w), Fp8AllGatherWeight):
        return
    if isinstance(w, DTensor):
        raise ValueError("fp8comm: enable the FP8 all-gather before fully_shard / distribute_module")
    linear.weight = nn.Parameter(Fp8AllGatherWeight(w.detach(), fp8_dtype), requires_grad=w.requires_grad)


def unwrap_weight(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor behind an Fp8AllGatherWeight (or a DTensor of one, kept
    a DTensor); anything else unchanged. state_dict values pass through here."""
    if isinstance(t, Fp8AllGatherWeight):
        return t._tensor
    if isinstance(t, DTensor) and isinstance(t._local_tensor, Fp8AllGatherWeight):
        local = t._local_tensor
        return DTensor(local._tensor, t._spec, requires_grad=t.requires_grad)
    return t


def has_fp8_all_gather(module: nn.Module) -> bool:
    """Whether ``module.weight`` is all-gathered as FP8 under FSDP2."""
    w = getattr(module, "weight", None)
    return w is not None and isinstance(_local(w), Fp8AllGatherWeight)


@torch.no_grad()
def precompute_fp8_scales_for_fsdp(model: nn.Module) -> int:
    """One all_reduce MAX for the amaxes of every FP8-gathered weight of
    ``model`` (per process group), instead of one per weight per all-gather.
    Call it after ``optimizer.step()``; the next all-gathers use the result.
    The FP8 bytes are the same as without it. A weight changed after the call
    (its version counter moved) falls back to its own all_reduce, so a stale
    scale is never used. Returns the number of weights covered."""
    by_group: dict = {}
    for module in model.modules():
        w = module._parameters.get("weight") if hasattr(module, "_parameters") else None
        if not isinstance(w, DTensor):
            continue  # not sharded by FSDP2: nothing is gathered
        local = w._local_tensor
        if not isinstance(local, Fp8AllGatherWeight):
            continue
        mesh = w.device_mesh
        groups = tuple(mesh.get_group(d) for d in range(mesh.ndim))
        by_group.setdefault(groups, []).append(local)
    count = 0
    for groups, weights in by_group.items():
        amaxes = torch.stack([w._local_amax(torch.float32) for w in weights])
        for g in groups:
            if dist.get_world_size(g) > 1:
                dist.all_reduce(amaxes, op=dist.ReduceOp.MAX, group=g)
        for w, amax in zip(weights, amaxes.unbind()):
            w._pre.amax, w._pre.version = amax.clone(), w._tensor._version
        count += len(weights)
    return count
