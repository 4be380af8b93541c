"""fp8 backend vs its own inner backend, same processes, same run.

    python -m fp8comm.bench comm --nproc 2 [--max-bytes 256M] [--json PATH] [--plot PNG] [--quick]
    torchrun --nproc_per_node=2 -m fp8comm.bench.comm [...]     # the same, launched by hand
    python -m fp8comm.bench comm --replot RESULT.json --plot PNG  # redraw a saved result

For each op (all_reduce, reduce_scatter, all_gather; tensor and list forms;
and, where --ops names them, all_to_all_single as `all_to_all` and
`all_to_all_skewed`), dtype and message size (4 KiB ... --max-bytes, x4),
times the collective on an fp8 group (fp8gloo / fp8nccl, every size
compressed: min_numel=0, compress="all", plus "all_to_all" where an
all_to_all op is asked for, since "all" does not include it) and on a plain
group (gloo / nccl) over the same ranks:
warm-up, then --reps timed calls of each, interleaved and each after a
barrier (CUDA events on GPU), median and p10/p90 of rank 0's times. Reports
algorithm and bus bandwidth (nccl-tests definitions), the bytes this rank sent
(fp8comm.get_stats), the SQNR against an exact FP64 result (FP64 passes
through the fp8 group uncompressed), and the fp8/plain time ratio (a row's
"speedup" is its inverse). Sizes are of the full tensor: the all_reduce
input, the reduce_scatter input, the all_gather output, each rank's
all_to_all input (nccl-tests' alltoall size; bus bandwidth (n-1)/n of it).
all_to_all splits the input equally; all_to_all_skewed uses a MoE-like
uneven split (skewed_splits: the same seeded P x P matrix on every rank, so
rank r's input split for d is d's output split from r). Inputs are drawn on
the device. Rank 0 prints each row and rewrites --json as the row finishes
("complete": false until the last), so a run cut short keeps what it measured.

The plot has one panel per op family: the fp8 group's median time over the
plain group's, per message size, against 1.0 (below it fp8 is faster); one
colour per dtype, dashed for the list form (all_to_all: the skewed split).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import fp8comm
from fp8comm.bench import all_gather_single, device_label, reduce_scatter_single

OPS = ["all_reduce", "reduce_scatter", "reduce_scatter_list", "all_gather", "all_gather_list"]
# all_to_all_single, asked for by name (--ops): not in the default run.
ALL_TO_ALL_OPS = ["all_to_all", "all_to_all_skewed"]
SKEW_SEED = 20250


def skewed_splits(numel: int, world: int, seed: int = SKEW_SEED) -> list[list[int]]:
    """A MoE-like dispatch: splits[r][d] elements go from rank r to rank d,
    every row summing to numel (each rank sends the same volume) while the
    columns (what each rank receives) differ. Each destination (expert) has
    a popularity drawn once: Zipf, 1/k for its place k = 1..P in a seeded
    permutation; each (r, d) pair then scales it by a lognormal(0, 0.5)
    factor (routing noise), and each row is normalized to numel and rounded
    down, the remainder going to the row's largest split. Drawn from a
    seeded CPU generator, so every rank computes the same matrix."""
    gen = torch.Generator().manual_seed(seed)
    place = torch.randperm(world, generator=gen).double() + 1
    noise = torch.exp(0.5 * torch.randn(world, world, generator=gen, dtype=torch.float64))
    weights = noise / place  # [r][d]: destination d's popularity in rank r's routing
    splits = []
    for row in (weights / weights.sum(dim=1, keepdim=True)).tolist():
        counts = [int(w * numel) for w in row]
        counts[max(range(world), key=lambda d: row[d])] += numel - sum(counts)
        splits.append(counts)
    return splits


def parse_size(s: str) -> int:
    s = s.strip().upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(float(s[:-1] if s[-1:] in "KMG" else s) * mult)


def human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


class Progress:
    """A one-line progress bar on stderr (rank 0)."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.enabled, self.t0 = total, 0, enabled, time.time()

    def step(self, label: str):
        self.done += 1
        if self.enabled:
            filled = int(30 * self.done / self.total)
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} "
                             f"{time.time() - self.t0:5.0f}s {label:40s}")
            sys.stderr.flush()
            if self.done == self.total:
                sys.stderr.write("\n")


def busbw_factor(op: str, world: int) -> float:
    if op == "all_reduce":
        return 2 * (world - 1) / world
    return (world - 1) / world


