"""`python3 bench/gpu_session/__main__.py [MODE]` (what bench/gpu_session.sh runs): main.py's docstring."""
import os
import sys

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    sys.path.insert(0, os.path.dirname(here))  # bench/: the gpu_session package
    from gpu_session.main import main

    sys.exit(main(sys.argv[1:]))
