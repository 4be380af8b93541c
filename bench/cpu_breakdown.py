"""Where the time of a CPU all_reduce goes: codec vs transport, wall vs CPU.

    torchrun --nproc_per_node=2 bench/cpu_breakdown.py [--mib 64] [--reps 10]

On rank 0, for an FP32 all_reduce of --mib MiB on P ranks:
  1. each codec pass of the compressed algorithm, alone, on this rank's thread,
     next to a copy. By default: quantize the P - 1 other ranks' segments,
     add their pieces to the own segment and re-quantize, decode P;
  2. one transport phase alone on plain gloo (a uint8 all_to_all of the wire
     bytes with no segment to itself, as fp8gloo moves them; the algorithm
     runs two, the two-rank exchange one);
  3. gloo's FP32 all_reduce and fp8gloo's, interleaved: wall time and the
     process CPU time (all threads, gloo's included) per call.
Medians of --reps. Both backends run in the same processes.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

import fp8comm
from fp8comm.bench import device_label


def timed(fn, reps, barrier=None):
    fn()
    wall, cpu = [], []
    for _ in range(reps):
        if barrier is not None:
            dist.barrier(group=barrier)
        w, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    return statistics.median(wall) * 1e3, statistics.median(cpu) * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args()
    dist.init_process_group("fp8gloo", pg_options=fp8comm.Options(min_numel=0))
    plain = dist.new_group(backend="gloo")
    rank, P = dist.get_rank(), dist.get_world_size()
    n = args.mib * (1 << 20) // 4
    m = -(-(-(-n // P)) // 32) * 32
    x = torch.randn(n)
    lines = [f"FP32 all_reduce of {args.mib} MiB on {P} ranks; rank 0; medians of {args.reps}; ms; "
             f"{device_label(False)}, torch {torch.__version__}"]

    S = dist.group.WORLD._get_backend(torch.device("cpu")).wire_segment_bytes(m, "cpu")
    seg = fp8comm.segment_bytes(m, 32)
    if rank == 0:  # 1. codec passes, one thread
        wire = torch.empty(P * seg, dtype=torch.uint8)  # the codec's segments, without the headers
        out, mine = torch.empty(n), torch.empty(seg, dtype=torch.uint8)
        others = x[m:]  # rank 0 quantizes segments 1 .. P-1 and keeps segment 0
        q = timed(lambda: fp8comm.quantize_segments(others, wire[: (P - 1) * seg], P - 1, m), args.reps)[0]
        fp8comm.quantize_segments(others, wire[: (P - 1) * seg], P - 1, m)
        d = timed(lambda: fp8comm.dequant_sum_requantize(wire[: (P - 1) * seg], mine, P - 1, m, own=x[:m]),
                  args.reps)[0]
        fp8comm.quantize_segments(x, wire, P, m)  # P segments to decode
        g = timed(lambda: fp8comm.dequantize_segments(wire, out, P, m), args.reps)[0]
        passes = f"quantize {q:.1f}, sum + re-quantize {d:.1f}, decode {g:.1f}, total {q + d + g:.1f}"
        c = timed(lambda: out.copy_(x), args.reps)[0]
        lines.append(f"codec, one thread: {passes} (a copy of the tensor: {c:.1f})")
    dist.barrier(group=plain)

    # 2. the transport phases alone, on plain gloo
    send = torch.randint(0, 255, ((P - 1) * S,), dtype=torch.uint8)
    recv = torch.empty((P - 1) * S, dtype=torch.uint8)
    splits = [0 if r == rank else S for r in range(P)]
    a2a = timed(lambda: dist.all_to_all_single(recv, send, splits, list(splits), group=plain), args.reps, plain)
    lines.append(f"transport, one all_to_all of {P - 1} x {S / 1e6:.1f} MB: wall {a2a[0]:.1f}, "
                 f"process CPU {a2a[1]:.1f} (the algorithm runs two)")

    # 3. the whole all_reduce, interleaved (the input copy outside the clock)
    y = torch.empty_like(x)
    results = {"gloo": ([], []), "fp8gloo": ([], [])}
    groups = [("gloo", plain), ("fp8gloo", dist.group.WORLD)]
    for name, group in groups:  # warm-up
        y.copy_(x)
        dist.all_reduce(y, group=group)
    for i in range(args.reps):
        for name, group in groups if i % 2 == 0 else groups[::-1]:
            y.copy_(x)
            dist.barrier(group=plain)
            w, c = time.perf_counter(), time.process_time()
            dist.all_reduce(y, group=group)
            results[name][0].append((time.perf_counter() - w) * 1e3)
            results[name][1].append((time.process_time() - c) * 1e3)
    for name, (w, c) in results.items():
        lines.append(f"{name} all_reduce: wall {statistics.median(w):.1f}, process CPU {statistics.median(c):.1f}")
    ratio = statistics.median(results["fp8gloo"][0]) / statistics.median(results["gloo"][0])
    lines.append(f"fp8gloo / gloo wall time: {ratio:.2f}")
    if rank == 0:
        print("\n".join(lines))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
