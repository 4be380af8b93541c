"""The exact node phases of fp8comm's `inter_node` scope, timed alone on plain
gloo: what they cost beside the hop between nodes (all_reduce and
all_gather run them chunk by chunk while the hop moves bytes), and the term
bench/model.py's by_node_seconds adds in series for reduce_scatter
(bench/netlab.py runs it over the unshaped lab).

    torchrun --nnodes N --nproc_per_node L bench/node_phases.py --cases all_reduce:64M [--check] [--wire-format e4m3] [--json PATH]

Each case is OP:BYTES[:DTYPE], the collective's full tensor (all_reduce's
tensor, reduce_scatter's input, all_gather's output; float32 unless DTYPE
says otherwise). The phases are the
ones csrc/algorithms/by_node.cpp runs on gloo (the transport's
exact_by_all_to_all traits), with the same copies:

- all_reduce: node reduce_scatter (an all_to_all of the other ranks'
  pieces, read from the tensor itself, or from a padded staging copy when L
  does not divide it; where they do not lie together, the middle ranks of
  a node of more than 2, from a copy; each rank reads its own piece where it
  is; added in rank order);
  after the hop, node all_gather (an all_to_all with no segment to itself:
  the chunk to every other rank, as it is to one peer, else from L - 1
  copies) and each rank's chunk copied into the tensor;
- reduce_scatter: the node reduce_scatter, each rank's own piece read in
  place and the other ranks' pieces (strided in its input, one segment per
  node) copied together to be sent;
- all_gather: the node all_gather of the gathered chunk, each rank's
  copied out.

The phases run here on the whole tensor, one after another, where the
collective runs all_reduce's and all_gather's on the hop's chunks beside it.
The ranks of every node run their phases at once, as in the collective.
Reports rank 0's median over --reps of the phases' time (each phase starts
after a barrier of the whole job, as it starts after a collective step).
--check also compares each case's result with plain gloo's collective on
the node (the hop between nodes left out), so the phases are known to do
the collective's work.

--wire-format FMT also times, interleaved with the exact phases, the same
node phases compressed: fp8gloo's flat reduce_scatter and all_gather in FMT
on the node group, one after the other (what eight bits inside a node
would cost, against the exact phases the inter_node scope runs).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

from fp8comm.bench.comm import parse_size


class NodePhases:
    """Buffers and phases of one case on this rank's node group."""

    def __init__(self, op: str, numel: int, dtype: torch.dtype, group, local: int):
        self.op, self.group, self.L = op, group, local
        # The collective's input, read by the first phase (all_gather's is
        # `gathered`, what the hop between nodes delivers), and its output,
        # written by the last: one tensor in all_reduce, kept apart here so
        # that every repetition starts from the same input.
        world = dist.get_world_size()
        if op in ("reduce_scatter", "all_gather") and numel % world:
            raise SystemExit(f"node_phases: {op} of {numel} elements: expected a multiple of the "
                             f"{world} ranks (one segment each); choose another size")
        self.input = torch.randn(numel).to(dtype) if op != "all_gather" else None
        self.tensor = torch.empty(numel, dtype=dtype)
        if op == "all_reduce":
            self.k = -(-numel // local)  # this rank's chunk of the node sum
        elif op == "reduce_scatter":
            self.k = numel // local  # nodes x output: what this rank reduces for the hop
        elif op == "all_gather":
            self.k = numel // local  # the hop's output
            self.gathered = torch.randn(self.k).to(dtype)
        else:
            raise SystemExit(f"node_phases: unknown op {op!r} (all_reduce, reduce_scatter, all_gather)")
        self.staging = torch.zeros(local * self.k, dtype=dtype)
        self.pieces = torch.empty(local * self.k, dtype=dtype)
        self.send = torch.empty((local - 1) * self.k, dtype=dtype)
        self.chunk = torch.empty(self.k, dtype=dtype)

    def before(self):
        if self.op == "all_gather":
            return
        n = self.input.numel()
        source = self.input
        if self.staging.numel() > n:  # all_reduce's padding
            self.staging.narrow(0, 0, n).copy_(self.input)
            self.staging.narrow(0, n, self.staging.numel() - n).zero_()
            source = self.staging
        L, k, me = self.L, self.k, dist.get_rank(self.group)
        # Only the other ranks' pieces travel: as they lie where they lie
        # together (all_reduce's first and last rank), else copied together.
        splits = [0 if r == me else k for r in range(L)]
        if self.op == "all_reduce" and me in (0, L - 1):
            others = source[k:] if me == 0 else source[:(L - 1) * k]
        else:
            others = self.send
            others[:me * k].copy_(source[:me * k])
            others[me * k:].copy_(source[(me + 1) * k:])
        dist.all_to_all_single(self.pieces[:(L - 1) * k], others, splits, splits, group=self.group)
        piece = [source[me * k:][:k] if r == me else self.pieces[(r if r < me else r - 1) * k:][:k]
                 for r in range(L)]
        torch.add(piece[0], piece[1], out=self.chunk)
        for r in range(2, L):
            self.chunk.add_(piece[r])

    def after(self):
        if self.op == "reduce_scatter":
            return
        source = self.chunk if self.op == "all_reduce" else self.gathered
        L, k, me = self.L, self.k, dist.get_rank(self.group)
        send = source
        if L > 2:
            send = self.pieces[:(L - 1) * k].view(L - 1, k)
            send.copy_(source.expand(L - 1, k))
        splits = [0 if r == me else k for r in range(L)]
        received = self.staging[:(L - 1) * k]
        dist.all_to_all_single(received, send.reshape(-1), splits, splits, group=self.group)
        n = self.tensor.numel()
        for r in range(L):
            piece = source if r == me else received[(r if r < me else r - 1) * k:][:k]
            start = min(r * k, n)
            self.tensor[start:start + min(k, n - start)].copy_(piece[:min(k, n - start)])

    def compressed(self, group):
        """The node phases as fp8gloo's flat collectives on `group`."""
        if self.op != "all_gather":
            source = self.input
            if self.staging.numel() > source.numel():  # all_reduce's padding
                self.staging.narrow(0, 0, source.numel()).copy_(source)
                self.staging.narrow(0, source.numel(), self.staging.numel() - source.numel()).zero_()
                source = self.staging
            dist.reduce_scatter_tensor(self.chunk, source, group=group)
        if self.op != "reduce_scatter":
            gathered = self.staging if self.op == "all_reduce" else self.tensor
            dist.all_gather_into_tensor(gathered, self.chunk if self.op == "all_reduce" else self.gathered,
                                        group=group)
            if self.op == "all_reduce":
                self.tensor.copy_(gathered[:self.tensor.numel()])

    def check(self):
        """The phases' result against plain gloo's collective on the node;
        the pieces are added in rank order, as gloo may not, so sums compare
        to a few roundings of their dtype (a wrong split or slice is off by
        whole values)."""
        if self.op == "all_gather":
            expected = torch.empty(self.L * self.k, dtype=self.tensor.dtype)
            dist.all_gather_into_tensor(expected, self.gathered, group=self.group)
            ok = torch.equal(self.tensor, expected[:self.tensor.numel()])
        else:
            tol = max(1e-2, 4 * torch.finfo(self.input.dtype).eps)
            summed = self.input.clone()
            dist.all_reduce(summed, group=self.group)
            if self.op == "all_reduce":
                ok = torch.allclose(self.tensor.float(), summed.float(), rtol=tol, atol=tol)
            else:
                mine = dist.get_rank(self.group) * self.k
                ok = torch.allclose(self.chunk.float(), summed[mine:mine + self.k].float(), rtol=tol, atol=tol)
        if not ok:
            raise SystemExit(f"node_phases: the {self.op} phases' result differs from gloo's on the node")


def timed(phase) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    phase()
    return time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", required=True, help="OP:BYTES[:DTYPE],... (e.g. all_reduce:64M,all_gather:64M:bfloat16)")
    p.add_argument("--check", action="store_true", help="also compare each case's result with gloo's on the node")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--local-size", type=int, default=int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    p.add_argument("--json", metavar="PATH", help="rank 0 writes {cases: [{op, bytes, median_s, times_s}]}")
    p.add_argument("--wire-format", help="also time the phases compressed in this format (fp8gloo on the node)")
    args = p.parse_args(argv)
    dist.init_process_group("gloo")
    world, rank, L = dist.get_world_size(), dist.get_rank(), args.local_size
    if L < 2 or world % L:
        raise SystemExit(f"node_phases: needs nodes of at least 2 ranks dividing the world ({world}); got {L}")
    nodes = world // L
    groups = [dist.new_group(list(range(b * L, (b + 1) * L))) for b in range(nodes)]
    fp8_groups = None
    if args.wire_format:
        import fp8comm

        options = fp8comm.Options(wire_format=args.wire_format, compress="all")
        fp8_groups = [dist.new_group(list(range(b * L, (b + 1) * L)), backend="fp8gloo", pg_options=options)
                      for b in range(nodes)]
    cases = []
    for case in args.cases.split(","):
        op, size, dtype_name = (case.split(":") + ["float32"])[:3]
        dtype = getattr(torch, dtype_name)
        phases = NodePhases(op, parse_size(size) // dtype.itemsize, dtype, groups[rank // L], L)
        # Warm-up: first touch of the buffers, gloo's connections.
        phases.before()
        phases.after()
        if args.check:
            phases.check()
        group8 = fp8_groups[rank // L] if fp8_groups else None
        if group8 is not None:
            phases.compressed(group8)  # warm-up
        times, compressed = [], []
        for _ in range(args.reps):
            times.append(timed(phases.before) + timed(phases.after))
            if group8 is not None:
                compressed.append(timed(lambda: phases.compressed(group8)))
        case_result = {"op": op, "bytes": parse_size(size), "dtype": dtype_name,
                       "median_s": statistics.median(times), "times_s": times}
        line = f"node_phases {op} {parse_size(size) >> 20} MiB: {statistics.median(times) * 1e3:.1f} ms"
        if compressed:
            case_result.update(wire_format=args.wire_format, compressed_median_s=statistics.median(compressed),
                               compressed_times_s=compressed)
            line += f", {args.wire_format} {statistics.median(compressed) * 1e3:.1f} ms"
        cases.append(case_result)
        if rank == 0:
            print(f"{line} ({nodes} nodes x {L} ranks)", flush=True)
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "node_phases", "date": time.strftime("%Y-%m-%d"),
                       "command": f"torchrun --nnodes 1 --nproc_per_node {world} bench/node_phases.py "
                                  + " ".join(sys.argv[1:]),
                       "torch": torch.__version__, "nodes": nodes, "local_size": L, "cases": cases}, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
