"""The comm benchmark from the source tree: fp8comm.bench.comm, which
`python -m fp8comm.bench comm` runs from an installed package.

    torchrun --nproc_per_node=2 bench/comm.py [--max-bytes 256M] [--json PATH] [--plot PNG] [--quick]
    python bench/comm.py --replot RESULT.json --plot PNG
"""
from fp8comm.bench.comm import main

if __name__ == "__main__":
    main(prog="bench/comm.py")
