"""Forward + backward time of Fp8Linear vs nn.Linear and torchao's Float8Linear,
eager and under torch.compile, on Llama-3-8B shapes; and the FP8 casts alone:
the fused operator (torch.ops.fp8comm.cast_fp8) vs the eager torch chain it
replaces.

    python bench/linear.py [--json PATH] [--quick] [--casts | --casts-only] [--compile | --no-compile]
                           [--cast-sets legacy,tiled]

Shapes (tokens x in -> out): 8192 and 16384 tokens through 4096->14336,
14336->4096 and 4096->4096. On CUDA each shape times, interleaved rep by rep,
nn.Linear in BF16 (the baseline, eager and compiled), Fp8Linear with the
eager casts and with the fused cast kernels (FP8COMM_FUSED_CAST toggled
around each step; with each CUDA cast kernel set of --cast-sets,
FP8COMM_CUDA_CAST toggled likewise: "fused" is the legacy set, "fused-tiled"
the tiled one) for each recipe, Fp8Linear compiled, and torchao's
Float8Linear (tensorwise and rowwise) compiled, as torchao recommends, and
eager; times are CUDA events, the median of --reps after warm-up. A variant
that fails to build or compile is reported with its error, not timed. On the
CPU (tiny shapes, a smoke test) the baseline is FP32, the casts are always
the fused CPU twin, and nothing is compiled unless --compile. Goal (GPU):
>= 1.5x BF16 at the largest shapes, and not slower than torchao compiled.

Casts: each row is one cast as Fp8Linear issues it (recipe, with the data
and/or the transpose), timed for the eager chain (scaling.eager_cast_fp8,
which makes the transpose with .t().contiguous()) and for the fused operator
(called directly, whatever FP8COMM_FUSED_CAST says; on CUDA once per kernel
set of --cast-sets, a row each), median of --reps. Two rates:
`floor_gb_per_s` counts the bytes a one-pass cast must move (x read once, one
byte per FP8 element written); `moved_gb_per_s` the bytes the fused kernels
really move: x once per pass they make over it (`input_passes`, see
input_passes()), the outputs once.
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
from fp8comm.nn import RECIPES, Fp8Linear
from fp8comm import _C
from fp8comm.nn.scaling import FUSED_CAST_ENV, eager_cast_fp8, fused_cast_enabled

SHAPES = [(t, i, o) for t in (8192, 16384) for (i, o) in ((4096, 14336), (14336, 4096), (4096, 4096))]
QUICK_SHAPES = [(256, 256, 512), (256, 512, 256)]
CAST_SHAPES_GPU = [(8192, 4096), (16384, 4096), (16384, 14336)]
CAST_SHAPES_CPU = [(1024, 1024), (4096, 2048)]
QUICK_CAST_SHAPES = [(256, 512)]
# (recipe, with_data, with_transpose): the casts Fp8Linear issues
CAST_MODES = [("tensorwise", True, False), ("tensorwise", True, True), ("rowwise", True, False),
              ("rowwise", True, True), ("rowwise", False, True)]


# The CUDA cast kernel sets, chosen per call by this variable (csrc/common/env.h).
CAST_SET_ENV = "FP8COMM_CUDA_CAST"
CAST_SETS = ("legacy", "tiled")
TORCHAO_RECIPES = ("tensorwise", "rowwise")


def torchao_linear(linear: nn.Linear, recipe: str):
    """torchao's Float8Linear of `linear`; None without torchao or for a recipe it lacks."""
    if recipe not in TORCHAO_RECIPES:
        return None
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError:
        return None
    model = nn.Sequential(copy.deepcopy(linear))
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe))
    return model


def compiled(module: nn.Module, x, grad):
    """torch.compile(module) after one forward + backward (so a compile error
    surfaces here, named, instead of in the timed loop)."""
    c = torch.compile(module)
    x.grad = None
    c(x).backward(grad)
    return c


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


def input_passes(cast_set: str | None, recipe: str, with_transpose: bool) -> int:
    """Passes the fused cast kernels make over x when no amax is given (every
    cast this bench times). The CPU twin (cast_set None) and the legacy CUDA
    set: an amax pass, then the cast pass (the legacy rowwise row kernel reads
    each row twice). The tiled set: rowwise without the transpose holds each row
    in registers (one pass); the rest an amax pass and a cast pass."""
    return 1 if cast_set == "tiled" and recipe == "rowwise" and not with_transpose else 2


def cast_env(cast_set: str | None) -> dict | None:
    """The variables that send Fp8Linear's casts through the fused kernels of
    `cast_set` (None: leave the environment as it is)."""
    return None if cast_set is None else {FUSED_CAST_ENV: "1", CAST_SET_ENV: cast_set}


@contextlib.contextmanager
def environment(env: dict | None):
    """os.environ updated by `env` inside the block (None: unchanged); the
    variables are read at every cast, so the switch takes effect at once."""
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v


