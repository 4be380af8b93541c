"""FSDP2 training of a Llama-style decoder with FP8 compute and FP8 communication.

    torchrun --nproc_per_node=2 examples/train_fsdp.py                 # FP8 compute + FP8 comm
    torchrun --nproc_per_node=2 examples/train_fsdp.py --no-fp8-compute --no-fp8-comm
    torchrun --nproc_per_node=2 examples/train_fsdp.py --compare losses.png
    torchrun --nproc_per_node=2 examples/train_fsdp.py --no-fp8-all-gather   # weights gathered in FP32/BF16
    torchrun --nproc_per_node=2 examples/train_fsdp.py --eval-batches 0 --json run.json
    torchrun --nproc_per_node=2 examples/train_fsdp.py --track-error         # SQNR of the FP8 traffic (CPU)
    torchrun --nproc_per_node=2 examples/train_fsdp.py --lr-schedule cosine --warmup-steps 25 --steps 500
    torchrun --nproc_per_node=2 examples/train_fsdp.py --no-fp8-compute --wire e5m2 --comm-block-size 512 \
        --error-feedback fp32                                           # error feedback (fp8comm.fsdp)

On CUDA machines the group is "cpu:gloo,cuda:fp8nccl" (BF16 parameters and
gradient reduction, one GPU per rank); without a GPU it is "fp8gloo" on the CPU
(FP32). The text is the Python standard library's own source, as bytes.
--compare trains the same model twice from the same seed and data — once with
nn.Linear over the plain backend, once with FP8 compute over the fp8 backend —
prints both loss curves and writes them to a PNG.
With FP8 compute and the tensorwise (or delayed) recipe, FSDP2 all-gathers the Fp8Linear
weights as the FP8 bytes their GEMMs consume (--fp8-all-gather, on by default
here); each run on an fp8 group prints the bytes one forward's all-gathers sent.
The eval loss is measured on held-out text: by default one batch of windows
that every rank shares; --eval-batches N spreads N batches per rank of distinct
windows over the ranks (0: the whole held-out tail). --json writes every run's
per-step losses, eval loss and counters (rank 0); bench/convergence.py reads it.
The final evaluation runs its collectives exact (fp8comm.uncompressed). With
--track-error (or FP8COMM_TRACK_ERROR=1) the fp8gloo group measures the
quantization error of every compressed call, and the run prints its SQNR per op.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import fp8comm
import fp8comm.fsdp
from tiny_llama import ByteBatches, ModelConfig, TinyLlama, stdlib_bytes


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (AdamW)")
    p.add_argument("--lr-schedule", default="constant", choices=["constant", "cosine"],
                   help="constant: --lr throughout; cosine: decay from --lr to --min-lr-ratio x --lr at the last step")
    p.add_argument("--warmup-steps", type=int, default=0,
                   help="raise the learning rate linearly to --lr over this many steps first")
    p.add_argument("--min-lr-ratio", type=float, default=0.1, help="the cosine schedule's final learning rate / --lr")
    p.add_argument("--fp8-compute", action=argparse.BooleanOptionalAction, default=True,
                   help="convert the model's nn.Linear layers to fp8comm Fp8Linear")
    p.add_argument("--fp8-comm", action=argparse.BooleanOptionalAction, default=True,
                   help="communicate through fp8nccl / fp8gloo (else plain nccl / gloo)")
    p.add_argument("--wire", default=None, choices=fp8comm.codec.WIRE_FORMATS,
                   help="the compressed gradients' wire format (with --comm-block-size, --error-feedback: the "
                        "reduce-scatter is compressed over the plain group by fp8comm.fsdp.compress_communication, "
                        "which equals the fp8 group bitwise)")
    p.add_argument("--comm-block-size", type=int, default=None, help="elements per scale on the wire")
    p.add_argument("--error-feedback", default="off", choices=["off", "fp32", "bf16"],
                   help="keep what the wire dropped and add it to the next step's gradients")
    p.add_argument("--rounding", default=None, choices=["nearest", "stochastic"],
                   help="how the wire rounds to FP8 (stochastic: unbiased per element)")
    p.add_argument("--recipe", default="tensorwise", choices=["tensorwise", "rowwise", "delayed"])
    p.add_argument("--fp8-all-gather", action=argparse.BooleanOptionalAction, default=True,
                   help="all-gather Fp8Linear weights as FP8 (FSDP2 extension; tensorwise and delayed recipes, "
                        "rowwise weights are gathered exactly)")
    p.add_argument("--fp8-layers", default="blocks", choices=["blocks", "auto"],
                   help="blocks: every linear of the decoder blocks (the output head stays high precision); "
                        "auto: fp8comm's default size rule")
    p.add_argument("--track-error", action="store_true",
                   help="measure the SQNR of every compressed collective (fp8comm.Options(track_error=True); "
                        "fp8gloo only)")
    p.add_argument("--compare", metavar="PNG", help="train a baseline and an FP8 run, plot both losses")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--eval-batches", type=int, default=None, metavar="N",
                   help="evaluate on N batches per rank of held-out windows, distinct across ranks "
                        "(0: the whole held-out tail); default: one batch every rank shares")
    p.add_argument("--json", metavar="PATH", help="rank 0 writes the runs' losses, eval loss and counters here")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not 0 <= args.warmup_steps < args.steps:
        p.error(f"--warmup-steps {args.warmup_steps}: expected 0 <= warmup < --steps ({args.steps})")
    if not 0.0 <= args.min_lr_ratio <= 1.0:
        p.error(f"--min-lr-ratio {args.min_lr_ratio}: expected a fraction of --lr in [0, 1]")
    return args


def lr_factor(step: int, steps: int, schedule: str, warmup: int, min_ratio: float) -> float:
    """The learning rate of optimizer step `step` (0-based) as a fraction of the peak:
    linear warmup over `warmup` steps, then constant or a cosine from 1 down to
    `min_ratio` at the last step."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    span = steps - 1 - warmup
    progress = (step - warmup) / span if span > 0 else 1.0
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def setup(track_error: bool):
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        if track_error:
            raise SystemExit("--track-error: fp8nccl (CUDA) groups do not measure the error; run on the CPU")
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("cpu:gloo,cuda:fp8nccl", device_id=device)
        plain = dist.new_group(backend="nccl")
    else:
        device = torch.device("cpu")
        dist.init_process_group("fp8gloo", pg_options=fp8comm.Options(track_error=True) if track_error else None)
        plain = dist.new_group(backend="gloo")
    return device, dist.group.WORLD, plain


