"""Expert-parallel mixture-of-experts training with compressed token traffic.

    torchrun --nproc_per_node=2 examples/train_moe.py                          # dispatch in E4M3, combine exact
    torchrun --nproc_per_node=2 examples/train_moe.py --wire exact             # torch's all_to_all: the baseline
    torchrun --nproc_per_node=2 examples/train_moe.py --wire mxfp4
    torchrun --nproc_per_node=2 examples/train_moe.py --wire e4m3 --combine e4m3
    torchrun --nproc_per_node=2 examples/train_moe.py --steps 200 --eval-batches 0 --json run.json

A decoder of the main job's attention blocks (examples/tiny_llama.py) whose
feed-forward layers are mixtures of SwiGLU experts, trained on the same text
(the Python standard library's source, as bytes). Each token goes to its top 2
of --experts experts; the experts are sharded over the ranks (rank r holds
experts r*E/world .. (r+1)*E/world - 1) and no token is dropped, so how many
tokens each rank sends to each other rank changes every step. Each MoE layer
moves its tokens twice, as torchtitan's expert parallelism does:

    dispatch  every rank sends each token to the ranks of its 2 experts
    combine   the experts' outputs come back to the token's rank, weighted and summed

The split sizes of both come from an all_to_all of per-expert token counts
(exact: integers). Dispatch and combine are `all_to_all_single_autograd(input,
output_split_sizes, input_split_sizes, group)`: torch's own
(torch.distributed._functional_collectives) where a direction is exact, else
fp8comm.functional's drop-in over the same plain gloo / nccl group, whose
forward sends --wire (dispatch) or --combine (combine) and whose backward, the
reverse all_to_all of the gradients, sends --grad-wire (exact by default).
Everything but the experts is replicated with DDP over the same plain group
(its gradient all-reduces stay exact); each expert's gradient is complete on
its own rank, since the combine's backward brings every token's gradient to it.

On CUDA machines each rank takes one GPU and the blocks compute in BF16
(autocast), so BF16 tokens go on the wire; on the CPU everything is FP32
over gloo. The eval loss is measured on held-out text as in
examples/train_fsdp.py, with exact all_to_alls, and where a forward is
compressed also through the run's own all_to_alls (the same weights: what the
wire alone changes); --json writes the losses, eval losses, tokens/s and the
all_to_all bytes (rank 0) in the main job's format, which bench/convergence.py
reads.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed import _functional_collectives as funcol
from torch.nn.parallel import DistributedDataParallel as DDP

import fp8comm
from tiny_llama import Attention, ByteBatches, ModelConfig, RMSNorm, rotary_tables, stdlib_bytes
from train_fsdp import global_mean, lr_factor

FORMATS = ["exact", *fp8comm.codec.WIRE_FORMATS]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--wire", default="e4m3", choices=FORMATS, help="the dispatch's wire format")
    p.add_argument("--combine", default="exact", choices=FORMATS, help="the combine's wire format")
    p.add_argument("--grad-wire", default="exact", choices=FORMATS,
                   help="the wire format of the gradients' all_to_alls (the backward of dispatch and combine)")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--experts", type=int, default=8, help="experts per MoE layer, in all (a multiple of the ranks)")
    p.add_argument("--top-k", type=int, default=2, help="experts per token")
    p.add_argument("--expert-hidden", type=int, default=0,
                   help="each expert's SwiGLU width (0: dim, so 2 experts of a token cost about one dense layer)")
    p.add_argument("--aux-loss", type=float, default=0.01,
                   help="weight of the load-balancing loss (Switch Transformer's: experts x sum of token share x "
                        "mean router probability)")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (AdamW)")
    p.add_argument("--lr-schedule", default="constant", choices=["constant", "cosine"])
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--eval-batches", type=int, default=None, metavar="N",
                   help="evaluate on N batches per rank of held-out windows, distinct across ranks "
                        "(0: the whole held-out tail); default: one batch every rank shares")
    p.add_argument("--json", metavar="PATH", help="rank 0 writes the run's losses, eval loss and counters here")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not 0 <= args.warmup_steps < args.steps:
        p.error(f"--warmup-steps {args.warmup_steps}: expected 0 <= warmup < --steps ({args.steps})")
    if not 1 <= args.top_k <= args.experts:
        p.error(f"--top-k {args.top_k}: expected 1 <= top-k <= --experts ({args.experts})")
    return args


# ---------------------------------------------------------------- the all_to_alls

def all_to_all(forward: str, backward: str):
    """all_to_all_single_autograd(input, output_split_sizes, input_split_sizes, group) whose forward
    sends `forward` and whose backward sends `backward` ("exact" or a wire format)."""
    if forward == "exact" and backward == "exact":
        return funcol.all_to_all_single_autograd

    def options(fmt):
        # all_to_all compresses only where `compress` names it; min_numel 0, so a
        # step's smaller slices are compressed too.
        if fmt == "exact":
            return fp8comm.Options(compress="none")
        return fp8comm.Options(wire_format=fmt, compress="all_to_all", min_numel=0)

    # An exact backward is torch's own all_to_all (backward_options None).
    fwd, bwd = options(forward), None if backward == "exact" else options(backward)

    def call(input, output_split_sizes, input_split_sizes, group):
        return fp8comm.functional.all_to_all_single_autograd(input, output_split_sizes, input_split_sizes, group,
                                                             options=fwd, backward_options=bwd)
    return call


EXACT = {"dispatch": funcol.all_to_all_single_autograd, "combine": funcol.all_to_all_single_autograd}


# ---------------------------------------------------------------- the model

class MoE(nn.Module):
    """Top-k routed SwiGLU experts, this rank's share of them, dropless."""

    def __init__(self, dim: int, hidden: int, experts: int, top_k: int, group, generator: torch.Generator):
        super().__init__()
        self.group, self.world, self.rank = group, dist.get_world_size(group), dist.get_rank(group)
        self.experts, self.top_k, self.local = experts, top_k, experts // self.world
        self.router = nn.Linear(dim, experts, bias=False)

        # Every rank draws all experts from the same generator and keeps its own,
        # so the model is the same whatever the number of ranks.
        def weights(*shape):
            w = torch.randn(experts, *shape, generator=generator) * 0.02
            return nn.Parameter(w[self.rank * self.local:(self.rank + 1) * self.local].clone())

        self.w1, self.w3, self.w2 = weights(dim, hidden), weights(dim, hidden), weights(hidden, dim)
        self.a2a = EXACT
        self.aux_loss = torch.zeros(())

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        # Under autocast the tokens travel in its dtype (BF16 on CUDA), as the experts compute.
        dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
        probs = self.router(x).float().softmax(-1)
        top_p, top_e = probs.topk(self.top_k, dim=-1)
        top_p = top_p / top_p.sum(-1, keepdim=True)
        counts = torch.bincount(top_e.reshape(-1), minlength=self.experts)  # token slots per expert
        # Load balancing: the share of this rank's token slots each expert gets,
        # times its mean router probability (minimal, 1, when both are even).
        self.aux_loss = self.experts * (counts.float() / top_e.numel() * probs.mean(0)).sum()

        # The token slots sorted by expert: each rank's experts are one run.
        order = top_e.reshape(-1).argsort(stable=True)
        tokens = order // self.top_k
        sent = x[tokens].to(dtype)
        # counts_in[s * local + j]: how many tokens rank s sends to local expert j.
        counts_in = torch.empty_like(counts)
        dist.all_to_all_single(counts_in, counts, group=self.group)
        send_splits = counts.view(self.world, self.local).sum(1).tolist()
        recv_splits = counts_in.view(self.world, self.local).sum(1).tolist()

        received = self.a2a["dispatch"](sent, recv_splits, send_splits, self.group)
        # Received by source rank, then by expert: regroup by expert to run each once.
        expert_of_row = torch.arange(self.local, device=x.device).repeat(self.world).repeat_interleave(counts_in)
        by_expert = expert_of_row.argsort(stable=True)
        outputs = []
        for j, rows in enumerate(received[by_expert].split(counts_in.view(self.world, self.local).sum(0).tolist())):
            outputs.append((F.silu(rows @ self.w1[j]) * (rows @ self.w3[j])) @ self.w2[j])
        computed = torch.cat(outputs)
        back = torch.empty_like(computed).index_copy(0, by_expert, computed)
        returned = self.a2a["combine"](back, send_splits, recv_splits, self.group)

        weighted = returned * top_p.reshape(-1)[order, None].to(returned.dtype)
        return torch.zeros_like(x).index_add(0, tokens, weighted.to(x.dtype)).view(shape)


