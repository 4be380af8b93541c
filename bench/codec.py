"""Throughput of the block codec against its floor, a copy of the same bytes.

    python bench/codec.py [--device cpu|cuda] [--sizes 1M,4M,...] [--dtypes float32,bfloat16]
                          [--wire-format e4m3,e5m2,mxfp4,nvfp4] [--trials 5] [--no-stochastic]
                          [--kernels legacy,tiled] [--json PATH] [--quick]

Every op is timed in --trials trials (at least 5), the ops of one (format,
dtype, size) interleaved trial by trial so that a clock or load change hits
them alike; a row holds the median time and its spread (min, max, quartiles).

An op's *floor* is the time its bytes (read + written, as a memory-bound
kernel moves them) take at the copy's rate: `dst.copy_(src)` of the row's
dtype and element count, timed beside it (a BF16 copy for BF16 rows, an FP32
copy for FP32 rows; BF16 rows also carry the FP32 copy, the unit the goals
are stated in). fraction_of_copy = floor / median time.

The ops, per wire format (`fp8comm.codec.WIRE_FORMATS`, each at its default
block), dtype and size n:
- quantize, dequantize: one segment of n elements (quantize_segments /
  dequantize_segments);
- dequant_sum_own, dequant_sum_requantize_own: the sums as a --ranks (4)-rank
  reduce_scatter and all_reduce call them (csrc/algorithms/reduce_scatter.cpp,
  all_reduce.cpp): ranks - 1 peers' segments of ceil(n / ranks) elements
  summed onto the own addend (`own=`, the row's dtype), written as the row's
  dtype or re-quantized into one segment;
- dequant_sum, dequant_sum_requantize: --ranks pieces without an own addend
  (the form the first GPU run timed as dequant_sum_4 / _requantize_4);
- quantize_stochastic, dequant_sum_requantize_own_stochastic: rounding
  stochastically (Options.rounding); --no-stochastic leaves them out;
- quantize_1_thread (CPU only): the per-core figure the CPU goal is stated in.

On CUDA, times are CUDA events around --reps calls after warm-up; on the CPU,
wall time with all threads. --kernels times each CUDA kernel set named (the
values of FP8COMM_CUDA_CODEC, one run of this script per set with the variable
set) and prints them side by side; the CPU codec has one set, so --kernels is
refused there, as it is by a build that does not read the variable.
The JSON's fields: bench/results/README.md ("codec.json").

Goals reported (not asserted): issue 44's, as fractions of the same device's
FP32 copy at >= 64M elements; CPU quantize >= 1 GB/s of fp32 input per core.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

import fp8comm
from fp8comm.bench import device_label

MIN_TRIALS = 5
KERNELS_VARIABLE = "FP8COMM_CUDA_CODEC"


def parse_size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1], 1)
    return int(float(s[:-1] if s[-1] in "KMG" else s) * mult)


@dataclass
class Op:
    """One timed call: its name, the bytes it reads + writes, the row's extra fields."""

    name: str
    run: Callable[[], None]
    bytes_moved: int
    fields: dict = field(default_factory=dict)
    threads: int | None = None  # CPU threads while it runs (None: as set)


def time_once(op: Op, device: str, reps: int) -> float:
    """Seconds per call of one trial: `reps` calls back to back."""
    threads = torch.get_num_threads()
    if op.threads is not None:
        torch.set_num_threads(op.threads)
    try:
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                op.run()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / reps
        t0 = time.perf_counter()
        for _ in range(reps):
            op.run()
        return (time.perf_counter() - t0) / reps
    finally:
        torch.set_num_threads(threads)


def spread(times: list[float]) -> dict:
    """Median and spread of one op's trial times."""
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return {"seconds": statistics.median(times), "seconds_min": min(times), "seconds_max": max(times),
            "seconds_q1": q1, "seconds_q3": q3}


