"""A process that ends with gloo Work still in flight exits cleanly
(DESIGN.md, "Exit").

ProcessGroupGloo's worker thread drops its reference to a Work after running
it; when that is the last reference and the Work's tensors have Python
objects, the worker takes the GIL, and during interpreter finalization Python
ends the thread by unwinding it through the Work's noexcept destructor:
std::terminate, "terminate called without an active exception", SIGABRT after
the script has done all its work (pytorch/pytorch#190489; plain gloo does it
too). fp8comm holds every Work of its CPU transports until no one else holds
it (csrc/backend/held_works.h), so no gloo worker drops a last reference.

The in-process test checks the holding and the letting go; the exit test
runs a job whose last all_gather gloo's worker finishes as the interpreter
finalizes: before the hold it aborted every run (10 of 10), as plain gloo
still does.
"""
from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

import fp8comm
from tests.support import doc_snippets
from tests.support.harness import PoolSpec, ctx

POOLS = [PoolSpec(2, "fp8gloo", pg_options={"min_numel": 1024})]


def held_then_let_go(calls: int) -> dict:
    """`calls` async all_gathers (passed through to gloo) whose handles are
    waited for and dropped, then a compressed all_reduce: how many Works
    fp8comm held after the all_gathers, and once every other holder has let
    go of them."""
    c = ctx()
    x = torch.full((4096,), float(c.rank))
    outs = [torch.empty(4096) for _ in range(c.world)]
    fp8comm._C.release_unshared_inner_works()
    for _ in range(calls):
        work = dist.all_gather(outs, x, group=c.group, async_op=True)
        work.wait()
        del work
    after_gathers = fp8comm._C.held_inner_works()
    dist.all_reduce(torch.ones(8192), group=c.group)  # compressed: its phases' Works are held too
    deadline = time.monotonic() + 30
    fp8comm._C.release_unshared_inner_works()
    while fp8comm._C.held_inner_works() and time.monotonic() < deadline:
        time.sleep(0.01)  # gloo's worker drops its reference just after the Work completes
        fp8comm._C.release_unshared_inner_works()
    assert [o[0].item() for o in outs] == list(range(c.world))
    return {"after_gathers": after_gathers, "at_end": fp8comm._C.held_inner_works()}


def test_gloo_works_are_held_until_no_one_else_holds_them(pool):
    for r in pool.run(held_then_let_go, 20):
        # The last gather's Work at least is still held: no one let go of it since.
        # Each call lets go of those only fp8comm holds, so they do not pile up.
        assert 1 <= r["after_gathers"] <= 20, r
        assert r["at_end"] == 0, r


# Rank 1 issues its last all_gather once rank 0 waits for it, so gloo's worker
# finishes it at once and, holding the last reference, waits for the GIL; the
# main thread, keeping the GIL (switch interval 100 s), finalizes, and releases
# the GIL in a finalizer: the worker wakes in a finalizing interpreter. Without
# fp8comm's hold (and over plain gloo) rank 1 aborts every time.
EXITS_WITH_WORK_IN_FLIGHT = """
import sys, time
import torch, torch.distributed as dist
import fp8comm
dist.init_process_group(sys.argv[1])
x = torch.ones(1024)
outs = [torch.empty(1024) for _ in range(dist.get_world_size())]
dist.all_gather(outs, x)
dist.all_reduce(torch.ones(1 << 16))  # compressed on fp8gloo


class ReleasesTheGilAtFinalization:
    def __del__(self, sleep=time.sleep):
        sleep(0.1)


if dist.get_rank() == 0:
    dist.all_gather(outs, x, async_op=True).wait()
    print("done", flush=True)
else:
    time.sleep(0.3)
    sys.setswitchinterval(100.0)
    finalizer = ReleasesTheGilAtFinalization()
    dist.all_gather(outs, x, async_op=True)  # the handle dropped at once; no print: it would release the GIL
"""
RUNS = 2


def _run_ranks(path, backend: str) -> list:
    """The script on 2 ranks, started directly (torchrun costs seconds a run)."""
    env = doc_snippets.launch_env()
    procs = [subprocess.Popen([sys.executable, str(path), backend], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**env, "RANK": str(r), "WORLD_SIZE": "2"}) for r in range(2)]
    return [(p, *p.communicate(timeout=120)) for p in procs]


@pytest.mark.full
def test_exiting_with_gloo_work_in_flight_never_aborts(tmp_path):
    path = tmp_path / "exits_with_work_in_flight.py"
    path.write_text(EXITS_WITH_WORK_IN_FLIGHT)
    for run in range(RUNS):
        for rank, (proc, stdout, stderr) in enumerate(_run_ranks(path, "fp8gloo")):
            where = f"run {run}, rank {rank}: rc {proc.returncode}\n{stderr[-3000:]}"
            assert "terminate called" not in stderr, where
            assert proc.returncode == 0 and stdout == ("done\n" if rank == 0 else ""), where