def time_fwd_bwd_interleaved(variants, x, grad, reps, device) -> dict:
    """Median forward + backward seconds of each (name, module, env) variant
    (env: the variables set around its steps, or None), their steps
    interleaved rep by rep (alternating the order), so that every variant sees
    the same clocks and neighbours."""

    def step(module, env):
        with environment(env):
            x.grad = None
            module(x).backward(grad)

    for _, module, env in variants:
        for _ in range(3):
            step(module, env)
    times = {name: [] for name, _, _ in variants}
    for i in range(reps):
        for name, module, env in (variants if i % 2 == 0 else variants[::-1]):
            times[name].append(timed(lambda: step(module, env), device))
    return {name: statistics.median(ts) for name, ts in times.items()}


def time_call(fn, reps, device) -> float:
    for _ in range(3):
        fn()
    return statistics.median(timed(fn, device) for _ in range(reps))


def bench_casts(device, dtypes, shapes, reps, cast_sets=(None,)) -> list:
    """One row per cast, dtype, shape and kernel set (None: the one set there is)."""
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
                written = x.numel() * (int(with_data) + int(with_t))
                floor = x.numel() * x.element_size() + written
                what = "+".join(n for n, on in (("data", with_data), ("transpose", with_t)) if on)
                for cast_set in cast_sets:
                    with environment(None if cast_set is None else {CAST_SET_ENV: cast_set}):
                        t_fused = time_call(fused, reps, device)
                    passes = input_passes(cast_set, recipe, with_t)
                    moved = passes * x.numel() * x.element_size() + written
                    rows.append({"m": m, "k": k, "dtype": str(dtype)[6:], "recipe": recipe, "outputs": what,
                                 "cast_set": cast_set, "eager_s": t_eager, "fused_s": t_fused,
                                 "speedup": t_eager / t_fused, "floor_gb_per_s": floor / t_fused / 1e9,
                                 "moved_gb_per_s": moved / t_fused / 1e9, "input_passes": passes})
                    print(f"cast {m:6d} x {k:5d} {str(dtype)[6:]:8s} {recipe:10s} {what:15s} "
                          f"{cast_set or 'cpu':6s} eager {t_eager * 1e3:8.3f} ms  fused {t_fused * 1e3:8.3f} ms"
                          f"  x{t_eager / t_fused:5.2f}  ({floor / t_fused / 1e9:6.1f} GB/s one-pass floor,"
                          f" {moved / t_fused / 1e9:6.1f} moved in {passes} pass{'es' if passes > 1 else ''})",
                          flush=True)
    return rows


