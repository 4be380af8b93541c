"""Multi-process test harness: a pool of P real processes, each with an
initialized process group, that runs module-level scenario functions on every
rank and returns their results. Starting torch in a process takes seconds, so a
pool is kept for many tests; a pool that hangs or dies is killed, not reused.

In a scenario, ``ctx()`` gives the rank's Context: ``group`` (the backend under
test, the default group), ``gloo`` (a plain gloo group over the same ranks, the
reference), ``rank``, ``world``. A scenario that fails kills the pool's ranks;
the pool's next scenario starts fresh ones.

A scenario is shipped to the ranks by reference (its module and name), so it
must be a module-level function of an importable module: a test module's own
scenarios sit beside its tests (the ranks import the test module), helpers
that several test modules share sit in tests/support/scenarios/. A module's
pool is tests/conftest.py's `pool` fixture, one per PoolSpec in its POOLS.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import queue
import tempfile
import time
import traceback
from typing import Any, Callable

import torch.multiprocessing as mp

DEFAULT_TIMEOUT_S = 120.0
# What the ranks' parent process has imported before it forks each rank: a
# rank starts without importing torch itself, the better part of a pool's start.
PRELOAD = ["torch", "torch.distributed", "fp8comm", "fp8comm._testing"]


def _context():
    """Ranks start from a forkserver (a clean process, never the test process
    itself, which holds threads a fork must not copy) that has PRELOAD imported."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


@dataclasses.dataclass
class Context:
    rank: int
    world: int
    group: Any
    gloo: Any


_CTX: Context | None = None


def ctx() -> Context:
    assert _CTX is not None, "not inside a DistPool worker"
    return _CTX


class ScenarioError(AssertionError):
    pass


def _worker(rank, world, init_file, backend, pg_options_spec, parent_env, env, timeout_s, inbox, outbox):
    global _CTX
    # The environment of the test process when the pool started (the forkserver's
    # is older), then the pool's own.
    os.environ.clear()
    os.environ.update(parent_env)
    os.environ.update(env)
    import datetime

    import torch
    import torch.distributed as dist

    import fp8comm
    import fp8comm._testing

    fp8comm._testing.register()
    torch.set_num_threads(1)
    dist.set_debug_level_from_env()  # torch read TORCH_DISTRIBUTED_DEBUG at import, before `env` was applied
    pg_options = fp8comm.Options(**pg_options_spec) if pg_options_spec is not None else None
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(
        backend, init_method=f"file://{init_file}", rank=rank, world_size=world, pg_options=pg_options,
        timeout=timeout,
    )
    gloo = dist.new_group(backend="gloo", timeout=timeout)
    _CTX = Context(rank=rank, world=world, group=dist.group.WORLD, gloo=gloo)
    outbox.put(("ready", rank, None))
    while True:
        job = inbox.get()
        if job is None:
            break
        module, name, args, kwargs = job
        try:
            fn = getattr(importlib.import_module(module), name)
            outbox.put(("ok", rank, fn(*args, **kwargs)))
        except BaseException:  # noqa: BLE001  (report everything to the parent)
            outbox.put(("error", rank, traceback.format_exc()))
    dist.destroy_process_group()


@dataclasses.dataclass(frozen=True)
class PoolSpec:
    """One variant of a module's pool (tests/conftest.py's `pool` fixture):
    DistPool's arguments, the test id it gives (`id`), and the attributes the
    tests read from the pool (`attrs`, e.g. {"scope": "inter_node"}; the
    pool's `backend` is its backend unless `attrs` names another)."""
    world: int
    backend: str = "fp8gloo"
    pg_options: dict | None = None
    env: dict | None = None
    timeout_s: float = 300.0
    id: str | None = None
    attrs: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def grid(cls, backends, worlds, **kwargs) -> list:
        """One spec per (backend, world), backend-major, ids "backend-world"."""
        return [cls(w, b, id=f"{b}-{w}", **kwargs) for b in backends for w in worlds]

    def start(self) -> "DistPool":
        p = DistPool(self.world, backend=self.backend, pg_options=self.pg_options, env=self.env,
                     timeout_s=self.timeout_s)
        for name, value in self.attrs.items():
            setattr(p, name, value)
        return p


