"""Interference: a Llama-3-8B-shaped BF16 GEMM on one stream beside the codec
on another, the GEMM's slowdown (issue 44, 4b). A data-parallel step overlaps
its gradient collectives with the backward's GEMMs; on a GPU the codec takes
SMs and HBM from them, which a single-rank codec benchmark never shows.

    python bench/interference.py [--json PATH [--part KEY]]
    python bench/interference.py --smoke     # the CPU: the shapes and the calls, one after another

For each GEMM shape and wire format: the GEMM alone (R back-to-back GEMMs
between CUDA events, median of trials), the codec alone (an all_reduce's
kernels at P = 8 over 128M BF16 elements, 8 chunks, as collective_time.py
lists them), then both at once: the GEMMs on one stream and enough codec
iterations to cover them on another, each stream timed by its own events.

Measured: every time, and so the GEMM's slowdown (beside / alone) and the
codec's. Counted: the codec's bytes; its share of HBM traffic is those bytes
over the GEMM's window times the measured copy rate. Issue 44's goal is
slowdown - 1 <= that share ("goal_met"); a GEMM that reads its operands
from L2 can do better than that.
"""
from __future__ import annotations

import argparse

import torch

import collective_time
import fp8comm
import one_gpu

# (tokens, in features, out features): the MLP's up / gate and down projections of Llama-3-8B
SHAPES = ((8192, 4096, 14336), (8192, 14336, 4096))
CODEC_RANKS = 8
# 128M BF16 elements, 8 chunks of NCCL's 16M: a working set several times the L2, as a bucket of gradients is
CODEC_NUMEL = 1 << 27


def codec_job(wire_format: str, numel: int, chunk_numel: int, device: str):
    """(a function running one all_reduce's codec kernels, their bytes)."""
    fmt = {"wire_format": wire_format}
    block = fp8comm.codec.default_block_size(wire_format)
    plan = collective_time.launches("all_reduce", CODEC_RANKS, block, numel, chunk_numel)
    bufs = collective_time.Buffers(plan, torch.bfloat16, device, fmt)
    moved = sum(collective_time.launch_bytes(x, 2, fp8comm.segment_bytes(x.m, **fmt)) for x in plan)

    def run():
        for x in plan:
            bufs.run(x)

    return run, moved