class Case:
    """One op on one tensor size, runnable on any group."""

    def __init__(self, op: str, numel: int, dtype, device, rank: int, world: int):
        self.op, self.numel, self.dtype, self.world = op, numel, dtype, world
        self.per_rank = numel // world
        self.in_splits = self.out_splits = None
        if op == "all_to_all":
            self.in_splits = self.out_splits = [self.per_rank] * world
        elif op == "all_to_all_skewed":
            splits = skewed_splits(numel, world)
            self.in_splits, self.out_splits = splits[rank], [splits[s][rank] for s in range(world)]
        # Drawn on the device itself: a GPU run's large inputs cost no host time.
        gen = torch.Generator(device=device).manual_seed(1234 + rank)
        in_numel = self.per_rank if op.startswith("all_gather") else numel
        self.input = torch.randn(in_numel, generator=gen, device=device).to(dtype)
        if self.out_splits is not None:
            out_numel = sum(self.out_splits)
        else:
            out_numel = numel if op.startswith("all_gather") else (numel if op == "all_reduce" else self.per_rank)
        self.output = torch.empty(out_numel, dtype=dtype, device=device)

    def prepare(self):
        """Resets the in-place all_reduce's tensor to the input, outside the clock."""
        if self.op == "all_reduce":
            self.output.copy_(self.input)

    def run(self, group, tensor=None, prepared=False):
        x = self.input if tensor is None else tensor
        out = self.output if tensor is None else torch.empty(self.output.numel(), dtype=x.dtype, device=x.device)
        if self.op == "all_reduce":
            if not prepared:
                out.copy_(x)
            dist.all_reduce(out, group=group)
        elif self.op == "reduce_scatter":
            reduce_scatter_single(out, x, group=group)
        elif self.op == "reduce_scatter_list":
            dist.reduce_scatter(out, list(x.chunk(self.world)), group=group)
        elif self.op == "all_gather":
            all_gather_single(out, x, group=group)
        elif self.in_splits is not None:
            dist.all_to_all_single(out, x, self.out_splits, self.in_splits, group=group)
        else:
            dist.all_gather(list(out.chunk(self.world)), x, group=group)
        return out


def time_once(case: Case, group, plain, device) -> float:
    case.prepare()
    dist.barrier(group=plain)
    if device.type == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        case.run(group, prepared=True)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    case.run(group, prepared=True)
    return time.perf_counter() - t0


def time_pair(case: Case, fp8_group, plain, reps: int, device) -> tuple[list[float], list[float]]:
    """fp8 and plain calls interleaved, alternating which goes first, so that
    both see the same machine (shared machines drift by 2x within a minute)."""
    for _ in range(2):
        case.run(fp8_group)
        case.run(plain)
    fp8_t, plain_t = [], []
    for i in range(reps):
        order = [(fp8_group, fp8_t), (plain, plain_t)]
        for group, times in (order if i % 2 == 0 else order[::-1]):
            times.append(time_once(case, group, plain, device))
    return fp8_t, plain_t


def sqnr_db(ref: torch.Tensor, got: torch.Tensor) -> float:
    err = (got.double() - ref).pow(2).sum().item()
    return float("inf") if err == 0 else 10 * math.log10(ref.pow(2).sum().item() / err)


