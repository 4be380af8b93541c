"""Builds fp8comm._C: a CUDAExtension when torch has CUDA and nvcc is found,
otherwise a CppExtension with the CPU codec and backend only.

    pip install --no-build-isolation -e .

FP8COMM_FORCE_CPU=1 builds the CPU-only extension on a CUDA machine.
TORCH_CUDA_ARCH_LIST picks the GPU targets (default "9.0", Hopper).
"""
import glob
import os

import torch
from setuptools import setup
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.abspath(__file__))


def sources(pattern):
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "csrc", "**", pattern), recursive=True))


def want_cuda():
    if os.environ.get("FP8COMM_FORCE_CPU", "0") == "1":
        return False
    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None


# Codec bytes must not depend on FMA contraction (CPU and CUDA agree bit for bit);
# -fno-trapping-math only lets the branch-free selects vectorize (IEEE results unchanged).
cxx_flags = ["-O3", "-ffp-contract=off", "-fno-trapping-math", "-fvisibility=hidden", "-fopenmp"]  # at::parallel_for is OpenMP in headers
define_macros = []
if want_cuda():
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
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
