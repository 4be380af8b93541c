"""Builds fp8comm._C: a CUDAExtension when torch has CUDA and a CUDA toolkit
of the same major version is found, otherwise a CppExtension with the CPU codec
and backend only (build_config.py decides, and warns when a CUDA torch gets the
CPU-only build).

    pip install --no-build-isolation -e .

FP8COMM_FORCE_CPU=1 builds the CPU-only extension on a CUDA machine.
TORCH_CUDA_ARCH_LIST picks the GPU targets (default "9.0+PTX": Hopper code plus
PTX that newer GPUs compile at load time).
"""
import glob
import importlib.util
import os
import sys

import torch
from setuptools import setup
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.abspath(__file__))


def load_build_config():
    # Loaded by path: build_config.py sits next to this file and is not part of the package.
    path = os.path.join(ROOT, "build_config.py")
    spec = importlib.util.spec_from_file_location("fp8comm_build_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sources(pattern):
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "csrc", "**", pattern), recursive=True))


build_config = load_build_config()
plan = build_config.decide(
    torch.version.cuda,
    cpp_extension.CUDA_HOME,
    build_config.nvcc_version(cpp_extension.CUDA_HOME),
    os.environ,
)
print(f"fp8comm setup: {plan.reason}", file=sys.stderr)
for message in plan.warnings:
    print(message, file=sys.stderr)

# Codec bytes must not depend on FMA contraction (CPU and CUDA agree bit for bit);
# -fno-trapping-math only lets the branch-free selects vectorize (IEEE results unchanged).
cxx_flags = ["-O3", "-ffp-contract=off", "-fno-trapping-math", "-fvisibility=hidden", "-fopenmp"]  # at::parallel_for is OpenMP in headers
define_macros = []
if plan.cuda:
    os.environ["TORCH_CUDA_ARCH_LIST"] = plan.arch_list
    define_macros.append(("FP8COMM_WITH_CUDA", "1"))
    ext = cpp_extension.CUDAExtension(
        "fp8comm._C",
        sources("*.cpp") + sources("*.cu"),
        define_macros=define_macros,
        extra_compile_args={"cxx": cxx_flags, "nvcc": ["-O3", "--fmad=false", "-lineinfo"]},
    )
else:
    ext = cpp_extension.CppExtension(
        "fp8comm._C", sources("*.cpp"), define_macros=define_macros, extra_compile_args=cxx_flags
    )

setup(
    ext_modules=[ext],
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
)
