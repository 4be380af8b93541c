"""How setup.py builds fp8comm._C: with the CUDA kernels or CPU-only.

Kept apart from setup.py so the decision is a pure function that tests can
call without running setup() (tests/tools/test_build_config.py); setup.py loads this
file by its path. It imports nothing outside the standard library.

The CUDA build needs a CUDA torch and an nvcc whose major version equals
torch's CUDA major version: torch.utils.cpp_extension refuses to build with a
mismatched major version, which would fail the whole install. In that case the
CPU-only extension is built instead, with a warning that says how to get the
CUDA one.
"""
from __future__ import annotations

import os
import re
import subprocess
from typing import Mapping, NamedTuple

# Hopper SASS plus compute_90 PTX, so GPUs newer than Hopper can JIT the kernels
# (SASS alone has no image for them).
DEFAULT_ARCH_LIST = "9.0+PTX"
WARNING_PREFIX = "fp8comm setup: WARNING:"

_NVCC_RELEASE = re.compile(r"release (\d+)\.(\d+)")
_NVCC_TOP = re.compile(r"^#\$ TOP=(.+)$", re.MULTILINE)


# The torch releases fp8comm supports (README, "Supported torch"): 2.11 through
# 2.15. CI builds and tests the two ends and the middle: 2.13 (the CPU build,
# both tiers), 2.11 (the CUDA build the lent GPU machines carry) and 2.15
# (PyPI's newest), the last two with .ci/cuda_torch_check.
MIN_TORCH = (2, 11)
MAX_TORCH = (2, 15)
TESTED_TORCH = ((2, 11), (2, 13), (2, 15))


def torch_version_check(version: str) -> tuple[str | None, str | None]:
    """(error, warning) for building against torch `version` ("2.11.0+cu130"):
    an error below MIN_TORCH, a warning above MAX_TORCH."""
    m = re.match(r"(\d+)\.(\d+)", version or "")
    if not m:
        return None, f"{WARNING_PREFIX} cannot read torch's version {version!r}; fp8comm supports " + _supported()
    release = (int(m.group(1)), int(m.group(2)))
    if release < MIN_TORCH:
        return (f"fp8comm needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} (its c10d Backend API), found {version}: "
                f"install a supported torch ({_supported()})"), None
    if release > MAX_TORCH:
        return None, (f"{WARNING_PREFIX} torch {version} is newer than the releases fp8comm supports "
                      f"({_supported()}); the build may work, but nothing here has checked it")
    return None, None


def _supported() -> str:
    return (f"{MIN_TORCH[0]}.{MIN_TORCH[1]} through {MAX_TORCH[0]}.{MAX_TORCH[1]}; CI tests "
            + ", ".join(f"{a}.{b}" for a, b in TESTED_TORCH))


class BuildPlan(NamedTuple):
    cuda: bool  # build the CUDAExtension (else the CppExtension, CPU only)
    arch_list: str | None  # TORCH_CUDA_ARCH_LIST for the CUDA build; None for CPU
    reason: str  # one line: why this plan
    warnings: tuple[str, ...] = ()  # each starts with WARNING_PREFIX


