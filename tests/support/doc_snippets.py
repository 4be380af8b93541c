"""The whole programs of docs/integrations.md, as the tests run them: the code
block that follows a marker comment (``<!-- snippet: name -->`` for
tests/integrations/test_frameworks.py, ``<!-- recipe: name -->`` for the
third-party recipes of tests/integrations/test_recipe_*.py), and the
environment and launcher of their CPU processes."""
from __future__ import annotations

import importlib.util
import os
import re
import socket
import subprocess
import sys

import pytest

from tests.support import REPO_ROOT

ROOT = str(REPO_ROOT)
DOC = os.path.join(ROOT, "docs", "integrations.md")
STATS = re.compile(r"fp8comm: calls_compressed=(\d+) bytes_sent=(\d+) of (\d+)")


def _doc() -> str:
    with open(DOC) as f:
        return f.read()


def code_block(name: str, marker: str = "snippet") -> str:
    """The code block that follows ``<!-- {marker}: {name} -->`` in the doc."""
    m = re.search(rf"<!-- {marker}: " + re.escape(name) + r" -->\s*```python\n(.*?)```", _doc(), re.S)
    assert m, f"docs/integrations.md has no {marker} {name!r}"
    return m.group(1)


def marked(marker: str) -> set:
    """The names of every ``<!-- {marker}: name -->`` in the doc."""
    return set(re.findall(rf"<!-- {marker}: (\w+) -->", _doc()))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_env(**extra) -> dict:
    """The CPU processes' environment: this checkout's fp8comm, a free port, no GPU."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")  # the launched processes import fp8comm
    env["MASTER_ADDR"] = "127.0.0.1"
    env["MASTER_PORT"] = str(free_port())
    env.setdefault("OMP_NUM_THREADS", "1")
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU path, also on a GPU machine
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        env.pop(var, None)
    env.update(extra)
    return env


def torchrun(path, env, nproc=2, args=()) -> list:
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
            f"--master_port={env['MASTER_PORT']}", str(path), *args]


def require(*packages: str, install: str) -> None:
    """Skips the test, naming what is missing and how to install it."""
    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed ({install})")


def run_torchrun(code: str, tmp_path, name: str, args=(), timeout_s=300, **env_extra):
    """Writes ``code`` to tmp_path/name.py and runs it on 2 CPU processes."""
    path = tmp_path / f"{name}.py"
    path.write_text(code)
    env = launch_env(**env_extra)
    return subprocess.run(torchrun(path, env, args=args), capture_output=True, text=True, timeout=timeout_s,
                          cwd=tmp_path, env=env)


def aborted_at_exit(out) -> bool:
    """Whether a run's process aborted as torch's teardown race over plain
    gloo makes one abort (pytorch/pytorch#190489): gloo's worker thread
    drops the last reference to a finished Work whose tensors have Python
    objects while the interpreter finalizes, and the process ends in SIGABRT
    after the script has done all its work. fp8gloo never does (DESIGN.md,
    "Exit"); the caller checks that the script's report is complete."""
    return "terminate called without an active exception" in out.stderr and "SIGABRT" in out.stderr


def log(out) -> str:
    """The end of a run's output, for an assertion message."""
    return out.stdout[-4000:] + out.stderr[-6000:]