class Block(nn.Module):
    def __init__(self, args, group, generator):
        super().__init__()
        self.attn_norm = RMSNorm(args.dim)
        self.attn = Attention(ModelConfig(dim=args.dim, heads=args.heads))
        self.moe_norm = RMSNorm(args.dim)
        self.moe = MoE(args.dim, args.expert_hidden or args.dim, args.experts, args.top_k, group, generator)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.moe(self.moe_norm(x))


class TinyMoE(nn.Module):
    def __init__(self, args, group):
        super().__init__()
        self.head_dim = args.dim // args.heads
        self.embed = nn.Embedding(256, args.dim)
        generator = torch.Generator().manual_seed(args.seed)
        self.blocks = nn.ModuleList(Block(args, group, generator) for _ in range(args.layers))
        self.norm = RMSNorm(args.dim)
        self.head = nn.Linear(args.dim, 256, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, tokens):
        cos, sin = rotary_tables(self.head_dim, tokens.shape[1], tokens.device)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(self.norm(x))

    def aux_loss(self):
        return sum(block.moe.aux_loss for block in self.blocks) / len(self.blocks)

    def use(self, a2a: dict):
        for block in self.blocks:
            block.moe.a2a = a2a


# ---------------------------------------------------------------- training

def setup():
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return device, dist.group.WORLD


