"""DDP training of the tiny Llama with FP8-compressed gradient all-reduce.

    torchrun --nproc_per_node=2 examples/train_ddp.py [--fp8-compute] [--no-fp8-comm]

The only fp8comm lines are the import, the backend string and (optionally)
convert_to_fp8. Replicas stay bitwise identical: every rank decodes the same
all-reduced bytes (the script checks it at the end).
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import fp8comm
from tiny_llama import ByteBatches, ModelConfig, TinyLlama, stdlib_bytes


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--fp8-compute", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--fp8-comm", action=argparse.BooleanOptionalAction, default=True)
    args = p.parse_args()

    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("cpu:gloo,cuda:fp8nccl" if args.fp8_comm else "cpu:gloo,cuda:nccl")
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        dist.init_process_group("fp8gloo" if args.fp8_comm else "gloo")
        device = torch.device("cpu")
    rank = dist.get_rank()

    torch.manual_seed(0)
    cfg = ModelConfig(dim=args.dim, layers=args.layers, heads=4, max_seq=args.seq)
    model = TinyLlama(cfg)
    if args.fp8_compute:
        fp8comm.convert_to_fp8(model, module_filter_fn=lambda mod, fqn: fqn.startswith("blocks."))
    model = DDP(model.to(device))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    data = ByteBatches(stdlib_bytes(), args.seq, args.batch, rank)
    for step in range(args.steps):
        x, y = (t.to(device) for t in data.next())
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_cuda):
            logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, cfg.vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if rank == 0 and step % 10 == 0:
            print(f"step {step:4d}  loss {loss.item():.4f}", flush=True)

    # Replicas must agree bit for bit: compare a checksum of all parameters.
    flat = torch.cat([q.detach().float().reshape(-1) for q in model.parameters()])
    checksum = flat.view(torch.int32).to(torch.int64).sum().reshape(1).cpu()
    sums = [torch.zeros_like(checksum) for _ in range(dist.get_world_size())]
    dist.all_gather(sums, checksum, group=dist.new_group(backend="gloo"))
    if rank == 0:
        same = all(torch.equal(s, sums[0]) for s in sums)
        print(f"replicas bitwise identical: {same}")
        if args.fp8_comm:
            s = fp8comm.get_stats()
            print(f"gradient bytes sent {s['bytes_sent'] / 2**20:.1f} MiB of {s['bytes_sent_uncompressed'] / 2**20:.1f} MiB")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
