"""GPU time of each compressed collective's codec work on one rank, at its real
chunk plan, for P = 2, 4, 8, 16 ranks, both dtypes and every wire format: the
one-GPU part of a cluster prediction (issue 44, 4a).

    python bench/collective_time.py [--sizes 16M,128M] [--ranks 2,4,8,16] [--json PATH [--part KEY]]
    python bench/collective_time.py --smoke     # the CPU, tiny sizes: the plan and the calls, no timing worth reading

A collective of P ranks cuts its tensor into the chunks csrc/algorithms/
chunk_plan.cpp gives (NCCL's chunk_numel, 16M elements, transport_traits.h),
and on each chunk one rank runs the codec kernels its algorithm launches
(all_reduce.cpp, reduce_scatter.cpp, all_gather.cpp, segments.h): `launches`
below lists them, as rank RANK runs them on an NCCL transport (no segment
headers, gather slot r = r). They run here back to back on one stream through
fp8comm's Python ops (the same kernels), between CUDA events.

Measured: the codec kernels' GPU time per call (median of trials, spread).
Counted: the chunks, launches and bytes each kernel moves (from the plan), and
so the rate as a fraction of the same device's copy. Not in it: the wire,
NCCL, host enqueue time (enqueue.py), overlap of codec and wire (overlap.py).
The size is the collective's whole tensor: all_reduce's tensor, reduce_scatter's
input, all_gather's output (each rank's segment is size / P).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

import torch

import fp8comm
import one_gpu

NCCL_CHUNK_NUMEL = 1 << 24  # TransportTraits::of, "nccl" (csrc/algorithms/transport_traits.h)
RANK = 1  # the rank whose launches are timed: in all_reduce, peers' segments on both sides of its own
OPS = ("all_reduce", "reduce_scatter", "all_gather")
DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class Chunk:
    begin: int
    numel: int
    m: int  # elements per wire segment


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def chunk_plan(P: int, block: int, of_tensor: bool, numel: int, chunk_numel: int = NCCL_CHUNK_NUMEL) -> list[Chunk]:
    """chunk_plan.cpp's plan: of_tensor (all_reduce) cuts the tensor into chunks
    of P segments; else (reduce_scatter, all_gather) each rank's segment into
    chunks of one segment per rank. At least one chunk."""
    per_rank = ceil_div(ceil_div(chunk_numel, P), block) * block
    step = (P if of_tensor else 1) * per_rank
    chunks: list[Chunk] = []
    begin = 0
    while begin < numel or not chunks:
        n = min(step, numel - begin)
        m = ceil_div(ceil_div(n, P), block) * block if of_tensor else n
        chunks.append(Chunk(begin, n, m))
        begin += step
    return chunks


@dataclasses.dataclass(frozen=True)
class Launch:
    """One codec kernel call. kind: quantize (count segments of m elements from
    `numel` source elements), sum_requantize (pieces segments + own addend of
    `numel` elements -> one segment), sum (pieces + own -> `numel` elements),
    dequantize (count segments -> `numel` elements). chunk and slot: the chunk
    whose send or wire bytes it writes or reads, and where; src_at / dst_at: where its elements start in the
    call's input / output (each chunk its own memory, as in the collective, so
    that nothing is timed out of L2 that the call would read from HBM)."""

    kind: str
    count: int
    m: int
    numel: int
    chunk: int = 0
    src_at: int = 0
    dst_at: int = 0
    slot: int = 0  # the first of its segments in the chunk's send or wire bytes


def launches(op: str, P: int, block: int, size: int, chunk_numel: int = NCCL_CHUNK_NUMEL) -> list[Launch]:
    """The codec kernels rank RANK launches for one call of `op` over `size`
    elements (the whole tensor) among P ranks, in order."""
    r = min(RANK, P - 1)
    out: list[Launch] = []
    if op == "all_reduce":
        chunks = chunk_plan(P, block, True, size, chunk_numel)
        for i, c in enumerate(chunks):  # quantize_for_peers: the segments before this rank's, then those after
            if r > 0:
                out.append(Launch("quantize", r, c.m, max(0, min(r * c.m, c.numel)), i, c.begin))
            if r + 1 < P:
                out.append(Launch("quantize", P - 1 - r, c.m,
                                  max(0, min((P - 1 - r) * c.m, c.numel - (r + 1) * c.m)), i,
                                  c.begin + min(c.numel, (r + 1) * c.m), slot=r))
        for i, c in enumerate(chunks):  # the peers' pieces summed onto this rank's own segment
            out.append(Launch("sum_requantize", P - 1, c.m, max(0, min(c.m, c.numel - r * c.m)), i,
                              c.begin + min(c.numel, r * c.m)))
        for i, c in enumerate(chunks):  # decode_gathered: P consecutive slots, one launch
            out.append(Launch("dequantize", P, c.m, c.numel, i, dst_at=c.begin))
        return out
    k = ceil_div(size, P)
    chunks = chunk_plan(P, block, False, k, chunk_numel)
    peers = [q for q in range(P) if q != r]
    if op == "reduce_scatter":  # input: P segments of k; output: this rank's k
        for i, c in enumerate(chunks):
            out += [Launch("quantize", 1, c.m, c.numel, i, q * k + c.begin, slot=j) for j, q in enumerate(peers)]
        out += [Launch("sum", P - 1, c.m, c.numel, i, r * k + c.begin, c.begin) for i, c in enumerate(chunks)]
        return out
    if op == "all_gather":  # input: this rank's k; output: P segments of k
        out += [Launch("quantize", 1, c.m, c.numel, i, c.begin) for i, c in enumerate(chunks)]
        if len(chunks) == 1:  # one chunk: the P segments decode in one launch into the flat output
            out.append(Launch("dequantize", P, k, P * k))
        else:
            out += [Launch("dequantize", 1, c.m, c.numel, i, dst_at=q * k + c.begin, slot=q)
                    for i, c in enumerate(chunks) for q in range(P)]
        return out
    raise ValueError(f"collective_time: op {op!r} is not one of {', '.join(OPS)}")


def launch_bytes(launch: Launch, element_size: int, segment_bytes: int) -> int:
    """Bytes a kernel must move through memory: its inputs read once, its outputs written once."""
    S = segment_bytes
    if launch.kind == "quantize":
        return launch.numel * element_size + launch.count * S
    if launch.kind == "sum_requantize":
        return launch.count * S + launch.numel * element_size + S
    if launch.kind == "sum":
        return launch.count * S + 2 * launch.numel * element_size
    return launch.count * S + launch.numel * element_size


class Buffers:
    """The call's input and output, and per chunk its send bytes and wire bytes
    holding real codes (decoding garbage would take the kernels' non-finite
    path), each launch a view of them."""

    def __init__(self, plan: list[Launch], dtype: torch.dtype, device: str, fmt: dict):
        self.fmt = fmt
        reads = [x for x in plan if x.kind != "dequantize"]
        self.x = torch.randn(max(x.src_at + max(x.numel, 1) for x in reads), device=device).to(dtype)
        writes = [x for x in plan if x.kind in ("sum", "dequantize")]
        self.out = torch.empty(max([x.dst_at + x.numel for x in writes] + [1]), dtype=dtype, device=device)
        self.wire, self.send = {}, {}
        # the wire's codes from random data (no segment of zeros, which may decode faster than real data)
        fill = torch.randn(max(x.m * (x.slot + x.count) for x in plan), device=device).to(dtype)
        for i in sorted({x.chunk for x in plan}):
            mine = [x for x in plan if x.chunk == i]
            count = max(x.slot + x.count for x in mine)
            self.wire[i] = {}
            for m in sorted({x.m for x in mine}):  # all_gather's one-launch decode: segments of k
                S = fp8comm.segment_bytes(m, **fmt)
                self.wire[i][m] = torch.empty(count * S, dtype=torch.uint8, device=device)
                fp8comm.quantize_segments(fill[: count * m], self.wire[i][m], count, m, **fmt)
            self.send[i] = torch.empty(count * fp8comm.segment_bytes(mine[0].m, **fmt), dtype=torch.uint8,
                                       device=device)
        del fill
        segment_most = max(fp8comm.segment_bytes(x.m, **fmt) for x in plan)
        self.one = {i: torch.empty(segment_most, dtype=torch.uint8, device=device) for i in self.wire}

    def run(self, x: Launch) -> None:
        S = fp8comm.segment_bytes(x.m, **self.fmt)
        wire = self.wire[x.chunk][x.m][x.slot * S: (x.slot + x.count) * S]
        src = self.x[x.src_at: x.src_at + x.numel]
        if x.kind == "quantize":
            fp8comm.quantize_segments(src, self.send[x.chunk][x.slot * S: (x.slot + x.count) * S], x.count, x.m,
                                      **self.fmt)
        elif x.kind == "sum_requantize":
            fp8comm.dequant_sum_requantize(wire, self.one[x.chunk][:S], x.count, x.m, own=src, **self.fmt)
        elif x.kind == "sum":
            fp8comm.dequant_sum(wire, self.out[x.dst_at: x.dst_at + x.numel], x.count, x.m, own=src, **self.fmt)
        else:
            fp8comm.dequantize_segments(wire, self.out[x.dst_at: x.dst_at + x.numel], x.count, x.m, **self.fmt)


def measure(op: str, P: int, dtype_name: str, wire_format: str, size: int, device: str, trials: int, reps: int,
            chunk_numel: int, copy_rate: float) -> dict:
    fmt = {"wire_format": wire_format}
    block = fp8comm.codec.default_block_size(wire_format)
    plan = launches(op, P, block, size, chunk_numel)
    dtype = getattr(torch, dtype_name)
    es = torch.tensor([], dtype=dtype).element_size()
    bufs = Buffers(plan, dtype, device, fmt)
    moved = sum(launch_bytes(x, es, fp8comm.segment_bytes(x.m, **fmt)) for x in plan)

    def call():
        for x in plan:
            bufs.run(x)

    t = one_gpu.time_trials(call, device, trials, reps)
    chunks = len(chunk_plan(P, block, op == "all_reduce", size if op == "all_reduce" else ceil_div(size, P),
                            chunk_numel))
    return {"op": op, "ranks": P, "dtype": dtype_name, "wire_format": wire_format, "numel": size, "chunks": chunks,
            "launches": len(plan), "seconds": t["median_s"], "spread": t["spread"], "trials_s": t["trials_s"],
            "codec_bytes": moved, "gb_per_s": moved / t["median_s"] / 1e9,
            "fraction_of_copy": moved / t["median_s"] / copy_rate}


LABELS = {"seconds": "measured (median; CUDA events around the rank's codec launches, one stream)",
          "spread": "measured", "chunks": "counted (chunk_plan.cpp's plan)", "launches": "counted",
          "codec_bytes": "counted (each input read once, each output written once)",
          "gb_per_s": "codec_bytes over the measured seconds", "fraction_of_copy": "against the measured copy"}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--sizes", default="16M,128M", help="whole-collective element counts")
    p.add_argument("--ranks", default="2,4,8,16")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--wire-formats", default=",".join(fp8comm.codec.WIRE_FORMATS))
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--chunk-numel", type=int, default=NCCL_CHUNK_NUMEL,
                   help="elements per chunk (default NCCL's, transport_traits.h; smaller only to exercise the plan)")
    p.add_argument("--smoke", action="store_true", help="the CPU, 64K elements, 16K-element chunks, one trial")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--part", help="write the result as this part of the JSON at PATH")
    args = p.parse_args(argv)
    if args.smoke:
        args.device, args.sizes, args.chunk_numel, args.trials, args.reps = "cpu", "64K", 1 << 14, 1, 1
    device = one_gpu.pick_device(args.device)
    copy_rate = one_gpu.copy_bytes_per_s(device, 1 << 16 if args.smoke else 1 << 26)
    rows = []
    for size in map(one_gpu.parse_size, args.sizes.split(",")):
        for op in args.ops.split(","):
            for P in map(int, args.ranks.split(",")):
                for dtype_name in args.dtypes.split(","):
                    for wf in args.wire_formats.split(","):
                        rows.append(measure(op, P, dtype_name, wf, size, device, args.trials, args.reps,
                                            args.chunk_numel, copy_rate))
                print(f"done {op} P={P} {size}", file=sys.stderr, flush=True)
    print(f"{'op':15s} {'P':>5s} {'dtype':9s} {'format':6s} {'numel':>10s} {'chunks':>6s} {'launch':>6s} "
          f"{'ms':>8s} {'spread':>6s} {'of copy':>7s}")
    for r in rows:
        print(f"{r['op']:15s} {'P=' + str(r['ranks']):>5s} {r['dtype']:9s} {r['wire_format']:6s} {r['numel']:10d} "
              f"{r['chunks']:6d} {r['launches']:6d} {r['seconds'] * 1e3:8.3f} {r['spread']:6.2f} "
              f"{r['fraction_of_copy']:7.2f}")
    doc = {**one_gpu.header("collective_time", device, args.smoke, LABELS, one_gpu.notes_of(__doc__)),
           "chunk_numel": args.chunk_numel, "rank": RANK, "copy_bytes_per_s": copy_rate, "rows": rows}
    if args.json:
        (one_gpu.write_part(args.json, args.part, doc) if args.part else one_gpu.write_whole(args.json, doc))
    return doc


if __name__ == "__main__":
    main()
