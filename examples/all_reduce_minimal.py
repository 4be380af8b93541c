"""The smallest fp8comm program: one FP8-compressed all_reduce.

    torchrun --nproc_per_node=2 examples/all_reduce_minimal.py

On a CUDA machine it uses "cpu:gloo,cuda:fp8nccl" (one GPU per rank), else
"fp8gloo" on the CPU. Prints the error against an exact FP64 sum and the bytes
each rank sent compared with plain NCCL / gloo.
"""
import os

import torch
import torch.distributed as dist

import fp8comm  # registers fp8nccl / fp8gloo


def main() -> None:
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("cpu:gloo,cuda:fp8nccl" if use_cuda else "fp8gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)

    x = torch.randn(1 << 20, generator=torch.Generator().manual_seed(rank)).to(device)
    # Exact reference: FP64 passes through the backend uncompressed.
    exact = x.double()
    dist.all_reduce(exact)

    fp8comm.reset_stats()
    dist.all_reduce(x)  # FP32: compressed to FP8 blocks on the wire
    err = (x.double() - exact).pow(2).sum() / exact.pow(2).sum()
    stats = fp8comm.get_stats()
    if rank == 0:
        print(f"world {world}, {x.numel()} float32 elements on {device}")
        print(f"SQNR vs exact FP64 sum: {-10 * torch.log10(err).item():.1f} dB")
        print(
            f"bytes sent by this rank: {stats['bytes_sent']:,} "
            f"(uncompressed {stats['bytes_sent_uncompressed']:,}, "
            f"ratio {stats['bytes_sent'] / stats['bytes_sent_uncompressed']:.3f})"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