def comm_plugin(args) -> bool:
    """Whether the run compresses through fp8comm.fsdp on the plain group (wire settings, error feedback)."""
    return args.fp8_comm and (args.wire is not None or args.comm_block_size is not None or args.error_feedback != "off"
                              or args.rounding is not None)


def global_mean(value: torch.Tensor, group) -> float:
    v = value.detach().float().reshape(1).clone()
    dist.all_reduce(v, group=group)  # a scalar: below min_numel, so exact even on fp8 groups
    return v.item() / dist.get_world_size(group)


def train(args, device, group, fp8_compute: bool, label: str, plugin: bool = False):
    """One run; `plugin`: compress the gradients' reduce-scatter on `group` (plain) with fp8comm.fsdp."""
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    cfg = ModelConfig(dim=args.dim, layers=args.layers, heads=args.heads, max_seq=args.seq)
    model = TinyLlama(cfg)
    fp8_all_gather = fp8_compute and args.fp8_all_gather and args.recipe != "rowwise"
    if fp8_compute:
        only_blocks = (lambda mod, fqn: fqn.startswith("blocks.")) if args.fp8_layers == "blocks" else None
        fp8comm.convert_to_fp8(model, recipe=args.recipe, module_filter_fn=only_blocks,
                               fp8_all_gather=fp8_all_gather)
    model.to(device)
    mesh = DeviceMesh.from_group(group, device.type)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16) if device.type == "cuda" else None
    kwargs = {"mesh": mesh} | ({"mp_policy": mp} if mp else {})
    for block in model.blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    if plugin:
        chosen = (("wire_format", args.wire), ("block_size", args.comm_block_size), ("rounding", args.rounding))
        options = fp8comm.Options(**{k: v for k, v in chosen if v is not None})
        ef = {"off": False, "fp32": torch.float32, "bf16": torch.bfloat16}[args.error_feedback]
        fp8comm.fsdp.compress_communication(model, options=options, error_feedback=ef)
    if fp8_all_gather:  # one all_reduce for all weight amaxes, instead of one per weight per all-gather
        fp8comm.precompute_fp8_scales_for_fsdp(model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: lr_factor(step, args.steps, args.lr_schedule, args.warmup_steps, args.min_lr_ratio))
    data = ByteBatches(stdlib_bytes(), args.seq, args.batch, rank, seed=args.seed)
    if fp8comm.registry.fp8_backends(group):
        fp8comm.reset_stats(group)
    fp8comm.nn.reset_linear_stats()

    losses, lrs, tokens, timed_s = [], [], 0, 0.0
    untimed = min(3, args.steps - 1)  # first steps: allocations, connections
    for step in range(args.steps):
        t0 = time.perf_counter()
        x, y = (t.to(device) for t in data.next())
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, cfg.vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        schedule.step()
        if fp8_all_gather:
            fp8comm.precompute_fp8_scales_for_fsdp(model)
        mean = global_mean(loss, group)  # also synchronizes the step
        if step >= untimed:
            timed_s += time.perf_counter() - t0
            tokens += x.numel() * dist.get_world_size(group)
        losses.append(mean)
        if rank == 0 and (step % args.log_every == 0 or step == args.steps - 1):
            print(f"[{label}] step {step:4d}  loss {mean:.4f}", flush=True)

    # Every rank runs the same number of eval forwards (each one all-gathers); the
    # batches are equal in size, so the mean of their losses is the per-token mean.
    if args.eval_batches is None:
        eval_set = [data.eval_batch()]
    else:
        eval_set = data.eval_batches(args.eval_batches, rank, dist.get_world_size(group))
    # The final evaluation's collectives run exact; collective: every rank enters here.
    with torch.no_grad(), fp8comm.uncompressed(group):
        eval_sum = torch.zeros((), device=device)
        for i, batch in enumerate(eval_set):
            x, y = (t.to(device) for t in batch)
            if i == 0:
                sent_before = fp8comm.get_stats(group)["bytes_sent"] if fp8comm.registry.fp8_backends(group) else None
            logits = model(x)  # the all-gathers of one forward (the amaxes were precomputed)
            if i == 0:
                sent_forward = fp8comm.get_stats(group)["bytes_sent"] - sent_before if sent_before is not None else None
            eval_sum += torch.nn.functional.cross_entropy(logits.float().view(-1, cfg.vocab), y.reshape(-1))
        eval_loss = global_mean(eval_sum / len(eval_set), group)
    result = {"label": label, "fp8_compute": fp8_compute, "fp8_comm": bool(fp8comm.registry.fp8_backends(group)),
              "fp8_all_gather": fp8_all_gather, "losses": losses, "lrs": lrs, "eval_loss": eval_loss,
              "eval_tokens": len(eval_set) * args.batch * args.seq * (1 if args.eval_batches is None
                                                                      else dist.get_world_size(group)),
              "tokens_per_s": tokens / timed_s if timed_s else float("nan"),
              "linear_stats": fp8comm.nn.linear_stats()}
    if sent_forward is not None and rank == 0:
        world = dist.get_world_size(group)
        gather_dtype = mp.param_dtype if mp else torch.float32
        exact = sum(p.numel() for p in model.parameters()) * gather_dtype.itemsize * (world - 1) // world
        fp8_elems = sum(m.weight.numel() for m in model.modules() if fp8comm.nn.has_fp8_all_gather(m))
        n_elems = sum(p.numel() for p in model.parameters())
        print(f"[{label}] all-gather bytes sent per forward {sent_forward / 2**20:.2f} MiB "
              f"(FP8 all-gather of {fp8_elems} of {n_elems} parameter elements; all in {str(gather_dtype)[6:]}: "
              f"{exact / 2**20:.2f} MiB, computed)", flush=True)
    if fp8comm.registry.fp8_backends(group):
        stats = fp8comm.get_stats(group)
        result["bytes_sent"] = stats["bytes_sent"]
        result["bytes_sent_uncompressed"] = stats["bytes_sent_uncompressed"]
        if "sqnr_db" in stats and rank == 0:  # the group tracks the error (--track-error)
            measured = [f"{op} {s['sqnr_db']:.1f} dB over {s['compressed']} calls"
                        for op, s in stats["per_op"].items() if s["sqnr_db"] is not None]
            print(f"[{label}] SQNR of what rank 0 put on the wire: {'; '.join(measured) or 'nothing compressed'}",
                  flush=True)
    if rank == 0:
        line = f"[{label}] eval loss {eval_loss:.4f}  tokens/s {result['tokens_per_s']:.0f}"
        if "bytes_sent" in result:
            saved = result["bytes_sent_uncompressed"] - result["bytes_sent"]
            line += (f"  comm bytes sent {result['bytes_sent'] / 2**20:.1f} MiB of "
                     f"{result['bytes_sent_uncompressed'] / 2**20:.1f} MiB ({saved / 2**20:.1f} MiB saved)")
        print(line, flush=True)
    return result


