"""How setup.py keeps the build of fp8comm._C short.

Parsing torch's headers (ATen/ATen.h, c10d's Backend) is most of what a unit
of csrc/ costs to compile, and every unit that includes them parsed them
again. So the build runs in two ninja calls instead of torch's one:

1. the torch-free units (the x86 codec kernels, the algorithms that see no
   tensor, the CUDA kernels) compile, longest first, while one more process
   precompiles csrc/common/precompiled_torch.h with the exact flags of the
   other units;
2. the units that include torch's headers compile, longest first, each
   loading that precompiled header (`-include`) instead of parsing them.

Whether a unit is torch-free is read from its includes (the project's own
headers followed); tests/tools/test_build_speed.py holds the codec kernels to
it. Nothing depends on the precompiled header but speed: it holds only
headers the units include anyway (include guards make the second include a
no-op), and if it cannot be built, or gcc cannot use it (-Winvalid-pch says
so in the log), the units parse the headers as before.

It hooks torch.utils.cpp_extension's `_write_ninja_file_and_compile_objects`
(keyword arguments, the same from torch 2.11 through 2.15); where that is
missing the build is torch's own, unchanged.
"""
from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
PRECOMPILED = os.path.join(ROOT, "csrc", "common", "precompiled_torch.h")
HOOKED = "_write_ninja_file_and_compile_objects"
_INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.MULTILINE)
_TORCH_HEADERS = ("torch/", "ATen/", "c10/", "pybind11/", "Python.h")


def _includes(path: str) -> list[tuple[str, str]]:
    with open(path, encoding="utf-8") as f:
        return _INCLUDE.findall(f.read())


def includes_torch(source: str, csrc: str = os.path.join(ROOT, "csrc"), _seen: set | None = None) -> bool:
    """Whether `source` includes a torch, ATen, c10 or pybind11 header,
    itself or through the project's own headers."""
    seen = set() if _seen is None else _seen
    for kind, name in _includes(source):
        if name.startswith(_TORCH_HEADERS):
            return True
        if kind != '"':
            continue
        for folder in (os.path.dirname(source), csrc):
            path = os.path.normpath(os.path.join(folder, name))
            if os.path.isfile(path):
                if path not in seen:
                    seen.add(path)
                    if includes_torch(path, csrc, seen):
                        return True
                break
    return False


def longest_first(sources: list[str]) -> list[str]:
    """Sources by size, largest first: the longest units start first, so the
    last to finish is not a long one started late (a unit's size is a fair
    stand-in for its compile time once torch's headers are precompiled)."""
    return sorted(sources, key=lambda s: (-os.path.getsize(s), s))


def _precompile(compiler: str, cflags: list[str], post_cflags: list[str], build_directory: str):
    """Starts precompiling PRECOMPILED into build_directory; returns (header, process),
    process None when the header there is current (same command, same torch)."""
    header = os.path.join(build_directory, "precompiled_torch.h")
    gch = header + ".gch"
    with open(PRECOMPILED, encoding="utf-8") as f:
        text = f.read()
    command = " ".join([compiler] + cflags + ["-x", "c++-header", shlex.quote(header), "-o", shlex.quote(gch)] + post_cflags)
    stamp = hashlib.sha256((command + text + _torch_stamp()).encode()).hexdigest()
    stamp_file = gch + ".stamp"
    if os.path.isfile(gch) and os.path.isfile(stamp_file) and open(stamp_file).read() == stamp:
        return header, None
    os.makedirs(build_directory, exist_ok=True)
    for stale in (gch, stamp_file):
        if os.path.exists(stale):
            os.remove(stale)
    with open(header, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"fp8comm setup: precompiling torch's headers: {command}", file=sys.stderr, flush=True)
    process = subprocess.Popen(command, shell=True)  # the flags arrive shell-quoted, as ninja takes them
    process.stamp = (stamp_file, stamp)
    return header, process


def _torch_stamp() -> str:
    import torch

    include = os.path.join(os.path.dirname(torch.__file__), "include", "ATen", "ATen.h")
    return f"{torch.__version__} {os.path.getmtime(include) if os.path.exists(include) else ''}"


def _subset(kwargs: dict, keep: list[int], **changes) -> dict:
    out = dict(kwargs)
    out["sources"] = [kwargs["sources"][i] for i in keep]
    out["objects"] = [kwargs["objects"][i] for i in keep]
    out.update(changes)
    return out


def compile_objects(original, compiler: str, **kwargs) -> None:
    """Stands in for torch's `_write_ninja_file_and_compile_objects`: the two
    ninja calls of the module doc string."""
    sources = kwargs["sources"]
    order = {s: i for i, s in enumerate(sources)}
    free = [order[s] for s in longest_first([s for s in sources if not includes_torch(s)])]
    torch_units = [order[s] for s in longest_first([s for s in sources if includes_torch(s)])]
    header, process = (None, None)
    if torch_units and shutil.which(compiler.split()[0]) and compiler.split()[0].endswith(("g++", "c++", "gcc")):
        header, process = _precompile(compiler, kwargs["cflags"], kwargs["post_cflags"], kwargs["build_directory"])
    if free:
        with_cuda = any(sources[i].endswith(".cu") for i in free)
        original(**_subset(kwargs, free, with_cuda=with_cuda))
    if process is not None:
        if process.wait() == 0:
            stamp_file, stamp = process.stamp
            with open(stamp_file, "w") as f:
                f.write(stamp)
        else:
            print("fp8comm setup: WARNING: precompiling torch's headers failed; the units parse them "
                  "(a slower build, the same extension)", file=sys.stderr)
            header = None
    if torch_units:
        post = list(kwargs["post_cflags"]) + (["-include", shlex.quote(header), "-Winvalid-pch"] if header else [])
        original(**_subset(kwargs, torch_units, post_cflags=post, with_cuda=False))


def install(cpp_extension) -> bool:
    """Routes torch's ninja compile through compile_objects; False where torch
    has no such function (its own build then runs unchanged)."""
    original = getattr(cpp_extension, HOOKED, None)
    if original is None or getattr(original, "fp8comm_hook", False):
        return original is not None

    def hooked(**kwargs):
        return compile_objects(original, cpp_extension.get_cxx_compiler(), **kwargs)

    hooked.fp8comm_hook = True
    setattr(cpp_extension, HOOKED, hooked)
    return True
