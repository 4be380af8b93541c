"""Compiles every CUDA source for sm_90 and sm_100 (`nvcc -c`, every warning an
error), disassembles the cubins and holds each kernel to the static rules
(tests/tools/sass/rules.py); prints a table per kernel and totals per file and
architecture. Exit 1 on a warning, a broken rule outside the exemption table,
or an exemption that names no kernel.

    python -m tests.tools.sass.check                      # csrc/**/*.cu, CI's `.ci/sass_check`
    python -m tests.tools.sass.check --arch sm_90 FILE.cu

Needs nvcc and nvdisasm: the PyPI wheel nvidia-cuda-nvdisasm (found under
site-packages/nvidia/*/bin), else the toolkit's own, else one on PATH.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter

from tests.tools.sass import parse, rules

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
ARCHES = ("sm_90", "sm_100")
PIP_LINE = 'python -m pip install "nvidia-cuda-nvdisasm==13.5.37"'
# The flags of the extension's build (setup.py) that change the code; every nvcc warning an
# error. The first architecture compiles the host code too (`-c`,
# its cubin kept), the others their device code alone (`-cubin`).
NVCC_FLAGS = ("-std=c++17", "-O3", "--fmad=false", "-Werror", "all-warnings", "-Xptxas", "-v")


def find_nvdisasm() -> tuple[str, str] | None:
    """(path, where it came from) of nvdisasm, or None."""
    for entry in dict.fromkeys(p for p in sys.path if p and os.path.isdir(p)):
        for path in sorted(glob.glob(os.path.join(entry, "nvidia", "*", "bin", "nvdisasm"))):
            if os.access(path, os.X_OK):
                return path, "PyPI wheel nvidia-cuda-nvdisasm"
    sys.path.insert(0, ROOT)
    import build_config  # noqa: E402  (the repository root's build helper)

    toolkit = build_config.toolkit_of_nvcc(shutil.which("nvcc"))
    if toolkit and os.access(os.path.join(toolkit, "bin", "nvdisasm"), os.X_OK):
        return os.path.join(toolkit, "bin", "nvdisasm"), f"the toolkit's ({toolkit})"
    path = shutil.which("nvdisasm")
    return (path, "PATH") if path else None


def tool_version(path: str) -> str:
    out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    return out[-2].strip() if len(out) >= 2 else "?"  # "Cuda compilation tools, release 13.0, V13.0.88"


def supported_arches(nvcc: str, wanted: list[str]) -> tuple[list[str], list[str]]:
    listed = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True).stdout.split()
    have = [a for a in wanted if a.replace("sm_", "compute_") in listed]
    return have, [a for a in wanted if a not in have]


def compile_and_read(nvcc: str, nvdisasm: str, source: str, arch: str, out_dir: str,
                     host: bool) -> dict[str, parse.Function]:
    """The functions of `source` (relative to ROOT) compiled for `arch`, with its host code when `host`."""
    keep = os.path.join(out_dir, f"{source.replace('/', '_')}.{arch}")
    os.makedirs(keep)
    stem = os.path.splitext(os.path.basename(source))[0]
    cubin = os.path.join(keep, f"{stem}.{arch}.cubin")
    output = ["-c", "--keep", "--keep-dir", keep, "-o", os.path.join(keep, "out.o")] if host else ["-cubin", "-o", cubin]
    built = subprocess.run([nvcc, *NVCC_FLAGS, *output, f"-arch={arch}", "-I" + os.path.join(ROOT, "csrc"),
                            os.path.join(ROOT, source)], capture_output=True, text=True)
    if built.returncode != 0:
        raise RuntimeError(f"nvcc failed on {source} for {arch}:\n{built.stderr}")
    sass = subprocess.run([nvdisasm, "-c", cubin], capture_output=True, text=True)
    if sass.returncode != 0:
        raise RuntimeError(f"nvdisasm failed on {source} for {arch}:\n{sass.stderr}")
    functions = parse.parse_ptxas(built.stderr)
    parse.parse_sass(sass.stdout, functions)
    if not any(f.entry for f in functions.values()):
        raise RuntimeError(f"{source} ({arch}): no kernels found in ptxas's or nvdisasm's output")
    return functions


def enum_names() -> dict[tuple[str, str], str]:
    """(enum, value) -> enumerator, from csrc's one-line `enum class X : int {...}`."""
    names = {}
    for header in glob.glob(os.path.join(ROOT, "csrc", "**", "*.h"), recursive=True):
        with open(header) as f:
            for m in re.finditer(r"enum class (\w+) : int \{([^}]*)\}", f.read()):
                for item in m.group(2).split(","):
                    if "=" in item:
                        key, value = (s.strip() for s in item.split("="))
                        names[(m.group(1), value)] = key
    return names


def short_name(demangled: str, enums: dict[tuple[str, str], str]) -> str:
    """`void ns::(anonymous namespace)::k<(ns::ElemType)1, ...>(args)` -> `k<BF16, ...>`."""
    s = demangled.replace("(anonymous namespace)::", "").replace("fp8comm::", "")
    s = re.sub(r"\((\w+)\)(-?\d+)", lambda m: enums.get((m.group(1), m.group(2)), m.group(0)), s)
    depth, cut = 0, len(s)
    for i, ch in enumerate(s):  # drop the argument list: the last top-level "(...)"
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
    s = s[:cut]
    return s.split(" ", 1)[1] if s.startswith("void ") else s


