"""Forward + backward time of Fp8Linear vs nn.Linear (and torchao's Float8Linear
when importable), on Llama-3-8B shapes; and the FP8 casts alone: the fused
operator (torch.ops.fp8comm.cast_fp8) vs the eager torch chain it replaces.

    python bench/linear.py [--json PATH] [--quick] [--casts | --casts-only]

Shapes (tokens x in -> out): 8192 and 16384 tokens through 4096->14336,
14336->4096 and 4096->4096. On CUDA each shape times, interleaved rep by rep,
nn.Linear in BF16 (the baseline), Fp8Linear with the eager casts and with the
fused cast kernels (FP8COMM_FUSED_CAST toggled around each step), for each
recipe, and torchao's Float8Linear when importable; times are CUDA events,
the median of --reps after warm-up. On the CPU (tiny shapes, a smoke test)
the baseline is FP32 and the casts are always the fused CPU twin. Goal (GPU):
>= 1.5x BF16 at the largest shapes, and not slower than torchao.

Casts: each row is one cast as Fp8Linear issues it (recipe, with the data
and/or the transpose), timed for the eager chain (scaling.eager_cast_fp8,
which makes the transpose with .t().contiguous()) and for the fused operator
(called directly, whatever FP8COMM_FUSED_CAST says), median of --reps. GB/s
counts the bytes the fused cast must move: x read once, one byte per FP8
element written.
"""
from __future__ import annotations

import argparse
import contextlib
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
from fp8comm.nn.scaling import FUSED_CAST_ENV, eager_cast_fp8, fused_cast_enabled

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


def timed(fn, device) -> float:
    """Seconds of one call of fn: CUDA events on a GPU, the wall clock on the CPU."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


@contextlib.contextmanager
def fused_casts(on: bool | None):
    """Fp8Linear's casts on CUDA through the fused kernels (on=True) or the eager
    chain (False), whatever the environment says; None leaves it as it is."""
    if on is None:
        yield
        return
    saved = os.environ.get(FUSED_CAST_ENV)
    os.environ[FUSED_CAST_ENV] = "1" if on else "0"
    try:
        yield
    finally:
        if saved is None:
            del os.environ[FUSED_CAST_ENV]
        else:
            os.environ[FUSED_CAST_ENV] = saved


def time_fwd_bwd_interleaved(variants, x, grad, reps, device) -> dict:
    """Median forward + backward seconds of each (name, module, fused) variant,
    their steps interleaved rep by rep (alternating the order), so that every
    variant sees the same clocks and neighbours."""

    def step(module, fused):
        with fused_casts(fused):
            x.grad = None
            module(x).backward(grad)

    for _, module, fused in variants:
        for _ in range(3):
            step(module, fused)
    times = {name: [] for name, _, _ in variants}
    for i in range(reps):
        for name, module, fused in (variants if i % 2 == 0 else variants[::-1]):
            times[name].append(timed(lambda: step(module, fused), device))
    return {name: statistics.median(ts) for name, ts in times.items()}


def time_call(fn, reps, device) -> float:
    for _ in range(3):
        fn()
    return statistics.median(timed(fn, device) for _ in range(reps))


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
    recipes = args.recipes.split(",")
    # On CUDA the casts run fused unless FP8COMM_FUSED_CAST=0: both are timed.
    # On the CPU they always run fused (the CPU twin), so there is one FP8 variant.
    cast_modes = [("eager", False), ("fused", True)] if device.type == "cuda" else [("fused", None)]
    base_name = str(dtype)[6:]
    rows = []
    if not args.casts_only:
        print(f"{'tokens x in -> out':24s} {'recipe':10s} {base_name + ' ms':>10s} "
              + " ".join(f"{'fp8 ' + m + ' ms':>14s} {'x':>5s}" for m, _ in cast_modes) + "  torchao ms", flush=True)
    for tokens, fin, fout in ([] if args.casts_only else shapes):
        base = nn.Linear(fin, fout, bias=False, device=device, dtype=dtype)
        x = torch.randn(tokens, fin, device=device, dtype=dtype, requires_grad=True)
        grad = torch.randn(tokens, fout, device=device, dtype=dtype)
        variants = [(base_name, base, None)]
        for recipe in recipes:
            ours = Fp8Linear.from_linear(copy.deepcopy(base), recipe=recipe)
            variants += [(f"{recipe}-{mode}", ours, fused) for mode, fused in cast_modes]
            ao = torchao_linear(base, recipe) if device.type == "cuda" else None
            if ao is not None:
                variants.append((f"{recipe}-torchao", ao, None))
        t = time_fwd_bwd_interleaved(variants, x, grad, reps, device)
        t_base = t[base_name]
        for recipe in recipes:
            fp8 = {mode: t[f"{recipe}-{mode}"] for mode, _ in cast_modes}
            t_ao = t.get(f"{recipe}-torchao")
            rows.append({"tokens": tokens, "in": fin, "out": fout, "recipe": recipe, "dtype": base_name,
                         "baseline_s": t_base, "fp8comm_s": fp8, "torchao_s": t_ao,
                         "speedup_vs_baseline": {mode: t_base / s for mode, s in fp8.items()},
                         "speedup_vs_torchao": {mode: t_ao / s for mode, s in fp8.items()} if t_ao else None})
            print(f"{f'{tokens} x {fin} -> {fout}':24s} {recipe:10s} {t_base * 1e3:10.3f} "
                  + " ".join(f"{s * 1e3:14.3f} {t_base / s:5.2f}" for s in fp8.values())
                  + (f"  {t_ao * 1e3:8.3f}" if t_ao else "  -"), flush=True)
    cast_rows = []
    if args.casts or args.casts_only:
        cast_shapes = QUICK_CAST_SHAPES if args.quick else (CAST_SHAPES_GPU if device.type == "cuda" else CAST_SHAPES_CPU)
        cast_dtypes = [torch.bfloat16] if device.type == "cuda" else [torch.float32, torch.bfloat16]
        cast_rows = bench_casts(device, cast_dtypes, cast_shapes, reps)
    result = {"benchmark": "linear", "date": datetime.date.today().isoformat(),
              "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
              "device": device_label(device.type == "cuda"),
              "torch": torch.__version__, "baseline": f"nn.Linear {str(dtype)[6:]}",
              "fp8_variants": {mode: ("fused casts" if fused is not False else "eager casts")
                               for mode, fused in cast_modes},
              "fused_cast": fused_cast_enabled(device), "rows": rows, "casts": cast_rows}
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