def codec_ops(n: int, dtype: torch.dtype, device: str, wire_format: str, ranks: int, stochastic: bool) -> list[Op]:
    """The copies and codec calls of one (format, dtype, size), their buffers made once."""
    es = torch.tensor([], dtype=dtype).element_size()
    fmt = dict(wire_format=wire_format)
    x = torch.randn(n, device=device).to(dtype)
    copy_dst = torch.empty_like(x)
    S1 = fp8comm.segment_bytes(n, **fmt)
    wire1 = torch.empty(S1, dtype=torch.uint8, device=device)
    out = torch.empty(n, dtype=dtype, device=device)
    m = math.ceil(n / ranks)  # one rank's segment
    Sp = fp8comm.segment_bytes(m, **fmt)
    wire_pieces = torch.empty(ranks * Sp, dtype=torch.uint8, device=device)
    fp8comm.quantize_segments(x, wire1, 1, n, **fmt)
    fp8comm.quantize_segments(x, wire_pieces, ranks, m, **fmt)
    peers = wire_pieces[: (ranks - 1) * Sp]  # the ranks - 1 peers' pieces of a collective
    own = x[:m]  # the rank's own segment, exact
    out_m = torch.empty(m, dtype=dtype, device=device)
    seg = torch.empty(Sp, dtype=torch.uint8, device=device)
    sr = dict(rounding="stochastic", rounding_key=1, **fmt)
    collective = {"pieces": ranks - 1, "own_addend": True, "ranks": ranks, "segment_numel": m}
    pieces_only = {"pieces": ranks, "own_addend": False, "ranks": ranks, "segment_numel": m}

    ops = [Op("copy", lambda: copy_dst.copy_(x), 2 * es * n)]
    if dtype != torch.float32:
        src32, dst32 = torch.randn(n, device=device), torch.empty(n, device=device)
        ops.append(Op("copy_fp32", lambda: dst32.copy_(src32), 8 * n))
    ops += [
        Op("quantize", lambda: fp8comm.quantize_segments(x, wire1, 1, n, **fmt), es * n + S1),
        Op("dequantize", lambda: fp8comm.dequantize_segments(wire1, out, 1, n, **fmt), S1 + es * n),
        Op("dequant_sum_own", lambda: fp8comm.dequant_sum(peers, out_m, ranks - 1, m, own=own, **fmt),
           (ranks - 1) * Sp + 2 * es * m, collective),
        Op("dequant_sum_requantize_own",
           lambda: fp8comm.dequant_sum_requantize(peers, seg, ranks - 1, m, own=own, **fmt),
           (ranks - 1) * Sp + es * m + Sp, collective),
        Op("dequant_sum", lambda: fp8comm.dequant_sum(wire_pieces, out_m, ranks, m, **fmt),
           ranks * Sp + es * m, pieces_only),
        Op("dequant_sum_requantize", lambda: fp8comm.dequant_sum_requantize(wire_pieces, seg, ranks, m, **fmt),
           ranks * Sp + Sp, pieces_only),
    ]
    if stochastic:
        ops += [
            Op("quantize_stochastic", lambda: fp8comm.quantize_segments(x, wire1, 1, n, **sr), es * n + S1,
               {"rounding": "stochastic"}),
            Op("dequant_sum_requantize_own_stochastic",
               lambda: fp8comm.dequant_sum_requantize(peers, seg, ranks - 1, m, own=own, **sr),
               (ranks - 1) * Sp + es * m + Sp, {**collective, "rounding": "stochastic"}),
        ]
    if device == "cpu":
        ops.append(Op("quantize_1_thread", lambda: fp8comm.quantize_segments(x, wire1, 1, n, **fmt), es * n + S1,
                      threads=1))
    return ops


