"""A performance model of fp8comm's collectives on clusters of GPU nodes.
Every number it prints is MODELED, not measured; its inputs (bench/model_inputs.py,
with their sources) are printed and written with it.

    python bench/model.py [--codec-json bench/results/gpu-<name>/codec.json [--codec-kernels SET]]
                          [--nodes 1,4,16,64] [--overlap 0] [--json PATH]

The cluster: nodes of 8 GPUs, NVLink inside (NVSwitch), one InfiniBand NIC
per GPU between nodes. A message of n elements of a dtype (b bytes each) per
rank; fp8comm's wire format moves w bytes per element (model_inputs.WIRE_BYTES).
Each phase costs bytes / (line rate x link efficiency) + NCCL's latency; the
efficiency is the same for NCCL and for fp8comm's NCCL phases, and does not
cancel in the ratio, because the codec's time does not scale with it.

NCCL (the baseline, in the message's dtype), as its tuner would pick:
- one node: all_reduce by NVLS (NVLink SHARP), its measured algorithm
  bandwidth (or a ring where that is faster); reduce_scatter / all_gather
  by a ring over NVLink;
- several nodes: all_reduce by the faster of a ring through all GPUs (each
  NIC carries 2 (P-1)/P n b / 8, NVLink the rest of the ring) and NVLS-tree
  (NVLS inside the node, a tree between nodes); reduce_scatter / all_gather
  by the ring.
fp8comm:
- scope `all` (flat): quantize, all_to_all of the segments (each GPU's bytes
  to other nodes leave through its own NIC: (P-G)/P n w), the sum onto the
  own segment and re-quantize, all_gather of the sums (NCCL's ring), decode;
- scope `inter_node` (several nodes): NCCL's exact reduce_scatter inside the
  node (over NVLink), the flat algorithm among the N nodes on each GPU's n/8
  elements (one NIC each), NCCL's exact all_gather inside, the copy into place.
Codec time: each pass's bytes (read + written) over the FP32 copy rate times
that op's measured fraction of it (quantize, dequantize, sum, sum + re-quantize,
per dtype and format: --codec-json), or issue 44's goals (assumed).
Launch: the host enqueues each phase of each chunk (16M elements) in
launch_us, ahead of the GPU: a call takes the longer of its GPU time and its
enqueue time (small messages are host-bound). Overlap: the chunks' phases overlap each other by the
fraction --overlap of what chunking allows (0: in series; the decode into the
output is never overlapped); each row also holds the speedup at full overlap.

Not modeled: NCCL's LL / LL128 protocols (small messages), NVLS for
reduce_scatter / all_gather, IB SHARP, incast and congestion of all_to_all on
large fabrics, the codec's SMs and HBM taken from overlapped compute (issue
44 item 4(b)). For shaped links, `shaped_link_seconds` overlaps the CPU cost
and the wire, and `by_node_seconds` adds the inter_node scope's node phases in
series (bench/netlab.py uses both).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
from dataclasses import asdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_inputs import (DTYPE_BYTES, WIRE_BYTES, Cluster, Codec, codec_from_json, h100_cluster,  # noqa: E402
                          target_codec)


def pipelined_seconds(cpu_s: float, wire_s: float, chunks: int | None) -> float:
    """A collective that overlaps its CPU work with the wire: the slower of
    the two, plus one chunk of the faster (filling and draining the
    pipeline). chunks=None: a transport with many small segments in flight
    (a ring), where the fill term vanishes."""
    if chunks is None:
        return max(cpu_s, wire_s)
    return max(cpu_s, wire_s) + min(cpu_s, wire_s) / max(1, chunks)


def shaped_link_seconds(unshaped_s: float, link_bytes: float, rate_gbit: float, chunks: int | None) -> float:
    """A collective's time over a link of `rate_gbit` Gbit/s per direction,
    from its time over an unshaped link (its CPU cost: codec, copies,
    sockets) and the bytes it puts on the link, CPU and wire overlapped
    (pipelined_seconds). bench/netlab.py prints it beside its measurements."""
    return pipelined_seconds(unshaped_s, link_bytes * 8 / (rate_gbit * 1e9), chunks)


def by_node_seconds(unshaped_s: float, node_s: float, link_bytes: float, rate_gbit: float,
                    chunks: int | None) -> float:
    """shaped_link_seconds for the inter_node scope: its exact phases inside
    each node (node_s, timed alone by bench/node_phases.py) run before and
    after the hop between nodes, not overlapped with it; the rest of the
    unshaped time overlaps the link."""
    return node_s + shaped_link_seconds(max(0.0, unshaped_s - node_s), link_bytes, rate_gbit, chunks)


# ---------------------------------------------------------------- the cluster


def staged_seconds(stages: list[float], chunks: int, overlap: float) -> float:
    """Stages of a chunked call: in series at overlap 0; at overlap 1 a
    pipeline of `chunks` chunks (the slowest stage, plus one chunk of the
    others); in between, that fraction of the gain."""
    serial = sum(stages)
    piped = max(stages) + (serial - max(stages)) / max(1, chunks)
    return serial - overlap * (serial - piped)


def ring_seconds(cl: Cluster, nbytes: float, P: int, N: int, passes: int) -> float:
    """NCCL's ring over P = N x G GPUs: `passes` 1 (reduce_scatter,
    all_gather) or 2 (all_reduce) of (P - 1) / P of `nbytes` through every
    GPU. Between nodes the node's G NICs carry one ring edge each; inside,
    NVLink the other G - 1. Latency as NCCL's tuning model."""
    G = P // N
    through = passes * (P - 1) / P * nbytes
    nvlink_s = through * (G - 1) / G / (cl.nvlink.gbps * 1e9) if N > 1 else through / (cl.nvlink.gbps * 1e9)
    nic_s = through / G / (cl.infiniband.gbps * 1e9) if N > 1 else 0.0
    steps = passes * (P - 1)
    inter_steps = (2 * N if passes == 2 else N - 1) if N > 1 else 0
    latency = cl.call_latency_us + (steps - inter_steps) * cl.nvlink.step_latency_us \
        + inter_steps * cl.infiniband.step_latency_us
    return max(nvlink_s, nic_s) + latency * 1e-6


