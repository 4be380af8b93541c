"""Forward + backward time of Fp8Linear vs nn.Linear (and torchao's Float8Linear
when importable), on Llama-3-8B shapes; and the FP8 casts alone: the fused
operator (torch.ops.fp8comm.cast_fp8) vs the eager torch chain it replaces.

    python bench/linear.py [--json PATH] [--quick] [--casts | --casts-only]

Shapes (tokens x in -> out): 8192 and 16384 tokens through 4096->14336,
14336->4096 and 4096->4096. On CUDA the baseline is nn.Linear in BF16, times
are CUDA events (median of --reps after warm-up); on the CPU (--quick, tiny
shapes, a smoke test) the baseline is FP32. Goal (GPU): >= 1.5x BF16 at the
largest shapes, and not slower than torchao.

Casts: each row is one cast as Fp8Linear issues it (recipe, with the data
and/or the transpose), timed for the eager chain (scaling.eager_cast_fp8,
which makes the transpose with .t().contiguous()) and for the fused operator
(called directly, whatever FP8COMM_FUSED_CAST says), median of --reps. GB/s
counts the bytes the fused cast must move: x read once, one byte per FP8
element written.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn

from fp8comm.bench import device_label
from fp8comm.nn import Fp8Linear
from fp8comm.nn.scaling import eager_cast_fp8, fused_cast_enabled

SHAPES = [(t, i, o) for t in (8192, 16384) for (i, o) in ((4096, 14336), (14336, 4096), (4096, 4096))]
QUICK_SHAPES = [(256, 256, 512), (256, 512, 256)]
CAST_SHAPES_GPU = [(8192, 4096), (16384, 4096), (16384, 14336)]
CAST_SHAPES_CPU = [(1024, 1024), (4096, 2048)]
QUICK_CAST_SHAPES = [(256, 512)]
# (recipe, with_data, with_transpose): the casts Fp8Linear issues
CAST_MODES = [("tensorwise", True, False), ("tensorwise", True, True), ("rowwise", True, False),
              ("rowwise", True, True), ("rowwise", False, True)]


def torchao_linear(linear: nn.Linear, recipe: str):
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError:
        return None
    model = nn.Sequential(copy.deepcopy(linear))
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe))
    return model


def time_fwd_bwd(module, x, grad, reps, device) -> float:
    def step():
        x.grad = None
        module(x).backward(grad)

    for _ in range(3):
        step()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_call(fn, reps, device) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_casts(device, dtypes, shapes, reps) -> list:
    rows = []
    for dtype in dtypes:
        for m, k in shapes:
            x = torch.randn(m, k, device=device, dtype=dtype)
            for recipe, with_data, with_t in CAST_MODES:
                rowwise = recipe == "rowwise"
                f8 = torch.float8_e4m3fn

                def eager():
                    return eager_cast_fp8(x, f8, rowwise, with_data=with_data, with_transpose=with_t)

                def fused():
                    return torch.ops.fp8comm.cast_fp8(x, f8, rowwise, with_data, with_t, None)

                t_eager = time_call(eager, reps, device)
                t_fused = time_call(fused, reps, device)
                moved = x.numel() * (x.element_size() + int(with_data) + int(with_t))
                what = "+".join(n for n, on in (("data", with_data), ("transpose", with_t)) if on)
                rows.append({"m": m, "k": k, "dtype": str(dtype)[6:], "recipe": recipe, "outputs": what,
                             "eager_s": t_eager, "fused_s": t_fused, "speedup": t_eager / t_fused,
                             "fused_gb_per_s": moved / t_fused / 1e9})
                print(f"cast {m:6d} x {k:5d} {str(dtype)[6:]:8s} {recipe:10s} {what:15s} eager {t_eager * 1e3:8.3f} ms"
                      f"  fused {t_fused * 1e3:8.3f} ms  x{t_eager / t_fused:5.2f}"
                      f"  ({moved / t_fused / 1e9:6.1f} GB/s)", flush=True)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--recipes", default="tensorwise,rowwise")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--casts", action="store_true", help="also benchmark the casts alone")
    p.add_argument("--casts-only", action="store_true", help="only the cast benchmark")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shapes = QUICK_SHAPES if args.quick or device.type == "cpu" else SHAPES
    reps = 3 if args.quick else args.reps
    rows = []
    for tokens, fin, fout in ([] if args.casts_only else shapes):
        base = nn.Linear(fin, fout, bias=False, device=device, dtype=dtype)
        x = torch.randn(tokens, fin, device=device, dtype=dtype, requires_grad=True)
        grad = torch.randn(tokens, fout, device=device, dtype=dtype)
        t_base = time_fwd_bwd(base, x, grad, reps, device)
        for recipe in args.recipes.split(","):
            ours = Fp8Linear.from_linear(copy.deepcopy(base), recipe=recipe)
            t_ours = time_fwd_bwd(ours, x, grad, reps, device)
            ao = torchao_linear(base, recipe) if device.type == "cuda" else None
            t_ao = time_fwd_bwd(ao, x, grad, reps, device) if ao is not None else None
            rows.append({"tokens": tokens, "in": fin, "out": fout, "recipe": recipe, "dtype": str(dtype)[6:],
                         "baseline_s": t_base, "fp8comm_s": t_ours, "torchao_s": t_ao,
                         "speedup_vs_baseline": t_base / t_ours,
                         "speedup_vs_torchao": (t_ao / t_ours) if t_ao else None})
            print(f"{tokens:6d} x {fin:5d} -> {fout:5d} {recipe:10s} base {t_base * 1e3:8.3f} ms  "
                  f"fp8comm {t_ours * 1e3:8.3f} ms  x{t_base / t_ours:5.2f}"
                  + (f"  torchao {t_ao * 1e3:8.3f} ms" if t_ao else ""), flush=True)
    cast_rows = []
    if args.casts or args.casts_only:
        cast_shapes = QUICK_CAST_SHAPES if args.quick else (CAST_SHAPES_GPU if device.type == "cuda" else CAST_SHAPES_CPU)
        cast_dtypes = [torch.bfloat16] if device.type == "cuda" else [torch.float32, torch.bfloat16]
        cast_rows = bench_casts(device, cast_dtypes, cast_shapes, reps)
    result = {"benchmark": "linear", "date": datetime.date.today().isoformat(),
              "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
              "device": device_label(device.type == "cuda"),
              "torch": torch.__version__, "baseline": f"nn.Linear {str(dtype)[6:]}",
              "fused_cast": fused_cast_enabled(device), "rows": rows, "casts": cast_rows}
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
