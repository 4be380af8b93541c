"""python -m fp8comm.bench comm [--nproc N] [bench/comm.py options]

Launches the communication benchmark (bench/comm.py of the source tree this
package was installed from) with torchrun on N local processes (default 2).
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys

SCRIPTS = {"comm": "comm.py"}


def device_label(cuda: bool) -> str:
    """The device a benchmark ran on, for its results: the GPU's name, or the
    CPU's model, core count and the codec kernels it ran (CPU results differ
    by vendor: docs/performance.md)."""
    import torch

    if cuda:
        return torch.cuda.get_device_name()
    model = "CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    from fp8comm import _C

    kernels = "AVX-512 + AVX2" if _C.cpu_simd_enabled() and _C.cpu_avx512_enabled() else (
        "AVX2" if _C.cpu_simd_enabled() else "scalar")
    return f"{model} ({os.cpu_count()} cores, {kernels} codec kernels)"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in SCRIPTS:
        print(__doc__.strip())
        return 2
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", SCRIPTS[argv[0]])
    if not os.path.exists(script):
        print(f"fp8comm.bench: {script} not found; run from an editable install of the fp8comm source tree")
        return 2
    rest = argv[1:]
    nproc = "2"
    if "--nproc" in rest:
        i = rest.index("--nproc")
        nproc = rest[i + 1]
        del rest[i : i + 2]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--master_port={port}",
           script, *rest]
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
