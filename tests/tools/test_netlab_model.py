"""bench/model.py's shaped-link model and bench/netlab.py's --remodel, on a
committed netlab result (netlab itself needs root and network namespaces:
docs/performance.md, "Shaped links")."""
import argparse
import json
import shutil
import subprocess
import sys

import pytest

from tests.support import REPO_ROOT
from tests.tools.test_convergence import load

ROOT = str(REPO_ROOT)
model = load("fp8comm_bench_model", "bench/model.py")
RESULT = REPO_ROOT / "bench" / "results" / "cpu-epyc-avx2" / "netlab-2nodes-1rank.json"


def test_pipelined_time_is_the_slower_side_plus_one_chunk_of_the_faster():
    assert model.pipelined_seconds(0.050, 0.010, chunks=16) == pytest.approx(0.050 + 0.010 / 16)
    assert model.pipelined_seconds(0.010, 0.050, chunks=16) == pytest.approx(0.050 + 0.010 / 16)
    assert model.pipelined_seconds(0.010, 0.050, chunks=1) == pytest.approx(0.060)  # nothing overlaps
    assert model.pipelined_seconds(0.010, 0.050, chunks=None) == pytest.approx(0.050)


def test_shaped_link_time_turns_bytes_into_wire_seconds():
    # 125 MB at 1 Gbit/s is one second of wire; a CPU cost of 0.2 s hides under it.
    assert model.shaped_link_seconds(0.2, 125e6, 1.0, chunks=None) == pytest.approx(1.0)
    assert model.shaped_link_seconds(0.2, 125e6, 10.0, chunks=None) == pytest.approx(0.2)