def parse_nvcc_version(text: str) -> tuple[int, int] | None:
    """(major, minor) from `nvcc --version` output ("... release 12.4, V12.4.131"), or None."""
    m = _NVCC_RELEASE.search(text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def nvcc_version(cuda_home: str | None) -> tuple[int, int] | None:
    """(major, minor) of CUDA_HOME's nvcc, or None when there is none or it does not answer."""
    if not cuda_home:
        return None
    for name in ("nvcc", "nvcc.exe"):
        path = os.path.join(cuda_home, "bin", name)
        if os.path.isfile(path):
            try:
                out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
            except (OSError, subprocess.SubprocessError):
                return None
            return parse_nvcc_version(out.stdout + out.stderr)
    return None


def toolkit_of_nvcc(nvcc: str | None) -> str | None:
    """The CUDA toolkit folder that `nvcc` belongs to, or None.

    Asked of nvcc itself (`--dryrun` prints `TOP=<toolkit>/bin/..`), because
    the nvcc on PATH may be a wrapper script or a link in another folder
    (/usr/local/bin/nvcc exec'ing /usr/local/cuda-13.0/bin/nvcc): torch derives
    CUDA_HOME from the folder of the nvcc it finds, and there finds no CUDA
    runtime to link against.
    """
    if not nvcc:
        return None
    try:
        out = subprocess.run([nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    m = _NVCC_TOP.search(out.stdout + out.stderr)
    return os.path.realpath(m.group(1).strip()) if m else None


def cuda_runtime_found(cuda_home: str) -> bool:
    """Whether CUDA_HOME holds the CUDA runtime library the CUDA build links."""
    for lib in ("lib64", "lib", os.path.join("targets", "x86_64-linux", "lib"), os.path.join("targets", "sbsa-linux", "lib")):
        folder = os.path.join(cuda_home, lib)
        if os.path.isdir(folder) and any(name.startswith("libcudart.so") for name in os.listdir(folder)):
            return True
    return False


def _major(version: str) -> int | None:
    m = re.match(r"\s*(\d+)", version or "")
    return int(m.group(1)) if m else None


def decide(
    torch_cuda: str | None,
    cuda_home: str | None,
    nvcc: tuple[int, int] | None,
    env: Mapping[str, str],
    *,
    cudart: bool,
) -> BuildPlan:
    """The build plan.

    torch_cuda: torch.version.cuda ("12.8"; None for a CPU torch).
    cuda_home: torch.utils.cpp_extension.CUDA_HOME (None when no toolkit was found).
    nvcc: nvcc_version(cuda_home).
    env: the environment (FP8COMM_FORCE_CPU, TORCH_CUDA_ARCH_LIST).
    cudart: cuda_runtime_found(cuda_home).
    """
    if env.get("FP8COMM_FORCE_CPU", "0") == "1":
        return BuildPlan(False, None, "FP8COMM_FORCE_CPU=1: CPU-only build")
    if torch_cuda is None:
        return BuildPlan(False, None, "torch is a CPU build: CPU-only build")
    how = (
        f"install a CUDA {_major(torch_cuda)}.x toolkit and set CUDA_HOME to it, "
        "or set FP8COMM_FORCE_CPU=1 to build CPU-only without this warning"
    )
    if not cuda_home:
        return BuildPlan(False, None, "no CUDA toolkit found: CPU-only build", (
            f"{WARNING_PREFIX} torch has CUDA {torch_cuda} but no CUDA toolkit (nvcc) was found, so fp8comm "
            f"is built WITHOUT its CUDA kernels (fp8comm._C.has_cuda is False). To build them, {how}.",
        ))
    if nvcc is None:
        return BuildPlan(False, None, "nvcc did not report a version: CPU-only build", (
            f"{WARNING_PREFIX} {os.path.join(cuda_home, 'bin', 'nvcc')} is missing or did not report its "
            f"version, so fp8comm is built WITHOUT its CUDA kernels (fp8comm._C.has_cuda is False). "
            f"To build them, {how}.",
        ))
    if nvcc[0] != _major(torch_cuda):
        return BuildPlan(False, None, "nvcc and torch's CUDA differ in major version: CPU-only build", (
            f"{WARNING_PREFIX} nvcc {nvcc[0]}.{nvcc[1]} (CUDA_HOME={cuda_home}) does not match the CUDA "
            f"{torch_cuda} that torch was built with (major versions differ, which torch.utils.cpp_extension "
            f"refuses), so fp8comm is built WITHOUT its CUDA kernels (fp8comm._C.has_cuda is False). "
            f"To build them, {how}.",
        ))
    if not cudart:
        return BuildPlan(False, None, "CUDA_HOME has no CUDA runtime library: CPU-only build", (
            f"{WARNING_PREFIX} CUDA_HOME={cuda_home} holds nvcc {nvcc[0]}.{nvcc[1]} but no libcudart.so "
            f"(lib64/, lib/ or targets/*/lib/), so fp8comm is built WITHOUT its CUDA kernels "
            f"(fp8comm._C.has_cuda is False). Set CUDA_HOME to the toolkit's own folder (the one holding "
            f"bin/nvcc and lib64/libcudart.so), or {how}.",
        ))
    user_arch = (env.get("TORCH_CUDA_ARCH_LIST") or "").strip()
    arch = user_arch or DEFAULT_ARCH_LIST
    why = "TORCH_CUDA_ARCH_LIST from the environment" if user_arch else "default TORCH_CUDA_ARCH_LIST"
    return BuildPlan(True, arch, f"CUDA build: torch CUDA {torch_cuda}, nvcc {nvcc[0]}.{nvcc[1]}, {why} {arch!r}")
