"""A performance model of fp8comm's collectives on GPU clusters. Every number it
prints is MODELED, not measured; its inputs are printed with it.

    python bench/model.py [--codec-json bench/results/gpu-<name>/codec.json] [--json PATH]

time = codec time + wire bytes / link bandwidth + steps x per-step latency

- Wire bytes per rank (ring / pairwise volumes): all_reduce 2(P-1)/P * n * b,
  reduce_scatter and all_gather (P-1)/P * n * b, with b = the element size for
  the plain collective and 1 + 1/32 bytes (+ segment padding) for fp8comm.
  fp8comm's all_reduce is an all_to_all followed by an all_gather, so it pays
  the same (P-1)-step latency twice, like the ring all_reduce it replaces.
- Codec time: the bytes each codec pass reads and writes divided by the
  device's memory bandwidth times the codec's efficiency (fraction of a copy's
  bandwidth). With --codec-json these come from bench/codec.py on that device
  (measured); without it the H100 defaults below are ASSUMED: HBM3 3.35 TB/s
  at 85% — the issue's target for the kernels, not a measurement.
- Links: bandwidth per GPU in one direction; NVLink-class 400 GB/s, 1 us per
  step; InfiniBand-class 50 GB/s (400 Gb/s NIC per GPU), 3 us per step. Both
  sides get the same link efficiency (1.0), so it cancels in the ratio.

Not modeled: hierarchical (NVLink within a node, IB across) algorithms, NCCL's
tree and NVLS algorithms (lower latency at scale), all_to_all incast on large
IB fabrics (fp8comm's all_reduce and reduce_scatter use all_to_all), overlap of
the codec with the transport in the cluster rows (none is assumed), and kernel
launch overheads. For shaped links, `shaped_link_seconds` overlaps them, and
`by_node_seconds` adds the inter_node scope's node phases in series
(bench/netlab.py uses both).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os

BLOCK = 32
LINKS = {
    "nvlink": {"bandwidth_gbps": 400.0, "step_latency_us": 1.0, "label": "NVLink-class"},
    "infiniband": {"bandwidth_gbps": 50.0, "step_latency_us": 3.0, "label": "InfiniBand-class"},
}
ASSUMED_H100 = {"device": "H100 (assumed, not measured)", "memory_gbps": 3350.0, "efficiency": 0.85,
                "source": "assumed: 85% of H100 SXM HBM3 3.35 TB/s"}


def wire_bytes_per_element() -> float:
    # [scales padded to 16][codes]: 1 + 1/32 bytes per element for large segments.
    return 1.0 + 1.0 / BLOCK


def codec_from_json(path: str) -> dict:
    with open(path) as f:
        data = json.load(f)
    rows = data["rows"]
    biggest = max(r["numel"] for r in rows)
    # The model's bytes are E4M3's (wire_bytes_per_element); other formats' rows are left out.
    at = [r for r in rows if r["numel"] == biggest and r["dtype"] in ("bfloat16", "float32")
          and r.get("wire_format", "e4m3") == "e4m3"]
    copy = max(r["gb_per_s"] for r in at if r["op"] == "copy_fp32")
    effs = [r["fraction_of_copy"] for r in at if r["op"] in ("quantize", "dequantize")]
    return {"device": data["device"], "memory_gbps": copy, "efficiency": min(effs),
            "source": f"measured: {path} (copy {copy:.0f} GB/s, worst of quantize/dequantize "
                      f"{min(effs):.2f} of copy at {biggest} elements)"}


def codec_seconds(op: str, n: int, elem: int, P: int, codec: dict) -> float:
    """Bytes read + written by the codec passes of one fp8comm collective on n
    elements (the full tensor), over the effective memory bandwidth."""
    w = wire_bytes_per_element()
    if op == "all_reduce":
        moved = (n * elem + n * w)  # quantize all P segments
        moved += n * w + n * w / P  # sum the P pieces of my segment, re-quantize it
        moved += n * w + n * elem  # decode all P segments
    elif op == "reduce_scatter":
        moved = (n * elem + n * w) + (n * w + n * elem / P)
    else:  # all_gather: n is the output
        moved = (n / P * elem + n / P * w) + (n * w + n * elem)
    return moved / (codec["memory_gbps"] * 1e9 * codec["efficiency"])


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


def transport_seconds(op: str, n: int, bytes_per_elem: float, P: int, link: dict) -> float:
    share = 2 * (P - 1) / P if op == "all_reduce" else (P - 1) / P
    steps = 2 * (P - 1) if op == "all_reduce" else (P - 1)
    return share * n * bytes_per_elem / (link["bandwidth_gbps"] * 1e9) + steps * link["step_latency_us"] * 1e-6


def model(codec: dict, gpus, sizes_mib, ops) -> list[dict]:
    rows = []
    for link_name, link in LINKS.items():
        for P in gpus:
            for mib in sizes_mib:
                for op in ops:
                    n = mib * (1 << 20) // 2  # elements of a BF16 message of this size
                    bf16 = transport_seconds(op, n, 2, P, link)
                    fp32 = transport_seconds(op, n, 4, P, link)
                    c = codec_seconds(op, n, 2, P, codec)
                    fp8 = c + transport_seconds(op, n, wire_bytes_per_element(), P, link)
                    rows.append({"link": link_name, "gpus": P, "bf16_message_mib": mib, "op": op,
                                 "modeled_bf16_ms": bf16 * 1e3, "modeled_fp32_ms": fp32 * 1e3,
                                 "modeled_fp8_ms": fp8 * 1e3, "modeled_codec_ms": c * 1e3,
                                 "modeled_speedup_vs_bf16": bf16 / fp8})
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--codec-json", help="bench/codec.py output of the GPU to model (else assumed H100 figures)")
    p.add_argument("--gpus", default="8,64,512")
    p.add_argument("--sizes-mib", default="4,64,256,1024", help="message sizes, as BF16 MiB")
    p.add_argument("--ops", default="all_reduce,reduce_scatter,all_gather")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    codec = codec_from_json(args.codec_json) if args.codec_json else ASSUMED_H100
    gpus = [int(g) for g in args.gpus.split(",")]
    sizes = [int(s) for s in args.sizes_mib.split(",")]
    ops = args.ops.split(",")
    rows = model(codec, gpus, sizes, ops)

    print("MODELED, not measured. Inputs:")
    print(f"  codec: {codec['source']}")
    for name, link in LINKS.items():
        print(f"  {link['label']}: {link['bandwidth_gbps']:.0f} GB/s per GPU, {link['step_latency_us']} us per step")
    print(f"  FP8 wire format: {wire_bytes_per_element():.4f} bytes/element; baseline BF16 (2) and FP32 (4)\n")
    print(f"{'link':11s} {'GPUs':>5s} {'BF16 MiB':>9s} {'op':15s} {'bf16 ms':>9s} {'fp32 ms':>9s} "
          f"{'fp8 ms':>9s} {'codec ms':>9s} {'x vs bf16':>9s}   (all modeled)")
    for r in rows:
        print(f"{r['link']:11s} {r['gpus']:5d} {r['bf16_message_mib']:9d} {r['op']:15s} {r['modeled_bf16_ms']:9.3f} "
              f"{r['modeled_fp32_ms']:9.3f} {r['modeled_fp8_ms']:9.3f} {r['modeled_codec_ms']:9.3f} "
              f"{r['modeled_speedup_vs_bf16']:9.2f}")
    result = {"benchmark": "model", "modeled": True, "date": datetime.date.today().isoformat(),
              "command": "python bench/model.py" + (f" --codec-json {args.codec_json}" if args.codec_json else ""),
              "codec": codec, "links": LINKS, "rows": rows}
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
