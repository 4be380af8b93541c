"""SQNR of one quantization and of every compressed collective against an
exact FP64 result, per op, dtype and wire format, through the real backend.

    torchrun --nproc_per_node=2 bench/accuracy.py [--numel N] [--formats e4m3,e5m2,mxfp4] [--json PATH]

Inputs are randn per rank, and DESIGN.md's mixed bucket (nine layers from
1e-6 to 1e2 in one tensor). The FP64 reference passes through the fp8 group
uncompressed, so it is exact.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys

import torch
import torch.distributed as dist

import fp8comm
from fp8comm.bench import all_gather_single, reduce_scatter_single


def sqnr_db(ref, got):
    err = (got.double() - ref).pow(2).sum().item()
    return float("inf") if err == 0 else 10 * math.log10(ref.pow(2).sum().item() / err)


def inputs(kind, n, rank):
    gen = torch.Generator().manual_seed(rank)
    if kind == "randn":
        return torch.randn(n, generator=gen)
    layer = n // 9
    return torch.cat([torch.randn(layer, generator=gen) * 10.0**k for k in range(-6, 3)])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--numel", type=int, default=1 << 20)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--formats", default="e4m3,e5m2,mxfp4", help="comma list of wire formats")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    n = 9 * 4096 if args.quick else args.numel
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    n = n // (world * 9) * world * 9
    rows = []
    for fmt in args.formats.split(","):
        g = dist.new_group(backend="fp8gloo", pg_options=fp8comm.Options(min_numel=0, compress="all", wire_format=fmt))
        for dtype in (torch.float32, torch.bfloat16):
            for kind in ("randn", "bucket"):
                x = inputs(kind, n, rank).to(dtype)
                for op in ("quantize", "all_reduce", "reduce_scatter", "all_gather"):
                    if op == "quantize":  # one round trip through the codec, this rank's input
                        q = fp8comm.quantize(x, wire_format=fmt)
                        got, exact = fp8comm.dequantize(*q, wire_format=fmt, dtype=dtype, numel=n), x.double()
                    elif op == "all_reduce":
                        got, exact = x.clone(), x.double()
                        dist.all_reduce(got, group=g)
                        dist.all_reduce(exact, group=g)
                    elif op == "reduce_scatter":
                        got = torch.empty(n // world, dtype=dtype)
                        exact = torch.empty(n // world, dtype=torch.float64)
                        reduce_scatter_single(got, x, group=g)
                        reduce_scatter_single(exact, x.double(), group=g)
                    else:
                        got = torch.empty(n * world, dtype=dtype)
                        exact = torch.empty(n * world, dtype=torch.float64)
                        all_gather_single(got, x, group=g)
                        all_gather_single(exact, x.double(), group=g)
                    row = {"format": fmt, "dtype": str(dtype)[6:], "input": kind, "op": op, "sqnr_db": sqnr_db(exact, got)}
                    if kind == "bucket":  # the worst of the nine layers
                        layer = exact.numel() // 9 if op != "all_gather" else n // 9
                        parts = [(exact[i : i + layer], got[i : i + layer]) for i in range(0, exact.numel() - layer + 1, layer)]
                        row["worst_layer_sqnr_db"] = min(sqnr_db(e, q) for e, q in parts)
                    rows.append(row)
    if rank == 0:
        print(f"SQNR (dB) vs exact FP64, {world} ranks, {n} elements per rank, block 32")
        print(f"{'format':6s} {'dtype':9s} {'input':7s} {'op':15s} {'SQNR':>6s} {'worst layer':>11s}")
        for r in rows:
            worst = f"{r['worst_layer_sqnr_db']:11.1f}" if "worst_layer_sqnr_db" in r else " " * 11
            print(f"{r['format']:6s} {r['dtype']:9s} {r['input']:7s} {r['op']:15s} {r['sqnr_db']:6.1f} {worst}")
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as f:
                json.dump({"benchmark": "accuracy", "date": datetime.date.today().isoformat(),
                           "command": " ".join(["torchrun", f"--nproc_per_node={world}"] + sys.argv),
                           "torch": torch.__version__, "world_size": world, "numel": n, "rows": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