def bench_group(n: int, dtype: torch.dtype, device: str, wire_format: str, *, reps: int, trials: int,
                ranks: int = 4, stochastic: bool = True, kernels: str | None = None) -> list[dict]:
    """Rows of one (format, dtype, size): every op's median over `trials`
    interleaved trials, its floor and its fraction of the copies."""
    ops = codec_ops(n, dtype, device, wire_format, ranks, stochastic)
    for op in ops:  # warm-up: first-call allocations, kernel loads, caches
        for _ in range(2):
            op.run()
    if device == "cuda":
        torch.cuda.synchronize()
    times: dict[str, list[float]] = {op.name: [] for op in ops}
    for _ in range(trials):
        for op in ops:
            times[op.name].append(time_once(op, device, reps))
    dtype_name = str(dtype).replace("torch.", "")
    rows = []
    for op in ops:
        row = {"op": op.name, "numel": n, "dtype": dtype_name, "wire_format": wire_format, "device": device,
               "kernels": kernels, "rounding": "nearest", "trials": trials, "reps": reps,
               "bytes_moved": op.bytes_moved, **op.fields, **spread(times[op.name])}
        row["gb_per_s"] = op.bytes_moved / row["seconds"] / 1e9
        rows.append(row)
    copy = next(r for r in rows if r["op"] == "copy")
    copy32 = copy if dtype == torch.float32 else next(r for r in rows if r["op"] == "copy_fp32")
    for r in rows:
        r["copy_gb_per_s"] = copy["gb_per_s"]
        r["floor_seconds"] = r["bytes_moved"] / (copy["gb_per_s"] * 1e9)
        r["fraction_of_copy"] = r["floor_seconds"] / r["seconds"]
        r["fraction_of_fp32_copy"] = r["gb_per_s"] / copy32["gb_per_s"]
    return rows


def print_rows(rows: list[dict]) -> None:
    print(f"{'op':38s} {'format':6s} {'dtype':9s} {'numel':>11s} {'median us':>10s} {'min-max us':>17s} "
          f"{'floor us':>9s} {'GB/s':>8s} {'of copy':>7s}")
    for r in rows:
        span = f"{r['seconds_min'] * 1e6:.1f}-{r['seconds_max'] * 1e6:.1f}"
        print(f"{r['op']:38s} {r['wire_format']:6s} {r['dtype']:9s} {r['numel']:11d} {r['seconds'] * 1e6:10.1f} "
              f"{span:>17s} {r['floor_seconds'] * 1e6:9.1f} {r['gb_per_s']:8.1f} {r['fraction_of_copy']:7.2f}")


def print_side_by_side(rows: list[dict], kernel_sets: list[str]) -> None:
    """Each op's fraction of the copy under every kernel set, one line per op."""
    key = lambda r: (r["wire_format"], r["dtype"], r["numel"], r["op"])  # noqa: E731
    by = {(r["kernels"], key(r)): r for r in rows}
    print("\nfraction of the copy (medians), kernel sets side by side:")
    print(f"{'op':38s} {'format':6s} {'dtype':9s} {'numel':>11s} " + " ".join(f"{k:>9s}" for k in kernel_sets))
    for k in dict.fromkeys(key(r) for r in rows):
        cells = [by.get((ks, k)) for ks in kernel_sets]
        print(f"{k[3]:38s} {k[0]:6s} {k[1]:9s} {k[2]:11d} "
              + " ".join(f"{c['fraction_of_copy']:9.2f}" if c else f"{'-':>9s}" for c in cells))


def check_kernels(device: str, kernel_sets: list[str]) -> None:
    """--kernels needs CUDA and a build that reads FP8COMM_CUDA_CODEC."""
    if device != "cuda":
        raise SystemExit(f"bench/codec.py: --kernels picks CUDA codec kernel sets ({KERNELS_VARIABLE}); the CPU "
                         f"codec has one set. Run without --kernels on --device {device}.")
    declared = {name for name, *_ in fp8comm._C.environment_variables()}
    if KERNELS_VARIABLE not in declared:
        raise SystemExit(f"bench/codec.py: this build of fp8comm does not read {KERNELS_VARIABLE} "
                         f"(csrc/common/env.h), so it has one CUDA kernel set; run without --kernels "
                         f"{','.join(kernel_sets)}.")


def child_argv(argv: list[str]) -> list[str]:
    """This run's arguments less --kernels and --json (each kernel set's run
    writes its own JSON, merged here)."""
    rest, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--kernels", "--json"):
            skip = True
        elif not a.startswith(("--kernels=", "--json=")):
            rest.append(a)
    return rest