def test_remodel_keeps_the_measurements_and_recomputes_the_model(tmp_path):
    path = tmp_path / "netlab.json"
    shutil.copy(RESULT, path)
    before = json.loads(path.read_text())
    out = subprocess.run([sys.executable, "bench/netlab.py", "--remodel", str(path)], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    after = json.loads(path.read_text())
    assert after["raw"] == before["raw"]
    assert "shaped_link_seconds" in after["modeled_columns"]
    shaped = [r for r in after["rows"] if r["rate_gbit"] != "unshaped"]
    assert shaped and len(after["rows"]) == len(before["rows"])
    for old, new in zip(before["rows"], after["rows"]):
        assert (old["plain_ms"], old["fp8_ms"], old["ratio"]) == (new["plain_ms"], new["fp8_ms"], new["ratio"])
    for r in shaped:
        assert r["modeled_ratio"] == pytest.approx(r["modeled_fp8_ms"] / r["modeled_plain_ms"])
        assert r["model_error"] == pytest.approx(r["modeled_ratio"] / r["ratio"] - 1)
        # Never faster than the unshaped link, never faster than the wire.
        base = next(b for b in after["rows"] if b["rate_gbit"] == "unshaped" and b["op"] == r["op"])
        assert r["modeled_fp8_ms"] >= base["fp8_ms"] and r["modeled_plain_ms"] >= base["plain_ms"]
    assert f"{shaped[0]['op']}" in out.stdout


def test_gloo_link_bytes_follow_its_algorithms():
    """gloo's reduce_scatter is an all_reduce of the whole input; its rings
    leave each node over one edge; two ranks' all_gather moves its two
    directions in turn."""
    netlab = load("fp8comm_bench_netlab", "bench/netlab.py")
    n = 1 << 20  # bytes of the whole tensor
    rs = {"op": "reduce_scatter", "bytes_sent_uncompressed": n // 2}  # (P - 1) / P of the input, P = 2
    ar = {"op": "all_reduce", "bytes_sent_uncompressed": n}
    assert netlab.link_bytes(rs, False, world=2, ranks_per_node=1) == netlab.link_bytes(ar, False, 2, 1) == n
    ag = {"op": "all_gather", "bytes_sent_uncompressed": n // 2}
    assert netlab.link_bytes(ag, False, world=2, ranks_per_node=1) == n
    ag4 = {"op": "all_gather", "bytes_sent_uncompressed": 3 * n // 4}  # 2 nodes x 2 ranks: one rank's sends leave
    assert netlab.link_bytes(ag4, False, world=4, ranks_per_node=2) == 3 * n // 4
    fp8 = {"op": "all_gather", "bytes_sent": 100, "bytes_sent_inter_node": 40}
    assert netlab.link_bytes(fp8, True, world=4, ranks_per_node=2) == 80  # both ranks' inter-node bytes


def test_by_node_time_adds_the_node_phases_in_series():
    # 0.3 s unshaped, 0.1 s of it the node phases; the link alone would take 0.25 s.
    t = model.by_node_seconds(0.3, 0.1, 125e6 / 4, 1.0, chunks=None)
    assert t == pytest.approx(0.1 + 0.25)
    assert model.by_node_seconds(0.3, 0.1, 125e6 / 4, 100.0, chunks=None) == pytest.approx(0.3)  # CPU-bound
    assert model.by_node_seconds(0.3, 0.0, 0.0, 1.0, chunks=None) == model.shaped_link_seconds(0.3, 0.0, 1.0, None)


def test_summarize_uses_the_node_phases_where_they_were_timed():
    netlab = load("fp8comm_bench_netlab", "bench/netlab.py")

    def comm(plain_s, fp8_s, phases=None):
        rows = [{"op": op, "dtype": "float32", "bytes": 1 << 26, "numel": 1 << 24, "sqnr_db": 30.0,
                 "plain": {"median_s": plain_s}, "fp8": {"median_s": fp8_s}, "bytes_sent": 75_000_000,
                 "bytes_sent_uncompressed": 100_000_000, "bytes_sent_inter_node": 8_650_000}
                for op in ("all_reduce", "reduce_scatter")]
        out = {"rows": rows}
        if phases is not None:
            out["node_phases"] = [{"op": op, "dtype": "float32", "bytes": 1 << 26, "median_s": phases}
                                  for op in ("all_reduce", "reduce_scatter")]
        return out

    def at_1gbit(by_rate):
        return {r["op"]: r for r in netlab.summarize(by_rate, world=4, ranks_per_node=2) if r["rate_gbit"] == "1"}

    by_rate = {"unshaped": [comm(0.18, 0.24, 0.10), comm(0.18, 0.24, 0.12)], "1": [comm(0.83, 0.35)]}
    shaped = at_1gbit(by_rate)
    link_s = 8_650_000 * 2 * 8 / 1e9
    for op in shaped:
        assert shaped[op]["node_phases_ms"] == pytest.approx(110.0)  # the median of the two runs
    # all_reduce runs its node phases beside the hop: the whole unshaped
    # time overlaps the link, which carries half the data in half the chunks.
    assert shaped["all_reduce"]["modeled_fp8_ms"] == pytest.approx(
        1e3 * model.pipelined_seconds(0.24, link_s, chunks=8))
    # reduce_scatter runs them before the hop, in series.
    assert shaped["reduce_scatter"]["modeled_fp8_ms"] == pytest.approx(
        1e3 * (0.11 + model.pipelined_seconds(0.24 - 0.11, link_s, chunks=8)))
    for run_ in by_rate["unshaped"]:
        del run_["node_phases"]
    flat = at_1gbit(by_rate)["all_reduce"]
    assert "node_phases_ms" not in flat
    assert flat["modeled_fp8_ms"] == pytest.approx(1e3 * model.shaped_link_seconds(0.24, 2 * 8_650_000, 1.0, 16))


@pytest.mark.parametrize("local", [2, 3])
def test_node_phases_script_times_every_case(tmp_path, local):
    """Every op and dtype timed on 2 nodes of 2 or 3 ranks, each result
    checked against gloo's on the node (--check: a wrong split, slice or
    padding fails the run); 500,003 bfloat16 elements leave padding on
    either node size, and 3 ranks send copies of the chunk to 2 peers."""
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={2 * local}",
                          "bench/node_phases.py", "--local-size", str(local), "--check", "--cases",
                          "all_reduce:64K,reduce_scatter:96K,all_gather:96K,all_reduce:1000006:bfloat16",
                          "--reps", "2", "--json", str(tmp_path / "phases.json")],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = json.loads((tmp_path / "phases.json").read_text())
    assert (result["nodes"], result["local_size"]) == (2, local)
    assert [(c["op"], c["dtype"]) for c in result["cases"]] == [
        ("all_reduce", "float32"), ("reduce_scatter", "float32"), ("all_gather", "float32"), ("all_reduce", "bfloat16")]
    assert all(len(c["times_s"]) == 2 and c["median_s"] > 0 for c in result["cases"])


def test_netlab_quick_run_in_inter_node_scope(tmp_path):
    """The whole lab, smallest form: two namespaces of two ranks, one rate,
    the node phases timed and modeled (skips where namespaces cannot be made)."""
    path = tmp_path / "netlab.json"
    out = subprocess.run([sys.executable, "bench/netlab.py", "--quick", "--ranks-per-node", "2",
                          "--ops", "all_reduce", "--env", "FP8COMM_SCOPE=inter_node", "--json", str(path)],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    if "netlab: skipped" in out.stdout:
        pytest.skip(out.stdout.strip())
    result = json.loads(path.read_text())
    shaped = [r for r in result["rows"] if r["rate_gbit"] != "unshaped"]
    assert shaped and all(r["node_phases_ms"] > 0 and r["modeled_fp8_ms"] > 0 for r in shaped)
    assert all("node_phases" in run_ for run_ in result["raw"]["unshaped"])


def test_all_to_all_link_bytes_count_slices_to_other_nodes_only():
    """An all_to_all's link carries the slices between nodes: never a
    rank's own slice, nor one to a rank on its node; the busier direction
    of the busiest node."""
    netlab = load("fp8comm_bench_netlab", "bench/netlab.py")
    two = [[0, 30], [70, 0]]  # [source][destination]
    assert netlab.a2a_link_bytes(two, 1) == 70
    four = [[0, 1, 10, 100], [2, 0, 20, 200], [3, 4, 0, 5], [6, 7, 8, 0]]
    # node 0 = ranks 0, 1: up 10 + 100 + 20 + 200, down 3 + 4 + 6 + 7
    assert netlab.a2a_link_bytes(four, 2) == 330
    row = {"op": "all_to_all", "peer_bytes_plain": two, "peer_bytes_wire": [[0, 8], [18, 0]]}
    assert netlab.a2a_link_bytes(two, 1, both_directions=True) == 100
    # two ranks: one gloo pair, its two directions in turn
    assert netlab.link_bytes(row, False, 2, 1) == 100 and netlab.link_bytes(row, True, 2, 1) == 26


def test_example_summary_compares_each_configuration_with_the_reference_at_its_rate():
    """--fsdp and --moe: medians over runs, each configuration's tokens/s
    over the reference's at the same rate, and the reference's share of a
    step spent communicating (the time it gains over the unshaped link)."""
    netlab = load("fp8comm_bench_netlab", "bench/netlab.py")
    ref, fast = netlab.MOE_CONFIGS[0][0], "dispatch e4m3"
    raw = {"unshaped": {ref: [1000.0, 900.0, 1100.0], fast: [1000.0, 1000.0, 1000.0]},
           "1": {ref: [400.0, 500.0, 600.0], fast: [800.0, 700.0, 750.0]}}
    rows = {(r["rate_gbit"], r["config"]): r for r in netlab.summarize_example(raw, ref)}
    assert rows["1", fast]["tokens_per_s"] == 750.0 and rows["1", fast]["speedup"] == pytest.approx(1.5)
    assert rows["unshaped", fast]["speedup"] == 1.0 and rows["1", ref]["speedup"] == 1.0
    assert rows["1", ref]["gloo_comm_share"] == pytest.approx(0.5)  # 500 of 1000 tokens/s: half a step on the link
    assert [k for k, r in rows.items() if "gloo_comm_share" in r] == [("1", ref)]


def test_example_configs_keep_the_reference_and_refuse_unknown_names():
    netlab = load("fp8comm_bench_netlab", "bench/netlab.py")
    args = argparse.Namespace(moe_configs="dispatch mxfp4", fsdp_configs=None)
    assert [c[0] for c in netlab.example_configs(args, "moe")] == ["exact (torch all_to_all over gloo)",
                                                                   "dispatch mxfp4"]
    assert netlab.example_configs(args, "fsdp") is netlab.FSDP_CONFIGS
    with pytest.raises(SystemExit, match="no configuration named"):
        netlab.example_configs(argparse.Namespace(moe_configs="e4m3"), "moe")


def test_example_runs_once_more_only_when_a_rank_aborted_at_exit_after_the_report(monkeypatch):
    """torch's teardown race (docs/integrations.md) may abort a rank once the
    example has reported; netlab runs that configuration again, once. Any
    other failure, or the abort before the report, stays a failure."""
    netlab = load("fp8comm_bench_netlab", "bench/netlab.py")
    report = "[dispatch e4m3, combine exact] eval loss 2.8000  tokens/s 12345  all_to_all bytes sent"
    aborted = netlab.LaunchFailed("node 1 failed", [report, netlab.EXIT_ABORT], [1])

    def launches(*results):
        calls = iter(results)

        def launch(*_):
            result = next(calls)
            if isinstance(result, Exception):
                raise result
            return result
        monkeypatch.setattr(netlab, "launch", launch)

    args = argparse.Namespace(moe_args="--steps 5", env=[], ranks_per_node=1, timeout=60.0)
    run = lambda: netlab.example_once(None, args, "moe", "dispatch e4m3", [], {})  # noqa: E731
    launches(aborted, [report.replace("12345", "23456"), ""])
    assert run() == 23456.0
    launches(aborted, aborted)
    with pytest.raises(netlab.LaunchFailed):
        run()
    launches(netlab.LaunchFailed("node 1 failed", ["step 0", netlab.EXIT_ABORT], [1]))
    with pytest.raises(netlab.LaunchFailed):
        run()
    launches(netlab.LaunchFailed("node 1 failed", [report, "RuntimeError: connection reset"], [1]))
    with pytest.raises(netlab.LaunchFailed):
        run()
