"""bench/gpu_session (the GPU session runner) imported as the package
`gpu_session`, for the tests that read its step table and plan without
starting it."""
import importlib
import sys

from tests.support import REPO_ROOT


def load(module: str = ""):
    """gpu_session, or one of its modules (plan, steps, results, runner, ...)."""
    bench = str(REPO_ROOT / "bench")
    if "gpu_session" not in sys.modules:
        sys.path.insert(0, bench)
        try:
            importlib.import_module("gpu_session")
        finally:
            sys.path.remove(bench)
    return importlib.import_module(f"gpu_session.{module}" if module else "gpu_session")


SESSION = load("steps").SESSION