def nvls_seconds(cl: Cluster, nbytes: float) -> float:
    """NCCL's all_reduce inside one NVSwitch node by NVLink SHARP: its
    measured algorithm bandwidth (a fraction of the NVLink rate)."""
    return nbytes / (cl.nvlink.gbps * cl.nvls_algbw_of_link * 1e9) + cl.nvls_latency_us * 1e-6


def nvls_tree_seconds(cl: Cluster, nbytes: float, N: int) -> float:
    """NCCL's NVLS-tree all_reduce: NVLS inside each node, pipelined with a
    tree between nodes on each GPU's share (one NIC each); beyond 2 nodes the
    tree's bandwidth is half the network's (NCCL's tuner)."""
    G = cl.gpus_per_node
    nic_s = (1 if N <= 2 else 2) * nbytes / G / (cl.infiniband.gbps * 1e9)
    inside = nbytes / (cl.nvlink.gbps * cl.nvls_algbw_of_link * 1e9)
    latency = cl.nvls_latency_us + 2 * math.log2(N) * cl.tree_hop_latency_us
    return max(nic_s, inside) + latency * 1e-6


def nccl_seconds(cl: Cluster, op: str, n: int, b: int, N: int) -> tuple[float, str]:
    """NCCL's time for `op` of n elements (b bytes each) per rank on N nodes, and its algorithm."""
    P = N * cl.gpus_per_node
    nbytes = n * b
    if op != "all_reduce":
        return ring_seconds(cl, nbytes, P, N, 1), "ring"
    options = {"ring": ring_seconds(cl, nbytes, P, N, 2)}
    if N == 1:
        options["nvls"] = nvls_seconds(cl, nbytes)
    else:
        options["nvls_tree"] = nvls_tree_seconds(cl, nbytes, N)
    algo = min(options, key=options.get)
    return options[algo], algo


def a2a_seconds(cl: Cluster, nbytes: float, P: int, N: int) -> float:
    """fp8comm's all_to_all (NCCL send / recv) of (P - 1) / P of `nbytes` per
    GPU: the slices to other nodes through its own NIC, the rest over NVLink."""
    G = P // N
    nic_s = (P - G) / P * nbytes / (cl.infiniband.gbps * 1e9)
    nvlink_s = (G - 1) / P * nbytes / (cl.nvlink.gbps * 1e9)
    hop = cl.infiniband.step_latency_us if N > 1 else cl.nvlink.step_latency_us
    latency = cl.call_latency_us + hop + (P - 1) * cl.a2a_post_us
    return max(nic_s, nvlink_s) + latency * 1e-6


