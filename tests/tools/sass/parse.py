"""Per-function facts read from a kernel file's compile: `ptxas -v` (registers,
stack frame, spills) and `nvdisasm -c` of its cubin (calls, global accesses,
conversions). Pure text in, records out, so the tests run on captured text.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import re
from collections import Counter

# The toolkit's subroutines for a 64-bit integer `/` and `%` (what nvcc calls
# for int64_t / uint64_t division it cannot prove 32-bit): dozens of
# instructions each, per call.
DIV64_CALL = re.compile(r"__cuda_sm\d+_(?:div|rem)_[su]64\b")
# The slow path of an IEEE FP32 division by a value unknown at compile time
# (one call per division; reported, not a rule).
FDIV32_CALL = re.compile(r"__cuda_sm\w*_div_rn\w*_f32")

# Element types of the OCP / NVIDIA 8- and 4-bit formats in F2FP / F2F opcodes.
_FP8_PARTS = frozenset({"E4M3", "E5M2", "E2M1", "E2M3", "E3M2", "UE8M0"})


@dataclasses.dataclass
class Function:
    """One function of a cubin (a kernel when `entry`)."""

    mangled: str
    entry: bool = False
    registers: int | None = None
    stack_frame: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    div64_calls: int = 0
    fdiv32_calls: int = 0
    loads: Counter = dataclasses.field(default_factory=Counter)  # global loads by width in bits
    stores: Counter = dataclasses.field(default_factory=Counter)  # global stores by width in bits
    fp8_conversions: int = 0  # F2FP / F2F to or from an 8- or 4-bit format
    bf16_conversions: int = 0  # F2FP packing to BF16

    def wide_loads(self) -> int:
        return sum(n for bits, n in self.loads.items() if bits >= 128)

    def wide_stores(self) -> int:
        return sum(n for bits, n in self.stores.items() if bits >= 128)


_COMPILING = re.compile(r"Compiling entry function '([^']+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")


def parse_ptxas(text: str, into: dict[str, Function] | None = None) -> dict[str, Function]:
    """Registers and local memory of each function from `ptxas -v` output.

    ptxas prints, per function, "Function properties for NAME" and on the next
    line its stack frame and spills; an entry's "Used N registers" follows its
    "Compiling entry function 'NAME'".
    """
    functions = {} if into is None else into
    entry = current = None
    for line in text.splitlines():
        if m := _COMPILING.search(line):
            entry = functions.setdefault(m.group(1), Function(m.group(1)))
            entry.entry = True
        elif m := _PROPERTIES.search(line):
            current = functions.setdefault(m.group(1), Function(m.group(1)))
        elif (m := _FRAME.search(line)) and current is not None:
            current.stack_frame, current.spill_stores, current.spill_loads = map(int, m.groups())
        elif (m := _USED.search(line)) and entry is not None:
            entry.registers = int(m.group(1))
    return functions


_SECTION = re.compile(r"^\s*\.section\s+\.text\.([^,\s]+)")
_ENTRY = re.compile(r'^\s*\.other\s+([^,\s]+),@"STO_CUDA_ENTRY')
# "/*0170*/   @!P0 CALL.REL.NOINC `($__internal_0_$__cuda_sm20_div_u64) ;"
_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
_WIDTHS = {"U8": 8, "S8": 8, "U16": 16, "S16": 16, "64": 64, "128": 128, "256": 256}


def access_bits(opcode: str) -> int:
    """The width of a global load or store from its opcode: LDG.E.128.CONSTANT -> 128."""
    for part in opcode.split(".")[1:]:
        if part in _WIDTHS:
            return _WIDTHS[part]
    return 32


def parse_sass(text: str, into: dict[str, Function] | None = None) -> dict[str, Function]:
    """Calls, global accesses and conversions of each function in `nvdisasm -c`
    output. A function's section holds its code and the subroutines only it
    calls (the 64-bit division ones among them), so counts are per function.
    """
    functions = {} if into is None else into
    fn = None
    for line in text.splitlines():
        if m := _SECTION.match(line):
            fn = functions.setdefault(m.group(1), Function(m.group(1)))
            continue
        if m := _ENTRY.match(line):
            functions.setdefault(m.group(1), Function(m.group(1))).entry = True
            continue
        m = _INSTRUCTION.match(line)
        if not m or fn is None:
            continue
        opcode, operands = m.groups()
        parts = opcode.split(".")
        op = parts[0]
        if op == "CALL" and DIV64_CALL.search(operands):
            fn.div64_calls += 1
        elif op == "CALL" and FDIV32_CALL.search(operands):
            fn.fdiv32_calls += 1
        elif op in ("LDG", "LDGSTS"):
            fn.loads[access_bits(opcode)] += 1
        elif op == "STG":
            fn.stores[access_bits(opcode)] += 1
        elif op in ("F2FP", "F2F"):
            if _FP8_PARTS.intersection(parts):
                fn.fp8_conversions += 1
            elif "BF16" in parts:
                fn.bf16_conversions += 1
    return functions


def demangle(name: str) -> str:
    """The C++ name of a mangled symbol (libstdc++'s demangler), else `name`."""
    if _cxa_demangle is None or not name.startswith("_Z"):
        return name
    status = ctypes.c_int()
    out = _cxa_demangle(name.encode(), None, None, ctypes.byref(status))
    if status.value != 0 or not out:
        return name
    try:
        return ctypes.string_at(out).decode()
    finally:
        _free(out)


def _load_demangler():
    lib = ctypes.util.find_library("stdc++")
    try:
        cxx = ctypes.CDLL(lib or "libstdc++.so.6")
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None, None
    f = cxx.__cxa_demangle
    f.restype = ctypes.c_void_p
    f.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    libc.free.argtypes = [ctypes.c_void_p]
    return f, libc.free


_cxa_demangle, _free = _load_demangler()


def base_name(demangled: str) -> str:
    """The unqualified function name without template or call arguments:
    `fp8comm::(anonymous namespace)::dequantize_kernel<...>(...)` -> `dequantize_kernel`.
    """
    head, depth = [], 0
    for ch in demangled:
        if ch in "<(":  # "(anonymous namespace)" is dropped with the arguments
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0:
            head.append(ch)
    return "".join(head).split("::")[-1].split()[-1]  # a template's return type stands first