def write_json(path, args, runs, device):
    """The runs as bench/convergence.py reads them, with what produced them."""
    world = dist.get_world_size()
    out = {"example": "train_fsdp", "date": datetime.date.today().isoformat(), "torch": torch.__version__,
           "command": " ".join(["torchrun", f"--nproc_per_node={world}", "examples/train_fsdp.py", *sys.argv[1:]]),
           "device": str(device), "world_size": world, "args": vars(args), "runs": runs}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        ax.plot(r["losses"], label=f"{r['label']} (eval {r['eval_loss']:.3f})")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (bytes, cross-entropy)")
    ax.set_title(f"tiny Llama, FSDP2, {dist.get_world_size()} ranks")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    args = parse_args(argv)
    device, fp8_group, plain_group = setup(args.track_error)
    baseline_label = "bf16" if device.type == "cuda" else "fp32"
    if args.compare:
        runs = [
            train(args, device, plain_group, fp8_compute=False, label=f"{baseline_label} nn.Linear + plain comm"),
            train(args, device, fp8_group, fp8_compute=True, label="Fp8Linear + fp8 comm"),
        ]
        if dist.get_rank() == 0:
            base, fp8 = runs
            tail = max(1, min(10, args.steps // 5))  # one step's loss is noisy: average the last few
            b_end = sum(base["losses"][-tail:]) / tail
            f_end = sum(fp8["losses"][-tail:]) / tail
            print(f"final loss (mean of last {tail} steps): baseline {b_end:.4f}, fp8 {f_end:.4f} "
                  f"({100 * (f_end - b_end) / b_end:+.2f}%); eval loss: baseline {base['eval_loss']:.4f}, "
                  f"fp8 {fp8['eval_loss']:.4f}; tokens/s ratio fp8/baseline "
                  f"{fp8['tokens_per_s'] / base['tokens_per_s']:.2f}", flush=True)
            plot(runs, args.compare)
            print(f"wrote {args.compare}")
    else:
        group = fp8_group if args.fp8_comm and not comm_plugin(args) else plain_group
        label = ("Fp8Linear" if args.fp8_compute else "nn.Linear") + (" + fp8 comm" if args.fp8_comm else " + plain comm")
        if comm_plugin(args):
            extras = ([f"error feedback {args.error_feedback}"] if args.error_feedback != "off" else []) + (
                [f"{args.rounding} rounding"] if args.rounding else [])
            label += f" ({args.wire or 'e4m3'}/{args.comm_block_size or 'default'} blocks{''.join(', ' + e for e in extras)})"
        runs = [train(args, device, group, fp8_compute=args.fp8_compute, label=label, plugin=comm_plugin(args))]
    if args.json and dist.get_rank() == 0:
        write_json(args.json, args, runs, device)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
