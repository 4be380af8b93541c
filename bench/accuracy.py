"""SQNR of one quantization and of every compressed collective against an
exact FP64 result, per op, dtype and wire format, through the real backend.

    torchrun --nproc_per_node=2 bench/accuracy.py [--numel N] [--formats e4m3,nvfp4] [--json PATH]

Inputs are randn per rank, Student-t with 3 degrees of freedom (heavy tails,
as gradients have), and DESIGN.md's mixed bucket (nine layers from 1e-6 to
1e2 in one tensor). The FP64 reference passes through the fp8 group
uncompressed, so it is exact. Every format (all of fp8comm.codec.WIRE_FORMATS
unless --formats) at its default block size; the first table puts the formats
side by side (one quantization, and the bytes per element a segment of
--numel elements takes on the wire) so a user can choose.
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


INPUTS = ("randn", "student_t3", "bucket")


def inputs(kind, n, rank):
    gen = torch.Generator().manual_seed(rank)
    if kind == "randn":
        return torch.randn(n, generator=gen)
    if kind == "student_t3":  # t = z / sqrt(chi2_3 / 3)
        z = torch.randn(n, generator=gen, dtype=torch.float64)
        chi2 = torch.randn(3, n, generator=gen, dtype=torch.float64).pow(2).sum(0)
        return (z / (chi2 / 3).sqrt()).float()
    layer = n // 9
    return torch.cat([torch.randn(layer, generator=gen) * 10.0**k for k in range(-6, 3)])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--numel", type=int, default=1 << 20)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--formats", default=",".join(fp8comm.codec.WIRE_FORMATS), help="comma list of wire formats")
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
            for kind in INPUTS:
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
        side_by_side = []
        print(f"One quantization of float32 input, SQNR (dB) vs exact FP64, {n} elements; bytes on the wire")
        print(f"{'format':6s} {'block':>5s} {'Gaussian':>8s} {'t(3)':>6s} {'bucket, worst layer':>19s} "
              f"{'bytes/elem':>10s} {'of FP32':>7s}")
        for fmt in args.formats.split(","):
            one = {r["input"]: r for r in rows if r["format"] == fmt and r["dtype"] == "float32" and r["op"] == "quantize"}
            per_elem = fp8comm.codec.segment_bytes(n, wire_format=fmt) / n
            side_by_side.append({"format": fmt, "block_size": fp8comm.codec.default_block_size(fmt),
                                 "gaussian_db": one["randn"]["sqnr_db"], "student_t3_db": one["student_t3"]["sqnr_db"],
                                 "bucket_worst_layer_db": one["bucket"]["worst_layer_sqnr_db"],
                                 "bytes_per_element": per_elem, "of_fp32": per_elem / 4})
            r = side_by_side[-1]
            print(f"{fmt:6s} {r['block_size']:5d} {r['gaussian_db']:8.2f} {r['student_t3_db']:6.2f} "
                  f"{r['bucket_worst_layer_db']:19.1f} {per_elem:10.4f} {per_elem / 4:7.4f}")
        print()
        print(f"SQNR (dB) vs exact FP64, {world} ranks, {n} elements per rank, each format's default block")
        print(f"{'format':6s} {'dtype':9s} {'input':10s} {'op':15s} {'SQNR':>6s} {'worst layer':>11s}")
        for r in rows:
            worst = f"{r['worst_layer_sqnr_db']:11.1f}" if "worst_layer_sqnr_db" in r else " " * 11
            print(f"{r['format']:6s} {r['dtype']:9s} {r['input']:10s} {r['op']:15s} {r['sqnr_db']:6.1f} {worst}")
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as f:
                json.dump({"benchmark": "accuracy", "date": datetime.date.today().isoformat(),
                           "command": " ".join(["torchrun", f"--nproc_per_node={world}"] + sys.argv),
                           "torch": torch.__version__, "world_size": world, "numel": n,
                           "side_by_side": side_by_side, "rows": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