class DistPool:
    def __init__(self, world: int, backend: str = "fp8gloo", pg_options: dict | None = None, env: dict | None = None,
                 timeout_s: float = 300.0):
        """timeout_s: the process groups' timeout (how long a collective may wait for peers)."""
        self.world = world
        self.backend = backend
        self._config = (backend, pg_options, env or {}, timeout_s)
        self._start()

    def _start(self) -> None:
        """Spawns the ranks and waits until each has its process groups."""
        backend, pg_options, env, timeout_s = self._config
        self._dir = tempfile.TemporaryDirectory()
        ctx = _context()
        self._outbox = ctx.Queue()
        self._inboxes = [ctx.Queue() for _ in range(self.world)]
        init_file = os.path.join(self._dir.name, "init")
        parent_env = dict(os.environ)
        self._procs = [
            ctx.Process(
                target=_worker,
                args=(r, self.world, init_file, backend, pg_options, parent_env, env, timeout_s, self._inboxes[r],
                      self._outbox),
                daemon=True,
            )
            for r in range(self.world)
        ]
        for p in self._procs:
            p.start()
        self.broken = False
        self._collect("ready", DEFAULT_TIMEOUT_S)

    def run(self, fn: Callable, *args, timeout: float = DEFAULT_TIMEOUT_S, **kwargs) -> list:
        """Runs fn(*args, **kwargs) on every rank; returns the results by rank.
        Raises ScenarioError with every failing rank's traceback."""
        if self.broken:
            # A failed scenario killed the ranks (their groups' state is unknown):
            # start fresh ones, so that one failure fails one test, not every later one.
            self._start()
        for inbox in self._inboxes:
            inbox.put((fn.__module__, fn.__name__, args, kwargs))
        return self._collect("ok", timeout)

    def run_with_deaths(self, fn: Callable, *args, timeout: float = DEFAULT_TIMEOUT_S, **kwargs) -> dict:
        """Like run(), for scenarios in which ranks may die: returns {rank:
        result, or the traceback string if it raised} for the ranks that
        answered; ranks that died are absent. Raises only if a live rank has
        not answered within `timeout` (a hang). The pool is closed after."""
        for inbox in self._inboxes:
            inbox.put((fn.__module__, fn.__name__, args, kwargs))
        answers: dict = {}
        deadline = time.monotonic() + timeout
        try:
            while True:
                alive = {r for r, p in enumerate(self._procs) if p.is_alive()}
                if alive <= set(answers):
                    return answers
                if time.monotonic() > deadline:
                    raise ScenarioError(f"rank(s) {sorted(alive - set(answers))} hung for {timeout}s")
                try:
                    kind, rank, value = self._outbox.get(timeout=0.2)
                    answers[rank] = value
                except queue.Empty:
                    pass
        finally:
            self.close(kill=True)

    def _collect(self, expected: str, timeout: float) -> list:
        results: list = [None] * self.world
        errors = {}
        deadline = time.monotonic() + timeout
        for _ in range(self.world):
            while True:
                try:
                    kind, rank, value = self._outbox.get(timeout=0.5)
                    break
                except queue.Empty:
                    dead = [r for r, p in enumerate(self._procs) if not p.is_alive()]
                    if dead or time.monotonic() > deadline:
                        self.close(kill=True)
                        why = f"rank(s) {dead} died" if dead else f"ranks did not answer within {timeout}s (hang?)"
                        raise ScenarioError(f"{why}; pool killed") from None
            if kind == "error":
                errors[rank] = value
            else:
                results[rank] = value
        if errors:
            self.close(kill=True)
            raise ScenarioError("\n".join(f"--- rank {r}:\n{tb}" for r, tb in sorted(errors.items())))
        return results

    def close(self, kill: bool = False) -> None:
        if not kill and not self.broken:
            for inbox in self._inboxes:
                inbox.put(None)
            for p in self._procs:
                p.join(timeout=30)
        for p in self._procs:
            if p.is_alive():
                p.kill()
                p.join()
        self.broken = True
        self._dir.cleanup()