def flat_parts(cl: Cluster, codec: Codec, op: str, n: int, dtype: str, fmt: str, N: int, G: int) -> dict:
    """The flat compressed algorithm over N nodes of G ranks on n elements per
    rank (all_gather: n is its output): each phase's seconds, by kind."""
    P = N * G
    b, w = DTYPE_BYTES[dtype], WIRE_BYTES[fmt]
    q = lambda m: codec.seconds("quantize", dtype, fmt, m * (b + w))  # noqa: E731
    dq = lambda m: codec.seconds("dequantize", dtype, fmt, m * (w + b))  # noqa: E731
    m = n / P  # one rank's segment
    local = cl.call_latency_us * 1e-6  # an exchange among one node's ranks costs a call, no link
    if op == "all_reduce":
        codec_s = [q(n), codec.seconds("sum_requantize", dtype, fmt, (P - 1) * m * w + m * b + m * w)]
        wire_s = [a2a_seconds(cl, n * w, P, N), ring_seconds(cl, n * w, P, N, 1)] if P > 1 else [local]
        decode_s, phases = dq(n), 5
    elif op == "reduce_scatter":
        codec_s = [q(n), codec.seconds("sum", dtype, fmt, (P - 1) * m * w + 2 * m * b)]
        wire_s = [a2a_seconds(cl, n * w, P, N)] if P > 1 else [local]
        decode_s, phases = 0.0, 3
    else:  # all_gather
        codec_s = [q(m)]
        wire_s = [ring_seconds(cl, n * w, P, N, 1)] if P > 1 else [local]
        decode_s, phases = dq(n), 3
    return {"codec": codec_s, "wire": wire_s, "decode": decode_s, "phases": phases}


def fp8comm_seconds(cl: Cluster, codec: Codec, op: str, n: int, dtype: str, fmt: str, N: int, scope: str,
                    overlap: float) -> dict:
    """fp8comm's time for `op` in `scope` and its parts (codec, wire, latency + launch)."""
    G, b = cl.gpus_per_node, DTYPE_BYTES[dtype]
    chunks = max(1, math.ceil(n / cl.chunk_numel))
    if scope == "all" or N == 1:
        parts = flat_parts(cl, codec, op, n, dtype, fmt, N, G)
        node_s, copy_s = [], 0.0
    else:
        # The hop: the flat algorithm among the N nodes on each GPU's n / G.
        parts = flat_parts(cl, codec, op, n / G, dtype, fmt, N, 1)
        inside = ring_seconds(cl, n * b, G, 1, 1)  # NCCL's exact reduce_scatter / all_gather in the node
        node_s = [inside, inside] if op == "all_reduce" else [inside]
        # the node all_gather's pieces copied into place, at the copy's rate
        copy_s = 0.0 if op == "reduce_scatter" else 2 * n * b / (codec.copy_gbps * 1e9)
        chunks = max(1, math.ceil(n / G / cl.chunk_numel))
    launch = (parts["phases"] + len(node_s)) * chunks * cl.launch_us * 1e-6
    stages = parts["codec"] + parts["wire"] + node_s
    if scope == "inter_node" and N > 1 and op == "reduce_scatter":
        # its node phase runs before the hop, in series
        body = node_s[0] + staged_seconds(parts["codec"] + parts["wire"], chunks, overlap)
        full = node_s[0] + staged_seconds(parts["codec"] + parts["wire"], chunks, 1.0)
    else:
        body = staged_seconds(stages, chunks, overlap)
        full = staged_seconds(stages, chunks, 1.0)
    tail = parts["decode"] + copy_s
    # The host enqueues every phase ahead of the GPU: the call takes the
    # longer of the two.
    return {"seconds": max(body + tail, launch), "seconds_full_overlap": max(full + tail, launch),
            "codec": sum(parts["codec"]) + parts["decode"] + copy_s, "wire": sum(parts["wire"]) + sum(node_s),
            "launch": launch, "chunks": chunks}


