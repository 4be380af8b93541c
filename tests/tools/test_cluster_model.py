"""bench/model.py's cluster model: NCCL's NVLS inside a node, the
hierarchical (inter_node) rows, link efficiency that does not cancel, the
per-op codec figures, and one case computed by hand."""
import json

import pytest

from tests.support import REPO_ROOT
from tests.tools.test_convergence import load

model = load("fp8comm_bench_model", "bench/model.py")
inputs = load("fp8comm_bench_model_inputs", "bench/model_inputs.py")
H100_CODEC = str(REPO_ROOT / "bench" / "results" / "gpu-h100-80gb-hbm3" / "codec.json")
OPS = ("quantize", "dequantize", "sum", "sum_requantize")


def round_cluster(**overrides):
    """Round numbers, no latency, nothing overlapped, one chunk."""
    fields = dict(nvlink=inputs.Link("nv", 100.0, 1.0, 0.0, ""), infiniband=inputs.Link("ib", 10.0, 1.0, 0.0, ""),
                  gpus_per_node=8, call_latency_us=0.0, nvls_algbw_of_link=0.75, nvls_latency_us=0.0,
                  tree_hop_latency_us=0.0, launch_us=0.0, overlap=0.0, chunk_numel=1 << 40, a2a_post_us=0.0)
    fields.update(overrides)
    return inputs.Cluster(**fields)


def flat_codec(fraction=0.5, copy_gbps=1000.0):
    eff = {(op, dtype, fmt): fraction for op in OPS for dtype in ("bfloat16", "float32") for fmt in ("e4m3", "mxfp4")}
    return inputs.Codec("test", copy_gbps, eff, "test")


def test_a_node_all_reduce_by_hand():
    """8 GPUs, 1 GB of BF16 each (n = 5e8), E4M3 (w = 1.03125 bytes), the
    codec at 500 GB/s, NVLink at 100 GB/s, NVLS at 0.75 of it."""
    cl, codec, n, w = round_cluster(), flat_codec(), 500_000_000, 1.03125
    nccl, algo = model.nccl_seconds(cl, "all_reduce", n, 2, 1)
    assert algo == "nvls" and nccl == pytest.approx(1e9 / 75e9)  # the ring: 2 * 7/8 * 1e9 / 100e9 = 17.5 ms
    quantize = n * (2 + w) / 500e9  # 3.03125 ms, and the decode the same
    sum_requantize = n / 8 * (7 * w + 2 + w) / 500e9  # 1.28125 ms
    exchange = 7 / 8 * n * w / 100e9  # all_to_all, then all_gather: 4.51171875 ms each
    t = model.fp8comm_seconds(cl, codec, "all_reduce", n, "bfloat16", "e4m3", 1, "all", 0.0)
    assert t["seconds"] == pytest.approx(2 * quantize + sum_requantize + 2 * exchange)
    assert t["seconds"] == pytest.approx(16.3671875e-3)
    assert t["codec"] == pytest.approx(2 * quantize + sum_requantize)


def test_nvls_is_nccls_all_reduce_inside_a_node_and_fp8_does_not_pay_against_it():
    cl = inputs.h100_cluster()
    codec = inputs.codec_from_json(H100_CODEC)
    rows = model.model(codec, cl, [1], [64, 1024], ["all_reduce", "reduce_scatter"], ["bfloat16"], ["e4m3"])
    ar = [r for r in rows if r["op"] == "all_reduce"]
    assert {r["nccl_algorithm"] for r in ar} == {"nvls"}
    for r in ar:
        n = r["message_mib"] << 19
        assert r["modeled_nccl_ms"] == pytest.approx(1e3 * model.nvls_seconds(cl, 2 * n))
        assert r["modeled_nccl_ms"] < 1e3 * model.ring_seconds(cl, 2 * n, 8, 1, 2)
        assert r["modeled_speedup"] < 1.0  # the H100's codec as measured, nothing overlapped
    assert {r["nccl_algorithm"] for r in rows if r["op"] == "reduce_scatter"} == {"ring"}
    assert all(r["scope"] == "all" for r in rows)  # inter_node inside one node is NCCL itself


def test_hierarchical_rows_cross_the_network_with_a_node_sum():
    """4 nodes of 8: the inter_node scope sends each GPU's 1/8 of the node's
    sum between nodes; the flat scope sends its own slices, 8 times the
    bytes; NCCL's ring 2 (P-1)/P of the message over the node's 8 NICs."""
    fast = inputs.Link("nv", 1e9, 1.0, 0.0, "")
    cl, codec = round_cluster(nvlink=fast), flat_codec(copy_gbps=1e12)
    n, w, ib, N, P = 1 << 27, 1.03125, 10e9, 4, 32
    ring = 2 * (P - 1) / P * n * 2 / 8 / ib
    tree = 2 * n * 2 / 8 / ib  # beyond 2 nodes at half the network's bandwidth
    assert model.nccl_seconds(cl, "all_reduce", n, 2, N) == (pytest.approx(ring), "ring")
    assert model.nvls_tree_seconds(cl, n * 2, N) == pytest.approx(tree)
    hier = model.fp8comm_seconds(cl, codec, "all_reduce", n, "bfloat16", "e4m3", N, "inter_node", 0.0)
    flat = model.fp8comm_seconds(cl, codec, "all_reduce", n, "bfloat16", "e4m3", N, "all", 0.0)
    assert hier["wire"] == pytest.approx(2 * (N - 1) / N * n / 8 * w / ib, rel=1e-6)
    assert flat["wire"] == pytest.approx(((P - 8) / P * n * w + (P - 1) / P * n * w / 8) / ib, rel=1e-6)
    assert hier["seconds"] < ring < flat["seconds"]

    rows = model.model(inputs.target_codec(), inputs.h100_cluster(), [4, 16, 64], [64], ["all_reduce"],
                       ["bfloat16"], ["e4m3"])
    assert {(r["nodes"], r["scope"]) for r in rows} == {(N, s) for N in (4, 16, 64) for s in ("all", "inter_node")}
    for N in (4, 16, 64):
        by = {r["scope"]: r for r in rows if r["nodes"] == N}
        assert by["inter_node"]["modeled_fp8comm_ms"] < by["all"]["modeled_fp8comm_ms"]
        assert by["all"]["gpus"] == 8 * N and by["all"]["nccl_algorithm"] in ("ring", "nvls_tree")


