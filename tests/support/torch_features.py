"""What the running torch can do, where releases differ (README, "Supported
torch"), probed by behaviour or by torch's own source, never by a version
string where a probe can tell. A test that a torch cannot run skips with the
probe's reason; the same test runs on every release that can."""
from __future__ import annotations

import datetime
import functools
import inspect

import torch
import torch.distributed as dist


@functools.cache
def gloo_has_list_all_to_all() -> bool:
    """Whether torch's gloo implements the list form of all_to_all (2.11's
    does not: "Backend gloo does not support alltoall")."""
    pg = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=30))
    out = [torch.zeros(1)]
    try:
        pg.alltoall(out, [torch.ones(1)]).wait()
    except RuntimeError as e:
        if "does not support alltoall" in str(e):
            return False
        raise
    return bool(out[0].item() == 1.0)


NO_GLOO_LIST_ALL_TO_ALL = ("this torch's gloo has no list-form all_to_all, so plain gloo, the reference, raises; "
                           "tests/backend/test_nothing_lost.py checks that fp8gloo refuses it too")


@functools.cache
def work_exception_converts() -> bool:
    """Whether Python can read Work.exception() (2.11's binding returns a
    std::exception_ptr that pybind11 cannot convert, for every backend)."""
    from torch._C._distributed_c10d import _create_work_from_future

    done = torch.futures.Future()
    done.set_result(None)
    try:
        _create_work_from_future(done).exception()
    except TypeError:
        return False
    return True


@functools.cache
def split_group_takes_the_bound_device() -> bool:
    """Whether torch's split_group splits the parent's backend for its bound
    device (so a CPU-bound group can stand in for a GPU one,
    groups.cpu_as_accelerator); 2.11's asks the parent for its CUDA backend
    only, and its DeviceMesh splits only when CUDA is available."""
    return 'torch.device("cuda")' not in inspect.getsource(dist.split_group)


SPLIT_NEEDS_CUDA = ("this torch's split_group (and DeviceMesh's split path) takes the parent's CUDA backend only, "
                    "so the eager-init split path cannot run on CPU processes here; bench/gpu_session.sh runs it "
                    "on a GPU (tests/backend/test_eager_init_cuda.py)")


def torch_release() -> tuple[int, int]:
    """(major, minor) of the running torch: only for a known difference that
    no probe isolates yet, named where it is used."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)
