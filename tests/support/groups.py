"""Extra process groups a scenario needs besides the pool's, created once per
worker process. Every rank runs the same scenarios in the same order, so every
rank creates them in the same order, as new_group requires."""
from __future__ import annotations

import contextlib
import os
import tempfile
from unittest import mock

import torch
import torch.distributed as dist

import fp8comm

_GROUPS: dict = {}


def fp8_group(spec: str):
    """An fp8gloo group over all ranks with the Options in `spec`
    ("key=value;..."; compress as a comma list), cached by spec."""
    if spec not in _GROUPS:
        kwargs = dict(item.split("=") for item in spec.split(";"))
        if "compress" in kwargs:
            kwargs["compress"] = kwargs["compress"].split(",")
        for key in ("block_size", "min_numel"):
            if key in kwargs:
                kwargs[key] = int(kwargs[key])
        _GROUPS[spec] = dist.new_group(backend="fp8gloo", pg_options=fp8comm.Options(**kwargs))
    return _GROUPS[spec]


def plain_gloo_group():
    """A second plain gloo group over all ranks, for barriers between cases:
    after one of its ops has failed, the pool's gloo group may re-raise that
    failure on some ranks only."""
    if "gloo" not in _GROUPS:
        _GROUPS["gloo"] = dist.new_group(backend="gloo")
    return _GROUPS["gloo"]


@contextlib.contextmanager
def cuda_world_of_one():
    """The default group as the CUDA tests use it: one rank on GPU 0,
    "cpu:fp8gloo,cuda:fp8nccl", every size compressed from 1024 elements."""
    with tempfile.TemporaryDirectory() as d:
        torch.cuda.set_device(0)
        dist.init_process_group(
            "cpu:fp8gloo,cuda:fp8nccl",
            init_method=f"file://{os.path.join(d, 'store')}",
            rank=0,
            world_size=1,
            pg_options=fp8comm.Options(min_numel=1024, compress="all"),
        )
        try:
            yield
        finally:
            dist.destroy_process_group()


@contextlib.contextmanager
def cpu_as_accelerator():
    """The CPU standing in for an accelerator, the default group bound to
    "cpu:0" as init_process_group(device_id=...) binds it on a GPU: torch's
    split_group and DeviceMesh's split path need both, so the path eager init
    takes on GPUs runs on CPU processes."""
    world = dist.distributed_c10d._get_default_group()
    unbound = world.bound_device_id
    world.bound_device_id = torch.device("cpu", 0)
    try:
        with mock.patch("torch.accelerator.is_available", return_value=True), \
                mock.patch("torch.accelerator.current_accelerator", return_value=torch.device("cpu")):
            yield
    finally:
        world.bound_device_id = unbound


def inner_transports(group) -> dict:
    """The inner backends of `group`'s fp8 backend for CPU tensors, by role:
    "group" (its own transport) and, in the inter_node scope, "intra" (among
    this node's ranks) and "inter" (among the ranks with this local index)."""
    backend = group._get_backend(torch.device("cpu"))
    found = {"group": backend.transport("cpu")}
    nodes = backend.node_transports("cpu")
    if nodes is not None:
        found["intra"], found["inter"] = nodes
    return found