def model(codec: Codec, cl: Cluster, nodes, sizes_mib, ops, dtypes, formats) -> list[dict]:
    rows = []
    for N in nodes:
        for dtype in dtypes:
            b = DTYPE_BYTES[dtype]
            for mib in sizes_mib:
                n = mib * (1 << 20) // b
                for op in ops:
                    base, algo = nccl_seconds(cl, op, n, b, N)
                    for fmt in formats:
                        for scope in (("all",) if N == 1 else ("all", "inter_node")):
                            t = fp8comm_seconds(cl, codec, op, n, dtype, fmt, N, scope, cl.overlap)
                            rows.append({
                                "modeled": True, "nodes": N, "gpus_per_node": cl.gpus_per_node,
                                "gpus": N * cl.gpus_per_node, "op": op, "dtype": dtype, "message_mib": mib,
                                "wire_format": fmt, "scope": scope, "nccl_algorithm": algo,
                                "modeled_nccl_ms": base * 1e3, "modeled_fp8comm_ms": t["seconds"] * 1e3,
                                "modeled_codec_ms": t["codec"] * 1e3, "modeled_wire_ms": t["wire"] * 1e3,
                                "modeled_launch_ms": t["launch"] * 1e3, "chunks": t["chunks"],
                                "modeled_speedup": base / t["seconds"],
                                "modeled_speedup_full_overlap": base / t["seconds_full_overlap"]})
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--codec-json", help="bench/codec.py output of the GPU to model (else issue 44's goals, assumed)")
    p.add_argument("--codec-kernels", help="the kernel set of a --codec-json that timed several (default: the last)")
    p.add_argument("--nodes", default="1,4,16,64")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--sizes-mib", default="4,64,256,1024", help="message sizes per rank, MiB of the dtype")
    p.add_argument("--ops", default="all_reduce,reduce_scatter,all_gather")
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--wire-formats", default="e4m3,mxfp4")
    p.add_argument("--overlap", type=float, default=0.0,
                   help="fraction of the chunks' possible overlap realized, 0-1 (default 0: assumed none)")
    p.add_argument("--launch-us", type=float, default=None, help="fp8comm's cost per phase per chunk (default 10)")
    p.add_argument("--nvlink-efficiency", type=float, default=None, help="default 370/450 (NCCL's)")
    p.add_argument("--ib-efficiency", type=float, default=None, help="default 47/50 (NCCL's)")
    p.add_argument("--ib-line-rate", type=float, default=None,
                   help="GB/s per NIC per direction (default 50: 400 Gb/s NDR; one NIC per GPU)")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    if not 0.0 <= args.overlap <= 1.0:
        p.error(f"--overlap is a fraction from 0 to 1, got {args.overlap}")
    codec = codec_from_json(args.codec_json, args.codec_kernels) if args.codec_json else target_codec()
    cl = h100_cluster(gpus_per_node=args.gpus_per_node, overlap=args.overlap)
    if args.launch_us is not None:
        cl.launch_us = args.launch_us
    if args.nvlink_efficiency is not None:
        cl.nvlink.efficiency = args.nvlink_efficiency
    if args.ib_efficiency is not None:
        cl.infiniband.efficiency = args.ib_efficiency
    if args.ib_line_rate is not None:
        cl.infiniband.line_rate_gbps = args.ib_line_rate
    rows = model(codec, cl, [int(x) for x in args.nodes.split(",")], [int(s) for s in args.sizes_mib.split(",")],
                 args.ops.split(","), args.dtypes.split(","), args.wire_formats.split(","))

    print("MODELED, not measured. Inputs (bench/model_inputs.py):")
    print(f"  codec: {codec.source}")
    for link in (cl.nvlink, cl.infiniband):
        print(f"  {link.label}: {link.line_rate_gbps:.0f} GB/s x {link.efficiency:.2f}, "
              f"{link.step_latency_us} us a step ({link.source})")
    for name, text in cl.sources.items():
        print(f"  {name}: {text}")
    print(f"\n{'nodes':>5s} {'GPUs':>5s} {'op':15s} {'dtype':9s} {'MiB':>5s} {'format':6s} {'scope':10s} "
          f"{'NCCL':10s} {'NCCL ms':>9s} {'fp8 ms':>9s} {'codec ms':>9s} {'x NCCL':>7s} {'x full ovl':>10s}"
          "   (all modeled)")
    for r in rows:
        print(f"{r['nodes']:5d} {r['gpus']:5d} {r['op']:15s} {r['dtype']:9s} {r['message_mib']:5d} "
              f"{r['wire_format']:6s} {r['scope']:10s} {r['nccl_algorithm']:10s} {r['modeled_nccl_ms']:9.3f} "
              f"{r['modeled_fp8comm_ms']:9.3f} {r['modeled_codec_ms']:9.3f} {r['modeled_speedup']:7.2f} "
              f"{r['modeled_speedup_full_overlap']:10.2f}")
    command = "python bench/model.py" + "".join(f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    result = {"benchmark": "model", "modeled": True, "date": datetime.date.today().isoformat(),
              "command": command, "codec": codec.describe(), "cluster": asdict(cl), "rows": rows}
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