def measure(case: Case, fp8_group, plain, reps: int, device, wire_format: str = "e4m3") -> dict:
    fp8_t, plain_t = time_pair(case, fp8_group, plain, reps, device)
    fp8comm.reset_stats(fp8_group)
    got = case.run(fp8_group).clone()
    stats = fp8comm.get_stats(fp8_group)
    exact = case.run(fp8_group, case.input.double())  # FP64: exact passthrough
    bytes_total = case.numel * case.input.element_size()

    def summary(ts):
        med = statistics.median(ts)
        q = sorted(ts)
        algbw = bytes_total / med / 1e9
        return {"median_s": med, "p10_s": q[len(q) // 10], "p90_s": q[(9 * len(q)) // 10],
                "algbw_gbps": algbw, "busbw_gbps": algbw * busbw_factor(case.op.split("_list")[0], case.world)}

    row = {
        "op": case.op, "dtype": str(case.dtype).replace("torch.", ""), "bytes": bytes_total, "numel": case.numel,
        "fp8": summary(fp8_t), "plain": summary(plain_t),
        "speedup": statistics.median(plain_t) / statistics.median(fp8_t),
        "bytes_sent": stats["bytes_sent"], "bytes_sent_uncompressed": stats["bytes_sent_uncompressed"],
        "bytes_sent_inter_node": stats["bytes_sent_inter_node"],
        "calls_compressed": stats["calls_compressed"], "sqnr_db": sqnr_db(exact, got),
    }
    if case.in_splits is not None:
        row.update(a2a_peer_bytes(case, wire_format))
    return row


def a2a_peer_bytes(case: Case, wire_format: str) -> dict:
    """An all_to_all's split matrix (elements, [source][destination]) and the
    bytes of every slice sent to a peer, as they are and in the wire format
    (codec.segment_bytes: codes and scales, without any transport header),
    for a link model to place on the links between ranks."""
    world, es = case.world, case.input.element_size()
    splits = ([[case.per_rank] * world for _ in range(world)] if case.op == "all_to_all"
              else skewed_splits(case.numel, world))
    plain = [[0 if s == d else n * es for d, n in enumerate(row)] for s, row in enumerate(splits)]
    wire = [[0 if s == d or n == 0 else fp8comm.segment_bytes(n, None, wire_format) for d, n in enumerate(row)]
            for s, row in enumerate(splits)]
    return {"splits": splits, "peer_bytes_plain": plain, "peer_bytes_wire": wire,
            "peer_bytes_ratio": sum(map(sum, wire)) / max(1, sum(map(sum, plain)))}


def plot(result: dict, path: str):
    """One panel per op family: fp8 median time / plain median time against
    message size, a line per dtype (dashed: the list form), 1.0 marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, NullFormatter

    rows = result["rows"]
    families = [f for f in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
                if any(r["op"].startswith(f) for r in rows)]
    dtypes = sorted({r["dtype"] for r in rows}, key=lambda d: (d != "float32", d))
    colors = {d: f"C{i % 10}" for i, d in enumerate(dtypes)}
    ratios = [r["fp8"]["median_s"] / r["plain"]["median_s"] for r in rows]
    lo = 2.0 ** math.floor(math.log2(min(ratios + [0.5])))
    hi = 2.0 ** math.ceil(math.log2(max(ratios + [2.0])))
    sizes = sorted({r["bytes"] for r in rows})
    labelled = sizes[:: 1 if len(sizes) <= 6 else 2]

    fig, axes = plt.subplots(1, len(families), figsize=(4.6 * len(families), 4.4), sharey=True, squeeze=False)
    for ax, family in zip(axes[0], families):
        for dtype in dtypes:
            for form, style in (("", "-"), ("_skewed" if family == "all_to_all" else "_list", "--")):
                sel = sorted((r for r in rows if r["op"] == family + form and r["dtype"] == dtype),
                             key=lambda r: r["bytes"])
                if sel:
                    ax.plot([r["bytes"] for r in sel], [r["fp8"]["median_s"] / r["plain"]["median_s"] for r in sel],
                            style, color=colors[dtype], marker="o", markersize=3.5, linewidth=1.6)
        ax.axhline(1.0, color="black", linewidth=1.0)
        ax.axhspan(lo / 1.15, 1.0, color="tab:green", alpha=0.06)
        ax.set_title(family)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_ylim(lo / 1.15, hi * 1.15)
        ax.xaxis.set_minor_locator(FixedLocator(sizes))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(labelled, [human(n) for n in labelled])
        ax.set_xlabel("message size (full tensor)")
        ax.grid(True, which="major", alpha=0.3)
    ticks = [2.0**k for k in range(int(math.log2(lo)), int(math.log2(hi)) + 1)]
    axes[0][0].set_yticks(ticks, [f"{t:g}" if t >= 0.125 else f"1/{round(1 / t)}" for t in ticks])
    axes[0][0].set_ylabel(f"{result['backend']} time / {result['baseline']} time\n(below 1: fp8 faster)")
    handles = [Line2D([], [], color=colors[d], marker="o", markersize=3.5, label=d) for d in dtypes]
    if any(r["op"].endswith("_list") for r in rows):
        handles += [Line2D([], [], color="gray", linestyle="-", label="tensor form"),
                    Line2D([], [], color="gray", linestyle="--", label="list form")]
    if any(r["op"].endswith("_skewed") for r in rows):
        handles += [Line2D([], [], color="gray", linestyle="--", label="all_to_all skewed split")]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False)
    machine = f"{result['machine']}, " if result.get("machine") else ""
    fig.suptitle(f"{result['backend']} vs {result['baseline']}, {result['world_size']} ranks, "
                 f"{machine}{result['device']}\nmedians of {result['reps']} interleaved calls, "
                 f"torch {result['torch']}, {result['date']}", fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def spawned_rank(rank: int, world: int, port: int, argv: list, command: str) -> None:
    """One rank of a torch.multiprocessing spawn launch (python -m
    fp8comm.bench comm --launcher spawn): the rendezvous variables only, as
    PyTorch's custom-backend tutorial sets them (no OMP_NUM_THREADS, no
    LOCAL_WORLD_SIZE)."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    main(argv, command=command)


