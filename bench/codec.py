"""Throughput of the FP8 block codec, next to a measured copy of the same bytes.

    python bench/codec.py [--device cpu|cuda] [--sizes 1M,4M,...] [--wire-format e4m3,mxfp4] [--json PATH]
                          [--quick] [--stochastic]

GB/s counts bytes read + bytes written by each op (as a memory-bound kernel
would move them). The copy baseline is `dst.copy_(src)` of an fp32 tensor of
the same element count (read + write bytes). On CUDA, times are CUDA events
around many repetitions after warm-up; on the CPU, wall time with all threads,
plus quantize with one thread (the per-core figure the goal is stated in).
--stochastic adds quantize and dequant_sum_requantize rounding stochastically
(Options.rounding), beside their round-to-nearest rows. --wire-format picks
the wire formats (comma list of fp8comm.codec.WIRE_FORMATS; default e4m3):
each is timed on the same sizes and dtypes, its own row per op.

Goals reported (not asserted): CUDA quantize and dequantize >= 85% of copy
bandwidth at >= 64M elements; CPU quantize >= 1 GB/s of fp32 input per core.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time

import torch

import fp8comm
from fp8comm.bench import device_label

P = 4  # pieces summed by dequant_sum / dequant_sum_requantize (a 4-rank reduce-scatter)


def parse_size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1], 1)
    return int(float(s[:-1] if s[-1] in "KMG" else s) * mult)


def timer(device: str, reps: int):
    def run(fn) -> float:
        for _ in range(2):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / reps
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) / reps

    return run


def bench_size(n: int, dtype: torch.dtype, device: str, reps: int, stochastic: bool = False,
               wire_format: str = "e4m3") -> list[dict]:
    es = torch.tensor([], dtype=dtype).element_size()
    x = torch.randn(n, device=device).to(dtype)
    fmt = dict(wire_format=wire_format)
    S1 = fp8comm.segment_bytes(n, **fmt)  # the format's default block
    m = math.ceil(n / P)
    Sp = fp8comm.segment_bytes(m, **fmt)
    wire1 = torch.empty(S1, dtype=torch.uint8, device=device)
    wireP = torch.empty(P * Sp, dtype=torch.uint8, device=device)
    out = torch.empty(n, dtype=dtype, device=device)
    out_m = torch.empty(m, dtype=dtype, device=device)
    seg = torch.empty(Sp, dtype=torch.uint8, device=device)
    fp8comm.quantize_segments(x, wire1, 1, n, **fmt)
    fp8comm.quantize_segments(x[: P * m] if P * m <= n else x, wireP, P, m, **fmt)
    src32 = torch.randn(n, device=device)
    dst32 = torch.empty_like(src32)
    t = timer(device, reps)
    rows = []

    def add(op, seconds, bytes_moved):
        rows.append({"op": op, "numel": n, "dtype": str(dtype).replace("torch.", ""), "wire_format": wire_format,
                     "device": device, "seconds": seconds, "gb_per_s": bytes_moved / seconds / 1e9})

    add("copy_fp32", t(lambda: dst32.copy_(src32)), 8 * n)
    add("quantize", t(lambda: fp8comm.quantize_segments(x, wire1, 1, n, **fmt)), es * n + S1)
    add("dequantize", t(lambda: fp8comm.dequantize_segments(wire1, out, 1, n, **fmt)), S1 + es * n)
    add(f"dequant_sum_{P}", t(lambda: fp8comm.dequant_sum(wireP, out_m, P, m, **fmt)), P * Sp + es * m)
    add(f"dequant_sum_requantize_{P}", t(lambda: fp8comm.dequant_sum_requantize(wireP, seg, P, m, **fmt)),
        P * Sp + Sp)
    if stochastic:  # the same calls rounding stochastically (Options.rounding)
        sr = dict(rounding="stochastic", rounding_key=1, **fmt)
        add("quantize_stochastic", t(lambda: fp8comm.quantize_segments(x, wire1, 1, n, **sr)), es * n + S1)
        add(f"dequant_sum_requantize_{P}_stochastic",
            t(lambda: fp8comm.dequant_sum_requantize(wireP, seg, P, m, **sr)), P * Sp + Sp)
    if device == "cpu":
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        add("quantize_1_thread", t(lambda: fp8comm.quantize_segments(x, wire1, 1, n, **fmt)), es * n + S1)
        torch.set_num_threads(threads)
    copy = rows[0]["gb_per_s"]
    for r in rows:
        r["fraction_of_copy"] = r["gb_per_s"] / copy
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() and fp8comm._C.has_cuda else "cpu")
    p.add_argument("--sizes", default="1M,4M,16M,64M,256M")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--wire-format", default="e4m3", help="comma list of wire formats (fp8comm.codec.WIRE_FORMATS), each at its default block size")
    p.add_argument("--reps", type=int, default=0, help="0: pick by size")
    p.add_argument("--quick", action="store_true", help="tiny sizes, few reps (a smoke test)")
    p.add_argument("--stochastic", action="store_true",
                   help="also time quantize and dequant_sum_requantize with stochastic rounding")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    sizes = [4096, 65536] if args.quick else [parse_size(s) for s in args.sizes.split(",")]
    rows = []
    for wire_format in args.wire_format.split(","):
        for dtype_name in args.dtypes.split(","):
            dtype = getattr(torch, dtype_name)
            for n in sizes:
                reps = args.reps or (2 if args.quick else max(3, min(100, (64 << 20) // n)))
                rows += bench_size(n, dtype, args.device, reps, args.stochastic, wire_format)
                print(f"done {wire_format} {dtype_name} {n}", file=sys.stderr, flush=True)

    print(f"{'op':36s} {'format':6s} {'dtype':9s} {'numel':>11s} {'GB/s':>9s} {'of copy':>8s}")
    for r in rows:
        print(f"{r['op']:36s} {r['wire_format']:6s} {r['dtype']:9s} {r['numel']:11d} {r['gb_per_s']:9.2f} "
              f"{r['fraction_of_copy']:8.2f}")
    result = {
        "benchmark": "codec",
        "date": datetime.date.today().isoformat(),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "device": device_label(args.device == "cuda"),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "rows": rows,
    }
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