def side_by_side(gemm, gemm_reps: int, codec, codec_reps: int, trials: int) -> tuple[dict, dict]:
    """Both at once, each on its own stream, launches interleaved so that both start together."""
    g_stream, c_stream = torch.cuda.Stream(), torch.cuda.Stream()
    g_times, c_times = [], []
    for _ in range(trials):
        torch.cuda.synchronize()
        events = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        with torch.cuda.stream(g_stream):
            events[0].record()
        with torch.cuda.stream(c_stream):
            events[2].record()
        i = j = 0
        while i < gemm_reps or j < codec_reps:
            if i < gemm_reps:
                with torch.cuda.stream(g_stream):
                    gemm()
                i += 1
            for _ in range(max(1, codec_reps // max(1, gemm_reps))):
                if j < codec_reps:
                    with torch.cuda.stream(c_stream):
                        codec()
                    j += 1
        with torch.cuda.stream(g_stream):
            events[1].record()
        with torch.cuda.stream(c_stream):
            events[3].record()
        torch.cuda.synchronize()
        g_times.append(events[0].elapsed_time(events[1]) / 1e3 / gemm_reps)
        c_times.append(events[2].elapsed_time(events[3]) / 1e3 / codec_reps)
    return one_gpu.summarize(g_times), one_gpu.summarize(c_times)


def measure(shape, wire_format: str, device: str, trials: int, gemm_reps: int, codec_numel: int,
            copy_rate: float) -> dict:
    M, K, N = shape
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a = torch.randn(M, K, device=device, dtype=dtype)
    b = torch.randn(K, N, device=device, dtype=dtype)
    c = torch.empty(M, N, device=device, dtype=dtype)

    def gemm():
        torch.matmul(a, b, out=c)

    chunk_numel = collective_time.NCCL_CHUNK_NUMEL if device == "cuda" else codec_numel
    codec, codec_bytes = codec_job(wire_format, codec_numel, chunk_numel, device)
    gemm_alone = one_gpu.time_trials(gemm, device, trials, gemm_reps)
    codec_alone = one_gpu.time_trials(codec, device, trials, max(1, gemm_reps))
    row = {"tokens": M, "in_features": K, "out_features": N, "wire_format": wire_format, "codec_ranks": CODEC_RANKS,
           "codec_numel": codec_numel, "gemm_alone_s": gemm_alone["median_s"], "gemm_alone_spread": gemm_alone["spread"],
           "codec_alone_s": codec_alone["median_s"], "codec_bytes": codec_bytes,
           "gemm_tflop_per_s": 2 * M * K * N / gemm_alone["median_s"] / 1e12}
    if device != "cuda":
        row.update(gemm_beside_s=None, codec_beside_s=None, slowdown=None, codec_hbm_share=None, goal_met=None,
                   why_none="no streams on the CPU: the smoke mode times each alone")
        return row
    window = gemm_alone["median_s"] * gemm_reps
    codec_reps = max(1, round(window / codec_alone["median_s"]))
    g, cdc = side_by_side(gemm, gemm_reps, codec, codec_reps, trials)
    share = codec_bytes * codec_reps / (g["median_s"] * gemm_reps) / copy_rate
    slowdown = g["median_s"] / gemm_alone["median_s"]
    row.update(gemm_beside_s=g["median_s"], gemm_beside_spread=g["spread"], codec_beside_s=cdc["median_s"],
               codec_reps=codec_reps, slowdown=slowdown, codec_slowdown=cdc["median_s"] / codec_alone["median_s"],
               codec_hbm_share=share, goal_met=slowdown - 1 <= share)
    return row


LABELS = {"gemm_alone_s": "measured", "codec_alone_s": "measured", "gemm_beside_s": "measured",
          "codec_beside_s": "measured", "slowdown": "measured (beside / alone)",
          "codec_bytes": "counted", "codec_hbm_share": "counted bytes over the measured window and copy rate",
          "goal_met": "issue 44's goal: slowdown - 1 <= codec_hbm_share"}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--wire-formats", default="e4m3,mxfp4")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--gemm-reps", type=int, default=10)
    p.add_argument("--smoke", action="store_true", help="the CPU, small shapes, one trial, no streams")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--part")
    args = p.parse_args(argv)
    shapes, codec_numel = SHAPES, CODEC_NUMEL
    if args.smoke:
        args.device, args.trials, args.gemm_reps = "cpu", 1, 1
        shapes, codec_numel = tuple((64, k // 64, n // 64) for _, k, n in SHAPES), 1 << 14
    device = one_gpu.pick_device(args.device)
    copy_rate = one_gpu.copy_bytes_per_s(device, 1 << 16 if args.smoke else 1 << 26)
    rows = [measure(s, wf, device, args.trials, args.gemm_reps, codec_numel, copy_rate)
            for s in shapes for wf in args.wire_formats.split(",")]
    for r in rows:
        shape = f"{r['tokens']}x{r['in_features']}->{r['out_features']}"
        if r["slowdown"] is None:
            print(f"{shape:20s} {r['wire_format']:6s} GEMM alone {r['gemm_alone_s'] * 1e3:8.3f} ms, codec alone "
                  f"{r['codec_alone_s'] * 1e3:8.3f} ms (slowdown: none, {r['why_none']})")
        else:
            print(f"{shape:20s} {r['wire_format']:6s} GEMM {r['gemm_alone_s'] * 1e3:7.3f} ms alone, "
                  f"{r['gemm_beside_s'] * 1e3:7.3f} beside the codec: slowdown {r['slowdown']:5.3f} "
                  f"(codec's HBM share {r['codec_hbm_share']:4.2f}, goal {'met' if r['goal_met'] else 'MISSED'})")
    doc = {**one_gpu.header("interference", device, args.smoke, LABELS, one_gpu.notes_of(__doc__)),
           "copy_bytes_per_s": copy_rate, "rows": rows}
    if args.json:
        (one_gpu.write_part(args.json, args.part, doc) if args.part else one_gpu.write_whole(args.json, doc))
    return doc


if __name__ == "__main__":
    main()
