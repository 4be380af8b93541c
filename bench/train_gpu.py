"""One training run on one GPU: a Llama-style model of about 1B parameters
under FSDP2 at world size 1, BF16 nn.Linear against fp8comm's Fp8Linear and
torchao's Float8Linear (compiled, as torchao recommends), tokens/s and loss.

    python bench/train_gpu.py [--steps 100] [--variants bf16,fp8comm,torchao-compiled] [--json PATH]
    python bench/train_gpu.py --smoke        # a tiny model on the CPU: the script's own test

Each variant trains the same model (examples/tiny_llama.py: dim 2048, 20
blocks, 16 heads, SwiGLU 5504, byte vocabulary: 1.0B parameters) from the same
seed on the same batches of the Python standard library's source text, with
AdamW, BF16 parameters and FP32 reduction (MixedPrecisionPolicy), over a
world-size-1 "cpu:gloo,cuda:fp8nccl" group. tokens/s is measured over the
steps after --warmup (compilation and autotuning excluded), with the device
synchronized at both ends; the loss of every step is kept, and the mean of the
last 10 is the figure compared. Variants:

    bf16              nn.Linear, eager
    bf16-compiled     nn.Linear, each block torch.compile'd
    fp8comm           Fp8Linear (tensorwise, fused casts, FP8 weight all-gather), eager
    fp8comm-compiled  the same, each block torch.compile'd
    fp8comm-<recipe>  Fp8Linear with another recipe (rowwise, delayed)
    torchao-compiled  torchao.float8 tensorwise, each block torch.compile'd
    torchao-rowwise-compiled

A variant that cannot be built here (no torchao, an unknown recipe) is
reported with the reason and skipped. World size 1 says nothing of the wire:
it measures compute (the FP8 GEMMs and casts) in a real training loop.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import fp8comm  # noqa: E402
from fp8comm.bench import device_label  # noqa: E402
from fp8comm.bench.comm import write_json  # noqa: E402
from tiny_llama import ByteBatches, ModelConfig, TinyLlama, stdlib_bytes  # noqa: E402

MODEL_1B = ModelConfig(dim=2048, layers=20, heads=16, max_seq=2048)
MODEL_SMOKE = ModelConfig(dim=64, layers=2, heads=4, max_seq=32)
DEFAULT_VARIANTS = "bf16,fp8comm,fp8comm-delayed,torchao-compiled"


def _fp8_filter(mod, fqn):
    return fqn.startswith("blocks.")  # the head and embedding stay high precision


def build(variant: str, cfg: ModelConfig, device):
    """The model of `variant`, sharded with FSDP2 over the default group; None
    and the reason when this machine cannot build it."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    model = TinyLlama(cfg).to(device)
    kind, _, rest = variant.partition("-")
    compiled = variant.endswith("-compiled")
    recipe = rest.removesuffix("compiled").strip("-") or "tensorwise"
    if kind == "fp8comm":
        try:
            fp8comm.convert_to_fp8(model, recipe=recipe, module_filter_fn=_fp8_filter,
                                   fp8_all_gather=recipe == "tensorwise")
        except (ValueError, TypeError) as e:
            return None, f"fp8comm recipe {recipe!r}: {e}"
    elif kind == "torchao":
        try:
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        except ImportError as e:
            return None, f"torchao not importable ({e})"
        config = Float8LinearConfig.from_recipe_name(recipe)
        if recipe == "tensorwise":
            config = Float8LinearConfig(enable_fsdp_float8_all_gather=True)
        convert_to_float8_training(model, config=config, module_filter_fn=_fp8_filter)
    elif kind != "bf16":
        return None, f"unknown variant {variant!r}"
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    mesh = init_device_mesh(device.type, (1,))
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    for i, block in enumerate(model.blocks):
        if compiled:
            model.blocks[i] = block = torch.compile(block)
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model, None


def train(model, batches: ByteBatches, steps: int, warmup: int, device, lr: float) -> dict:
    opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=device.type == "cuda")
    vocab = model.cfg.vocab
    losses = []
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    t0 = None
    for step in range(steps):
        if step == warmup:
            sync()
            t0 = time.perf_counter()
        x, y = batches.next()
        logits = model(x.to(device, non_blocking=True))
        loss = F.cross_entropy(logits.float().reshape(-1, vocab), y.to(device, non_blocking=True).reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    sync()
    seconds = time.perf_counter() - t0
    timed_steps = steps - warmup
    losses = [float(v) for v in losses]
    return {"losses": losses, "final_loss": statistics.fmean(losses[-10:]), "timed_steps": timed_steps,
            "seconds": seconds, "tokens_per_s": timed_steps * batches.batch * batches.seq / seconds}


def _compare(runs: dict) -> None:
    base = runs.get("bf16")
    for run in runs.values():
        run["speedup_vs_bf16"] = run["tokens_per_s"] / base["tokens_per_s"] if base else None
        run["final_loss_vs_bf16"] = run["final_loss"] / base["final_loss"] - 1 if base else None


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10, help="steps before the clock starts")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--variants", default=DEFAULT_VARIANTS)
    p.add_argument("--smoke", action="store_true", help="tiny model on the CPU, a few steps (the script's test)")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    if device.type == "cpu" and not args.smoke:
        p.error("needs a CUDA GPU (or --smoke for the tiny CPU run)")
    cfg = MODEL_SMOKE if args.smoke else MODEL_1B
    seq = min(args.seq, cfg.max_seq)
    steps, warmup, batch = (4, 1, 2) if args.smoke else (args.steps, args.warmup, args.batch)
    if device.type == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group("cpu:gloo,cuda:fp8nccl" if device.type == "cuda" else "fp8gloo",
                            store=dist.HashStore(), rank=0, world_size=1)
    text = stdlib_bytes()
    runs, skipped = {}, {}
    result = {"benchmark": "train_gpu", "date": datetime.date.today().isoformat(),
              "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
              "device": device_label(device.type == "cuda"), "torch": torch.__version__,
              "model": {"dim": cfg.dim, "layers": cfg.layers, "heads": cfg.heads, "hidden": cfg.hidden,
                        "vocab": cfg.vocab, "parameters": None},
              "batch": batch, "seq": seq, "steps": steps, "warmup": warmup, "world_size": 1,
              "runs": runs, "skipped": skipped}
    try:
        for variant in args.variants.split(","):
            model, why = build(variant, cfg, device)
            if model is None:
                skipped[variant] = why
                print(f"{variant:26s} skipped: {why}", flush=True)
                continue
            result["model"]["parameters"] = sum(p.numel() for p in model.parameters())
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            run = train(model, ByteBatches(text, seq, batch, rank=0, seed=0), steps, warmup, device, args.lr)
            if device.type == "cuda":
                run["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
            runs[variant] = run
            print(f"{variant:26s} {run['tokens_per_s']:12.0f} tokens/s  final loss {run['final_loss']:.4f}"
                  f"  (first {run['losses'][0]:.4f})", flush=True)
            _compare(runs)
            write_json(result, args.json)  # after each variant: a run cut short keeps the ones done
            del model
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    finally:
        dist.destroy_process_group()
    write_json(result, args.json)
    return result


if __name__ == "__main__":
    main()