COLUMNS = ("regs", "frame", "spill", "div64", "fdiv", "ld128", "st128", "ld64", "st64", "ld<64", "st<64", "cvt8", "cvtbf")


def row(fn: parse.Function) -> tuple[int, ...]:
    return (fn.registers if fn.registers is not None else -1, fn.stack_frame, fn.spill_stores + fn.spill_loads,
            fn.div64_calls, fn.fdiv32_calls, fn.wide_loads(), fn.wide_stores(), fn.loads[64], fn.stores[64],
            sum(n for b, n in fn.loads.items() if b < 64), sum(n for b, n in fn.stores.items() if b < 64),
            fn.fp8_conversions, fn.bf16_conversions)


def report(source: str, arch: str, functions: dict[str, parse.Function], enums, seen: set) -> list[str]:
    """Prints the table of `source` for `arch`; returns the failures."""
    failures, broken = [], Counter()
    print(f"\n{source} ({arch})")
    print("  " + " ".join(f"{c:>5}" for c in COLUMNS) + "  kernel: broken rules")
    for fn in sorted(functions.values(), key=lambda f: (not f.entry, parse.demangle(f.mangled))):
        demangled = parse.demangle(fn.mangled)
        name = parse.base_name(demangled)
        found = rules.violations(source, name, fn)
        why = rules.exemption(source, name)
        if why:
            seen.add((source, name))
        verdict = "" if not found else f": {'legacy' if why else 'FAIL'} " + ", ".join(rule for rule, _ in found)
        print("  " + " ".join(f"{v:>5}" for v in row(fn)) + "  " + short_name(demangled, enums)
              + ("" if fn.entry else " [device function]") + verdict)
        broken.update(rule for rule, _ in found)
        if found and not why:
            failures += [f"{source} ({arch}): {short_name(demangled, enums)}: {v}" for _, v in found]
    kernels = [f for f in functions.values() if f.entry]
    print(f"  totals: {len(kernels)} kernels; 64-bit div/rem calls {sum(f.div64_calls for f in functions.values())}; "
          f"FP32 division calls {sum(f.fdiv32_calls for f in functions.values())}; "
          f"max registers {max((f.registers or 0) for f in kernels)}; "
          f"stack+spill bytes {sum(f.stack_frame + f.spill_stores + f.spill_loads for f in functions.values())}; "
          f"128-bit loads {sum(f.wide_loads() for f in functions.values())}, "
          f"stores {sum(f.wide_stores() for f in functions.values())}; "
          f"hardware FP8/FP4 conversions {sum(f.fp8_conversions for f in functions.values())}, "
          f"BF16 {sum(f.bf16_conversions for f in functions.values())}; functions breaking each rule: "
          + (", ".join(f"{rule} {n}" for rule, n in sorted(broken.items())) or "none"))
    return failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", help="CUDA sources relative to the repository root (default csrc/**/*.cu)")
    ap.add_argument("--arch", action="append", help=f"architectures (default {', '.join(ARCHES)})")
    args = ap.parse_args(argv)
    nvcc = shutil.which("nvcc")
    found = find_nvdisasm()
    if not nvcc or not found:
        print(f"sass_check: needs nvcc (found: {nvcc or 'none'}) and nvdisasm (found: {found[0] if found else 'none'}; "
              f"the wheel: {PIP_LINE})")
        return 2
    nvdisasm, origin = found
    arches, missing = supported_arches(nvcc, args.arch or list(ARCHES))
    print(f"nvcc: {tool_version(nvcc)}; nvdisasm: {tool_version(nvdisasm)}, {origin}: {nvdisasm}")
    if missing:
        print(f"this nvcc cannot compile for {', '.join(missing)}: skipped")
    print("columns: registers, stack frame bytes, spill bytes (stores + loads), calls to 64-bit integer "
          "div/rem, calls to FP32 division's slow path, global loads / stores of >= 128 bits, of 64, "
          "narrower, hardware conversions (F2FP) to or from FP8 / FP4, to BF16")
    sources = args.files or sorted(os.path.relpath(p, ROOT) for p in
                                   glob.glob(os.path.join(ROOT, "csrc", "**", "*.cu"), recursive=True))
    enums = enum_names()
    with tempfile.TemporaryDirectory() as out_dir, \
            concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        jobs = {(s, a): pool.submit(compile_and_read, nvcc, nvdisasm, s, a, out_dir, a == arches[0])
                for s in sources for a in arches}
        failures, seen = [], set()
        for (source, arch), job in jobs.items():
            try:
                failures += report(source, arch, job.result(), enums, seen)
            except RuntimeError as e:
                print(e)
                failures.append(f"{source} ({arch}): did not compile or disassemble (above)")
    everything = not args.files and set(arches) == set(ARCHES)
    stale = sorted(set(rules.EXEMPT) - seen) if everything else []
    failures += [f"{s}: exemption for {n}, a kernel that no longer exists: remove it from rules.EXEMPT" for s, n in stale]
    print()
    for line in failures:
        print("sass_check: " + line)
    print(f"sass_check: {'failed' if failures else 'passed'}: {len(sources)} files, {', '.join(arches)}; "
          "rules in tests/tools/sass/rules.py")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