def run_kernel_sets(argv: list[str], kernel_sets: list[str]) -> list[dict]:
    """This script once per kernel set, the variable set in its environment
    (a fresh process each: a process never mixes two sets)."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for ks in kernel_sets:
            path = os.path.join(tmp, f"codec-{ks}.json")
            env = {**os.environ, KERNELS_VARIABLE: ks}
            print(f"== kernel set {ks} ({KERNELS_VARIABLE}={ks})", file=sys.stderr, flush=True)
            done = subprocess.run([sys.executable, os.path.abspath(__file__), *child_argv(argv), "--json", path],
                                  env=env)
            if done.returncode != 0:
                raise SystemExit(f"bench/codec.py: the run with {KERNELS_VARIABLE}={ks} failed "
                                 f"(exit status {done.returncode})")
            with open(path) as f:
                rows += json.load(f)["rows"]
    return rows


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() and fp8comm._C.has_cuda else "cpu")
    p.add_argument("--sizes", default="1M,4M,16M,64M,256M")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--wire-format", default=",".join(fp8comm.codec.WIRE_FORMATS),
                   help="comma list of wire formats (fp8comm.codec.WIRE_FORMATS), each at its default block size")
    p.add_argument("--ranks", type=int, default=4, help="the collective the sums stand for (ranks - 1 peers + own)")
    p.add_argument("--trials", type=int, default=MIN_TRIALS, help=f"timed trials per op (at least {MIN_TRIALS})")
    p.add_argument("--reps", type=int, default=0, help="calls per trial; 0: pick by size")
    p.add_argument("--quick", action="store_true", help="tiny sizes, few reps (a smoke test)")
    p.add_argument("--no-stochastic", dest="stochastic", action="store_false",
                   help="leave out the stochastic-rounding rows")
    p.add_argument("--stochastic", action="store_true", default=True, help="(the default) time stochastic rounding too")
    p.add_argument("--kernels", help=f"CUDA only: comma list of {KERNELS_VARIABLE} values to time side by side")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    if args.trials < MIN_TRIALS:
        p.error(f"--trials must be at least {MIN_TRIALS} (a median and its spread), got {args.trials}")
    if args.ranks < 2:
        p.error(f"--ranks must be at least 2 (one peer), got {args.ranks}")
    for wire_format in args.wire_format.split(","):
        fp8comm.codec.wire_format_info(wire_format)  # raises naming the formats
    sizes = [4096, 65536] if args.quick else [parse_size(s) for s in args.sizes.split(",")]
    kernel_sets = args.kernels.split(",") if args.kernels else None

    if kernel_sets:
        check_kernels(args.device, kernel_sets)
        rows = run_kernel_sets(argv, kernel_sets)
    else:
        kernels = (os.environ.get(KERNELS_VARIABLE) or "default") if args.device == "cuda" else None
        rows = []
        for wire_format in args.wire_format.split(","):
            for dtype_name in args.dtypes.split(","):
                dtype = getattr(torch, dtype_name)
                for n in sizes:
                    reps = args.reps or (2 if args.quick else max(3, min(100, (64 << 20) // n)))
                    rows += bench_group(n, dtype, args.device, wire_format, reps=reps, trials=args.trials,
                                        ranks=args.ranks, stochastic=args.stochastic, kernels=kernels)
                    print(f"done {wire_format} {dtype_name} {n}", file=sys.stderr, flush=True)
    print_rows(rows)
    if kernel_sets:
        print_side_by_side(rows, kernel_sets)
    result = {
        "benchmark": "codec",
        "date": datetime.date.today().isoformat(),
        "command": " ".join([os.path.basename(sys.executable), "bench/codec.py", *argv]),
        "device": device_label(args.device == "cuda"),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "trials": args.trials,
        "ranks": args.ranks,
        "kernels": kernel_sets or sorted({r["kernels"] for r in rows if r["kernels"]}) or None,
        "rows": rows,
    }
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