def main(argv=None, prog="-m fp8comm.bench.comm", command=None):
    """prog: how this benchmark was started, for the command a result
    records; command: that whole command, where it is not torchrun's."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--min-bytes", default="4K")
    p.add_argument("--max-bytes", default="1G")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="4 KiB and 64 KiB, 3 reps: a smoke test")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--plot", metavar="PNG")
    p.add_argument("--replot", metavar="JSON", help="draw --plot from a saved --json result; runs nothing")
    args = p.parse_args(argv)
    if args.replot:
        if not args.plot:
            p.error("--replot needs --plot")
        with open(args.replot) as f:
            plot(json.load(f), args.plot)
        return

    use_cuda = torch.cuda.is_available() and fp8comm._C.has_cuda
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    dist.init_process_group("cpu:gloo,cuda:nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    fp8_backend = "fp8nccl" if use_cuda else "fp8gloo"
    ops = args.ops.split(",")
    unknown = set(ops) - set(OPS + ALL_TO_ALL_OPS)
    if unknown:
        p.error(f"--ops: unknown {sorted(unknown)}; choose from {OPS + ALL_TO_ALL_OPS}")
    # "all" never includes all_to_all (DESIGN.md, Options): named where asked
    # for, so the other ops' groups stay what they were.
    compress = "all"
    if set(ops) & set(ALL_TO_ALL_OPS):
        compress = "all_reduce,reduce_scatter,all_gather,all_to_all"
    fp8_options = fp8comm.Options(min_numel=0, compress=compress)
    fp8_group = dist.new_group(backend=fp8_backend, pg_options=fp8_options)
    plain = dist.new_group(backend="nccl" if use_cuda else "gloo")

    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    lo, hi = (4096, 65536) if args.quick else (parse_size(args.min_bytes), parse_size(args.max_bytes))
    reps = 3 if args.quick else args.reps
    sizes = []
    s = lo
    while s <= hi:
        sizes.append(s)
        s *= 4
    # A bar where someone watches; a log gets the rows themselves.
    progress = Progress(len(ops) * len(dtypes) * len(sizes), enabled=rank == 0 and sys.stderr.isatty())
    result = {
        "benchmark": "comm", "date": datetime.date.today().isoformat(),
        "command": command or " ".join(["torchrun", f"--nproc_per_node={world}", prog] + sys.argv[1:]),
        "launcher": "spawn" if command else "torchrun",
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "codec_threads": fp8comm._C.cpu_threads(),
        "device": device_label(use_cuda),
        "backend": fp8_backend, "baseline": "nccl" if use_cuda else "gloo", "world_size": world,
        "compress": compress, "wire_format": str(fp8_options.resolved().wire_format),
        "torch": torch.__version__, "reps": reps, "complete": False, "rows": [],
    }
    if rank == 0:
        print(f"{fp8_backend} vs {result['baseline']}, {world} ranks, {result['device']}; times are medians of {reps}")
        print(f"{'op':20s} {'dtype':9s} {'size':>9s} {'plain ms':>9s} {'fp8 ms':>9s} {'fp8/plain':>9s} "
              f"{'fp8 busbw':>10s} {'sent/uncomp':>11s} {'SQNR dB':>8s}", flush=True)
    for dtype in dtypes:
        es = torch.tensor([], dtype=dtype).element_size()
        for size in sizes:
            numel = max(world, size // es // world * world)
            for op in ops:
                case = Case(op, numel, dtype, device, rank, world)
                row = measure(case, fp8_group, plain, reps, device, result["wire_format"])
                del case
                progress.step(f"{op} {str(dtype)[6:]} {human(size)}")
                if rank == 0:
                    # Each row as it finishes, on stdout and in the JSON, so a run cut
                    # short (a timeout) still leaves every row it measured.
                    result["rows"].append(row)
                    print_row(row)
                    write_json(result, args.json)

    if rank == 0:
        result["complete"] = True
        result["load_average"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        write_json(result, args.json)
        if args.plot:
            plot(result, args.plot)
    dist.destroy_process_group()


def print_row(r: dict) -> None:
    print(f"{r['op']:20s} {r['dtype']:9s} {human(r['bytes']):>9s} {r['plain']['median_s'] * 1e3:9.3f} "
          f"{r['fp8']['median_s'] * 1e3:9.3f} {1 / r['speedup']:9.2f} {r['fp8']['busbw_gbps']:10.2f} "
          f"{r['bytes_sent'] / max(1, r['bytes_sent_uncompressed']):11.3f} {r['sqnr_db']:8.1f}", flush=True)


def write_json(result: dict, path: str | None) -> None:
    """Writes `result` whole, through a temporary file, so the file is never half written."""
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
