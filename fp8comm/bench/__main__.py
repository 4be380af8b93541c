"""python -m fp8comm.bench comm [--nproc N] [--launcher torchrun|spawn] [comm options]

Launches fp8comm.bench.comm on N local processes (default 2), on a free port:
with torchrun (which sets OMP_NUM_THREADS=1 and LOCAL_WORLD_SIZE), or with
torch.multiprocessing's spawn as PyTorch's custom-backend tutorial does
(neither set). With --replot it only draws a saved result, in this process.
"""
from __future__ import annotations

import socket
import subprocess
import sys

BENCHMARKS = {"comm": "fp8comm.bench.comm"}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in BENCHMARKS:
        print(__doc__.strip())
        return 2
    module, rest = BENCHMARKS[argv[0]], argv[1:]
    nproc = "2"
    if "--nproc" in rest:
        i = rest.index("--nproc")
        nproc = rest[i + 1]
        del rest[i : i + 2]
    launcher = "torchrun"
    if "--launcher" in rest:
        i = rest.index("--launcher")
        launcher = rest[i + 1]
        del rest[i : i + 2]
    if launcher not in ("torchrun", "spawn"):
        print(f"fp8comm.bench: --launcher must be torchrun or spawn, got {launcher!r}")
        return 2
    if "--replot" in rest:
        return subprocess.call([sys.executable, "-m", module, *rest])
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    if launcher == "spawn":
        import torch.multiprocessing as mp

        from .comm import spawned_rank

        command = " ".join(["python -m fp8comm.bench", *argv])
        mp.spawn(spawned_rank, args=(int(nproc), port, rest, command), nprocs=int(nproc), join=True)
        return 0
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--master_port={port}",
           "-m", module, *rest]
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