def check_cast_sets(names: list[str]) -> list[str]:
    """--cast-sets: known names, and a build that reads FP8COMM_CUDA_CAST when
    more than the legacy set is asked for."""
    unknown = [n for n in names if n not in CAST_SETS]
    if unknown:
        raise SystemExit(f"bench/linear.py: --cast-sets takes {', '.join(CAST_SETS)}; got {', '.join(unknown)}")
    declared = {name for name, _, _ in _C.environment_variables()}
    if names != ["legacy"] and CAST_SET_ENV not in declared:
        raise SystemExit(f"bench/linear.py: this build of fp8comm does not read {CAST_SET_ENV} (csrc/common/env.h), "
                         "so it has one CUDA cast kernel set; run with --cast-sets legacy, or rebuild")
    return names


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--recipes", default="tensorwise,rowwise")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--casts", action="store_true", help="also benchmark the casts alone")
    p.add_argument("--casts-only", action="store_true", help="only the cast benchmark")
    p.add_argument("--compile", dest="compile", action="store_true", default=None,
                   help="also time the compiled variants (the default on CUDA)")
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument("--cast-sets", default=",".join(CAST_SETS),
                   help=f"CUDA only: comma list of {CAST_SET_ENV} values whose fused casts are timed side by side "
                        "(each a variant of its own; default: both)")
    p.add_argument("--compile-shapes", default="all",
                   help="shapes that get the compiled variants (each shape compiles anew): 'all' or a comma list "
                        "of TOKENSxINxOUT")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shapes = QUICK_SHAPES if args.quick or device.type == "cpu" else SHAPES
    reps = 3 if args.quick else args.reps
    recipes = args.recipes.split(",")
    compile_all = device.type == "cuda" if args.compile is None else args.compile
    # On CUDA the casts run fused unless FP8COMM_FUSED_CAST=0: both are timed,
    # the fused ones with each kernel set of --cast-sets ("fused": the legacy
    # set, "fused-<set>" another). On the CPU they always run fused (the CPU
    # twin), so there is one FP8 variant.
    cast_sets = check_cast_sets(args.cast_sets.split(",")) if device.type == "cuda" else [None]
    cast_modes = [("eager", {FUSED_CAST_ENV: "0"})] if device.type == "cuda" else []
    cast_modes += [("fused" if s in (None, "legacy") else f"fused-{s}", cast_env(s)) for s in cast_sets]
    default_env = dict(cast_modes).get("fused", cast_modes[-1][1])
    base_name = str(dtype)[6:]
    rows = []
    if not args.casts_only:
        print(f"{'tokens x in -> out':24s} {'recipe':10s} {base_name + ' ms':>10s} "
              + " ".join(f"{'fp8 ' + m + ' ms':>14s} {'x':>5s}" for m, _ in cast_modes + [("compiled", 0)] * compile_all)
              + "  torchao ms  compiled", flush=True)
    for tokens, fin, fout in ([] if args.casts_only else shapes):
        base = nn.Linear(fin, fout, bias=False, device=device, dtype=dtype)
        x = torch.randn(tokens, fin, device=device, dtype=dtype, requires_grad=True)
        grad = torch.randn(tokens, fout, device=device, dtype=dtype)
        variants, errors = [(base_name, base, None)], {}

        def add(name, make, env=None):
            try:
                module = make()
            except Exception as e:  # noqa: BLE001  (reported in the row, the others still timed)
                errors[name] = f"{type(e).__name__}: {e}"[:500]
                return
            if module is not None:
                variants.append((name, module, env))

        compile_ = compile_all and (args.compile_shapes == "all"
                                    or f"{tokens}x{fin}x{fout}" in args.compile_shapes.split(","))
        if compile_:
            add(f"{base_name}-compiled", lambda: compiled(base, x, grad))
        for recipe in recipes:
            ours = Fp8Linear.from_linear(copy.deepcopy(base), recipe=recipe)
            # the delayed recipe's fused cast (cast_fp8_scaled) is the tiled kernels' whatever the set: no pair
            modes = [m for m in cast_modes if not (RECIPES[recipe].delayed and m[0].startswith("fused-"))]
            variants += [(f"{recipe}-{mode}", ours, env) for mode, env in modes]
            if compile_:
                add(f"{recipe}-compiled", lambda: compiled(Fp8Linear.from_linear(copy.deepcopy(base), recipe=recipe),
                                                           x, grad), env=default_env)
            if device.type == "cuda":
                add(f"{recipe}-torchao", lambda: torchao_linear(base, recipe))
                if compile_:
                    add(f"{recipe}-torchao-compiled",
                        lambda: None if torchao_linear(base, recipe) is None else compiled(
                            torchao_linear(base, recipe), x, grad))
        t = time_fwd_bwd_interleaved(variants, x, grad, reps, device)
        t_base = t[base_name]
        t_base_c = t.get(f"{base_name}-compiled")
        for recipe in recipes:
            fp8 = {mode: t[f"{recipe}-{mode}"] for mode, _ in cast_modes if f"{recipe}-{mode}" in t}
            if f"{recipe}-compiled" in t:
                fp8["compiled"] = t[f"{recipe}-compiled"]
            t_ao, t_ao_c = t.get(f"{recipe}-torchao"), t.get(f"{recipe}-torchao-compiled")
            rows.append({"tokens": tokens, "in": fin, "out": fout, "recipe": recipe, "dtype": base_name,
                         "baseline_s": t_base, "baseline_compiled_s": t_base_c, "fp8comm_s": fp8,
                         "torchao_s": t_ao, "torchao_compiled_s": t_ao_c,
                         "speedup_vs_baseline": {mode: t_base / s for mode, s in fp8.items()},
                         "torchao_compiled_speedup_vs_baseline": t_base / t_ao_c if t_ao_c else None,
                         "speedup_vs_torchao": {mode: t_ao / s for mode, s in fp8.items()} if t_ao else None,
                         "speedup_vs_torchao_compiled": ({mode: t_ao_c / s for mode, s in fp8.items()}
                                                         if t_ao_c else None),
                         "errors": {k: v for k, v in errors.items() if k.startswith(recipe) or k.startswith(base_name)}})
            print(f"{f'{tokens} x {fin} -> {fout}':24s} {recipe:10s} {t_base * 1e3:10.3f} "
                  + " ".join(f"{s * 1e3:14.3f} {t_base / s:5.2f}" for s in fp8.values())
                  + (f"  {t_ao * 1e3:8.3f}" if t_ao else "  -")
                  + (f"  {t_ao_c * 1e3:8.3f} ({t_base / t_ao_c:4.2f}x)" if t_ao_c else "  -"), flush=True)
        for name, error in errors.items():
            print(f"  {name}: not timed ({error})", flush=True)
    cast_rows = []
    if args.casts or args.casts_only:
        cast_shapes = QUICK_CAST_SHAPES if args.quick else (CAST_SHAPES_GPU if device.type == "cuda" else CAST_SHAPES_CPU)
        cast_dtypes = [torch.bfloat16] if device.type == "cuda" else [torch.float32, torch.bfloat16]
        cast_rows = bench_casts(device, cast_dtypes, cast_shapes, reps, cast_sets)
    result = {"benchmark": "linear", "date": datetime.date.today().isoformat(),
              "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
              "device": device_label(device.type == "cuda"),
              "torch": torch.__version__, "baseline": f"nn.Linear {str(dtype)[6:]}",
              "fp8_variants": {mode: ("eager casts" if env and env.get(FUSED_CAST_ENV) == "0" else
                                      f"fused casts ({(env or {}).get(CAST_SET_ENV, 'cpu twin')} kernels)")
                               for mode, env in cast_modes},
              "cast_sets": cast_sets,
              "fused_cast": fused_cast_enabled(device), "rows": rows, "casts": cast_rows}
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
