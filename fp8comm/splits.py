"""Split sizes of an all_to_all_single, checked where they enter
(fp8comm.functional): each caller's mistake is named here, in Python, rather
than deep in gloo or NCCL as a size mismatch (or, for splits the ranks
disagree on, a hang).

A split size counts rows: slices of the tensor's first dimension, each of
``row_numel`` elements (the product of the trailing dimensions).
"""
from __future__ import annotations

import math
import operator

import torch


def row_numel(tensor: torch.Tensor) -> int:
    """Elements per row (first-dimension slice) of ``tensor``."""
    return math.prod(tensor.shape[1:])


def as_sizes(splits, op: str, what: str) -> list[int] | None:
    """``splits`` (None, or a sequence of ints) as a list of ints."""
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        raise TypeError(f"fp8comm.functional.{op}: {what} must be a list of ints, got a tensor; "
                        f"pass {what}.tolist()")
    try:
        sizes = [operator.index(s) for s in splits]
    except TypeError:
        raise TypeError(f"fp8comm.functional.{op}: {what} must be a list of ints, got {splits!r}") from None
    if any(s < 0 for s in sizes):
        raise ValueError(f"fp8comm.functional.{op}: {what} {sizes} has a negative size; each is a row count >= 0")
    return sizes


def check(sizes: list[int] | None, tensor: torch.Tensor, world: int, op: str, what: str, name: str) -> None:
    """Raises unless ``sizes`` (rows for each of ``world`` ranks, or None for
    equal slices) fit ``tensor`` (called ``name``)."""
    rows = tensor.shape[0]
    if sizes is None:
        if rows % world:
            raise ValueError(f"fp8comm.functional.{op}: {name} has {rows} rows, which the group's {world} ranks "
                             f"cannot split equally; pass {what} (one row count per rank)")
        return
    if len(sizes) != world:
        raise ValueError(f"fp8comm.functional.{op}: {what} has {len(sizes)} sizes but the group has {world} ranks; "
                         "pass one row count per rank")
    if sum(sizes) != rows:
        raise ValueError(f"fp8comm.functional.{op}: {what} {sizes} sum to {sum(sizes)} rows but {name} has {rows}; "
                         f"the sizes must add up to {name}.shape[0]")


def check_pair(output: torch.Tensor, input: torch.Tensor, op: str) -> None:
    """Raises unless ``output`` and ``input`` can be the two ends of one
    all_to_all_single: tensors of at least one dimension, one dtype and
    device, and rows of the same element count."""
    for name, t in (("output", output), ("input", input)):
        if t.dim() == 0:
            raise ValueError(f"fp8comm.functional.{op}: {name} is a scalar; it needs a first dimension to split "
                             "(view it as shape [1])")
    if output.dtype != input.dtype:
        raise TypeError(f"fp8comm.functional.{op}: output is {output.dtype} but input is {input.dtype}; "
                        "give both one dtype")
    if output.device != input.device:
        raise ValueError(f"fp8comm.functional.{op}: output is on {output.device} but input is on {input.device}; "
                         "keep both on one device")
    if row_numel(output) != row_numel(input):
        raise ValueError(f"fp8comm.functional.{op}: output's rows hold {row_numel(output)} elements "
                         f"(shape {list(output.shape)}) but input's hold {row_numel(input)} (shape "
                         f"{list(input.shape)}); split sizes count rows, so both need the same trailing size")


def equal(rows: int, world: int) -> list[int]:
    """The equal split of ``rows`` over ``world`` ranks (rows divisible by world)."""
    return [rows // world] * world
