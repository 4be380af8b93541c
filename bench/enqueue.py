"""Host enqueue time against GPU time per compressed call (issue 44, 4c): a
world-size-1 "cpu:fp8gloo,cuda:fp8nccl" group, every call compressed, eager
and in a CUDA graph. Where the host takes longer to enqueue a call than the
GPU takes to run it, a step is bound by the host, however fast the kernels.

    python bench/enqueue.py [--sizes 1M,16M] [--json PATH [--part KEY]]
    python bench/enqueue.py --smoke     # the CPU: an fp8gloo group, host time only

Eager: N calls back to back; the host's time is the wall time of the N
calls returning (they enqueue and return: fp8nccl never blocks the host), the
GPU's is CUDA events around them on the current stream (which waits for the
side streams). Graph: the same N calls captured into one CUDA graph, then its
replay timed the same way. fp8nccl either captures (the replays are timed) or
refuses at capture with an error that names fp8comm (recorded; any other
error fails this benchmark, as tests/backend/test_cuda_streams.py holds).

Measured: every time. A world of one rank: no wire, so the GPU time is the
codec's and the stream plumbing's (NCCL's world-size-1 calls are copies).
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
import torch.distributed as dist

import fp8comm
import one_gpu
from fp8comm.bench import all_gather_single, reduce_scatter_single

OPS = ("all_reduce", "reduce_scatter", "all_gather")


def call_of(op: str, n: int, device: str, dtype: torch.dtype):
    x = torch.randn(n, device=device).to(dtype)
    out = torch.empty(n, device=device, dtype=dtype)
    if op == "all_reduce":
        return lambda: dist.all_reduce(x)
    if op == "reduce_scatter":
        return lambda: reduce_scatter_single(out, x)
    return lambda: all_gather_single(out, x)


def host_and_gpu(fn, device: str, calls: int, trials: int) -> tuple[dict, dict | None]:
    """Seconds per call: the host's (wall time until the calls returned) and the GPU's (events)."""
    fn()
    one_gpu.synchronize(device)
    host, gpu = [], []
    for _ in range(trials):
        one_gpu.synchronize(device)
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        host.append((time.perf_counter() - t0) / calls)
        if device == "cuda":
            end.record()
            end.synchronize()
            gpu.append(start.elapsed_time(end) / 1e3 / calls)
    return one_gpu.summarize(host), (one_gpu.summarize(gpu) if gpu else None)


def messages(exc: BaseException) -> str:
    seen = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return " | ".join(f"{type(e).__name__}: {e}" for e in seen)


def refusal(op: str, exc: BaseException) -> str:
    """A capture's error, if it is a clear refusal (it names fp8comm); else this benchmark fails."""
    message = messages(exc)
    if "fp8comm" not in message:
        raise SystemExit(f"error: CUDA graph capture of fp8nccl's {op} failed with an error that does not name "
                         f"fp8comm: {message}")
    return message


def graph_row(op: str, n: int, dtype: torch.dtype, calls: int, trials: int) -> dict:
    """The same calls captured into one CUDA graph, or fp8nccl's refusal to capture."""
    fn = call_of(op, n, "cuda", dtype)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graph asks
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
    except Exception as e:  # noqa: BLE001 (any refusal must name fp8comm; checked below)
        message = refusal(op, e)
        torch.cuda.synchronize()
        return {"graph": "refused", "graph_error": message}
    host, gpu = host_and_gpu(graph.replay, "cuda", 1, trials)
    return {"graph": "captured", "graph_host_s": host["median_s"] / calls, "graph_gpu_s": gpu["median_s"] / calls}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--sizes", default="1M,16M", help="elements per call")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--smoke", action="store_true", help="the CPU: fp8gloo, 64K elements, host time only")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--part", default="enqueue", help="the part of the JSON at PATH this result is written as")
    args = p.parse_args(argv)
    if args.smoke:
        args.device, args.sizes, args.calls, args.trials = "cpu", "64K", 2, 1
    device = one_gpu.pick_device(args.device)
    backend = "cpu:fp8gloo,cuda:fp8nccl" if device == "cuda" else "cpu:fp8gloo"
    rows = []
    with tempfile.TemporaryDirectory() as d:
        if device == "cuda":
            torch.cuda.set_device(0)
        dist.init_process_group(backend, init_method=f"file://{os.path.join(d, 'store')}", rank=0, world_size=1,
                                pg_options=fp8comm.Options(min_numel=1024, compress="all"))
        try:
            cases = [(n, dtype_name, op) for n in map(one_gpu.parse_size, args.sizes.split(","))
                     for dtype_name in args.dtypes.split(",") for op in OPS]
            for n, dtype_name, op in cases:
                dtype = getattr(torch, dtype_name)
                before = fp8comm.get_stats()["calls_compressed"]
                host, gpu = host_and_gpu(call_of(op, n, device, dtype), device, args.calls, args.trials)
                compressed = fp8comm.get_stats()["calls_compressed"] - before
                rows.append({"op": op, "numel": n, "dtype": dtype_name, "calls_compressed": compressed,
                             "calls": 1 + args.calls * args.trials, "host_s": host["median_s"],
                             "host_spread": host["spread"], "gpu_s": gpu["median_s"] if gpu else None,
                             "host_over_gpu": host["median_s"] / gpu["median_s"] if gpu else None,
                             "graph": "not attempted: no CUDA on the CPU"})
            # the graphs after every eager row: a refused capture may leave the communicator unusable
            refused = None
            for row, (n, dtype_name, op) in zip(rows, cases):
                if device != "cuda":
                    break
                if refused:
                    row.update(graph="refused", graph_error=f"not attempted again after: {refused}")
                    continue
                row.update(graph_row(op, n, getattr(torch, dtype_name), args.calls, args.trials))
                refused = row.get("graph_error")
        finally:
            dist.destroy_process_group()
    for r in rows:
        gpu = f"GPU {r['gpu_s'] * 1e6:8.1f} us (host / GPU {r['host_over_gpu']:5.2f})" if r["gpu_s"] else "GPU -"
        graph = (f"graph host {r['graph_host_s'] * 1e6:7.1f} us, GPU {r['graph_gpu_s'] * 1e6:7.1f} us"
                 if r["graph"] == "captured" else f"graph {r['graph']}")
        print(f"{r['op']:15s} {r['dtype']:9s} {r['numel']:9d}: host {r['host_s'] * 1e6:8.1f} us, {gpu}; {graph}")
    labels = {"host_s": "measured (wall time per call until it returned)",
              "gpu_s": "measured (CUDA events per call)", "graph_host_s": "measured (per captured call)",
              "graph_gpu_s": "measured (per captured call)", "calls_compressed": "counted by fp8comm.get_stats"}
    doc = {**one_gpu.header("enqueue", device, args.smoke, labels, one_gpu.notes_of(__doc__)), "backend": backend,
           "rows": rows}
    if args.json:
        one_gpu.write_part(args.json, args.part, doc)
    return doc


if __name__ == "__main__":
    main()