@pytest.mark.parametrize("scope,nodes", [("all", 1), ("inter_node", 4)])
def test_link_efficiency_does_not_cancel(scope, nodes):
    """Both sides' links slow down alike; the codec does not, so the ratio
    moves. With a free codec and no latency it would cancel."""
    def ratio(efficiency, codec, **overrides):
        cl = inputs.h100_cluster(**overrides)
        cl.nvlink.efficiency = cl.infiniband.efficiency = efficiency
        n = 1 << 29
        nccl, _ = model.nccl_seconds(cl, "all_reduce", n, 2, nodes)
        return nccl / model.fp8comm_seconds(cl, codec, "all_reduce", n, "bfloat16", "e4m3", nodes, scope,
                                            0.0)["seconds"]

    measured = inputs.codec_from_json(H100_CODEC)
    assert ratio(0.5, measured) > 1.05 * ratio(1.0, measured)
    free = flat_codec(copy_gbps=1e15)
    quiet = dict(call_latency_us=0.0, nvls_latency_us=0.0, tree_hop_latency_us=0.0, launch_us=0.0, a2a_post_us=0.0)
    quiet_links = dict(nvlink=inputs.Link("nv", 450.0, 1.0, 0.0, ""), infiniband=inputs.Link("ib", 50.0, 1.0, 0.0, ""))
    assert ratio(0.5, free, **quiet, **quiet_links) == pytest.approx(ratio(1.0, free, **quiet, **quiet_links))


def test_codec_figures_are_per_op_dtype_and_format():
    codec = inputs.codec_from_json(H100_CODEC)
    # the first H100 run, 256M elements: E4M3 quantize of FP32 0.88, of BF16 0.55, its 4-piece sum + re-quantize 0.37
    assert codec.fraction("quantize", "float32", "e4m3") == pytest.approx(0.879, abs=0.001)
    assert codec.fraction("quantize", "bfloat16", "e4m3") == pytest.approx(0.550, abs=0.001)
    assert codec.fraction("sum_requantize", "bfloat16", "e4m3") == pytest.approx(0.374, abs=0.001)
    assert codec.fraction("sum_requantize", "bfloat16", "mxfp4") == pytest.approx(0.179, abs=0.001)
    assert codec.fraction("quantize", "bfloat16", "nvfp4") == codec.fraction("quantize", "bfloat16", "mxfp4")
    assert "dequant_sum_requantize_4" in codec.source and codec.copy_gbps == pytest.approx(3000, rel=0.01)
    cl = inputs.h100_cluster()
    # a slower sum makes all_reduce slower, not reduce_scatter (which sums without re-quantizing)
    slow = inputs.Codec("x", codec.copy_gbps, {**codec.efficiency, ("sum_requantize", "bfloat16", "e4m3"): 0.05}, "x")
    t = lambda c, op: model.fp8comm_seconds(cl, c, op, 1 << 28, "bfloat16", "e4m3", 1, "all", 0.0)["seconds"]  # noqa
    assert t(slow, "all_reduce") > t(codec, "all_reduce") and t(slow, "reduce_scatter") == t(codec, "reduce_scatter")


def test_codec_json_of_two_kernel_sets_reads_the_one_named(tmp_path):
    rows = []
    for ks, q in (("legacy", 0.5), ("tiled", 0.9)):
        for op, f in (("copy", 1.0), ("quantize", q)):
            rows.append({"op": op, "numel": 1 << 26, "dtype": "float32", "wire_format": "e4m3", "kernels": ks,
                         "rounding": "nearest", "gb_per_s": 3000.0 * f, "fraction_of_copy": f,
                         "fraction_of_fp32_copy": f})
    path = tmp_path / "codec.json"
    path.write_text(json.dumps({"device": "GPU", "kernels": ["legacy", "tiled"], "rows": rows}))
    assert inputs.codec_from_json(str(path)).fraction("quantize", "float32", "e4m3") == 0.9  # the last listed
    assert inputs.codec_from_json(str(path), "legacy").fraction("quantize", "float32", "e4m3") == 0.5
    with pytest.raises(SystemExit, match="not 'fast'"):
        inputs.codec_from_json(str(path), "fast")


def test_overlap_and_launch():
    cl, codec = inputs.h100_cluster(), inputs.target_codec()
    n = 1 << 30  # 64 chunks
    at = lambda o: model.fp8comm_seconds(cl, codec, "all_reduce", n, "bfloat16", "e4m3", 1, "all", o)  # noqa
    assert at(1.0)["seconds"] < at(0.5)["seconds"] < at(0.0)["seconds"]
    assert at(0.0)["seconds_full_overlap"] == at(1.0)["seconds"]
    # a small message on a slow host is host-bound: five phases enqueued at launch_us each
    slow_host = inputs.h100_cluster(launch_us=30.0)
    small = model.fp8comm_seconds(slow_host, codec, "all_reduce", 1 << 10, "bfloat16", "e4m3", 1, "all", 0.0)
    assert small["seconds"] == pytest.approx(5 * 30e-6) and small["launch"] == small["seconds"]
