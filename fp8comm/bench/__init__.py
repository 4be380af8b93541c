"""Benchmarks shipped with the package, and what they share.

    python -m fp8comm.bench comm [--nproc N] [comm options]   # fp8 backend vs its inner backend
    python -m fp8comm.bench comm --replot RESULT.json --plot OUT.png

`comm` runs under torchrun on N local processes (default 2); `--replot` draws
a saved result without starting any process group. The other benchmarks
(codec, accuracy, linear, model, cpu_breakdown) live in the source tree's
bench/ folder.
"""
from __future__ import annotations

import os

import torch.distributed as dist

# The single-tensor reduce_scatter / all_gather under torch's current names:
# where they exist, the old names warn on every call; older torch has only those.
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def device_label(cuda: bool) -> str:
    """The device a benchmark ran on, for its results: the GPU's name, or the
    CPU's model, core count and the codec kernels it ran (CPU results differ
    by vendor: docs/performance.md)."""
    import torch

    if cuda:
        return torch.cuda.get_device_name()
    model = "CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    from fp8comm import _C

    kernels = "AVX-512 + AVX2" if _C.cpu_simd_enabled() and _C.cpu_avx512_enabled() else (
        "AVX2" if _C.cpu_simd_enabled() else "scalar")
    return f"{model} ({os.cpu_count()} cores, {kernels} codec kernels)"