def train(args, device, group):
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if args.experts % world:
        raise SystemExit(f"--experts {args.experts}: expected a multiple of the ranks ({world})")
    torch.manual_seed(args.seed)
    model = TinyMoE(args, group).to(device)
    # DDP all-reduces everything but the experts, which are each rank's own.
    experts = [name for name, _ in model.named_parameters() if name.split(".")[-1] in ("w1", "w2", "w3")]
    DDP._set_params_and_buffers_to_ignore_for_model(model, experts)
    ddp = DDP(model, process_group=group, device_ids=[device.index] if device.type == "cuda" else None)
    train_a2a = {"dispatch": all_to_all(args.wire, args.grad_wire), "combine": all_to_all(args.combine, args.grad_wire)}
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: lr_factor(step, args.steps, args.lr_schedule, args.warmup_steps, args.min_lr_ratio))
    data = ByteBatches(stdlib_bytes(), args.seq, args.batch, rank, seed=args.seed)
    autocast = torch.autocast("cuda", torch.bfloat16, enabled=device.type == "cuda")
    compressed = {args.wire, args.combine, args.grad_wire} != {"exact"}

    model.use(train_a2a)
    losses, lrs, tokens, timed_s = [], [], 0, 0.0
    untimed = min(3, args.steps - 1)  # first steps: allocations, connections
    for step in range(args.steps):
        if step == untimed and fp8comm.registry.fp8_backends(group):
            fp8comm.reset_stats(group)  # the bytes of the timed steps
        t0 = time.perf_counter()
        x, y = (t.to(device) for t in data.next())
        with autocast:
            logits = ddp(x)
        loss = F.cross_entropy(logits.float().view(-1, 256), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        (loss + args.aux_loss * model.aux_loss()).backward()
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        schedule.step()
        mean = global_mean(loss, group)  # also synchronizes the step
        if step >= untimed:
            timed_s += time.perf_counter() - t0
            tokens += x.numel() * world
        losses.append(mean)
        if rank == 0 and (step % args.log_every == 0 or step == args.steps - 1):
            print(f"[{label(args)}] step {step:4d}  loss {mean:.4f}", flush=True)
    stats = fp8comm.get_stats(group) if compressed else None

    # Held-out text, as in train_fsdp.py, with exact all_to_alls: the model is
    # measured, not the wire.
    eval_set = ([data.eval_batch()] if args.eval_batches is None
                else data.eval_batches(args.eval_batches, rank, world))

    def evaluate(a2a):
        model.use(a2a)
        with torch.no_grad(), autocast:
            eval_sum = torch.zeros((), device=device)
            for batch in eval_set:
                x, y = (t.to(device) for t in batch)
                eval_sum += F.cross_entropy(model(x).float().view(-1, 256), y.reshape(-1))
            return global_mean(eval_sum / len(eval_set), group)

    eval_loss = evaluate(EXACT)
    result = {"label": label(args), "wire": args.wire, "combine": args.combine, "grad_wire": args.grad_wire,
              "losses": losses, "lrs": lrs, "eval_loss": eval_loss,
              "eval_tokens": len(eval_set) * args.batch * args.seq * (1 if args.eval_batches is None else world),
              "tokens_per_s": tokens / timed_s if timed_s else float("nan")}
    line = f"[{label(args)}] eval loss {eval_loss:.4f}  tokens/s {result['tokens_per_s']:.0f}"
    if {args.wire, args.combine} != {"exact"}:
        # The same weights with the forward all_to_alls on the wire: what the
        # compression itself changes, free of the divergence of two trainings.
        result["eval_loss_wire"] = evaluate(train_a2a)
        line += f"  (through its wire {result['eval_loss_wire']:.4f})"
    if stats is not None:
        # What this rank's compressed all_to_alls sent to peers, against the same calls sent exactly.
        result["bytes_sent"], result["bytes_sent_uncompressed"] = stats["bytes_sent"], stats["bytes_sent_uncompressed"]
        line += (f"  all_to_all bytes sent {stats['bytes_sent'] / 2**20:.2f} MiB of "
                 f"{stats['bytes_sent_uncompressed'] / 2**20:.2f} MiB "
                 f"({stats['bytes_sent'] / max(1, stats['bytes_sent_uncompressed']):.3f})")
    if rank == 0:
        print(line, flush=True)
    return result


def label(args) -> str:
    return f"dispatch {args.wire}, combine {args.combine}" + (
        f", gradients {args.grad_wire}" if args.grad_wire != "exact" else "")


def write_json(path, args, runs, device):
    """The run as bench/convergence.py reads it, with what produced it."""
    world = dist.get_world_size()
    out = {"example": "train_moe", "date": datetime.date.today().isoformat(), "torch": torch.__version__,
           "command": " ".join(["torchrun", f"--nproc_per_node={world}", "examples/train_moe.py", *sys.argv[1:]]),
           "device": str(device), "world_size": world, "args": vars(args), "runs": runs}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


def main(argv=None):
    args = parse_args(argv)
    device, group = setup()
    runs = [train(args, device, group)]
    if args.json and dist.get_rank() == 0:
        write_json(args.json, args, runs, device)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
