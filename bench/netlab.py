"""Real links on one machine: every "node" is a Linux network namespace, and
the nodes reach each other through a bridge over veth pairs shaped by tc.

    sudo python bench/netlab.py --rates 1,10,25 [--ranks-per-node 1] [--json PATH] [--plot PNG]
    sudo python bench/netlab.py --quick          # one rate, two sizes: a smoke run
    sudo python bench/netlab.py --rates 1 --moe --no-comm   # the MoE example's tokens/s per MOE_CONFIGS

Topology: a "switch" namespace holds a bridge; node i is namespace i with one
veth to the bridge and address 10.213.<lab>.<i+1>. Both directions of every
node's link are shaped by a token bucket (tbf) at the link rate, with an
optional netem delay, so each node has the rate up and the rate down, as a NIC
does. Ranks on one node talk over the namespace's own loopback (unshaped),
ranks on different nodes over the shaped link. The script uses only the
addresses of the namespaces it creates and deletes them on exit (also on
Ctrl-C); where namespaces cannot be made (not root, no iproute2) it says so
and exits 0 without measuring.

It runs the comm benchmark (fp8comm.bench's comm: gloo and fp8gloo timed
interleaved in one job, medians of --reps calls) --runs times at each rate,
the rates interleaved within each run, and reports, per op and size, the
median over runs of the fp8/plain time ratio. --fsdp also times the FSDP2
example (tokens/s) in each of FSDP_CONFIGS, interleaved, and estimates
gloo's share of a step spent communicating (its step time over the
unshaped link's); --moe does the same for the expert-parallel MoE example
in each of MOE_CONFIGS, against its exact all_to_alls over gloo. Every
rank gets OMP_NUM_THREADS = cores / ranks.

The "model" columns are MODELED by bench/model.py's shaped_link_seconds:
time(rate) = max(time at the unshaped link, bytes on the shaped link / rate),
plus one chunk of the smaller for fp8comm's chunked pipeline; the unshaped
run calibrates the CPU term. In inter_node scope with several ranks per node,
each unshaped run also times the exact node phases alone
(bench/node_phases.py): all_reduce and all_gather run them beside the hop,
chunk by chunk, so they count as CPU time that overlaps the link; for
reduce_scatter by_node_seconds adds them in series. Each modeled
point is printed beside its measurement with the relative error of the ratio.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from model import by_node_seconds, shaped_link_seconds  # noqa: E402

CHUNK_NUMEL = 1 << 20  # gloo's TransportTraits::chunk_numel (csrc/algorithms/transport_traits.h)
ELEMENT_SIZE = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
MODELED_COLUMNS = ("modeled_*: bench/model.py shaped_link_seconds, max(time at the unshaped link, link bytes / rate) "
                   "+ one chunk's fill for fp8comm; in inter_node scope, for reduce_scatter, whose node phases "
                   "run before the hop, by_node_seconds: the node phases (bench/node_phases.py, "
                   "unshaped) + shaped_link_seconds of the rest (not measured)")
SUBNET = "10.213"
# Ops whose node phases (inter_node scope) csrc/algorithms/by_node.cpp runs
# chunk by chunk beside the hop between nodes: modeled as CPU time that
# overlaps the link, like the rest of the unshaped time; the others' in series.
NODE_PHASES_BESIDE_THE_HOP = ("all_reduce", "all_gather")


def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def why_no_namespaces() -> str | None:
    """None when this process can build the lab, else the reason."""
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs iproute2 (ip, tc)"
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    probe = f"fp8lab-probe-{os.getpid()}"
    made = run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    run("ip", "netns", "del", probe, check=False)
    return None


class Lab:
    """Namespaces node0..node{N-1} joined by a bridge; deleted by close()."""

    def __init__(self, nodes: int, mtu: int):
        self.tag = f"{os.getpid() % 100000}"
        self.lab_id = os.getpid() % 200 + 20
        self.switch = f"fp8lab{self.tag}s"
        self.nodes = [f"fp8lab{self.tag}n{i}" for i in range(nodes)]
        self.node_if = "eth0"
        self.mtu = mtu
        self.created: list[str] = []

    def address(self, i: int) -> str:
        return f"{SUBNET}.{self.lab_id}.{i + 1}"

    def switch_if(self, i: int) -> str:
        return f"f8{self.tag}p{i}"[:15]

    def build(self):
        ns = lambda name, *cmd: run("ip", "netns", "exec", name, *cmd)  # noqa: E731
        run("ip", "netns", "add", self.switch)
        self.created.append(self.switch)
        ns(self.switch, "ip", "link", "add", "br0", "type", "bridge")
        ns(self.switch, "ip", "link", "set", "br0", "up")
        for i, node in enumerate(self.nodes):
            run("ip", "netns", "add", node)
            self.created.append(node)
            peer = self.switch_if(i)
            ns(node, "ip", "link", "add", self.node_if, "mtu", str(self.mtu), "type", "veth",
               "peer", "name", peer, "mtu", str(self.mtu), "netns", self.switch)
            ns(self.switch, "ip", "link", "set", peer, "master", "br0", "up")
            ns(node, "ip", "addr", "add", f"{self.address(i)}/24", "dev", self.node_if)
            ns(node, "ip", "link", "set", self.node_if, "up")
            ns(node, "ip", "link", "set", "lo", "up")

    def sysctl(self, settings: list[tuple[str, str]]):
        """Sets per-namespace kernel settings (e.g. TCP's) on every node."""
        for node in self.nodes:
            for key, value in settings:
                run("ip", "netns", "exec", node, "sysctl", "-q", "-w", f"{key}={value}")

    def shape(self, gbit: float | None, delay_ms: float, queue_ms: float = 100.0):
        """Shapes both directions of every node's link; None: unshaped.
        queue_ms: how long a packet may wait in the shaper's queue (its depth)."""
        for i, node in enumerate(self.nodes):
            for where, dev in ((node, self.node_if), (self.switch, self.switch_if(i))):
                run("ip", "netns", "exec", where, "tc", "qdisc", "del", "dev", dev, "root", check=False)
                parent = ["root"]
                if delay_ms > 0:
                    run("ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:",
                        "netem", "delay", f"{delay_ms}ms", "limit", "100000")
                    parent = ["parent", "1:"]
                if gbit is not None:
                    # A burst of 2 ms at the rate (at least 64 KiB): enough for the kernel's timer
                    # granularity, small against any transfer measured.
                    burst = max(64 * 1024, int(gbit * 1e9 / 8 * 0.002))
                    run("ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", dev, *parent, "handle", "2:",
                        "tbf", "rate", f"{gbit}gbit", "burst", str(burst), "latency", f"{queue_ms}ms")

    def close(self):
        for name in reversed(self.created):
            run("ip", "netns", "del", name, check=False)
        self.created.clear()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LaunchFailed(RuntimeError):
    """A node's torchrun exited non-zero; `outputs` holds every node's output."""

    def __init__(self, message: str, outputs: list[str], failed: list[int]):
        super().__init__(message)
        self.outputs, self.failed = outputs, failed


def launch(lab: Lab, ranks_per_node: int, target: list[str], env_extra: dict, timeout_s: float) -> list[str]:
    """Runs `target` (a torchrun script or -m module with its arguments) on
    every node, ranks_per_node processes each; returns each node's output."""
    port = 29500 + free_port() % 10000
    world = len(lab.nodes) * ranks_per_node
    env = dict(os.environ, GLOO_SOCKET_IFNAME=lab.node_if,
               OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // world)), **env_extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.path.join(ROOT, "examples"), env.get("PYTHONPATH")) if p)
    procs = []
    for i, node in enumerate(lab.nodes):
        cmd = ["ip", "netns", "exec", node, sys.executable, "-m", "torch.distributed.run",
               f"--nnodes={len(lab.nodes)}", f"--node_rank={i}", f"--nproc_per_node={ranks_per_node}",
               f"--master_addr={lab.address(0)}", f"--master_port={port}", *target]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout_s)
            outputs.append(out)
    except subprocess.TimeoutExpired:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        raise RuntimeError(f"netlab: {' '.join(target)} ran past {timeout_s:.0f} s; killed")
    failed = [i for i, p in enumerate(procs) if p.returncode != 0]
    if failed:
        raise LaunchFailed(f"netlab: node {failed[0]} failed running {' '.join(target)}:\n{outputs[failed[0]][-3000:]}",
                           outputs, failed)
    return outputs


def comm_once(lab, args, rate, tmp, run_index) -> dict:
    path = os.path.join(tmp, f"comm-{rate}-{run_index}.json")
    target = ["-m", "fp8comm.bench.comm"] if module_exists("fp8comm.bench.comm") else [
        os.path.join(ROOT, "bench", "comm.py")]
    target += ["--ops", args.ops, "--dtypes", args.dtypes, "--min-bytes", args.min_bytes,
               "--max-bytes", args.max_bytes, "--reps", str(args.reps), "--json", path]
    launch(lab, args.ranks_per_node, target, dict(args.env), args.timeout)
    with open(path) as f:
        result = json.load(f)
    if rate == "unshaped" and by_node(dict(args.env), args.ranks_per_node):
        result["node_phases"] = node_phases_once(lab, args, result["rows"], tmp, run_index)
    return result


def by_node(env: dict, ranks_per_node: int) -> bool:
    """Whether fp8comm runs its by-node algorithms (exact phases inside each node)."""
    return env.get("FP8COMM_SCOPE") == "inter_node" and ranks_per_node > 1


def node_phases_once(lab, args, rows: list[dict], tmp, run_index) -> list[dict]:
    """bench/node_phases.py on the comm benchmark's cases: the by-node
    model's serial term, measured over the same unshaped lab."""
    path = os.path.join(tmp, f"node-phases-{run_index}.json")
    cases = ",".join(f"{r['op']}:{r['bytes']}:{r['dtype']}" for r in rows)
    target = [os.path.join(ROOT, "bench", "node_phases.py"), "--cases", cases, "--reps", str(args.reps),
              "--json", path]
    launch(lab, args.ranks_per_node, target, {}, args.timeout)
    with open(path) as f:
        return json.load(f)["cases"]


# The FSDP2 example's configurations timed by --fsdp: (label, example flags, extra environment).
FSDP_CONFIGS = [
    ("gloo", ["--no-fp8-compute", "--no-fp8-comm"], {}),
    ("fp8gloo", ["--no-fp8-compute"], {}),
    ("fp8gloo, all_gather too", ["--no-fp8-compute"], {"FP8COMM_COMPRESS": "all"}),
    ("fp8gloo + Fp8Linear (the example's default)", [], {}),
    # The gradients' reduce-scatter through fp8comm.fsdp on the plain group, at
    # the convergence study's settings, and what error feedback and stochastic
    # rounding cost there.
    ("e5m2/512 via fp8comm.fsdp", ["--no-fp8-compute", "--wire", "e5m2", "--comm-block-size", "512"], {}),
    ("e5m2/512 via fp8comm.fsdp + error feedback",
     ["--no-fp8-compute", "--wire", "e5m2", "--comm-block-size", "512", "--error-feedback", "fp32"], {}),
    ("e5m2/512 via fp8comm.fsdp + stochastic rounding",
     ["--no-fp8-compute", "--wire", "e5m2", "--comm-block-size", "512", "--rounding", "stochastic"], {}),
    # Four bits: MXFP4 on the fp8 group (every compressed op), and on the
    # gradients' reduce-scatter through fp8comm.fsdp, with error feedback.
    ("fp8gloo (mxfp4 wire)", ["--no-fp8-compute"], {"FP8COMM_WIRE_FORMAT": "mxfp4"}),
    ("mxfp4 via fp8comm.fsdp", ["--no-fp8-compute", "--wire", "mxfp4"], {}),
    ("mxfp4 via fp8comm.fsdp + error feedback", ["--no-fp8-compute", "--wire", "mxfp4", "--error-feedback", "fp32"],
     {}),
]


# The MoE example's configurations timed by --moe, the same way; every one runs
# over the plain gloo group, the first with torch's own all_to_alls.
MOE_CONFIGS = [
    ("exact (torch all_to_all over gloo)", ["--wire", "exact", "--combine", "exact"], {}),
    ("dispatch e4m3", ["--wire", "e4m3", "--combine", "exact"], {}),
    ("dispatch mxfp4", ["--wire", "mxfp4", "--combine", "exact"], {}),
    ("dispatch + combine e4m3", ["--wire", "e4m3", "--combine", "e4m3"], {}),
    # The backward's all_to_alls carry as many bytes as the forward's.
    ("dispatch + combine + gradients e4m3", ["--wire", "e4m3", "--combine", "e4m3", "--grad-wire", "e4m3"], {}),
]

# What --fsdp and --moe time: the example script and its configurations, the
# reference (the plain run every other is compared with) first.
EXAMPLES = {"fsdp": ("train_fsdp.py", FSDP_CONFIGS), "moe": ("train_moe.py", MOE_CONFIGS)}


def example_configs(args, example: str) -> list:
    """The configurations --<example>-configs names, the reference always first."""
    table = EXAMPLES[example][1]
    names = getattr(args, f"{example}_configs")
    if not names:
        return table
    wanted = {name.strip() for name in names.split(",")}
    unknown = wanted - {label for label, _, _ in table}
    if unknown:
        raise SystemExit(f"netlab: --{example}-configs: no configuration named {sorted(unknown)}; "
                         f"choose from {[label for label, _, _ in table]}")
    return [c for i, c in enumerate(table) if i == 0 or c[0] in wanted]


def reported_tokens_per_s(output: str) -> float | None:
    """The tokens/s of rank 0's report: the example's final line holds the
    eval loss and the tokens/s of the steps after the first few."""
    for line in output.splitlines():
        if "tokens/s" in line and "eval loss" in line:
            return float(line.split("tokens/s")[1].split()[0])
    return None


# libstdc++'s message when torch's teardown race aborts a process at exit
# (docs/integrations.md, pytorch/pytorch#190489).
EXIT_ABORT = "terminate called without an active exception"


def example_once(lab, args, example: str, label: str, flags: list[str], env: dict) -> float:
    """Tokens/s of one run of the example (rank 0's report)."""
    script = EXAMPLES[example][0]
    target = [os.path.join(ROOT, "examples", script), *getattr(args, f"{example}_args").split(), *flags]
    try:
        outputs = launch(lab, args.ranks_per_node, target, dict(args.env) | env, args.timeout)
    except LaunchFailed as e:
        # A rank that aborted in torch's teardown race after the run reported
        # failed the launch, not the run: run it once more, as the tests do.
        if reported_tokens_per_s(e.outputs[0]) is None or not all(EXIT_ABORT in e.outputs[i] for i in e.failed):
            raise
        print(f"netlab: {script} ({label}) aborted at exit after its report; running it again", file=sys.stderr,
              flush=True)
        outputs = launch(lab, args.ranks_per_node, target, dict(args.env) | env, args.timeout)
    tokens_per_s = reported_tokens_per_s(outputs[0])
    if tokens_per_s is None:
        raise RuntimeError(f"netlab: {script} ({label}) printed no tokens/s:\n{outputs[0][-2000:]}")
    return tokens_per_s


def module_exists(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def link_bytes(row: dict, fp8: bool, world: int, ranks_per_node: int) -> float:
    """Bytes one node's link carries in one call, in one direction or, where
    the two directions take turns, both (algorithm volumes; peers on the
    same node are reached over loopback)."""
    if "peer_bytes_plain" in row:  # an all_to_all: the slices to peers, each node's busier direction
        return a2a_link_bytes(row["peer_bytes_wire" if fp8 else "peer_bytes_plain"], ranks_per_node,
                              both_directions=world == 2)
    if fp8 and "bytes_sent_inter_node" in row:  # what fp8comm counted for other nodes (either scope)
        return row["bytes_sent_inter_node"] * ranks_per_node
    if not fp8:
        # gloo's rings run over contiguous ranks, so one edge of the ring
        # leaves each node, carrying what one rank sends.
        if row["op"] == "all_reduce":
            return row["bytes_sent_uncompressed"]
        if row["op"] == "reduce_scatter":
            # ProcessGroupGloo's reduce_scatter_tensor all-reduces a copy of
            # the whole input and keeps its own chunk: an all_reduce's bytes.
            return 2 * row["bytes_sent_uncompressed"]
        if row["op"] == "all_gather":
            # gloo's ring all_gather sends each step as two large messages;
            # between two ranks one TCP pair carries both directions, and a
            # gloo pair moves large messages one direction at a time
            # (bench/netlab_duplex.py): counted as both directions' bytes.
            return row["bytes_sent_uncompressed"] * (2 if world == 2 else 1)
    remote_share = (world - ranks_per_node) / world
    per_rank = row["bytes_sent"] if fp8 else row["bytes_sent_uncompressed"]
    # bytes_sent counts every peer; the link carries the share sent to other nodes.
    return per_rank * remote_share / ((world - 1) / world) * ranks_per_node


def a2a_link_bytes(peer_bytes: list[list[int]], ranks_per_node: int, both_directions: bool = False) -> float:
    """The bytes an all_to_all puts on the busiest link direction: node i's
    link carries up what its ranks send to other nodes' ranks and down what
    they receive from them (peer_bytes[s][d]: the slice rank s sends rank d,
    as the comm benchmark records it, plain or in the wire format; ranks
    fill nodes in order, as torchrun places them). Only slices to peers on
    other nodes count; the own slice and same-node slices never reach it.
    both_directions: up and down counted together, for two ranks, whose one
    gloo pair moves a large message's two directions in turn
    (bench/netlab_duplex.py), as link_bytes counts all_gather's."""
    world = len(peer_bytes)
    node = [r // ranks_per_node for r in range(world)]
    busiest = 0
    for i in set(node):
        up = sum(peer_bytes[s][d] for s in range(world) for d in range(world) if node[s] == i != node[d])
        down = sum(peer_bytes[s][d] for s in range(world) for d in range(world) if node[d] == i != node[s])
        busiest = max(busiest, up + down if both_directions else max(up, down))
    return float(busiest)


def node_phase_seconds(base: list[dict], key: tuple) -> float | None:
    """Median over the unshaped runs of the node phases' time for this
    (op, dtype, bytes); None where they were not timed (not by node)."""
    times = [c["median_s"] for run_ in base for c in run_.get("node_phases", [])
             if (c["op"], c["dtype"], c["bytes"]) == key]
    return statistics.median(times) if times else None


def summarize(by_rate: dict, world: int, ranks_per_node: int) -> list[dict]:
    """One row per (rate, op, dtype, size): medians over runs, and the model."""
    base = by_rate.get("unshaped")
    out = []
    for rate, runs in by_rate.items():
        keys = [(r["op"], r["dtype"], r["bytes"]) for r in runs[0]["rows"]]
        for i, key in enumerate(keys):
            rows = [run_["rows"][i] for run_ in runs]
            plain = statistics.median(r["plain"]["median_s"] for r in rows)
            fp8 = statistics.median(r["fp8"]["median_s"] for r in rows)
            row = {"rate_gbit": rate, "op": key[0], "dtype": key[1], "bytes": key[2], "runs": len(rows),
                   "plain_ms": plain * 1e3, "fp8_ms": fp8 * 1e3, "ratio": fp8 / plain,
                   "ratios_per_run": [r["fp8"]["median_s"] / r["plain"]["median_s"] for r in rows],
                   "sqnr_db": rows[0]["sqnr_db"]}
            if base is not None and rate != "unshaped":
                b_plain = statistics.median(r["rows"][i]["plain"]["median_s"] for r in base)
                b_fp8 = statistics.median(r["rows"][i]["fp8"]["median_s"] for r in base)
                chunks = max(1, key[2] // ELEMENT_SIZE[key[1]] // CHUNK_NUMEL)
                m_plain = shaped_link_seconds(b_plain, link_bytes(rows[0], False, world, ranks_per_node),
                                              float(rate), chunks=None)
                fp8_link = link_bytes(rows[0], True, world, ranks_per_node)
                node_s = node_phase_seconds(base, key)
                if node_s is None:
                    m_fp8 = shaped_link_seconds(b_fp8, fp8_link, float(rate), chunks=chunks)
                else:  # the hop between nodes carries 1/L of the data, in as many fewer chunks
                    hop_chunks = max(1, chunks // ranks_per_node)
                    if key[0] in NODE_PHASES_BESIDE_THE_HOP:
                        m_fp8 = shaped_link_seconds(b_fp8, fp8_link, float(rate), chunks=hop_chunks)
                    else:
                        m_fp8 = by_node_seconds(b_fp8, node_s, fp8_link, float(rate), chunks=hop_chunks)
                    row["node_phases_ms"] = node_s * 1e3
                row.update(modeled_plain_ms=m_plain * 1e3, modeled_fp8_ms=m_fp8 * 1e3,
                           modeled_ratio=m_fp8 / m_plain,
                           model_error=(m_fp8 / m_plain) / (fp8 / plain) - 1,
                           model_error_plain=m_plain / plain - 1, model_error_fp8=m_fp8 / fp8 - 1)
            out.append(row)
    return out


def summarize_example(raw: dict, reference: str) -> list[dict]:
    """Median tokens/s per rate and configuration, its speedup over the
    reference (a plain gloo run) at the same rate, and the reference's share
    of a step spent communicating, estimated as the time a step gains over
    the unshaped link (the compute is the same)."""
    rows = []
    for rate, by_config in raw.items():
        ref = statistics.median(by_config[reference])
        for config, values in by_config.items():
            row = {"rate_gbit": rate, "config": config, "runs": len(values),
                   "tokens_per_s": statistics.median(values), "speedup": statistics.median(values) / ref}
            if config == reference and rate != "unshaped" and "unshaped" in raw:
                unshaped = statistics.median(raw["unshaped"][reference])
                row["gloo_comm_share"] = max(0.0, 1 - ref / unshaped)
            rows.append(row)
    return rows


def plot(rows: list[dict], path: str, title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shaped = [r for r in rows if r["rate_gbit"] != "unshaped"]
    ops = sorted({r["op"] for r in shaped})
    fig, axes = plt.subplots(1, len(ops), figsize=(4.5 * len(ops), 4), squeeze=False)
    for ax, op in zip(axes[0], ops):
        sizes = sorted({r["bytes"] for r in shaped if r["op"] == op})
        for size in sizes:
            sel = sorted((r for r in shaped if r["op"] == op and r["bytes"] == size), key=lambda r: float(r["rate_gbit"]))
            xs = [float(r["rate_gbit"]) for r in sel]
            line, = ax.plot(xs, [r["ratio"] for r in sel], marker="o", label=f"{size >> 20} MiB measured")
            if "modeled_ratio" in sel[0]:
                ax.plot(xs, [r["modeled_ratio"] for r in sel], linestyle="--", color=line.get_color(),
                        label=f"{size >> 20} MiB modeled")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("link rate, Gbit/s")
        ax.set_ylabel("fp8gloo time / gloo time")
        ax.set_title(op)
        ax.set_ylim(0, max(1.2, max(r["ratio"] for r in shaped if r["op"] == op) * 1.1))
        ax.legend(fontsize=6)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def print_rows(rows: list[dict]):
    print(f"{'rate':>9s} {'op':15s} {'dtype':8s} {'MiB':>6s} {'gloo ms':>9s} {'fp8 ms':>9s} {'ratio':>6s} "
          f"{'modeled':>8s} {'err':>6s} {'gloo err':>8s} {'fp8 err':>7s}")
    for r in rows:
        modeled = (f"{r['modeled_ratio']:8.3f} {r['model_error'] * 100:5.0f}% {r['model_error_plain'] * 100:7.0f}% "
                   f"{r['model_error_fp8'] * 100:6.0f}%") if "modeled_ratio" in r else ""
        print(f"{r['rate_gbit']:>9s} {r['op']:15s} {r['dtype']:8s} {r['bytes'] / 2**20:6.0f} {r['plain_ms']:9.1f} "
              f"{r['fp8_ms']:9.1f} {r['ratio']:6.3f} {modeled}")


def scope_label(env: dict) -> str:
    return f", scope {env['FP8COMM_SCOPE']}" if "FP8COMM_SCOPE" in env else ""


def remodel(path: str, plot_path: str | None) -> int:
    """Recomputes the modeled columns of a saved result from its raw runs
    (the measurements are kept) and rewrites the file."""
    with open(path) as f:
        result = json.load(f)
    result["rows"] = summarize(result["raw"], result["nodes"] * result["ranks_per_node"], result["ranks_per_node"])
    result["modeled_columns"] = MODELED_COLUMNS
    print_rows(result["rows"])
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    if plot_path:
        plot(result["rows"], plot_path, f"fp8gloo vs gloo over shaped links: {result['nodes']} nodes x "
                                        f"{result['ranks_per_node']} ranks{scope_label(result['env'])}, {result['device']}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="1,10,25", help="link rates in Gbit/s, comma separated")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--ranks-per-node", type=int, default=1)
    p.add_argument("--delay-ms", type=float, default=0.0, help="netem delay on every link direction")
    p.add_argument("--mtu", type=int, default=1500)
    p.add_argument("--ops", default="all_reduce,reduce_scatter,all_gather")
    p.add_argument("--dtypes", default="float32")
    p.add_argument("--min-bytes", default="1M")
    p.add_argument("--max-bytes", default="256M")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--runs", type=int, default=3, help="jobs per rate; rows are medians over them")
    p.add_argument("--env", action="append", default=[], type=lambda s: tuple(s.split("=", 1)),
                   help="NAME=VALUE for every rank (e.g. FP8COMM_SCOPE=inter_node)")
    p.add_argument("--sysctl", action="append", default=[], type=lambda s: tuple(s.split("=", 1)),
                   help="KEY=VALUE set in every node's namespace (e.g. net.ipv4.tcp_slow_start_after_idle=0)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per job")
    examples = p.add_mutually_exclusive_group()
    examples.add_argument("--fsdp", action="store_true",
                          help="also time the FSDP2 example's configurations (FSDP_CONFIGS)")
    examples.add_argument("--moe", action="store_true",
                          help="also time the expert-parallel MoE example's configurations (MOE_CONFIGS)")
    p.add_argument("--fsdp-args", default="--dim 512 --layers 2 --heads 8 --seq 128 --batch 2 --steps 13",
                   help="the example's model and run (default: a wide model and a small batch)")
    p.add_argument("--fsdp-configs", default=None,
                   help="comma list of FSDP_CONFIGS labels to time (default all; gloo is always timed)")
    p.add_argument("--moe-args", default="--steps 33",
                   help="the MoE example's model and run (default: its own model)")
    p.add_argument("--moe-configs", default=None,
                   help="comma list of MOE_CONFIGS labels to time (default all; the exact one is always timed)")
    p.add_argument("--no-comm", action="store_true", help="skip the comm benchmark (with --fsdp or --moe)")
    p.add_argument("--quick", action="store_true", help="10 Gbit/s only, 1 and 4 MiB, 3 reps, 1 run")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--plot", metavar="PNG")
    p.add_argument("--remodel", metavar="JSON", help="recompute a saved result's modeled columns; no measuring")
    args = p.parse_args(argv)
    if args.remodel:
        return remodel(args.remodel, args.plot)
    if args.quick:
        args.rates, args.min_bytes, args.max_bytes, args.reps, args.runs = "10", "1M", "4M", 3, 1

    reason = why_no_namespaces()
    if reason is not None:
        print(f"netlab: skipped, {reason}")
        return 0
    world = args.nodes * args.ranks_per_node
    example = "fsdp" if args.fsdp else "moe" if args.moe else None
    configs = example_configs(args, example) if example else []
    rates = ["unshaped"] + [r.strip() for r in args.rates.split(",")]
    lab = Lab(args.nodes, args.mtu)
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def interrupted(signum, frame):
        lab.close()
        sys.exit(128 + signum)

    for s in previous:
        signal.signal(s, interrupted)
    by_rate: dict = {}
    timed: dict = {}  # rate -> configuration -> the example's tokens/s per run
    try:
        lab.build()
        lab.sysctl(args.sysctl)
        with tempfile.TemporaryDirectory(prefix="fp8lab") as tmp:
            # Rates interleaved within each run, so that a slow spell of the
            # machine does not land on one rate (the unshaped run calibrates the model).
            for i in range(args.runs):
                for rate in rates:
                    lab.shape(None if rate == "unshaped" else float(rate), args.delay_ms)
                    if not args.no_comm:
                        by_rate.setdefault(rate, []).append(comm_once(lab, args, rate, tmp, i))
                    for label, flags, env in configs:  # configurations interleaved within each run
                        timed.setdefault(rate, {}).setdefault(label, []).append(
                            example_once(lab, args, example, label, flags, env))
                    print(f"netlab: {rate if rate == 'unshaped' else rate + ' Gbit/s'} run {i + 1}/{args.runs} done",
                          file=sys.stderr, flush=True)
    finally:
        lab.close()
        for s, h in previous.items():
            signal.signal(s, h)

    example_rows = summarize_example(timed, configs[0][0]) if example else []
    for r in example_rows:
        print(f"netlab {'FSDP2' if example == 'fsdp' else 'MoE'} {r['rate_gbit']:>9s} {r['config']:45s} "
              f"tokens/s {r['tokens_per_s']:8.0f}  x{r['speedup']:.2f} of {configs[0][0]}"
              + (f"  (gloo communicating {r['gloo_comm_share']:.0%} of a step, estimated)"
                 if "gloo_comm_share" in r else ""))
    # The JSON's fields for the example; without one, the comm result keeps the FSDP2 example's (empty).
    key = example or "fsdp"
    if args.no_comm:
        if args.json:
            import torch

            from fp8comm.bench import device_label

            with open(args.json, "w") as f:
                json.dump({"benchmark": f"netlab-{key}", "date": datetime.date.today().isoformat(),
                           "command": shlex.join(["python", "bench/netlab.py"] + list(sys.argv[1:] if argv is None else argv)),
                           "device": device_label(cuda=False), "torch": torch.__version__, "delay_ms": args.delay_ms,
                           "omp_num_threads": max(1, (os.cpu_count() or 1) // world),
                           "nodes": args.nodes, "ranks_per_node": args.ranks_per_node,
                           f"{key}_args": getattr(args, f"{key}_args"), key: example_rows, "raw": timed},
                          f, indent=1)
        return 0
    rows = summarize(by_rate, world, args.ranks_per_node)
    device = by_rate["unshaped"][0]["device"]
    print(f"\nnetlab: {args.nodes} nodes x {args.ranks_per_node} ranks, {device}, delay {args.delay_ms} ms, "
          f"MTU {args.mtu}; medians over {args.runs} runs of {args.reps} interleaved calls each")
    print_rows(rows)
    result = {"benchmark": "netlab", "date": datetime.date.today().isoformat(),
              "command": shlex.join(["python", "bench/netlab.py"] + list(sys.argv[1:] if argv is None else argv)),
              "device": device, "nodes": args.nodes, "ranks_per_node": args.ranks_per_node,
              "delay_ms": args.delay_ms, "mtu": args.mtu, "env": dict(args.env), "sysctl": dict(args.sysctl),
              "omp_num_threads": max(1, (os.cpu_count() or 1) // world),
              "modeled_columns": MODELED_COLUMNS,
              "rows": rows, "raw": by_rate, f"{key}_args": getattr(args, f"{key}_args"),
              key: example_rows, f"{key}_raw": timed}
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.plot:
        plot(rows, args.plot, f"fp8gloo vs gloo over shaped links: {args.nodes} nodes x {args.ranks_per_node} "
                              f"ranks{scope_label(dict(args.env))}, {device}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
