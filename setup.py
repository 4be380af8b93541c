"""Builds fp8comm._C: a CUDAExtension when torch has CUDA and a CUDA toolkit
of the same major version is found, otherwise a CppExtension with the CPU codec
and backend only (build_config.py decides, and warns when a CUDA torch gets the
CPU-only build).

    pip install --no-build-isolation -e .

The CUDA toolkit is CUDA_HOME, else the one the nvcc on PATH belongs to (asked
of nvcc itself, so a wrapper script on PATH is no obstacle).
FP8COMM_FORCE_CPU=1 builds the CPU-only extension on a CUDA machine.
TORCH_CUDA_ARCH_LIST picks the GPU targets (default "9.0+PTX": Hopper code plus
PTX that newer GPUs compile at load time).
"""
import glob
import importlib.util
import os
import shutil
import sys

import torch
from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def load(name):
    # Loaded by path: build_config.py and build_speed.py sit next to this file and are not part of the package.
    spec = importlib.util.spec_from_file_location(f"fp8comm_{name}", os.path.join(ROOT, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sources(pattern):
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "csrc", "**", pattern), recursive=True))


build_config = load("build_config")
torch_error, torch_warning = build_config.torch_version_check(torch.__version__)
if torch_error:
    sys.exit(f"fp8comm setup: {torch_error}")
if torch_warning:
    print(torch_warning, file=sys.stderr)
# torch.utils.cpp_extension fixes CUDA_HOME when it is imported, from the folder of the
# nvcc on PATH; point it at the toolkit that nvcc really is (build_config.toolkit_of_nvcc).
if torch.version.cuda and not (os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")):
    toolkit = build_config.toolkit_of_nvcc(shutil.which("nvcc"))
    if toolkit:
        os.environ["CUDA_HOME"] = toolkit
        print(f"fp8comm setup: CUDA_HOME={toolkit} (the toolkit of the nvcc on PATH)", file=sys.stderr)

from torch.utils import cpp_extension  # noqa: E402 (after CUDA_HOME is settled)

plan = build_config.decide(
    torch.version.cuda,
    cpp_extension.CUDA_HOME,
    build_config.nvcc_version(cpp_extension.CUDA_HOME),
    os.environ,
    cudart=bool(cpp_extension.CUDA_HOME) and build_config.cuda_runtime_found(cpp_extension.CUDA_HOME),
)
print(f"fp8comm setup: {plan.reason}", file=sys.stderr)
for message in plan.warnings:
    print(message, file=sys.stderr)

# Codec bytes must not depend on FMA contraction (CPU and CUDA agree bit for bit);
# -fno-trapping-math only lets the branch-free selects vectorize (IEEE results unchanged).
# -g0: no debug information (Python's own flags ask for it), which torch's headers make large and slow.
cxx_flags = ["-O3", "-ffp-contract=off", "-fno-trapping-math", "-fvisibility=hidden", "-fopenmp", "-g0"]  # at::parallel_for is OpenMP in headers
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

# Torch-free units first, beside one precompiled header of torch's headers (build_speed.py).
if not load("build_speed").install(cpp_extension):
    print("fp8comm setup: this torch's cpp_extension has no ninja compile hook; building without the "
          "precompiled header", file=sys.stderr)

setup(
    ext_modules=[ext],
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
)
