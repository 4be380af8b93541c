"""The static rules every CUDA kernel is held to (issue 44: kernels at the
memory bound), the table of kernels exempt from them, and the verdict on one
kernel. Each rule names what it found and the fix.

- no call to the toolkit's 64-bit integer division / remainder subroutines
  (index math within a segment fits 32 bits);
- a codec kernel (csrc/codec/) or a tiled cast kernel
  (csrc/linear/cast_cuda_tiled.cu) uses at most 64 registers (occupancy:
  loads in flight hide the memory latency);
- no stack frame and no spills (local memory is far slower than registers);
- a kernel that reads FP32 / BF16 / F16 elements has a 128-bit (or wider)
  global load, one that writes them a 128-bit global store: narrower element
  accesses cannot reach the copy's bandwidth.
"""
from __future__ import annotations

import re

from tests.tools.sass.parse import Function

# Register ceiling by source folder or file: the codec's kernels (the collectives'
# hot path) and the tiled casts of Fp8Linear.
REGISTER_LIMITS = {"csrc/codec/": 64, "csrc/linear/cast_cuda_tiled.cu": 64}

# Which kernels move elements, by the kernel's unqualified name; the first
# match decides: (pattern, reads elements, writes elements). A kernel that
# matches none has no element path (it touches scales or headers only).
ELEMENT_PATHS = (
    (re.compile(r"clear_|segment_scale"), False, False),  # segment headers only
    (re.compile(r"dequant.*sum"), True, True),  # the own addend in, the sum out
    (re.compile(r"dequant"), False, True),  # codes in, elements out
    (re.compile(r"quantize|cast|amax"), True, False),  # elements in, codes or scales out
)

LEGACY_REASON = "legacy set, kept selectable until a GPU measures both: issue 44"
# (cast_cuda.cu's kernels: FP8COMM_CUDA_CAST=legacy; cast_cuda_tiled.cu's are held to the rules.)

# Today's kernels, reported but not failed: (file, kernel name) -> reason.
# A kernel of another name, in these files or any other, is held to the rules.
EXEMPT = {
    **{("csrc/codec/codec_cuda.cu", name): LEGACY_REASON for name in (
        "quantize_shuffle_kernel", "quantize_warp_kernel", "clear_segment_amax_kernel",
        "segment_amax_kernel", "segment_scale_kernel", "dequantize_kernel", "dequant_sum_kernel")},
    **{("csrc/linear/cast_cuda.cu", name): LEGACY_REASON for name in (
        "amax_flat_kernel", "cast_flat_kernel", "cast_rows_kernel", "amax_tile_kernel", "cast_tile_kernel")},
}


def element_path(name: str) -> tuple[bool, bool]:
    """(reads elements, writes elements) of the kernel called `name`."""
    for pattern, reads, writes in ELEMENT_PATHS:
        if pattern.search(name):
            return reads, writes
    return False, False


def register_limit(source: str) -> int | None:
    for folder, limit in REGISTER_LIMITS.items():
        if source.startswith(folder):
            return limit
    return None


def violations(source: str, name: str, fn: Function) -> list[tuple[str, str]]:
    """(rule, what and fix) for each rule function `fn` (unqualified `name`) of
    the file `source` (a path relative to the repository root) breaks; the
    rules: div64, registers, local-memory, load128, store128.
    """
    found = []
    if fn.div64_calls:
        found.append(("div64", f"{fn.div64_calls} calls to 64-bit integer division / remainder subroutines "
                     "(keep index math within a segment in 32 bits, or divide by a power of two)"))
    limit = register_limit(source)
    if fn.entry and limit is not None and fn.registers is not None and fn.registers > limit:
        found.append(("registers", f"{fn.registers} registers, above the {limit} a kernel of {source} may use "
                     "(fewer live values, or __launch_bounds__ with a minimum of blocks)"))
    if fn.stack_frame or fn.spill_stores or fn.spill_loads:
        found.append(("local-memory", f"{fn.stack_frame} bytes stack frame, {fn.spill_stores} bytes spill stores, "
                     f"{fn.spill_loads} bytes spill loads (index per-thread arrays with static indices)"))
    if fn.entry:
        reads, writes = element_path(name)
        if reads and not fn.wide_loads():
            found.append(("load128", "reads elements without a 128-bit global load (load 16 bytes a lane)"))
        if writes and not fn.wide_stores():
            found.append(("store128", "writes elements without a 128-bit global store (store 16 bytes a lane)"))
    return found


def exemption(source: str, name: str) -> str | None:
    """Why kernel `name` of `source` is not failed by the rules, or None."""
    return EXEMPT.get((source, name))
