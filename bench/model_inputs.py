"""The inputs of bench/model.py's cluster model: links, NCCL's algorithms and
the codec's speed per op, each with where it comes from. Every figure here is
either measured elsewhere (cited) or ASSUMED (said so).

Sources:
- [nccl-tests#212] github.com/NVIDIA/nccl-tests/issues/212 (NCCL's maintainer):
  H100 NVLink 450 GB/s line rate per direction, about 370 GB/s after NCCL's
  protocol overhead ("BusBw" of the non-all_reduce ops, or of a ring); NCCL's
  all_reduce on 8 H100s uses NVLink SHARP (NVLS): peak busBw ~480 GB/s,
  algbw ~275 GB/s, reached above 256 MB.
- [nccl#1455] github.com/NVIDIA/nccl/issues/1455: 8 x H100 SXM, 2-4 GB:
  ring busbw 365-370 GB/s; NVLS algbw 258-273 GB/s at 5-8 GPUs.
  [nccl#1442] and [nccl#2140] report the same 370 / 480 (algbw 211 / 275).
- [nccl-tests#290] github.com/NVIDIA/nccl-tests/issues/290 (NCCL team):
  NDR 400 Gb/s InfiniBand, "46-48 GB/s per NIC" through NCCL.
- [tuning.cc] github.com/NVIDIA/nccl src/graph/tuning.cc (commit b6475625):
  NCCL's own latency model, Simple protocol: ring base 8.4 us per call, per
  step 3.4 us over NVLink and 14 us over the network; NVLS 23 us inside a
  node; NVLS-tree 23 us + 2 log2(nodes) x 14 us; tree bandwidth between more
  than 2 nodes at half the network's (NVLS_TREE: bwInter / 2).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

# Bytes per element on the wire for large segments: codes + block scales
# (fp8comm.segment_bytes without the padding; NVFP4: E4M3 scale per 16).
WIRE_BYTES = {"e4m3": 1 + 1 / 32, "e5m2": 1 + 1 / 32, "mxfp4": 0.5 + 1 / 32, "nvfp4": 0.5 + 1 / 16}
DTYPE_BYTES = {"bfloat16": 2, "float32": 4}
# Formats the measured codec may lack, and the format whose kernels stand in
# for them (the same kernels up to the element code).
STAND_IN = {"e5m2": "e4m3", "nvfp4": "mxfp4"}
CODEC_OPS = ("quantize", "dequantize", "sum", "sum_requantize")


@dataclass
class Link:
    label: str
    line_rate_gbps: float  # per direction, per GPU (NVLink) or per NIC (InfiniBand)
    efficiency: float  # what NCCL's protocol leaves of the line rate; both sides of a ratio get it
    step_latency_us: float  # per ring step / hop
    source: str

    @property
    def gbps(self) -> float:
        return self.line_rate_gbps * self.efficiency


@dataclass
class Cluster:
    """Nodes of `gpus_per_node` GPUs: NVLink inside, one InfiniBand NIC per GPU between."""

    nvlink: Link
    infiniband: Link
    gpus_per_node: int = 8
    call_latency_us: float = 8.4  # NCCL's base latency of one call (tuning.cc, ring / Simple)
    nvls_algbw_of_link: float = 275.0 / 370.0  # NVLS all_reduce algbw over the link's NCCL rate
    nvls_latency_us: float = 23.0
    tree_hop_latency_us: float = 14.0  # NVLS-tree, per hop between nodes
    # fp8comm: the host's time to enqueue one phase of a compressed call
    # (a kernel or an NCCL call) per chunk of chunk_numel elements; overlap
    # of the chunks' phases, 0 (none) to 1 (all that chunking allows).
    launch_us: float = 10.0
    overlap: float = 0.0
    chunk_numel: int = 1 << 24  # TransportTraits::chunk_numel over NCCL
    a2a_post_us: float = 1.0  # per peer of an all_to_all (tuning.cc's network post overhead)
    sources: dict = field(default_factory=dict)


def h100_cluster(**overrides) -> Cluster:
    nvlink = Link("NVLink 4 (H100 SXM, NVSwitch)", 450.0, 370.0 / 450.0, 3.4,
                  "450 GB/s per direction; NCCL reaches 370 [nccl-tests#212, nccl#1455]; 3.4 us a step [tuning.cc]")
    infiniband = Link("InfiniBand NDR, one 400 Gb/s NIC per GPU", 50.0, 47.0 / 50.0, 14.0,
                      "50 GB/s per direction; NCCL reaches 46-48 [nccl-tests#290]; 14 us a step [tuning.cc]")
    fields = dict(nvlink=nvlink, infiniband=infiniband, sources={
        "nvls": "NCCL all_reduce on 8 x H100: algbw 275 GB/s = 275/370 of the NVLink rate NCCL reaches "
                "[nccl-tests#212, nccl#1455, nccl#2140]; 23 us [tuning.cc]",
        "tree": "NVLS-tree between nodes: 23 us + 2 log2(N) x 14 us; beyond 2 nodes half the network's "
                "bandwidth [tuning.cc]",
        "launch_us": "ASSUMED 10 us of host enqueue per phase per chunk, the GPU working meanwhile: at world "
                     "size 1 a compressed all_reduce took 0.06 ms against nccl's 0.03 for its ~3 phases "
                     "(bench/results/gpu-h100-80gb-hbm3/comm-1rank.json); issue 44 item 4(c) measures "
                     "enqueue against GPU time",
        "overlap": "ASSUMED 0 (none): the chunks' codec against the wire is unmeasured (issue 44 item 4(d)); "
                   "rows also give the speedup at full overlap",
    })
    fields.update(overrides)
    return Cluster(**fields)


@dataclass
class Codec:
    """The codec's speed: each op's fraction of the device's FP32 copy rate,
    per (op, dtype, wire format); ops as CODEC_OPS (sum = dequant_sum onto
    the own addend, sum_requantize = dequant_sum_requantize onto it)."""

    device: str
    copy_gbps: float
    efficiency: dict  # (op, dtype, format) -> fraction
    source: str

    def fraction(self, op: str, dtype: str, fmt: str) -> float:
        for f in (fmt, STAND_IN.get(fmt)):
            if (op, dtype, f) in self.efficiency:
                return self.efficiency[op, dtype, f]
        raise KeyError(f"bench/model.py: the codec ({self.source}) has no {op} of {dtype} in {fmt} "
                       f"(nor in {STAND_IN.get(fmt, 'a stand-in format')}); measure it with bench/codec.py "
                       f"--wire-format {fmt}")

    def seconds(self, op: str, dtype: str, fmt: str, bytes_moved: float) -> float:
        return bytes_moved / (self.copy_gbps * 1e9 * self.fraction(op, dtype, fmt))

    def describe(self) -> dict:
        return {"device": self.device, "copy_gbps": self.copy_gbps, "source": self.source,
                "fraction_of_fp32_copy": {f"{op} {dtype} {fmt}": v for (op, dtype, fmt), v
                                          in sorted(self.efficiency.items())}}


def target_codec() -> Codec:
    """ASSUMED: issue 44's goals for the kernels, at the H100's measured FP32 copy rate."""
    eff = {}
    for fmt, sum_goal in (("e4m3", 0.80), ("mxfp4", 0.65)):
        for dtype, q in (("float32", 0.92), ("bfloat16", 0.88)):
            eff.update({("quantize", dtype, fmt): q, ("dequantize", dtype, fmt): 0.88,
                        ("sum", dtype, fmt): sum_goal, ("sum_requantize", dtype, fmt): sum_goal})
    return Codec("H100 (assumed: issue 44's kernel goals)", 3000.0, eff,
                 "ASSUMED: issue 44's goals (quantize 0.92 FP32 / 0.88 BF16, dequantize 0.88, sums 0.80 E4M3 / "
                 "0.65 MXFP4) of a 3.0 TB/s FP32 copy (the H100's, measured: gpu-h100-80gb-hbm3/codec.json)")


# bench/codec.py's op names, today's and the first GPU run's, as the model's ops.
_OPS = {"quantize": "quantize", "dequantize": "dequantize",
        "dequant_sum_own": "sum", "dequant_sum_requantize_own": "sum_requantize",
        "dequant_sum_4": "sum", "dequant_sum_requantize_4": "sum_requantize"}


def codec_from_json(path: str, kernels: str | None = None) -> Codec:
    """Each op's fraction of the FP32 copy at the file's largest size, round
    to nearest. A file from before the own-addend rows gives its 4-piece sums
    for the collectives' sums (said in the source). A file of several CUDA
    kernel sets: `kernels` picks one, else the last the file lists."""
    with open(path) as f:
        data = json.load(f)
    rows = [r for r in data["rows"] if r.get("rounding", "nearest") == "nearest"]
    sets = data.get("kernels") or []
    chosen = kernels or (sets[-1] if len(sets) > 1 else None)
    if chosen is not None:
        if chosen not in sets:
            raise SystemExit(f"bench/model.py: {path} holds kernel sets {sets}, not {chosen!r}")
        rows = [r for r in rows if r.get("kernels") == chosen]
    biggest = max(r["numel"] for r in rows)
    at = [r for r in rows if r["numel"] == biggest]
    copies = [r["gb_per_s"] for r in at if r["op"] == "copy_fp32" or (r["op"] == "copy" and r["dtype"] == "float32")]
    eff, proxies = {}, set()
    for r in at:
        op = _OPS.get(r["op"])
        if op is None:
            continue
        if r["op"].endswith("_4"):
            proxies.add(r["op"])
        eff[op, r["dtype"], r.get("wire_format", "e4m3")] = r.get("fraction_of_fp32_copy", r["fraction_of_copy"])
    note = (f"; no own-addend rows: the sums are its {' / '.join(sorted(proxies))} (4 pieces, no own addend)"
            if proxies else "")
    which = f", kernel set {chosen}" if chosen else ""
    return Codec(data["device"], max(copies), eff,
                 f"measured: {path} ({biggest} elements{which}, FP32 copy {max(copies):.0f} GB/s{note})")
