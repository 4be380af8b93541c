"""Scenarios for tests/backend/test_split.py (run on every rank of a 4-rank
DistPool): fp8 groups split through ProcessGroup.split_group (what
torch.distributed.split_group and DeviceMesh call under eager init), and the
device ids fp8nccl's barrier hands to NCCL."""
from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

import fp8comm
import fp8comm._testing
from fp8comm import subgroups
from tests.support.groups import cpu_as_accelerator
from tests.support.harness import ctx
from tests.support.inputs import rank_input

SPLITS = [[0, 1], [2, 3]]
N = 8192  # elements per rank: above the pool's min_numel, whole blocks
CUSTOM = dist.ProcessGroup.BackendType.CUSTOM

_GROUPS: dict = {}


def _mine(rank: int) -> list[int]:
    return next(s for s in SPLITS if rank in s)


def _name(what: str) -> str:
    """A group name for this rank's split: one per split, as torch's are (the
    name prefixes the split's store keys)."""
    return f"{what}-{'-'.join(map(str, _mine(ctx().rank)))}"


def fp8_backend(group):
    return group._get_backend(torch.device("cpu"))


def _reference_groups(backend: str) -> dict:
    """new_group over each split, with the pool's backend and options: what
    a split group must compute bit for bit. Created once, on every rank."""
    if backend not in _GROUPS:
        options = fp8_backend(ctx().group).options
        _GROUPS[backend] = {tuple(s): dist.new_group(s, backend=backend, pg_options=options) for s in SPLITS}
    return _GROUPS[backend]


def run_collectives(group, members: list[int], seed: int):
    """all_reduce, reduce_scatter_tensor and all_gather_into_tensor of each
    rank's input on `group` (whose ranks are the global ranks `members`):
    the outputs, and the exact results in float64."""
    rank, p = ctx().rank, len(members)
    x = rank_input(rank, N, seed=seed, scale=3.0)
    got = {"all_reduce": x.clone(), "reduce_scatter": torch.empty(N // p), "all_gather": torch.empty(N * p)}
    dist.all_reduce(got["all_reduce"], group=group)
    dist.reduce_scatter_tensor(got["reduce_scatter"], x.clone(), group=group)
    dist.all_gather_into_tensor(got["all_gather"], x.clone(), group=group)
    inputs = [rank_input(r, N, seed=seed, scale=3.0).double() for r in members]
    total = torch.stack(inputs).sum(0)
    exact = {"all_reduce": total, "reduce_scatter": total.view(p, -1)[members.index(rank)],
             "all_gather": torch.cat(inputs)}
    return got, exact


def _describe(sub, seed: int, reference) -> dict:
    """What the tests check of a split group `sub` of this rank."""
    c = ctx()
    parent, be = fp8_backend(c.group), fp8_backend(sub)
    members = _mine(c.rank)
    fp8comm.reset_stats(sub)
    got, exact = run_collectives(sub, members, seed)
    stats = fp8comm.get_stats(sub)
    ref, _ = run_collectives(reference, members, seed)
    return {
        "type": type(be).__name__, "name": be.name(), "rank": sub.rank(), "size": sub.size(),
        "same_options": be.options == parent.options, "options": repr(be.options),
        "traits": be.transport_traits("cpu"), "parent_traits": parent.transport_traits("cpu"),
        "got": got, "exact": exact, "ref": ref, "stats": stats,
    }


def split_through_backend_api(backend: str, seed: int):
    """Every rank splits the world into SPLITS with ProcessGroup.split_group
    (no options: the parent's) and runs the collectives there, then on a
    new_group over the same ranks."""
    c = ctx()
    reference = _reference_groups(backend)[tuple(_mine(c.rank))]
    sub = c.group.split_group(_mine(c.rank), group_name=_name(f"split-api-{seed}"))
    return _describe(sub, seed, reference)


def split_through_torch_split_group(backend: str, seed: int):
    """torch.distributed.split_group, as DeviceMesh calls it under eager init
    (the CPU standing in for an accelerator): the parent's options are deep
    copied, the group is registered with torch."""
    c = ctx()
    reference = _reference_groups(backend)[tuple(_mine(c.rank))]
    with cpu_as_accelerator():
        sub = dist.split_group(split_ranks=SPLITS, group_desc=f"split-{seed}")
    out = _describe(sub, seed, reference)
    out["backend_string"] = dist.get_backend(sub)
    out["global_ranks"] = dist.get_process_group_ranks(sub)
    return out


def split_leaves_out_the_other_ranks():
    """Split off ranks 0 and 1 only: the others get no group."""
    c = ctx()
    sub = c.group.split_group([0, 1], group_name="split-01-only")
    if sub is None:
        return None
    x = torch.full((N,), float(c.rank + 1))
    dist.all_reduce(x, group=sub)
    return x


def split_with_options(rank_dependent: bool):
    """Split with fp8comm.Options of its own (block_size 32, min_numel 0,
    all_reduce only, cpu_threads 1), the same on every rank or, with
    `rank_dependent`, a different min_numel per rank. Returns the split
    group's options and CPU threads, or the error."""
    c = ctx()
    min_numel = c.rank if rank_dependent else 0
    options = fp8comm.Options(block_size=32, min_numel=min_numel, compress="all_reduce", cpu_threads=1)
    before = fp8comm._C.cpu_threads()
    try:
        sub = c.group.split_group(_mine(c.rank), opts=options, group_name=_name(f"split-options-{rank_dependent}"),
                                  timeout=datetime.timedelta(seconds=60))
    except ValueError as e:
        return {"error": str(e)}
    finally:
        threads = fp8comm._C.set_cpu_threads(before)
    be = fp8_backend(sub)
    fp8comm.reset_stats(sub)
    x = rank_input(c.rank, 256)
    dist.all_reduce(x, group=sub)
    return {"error": None, "block_size": be.block_size, "min_numel": be.min_numel, "ops": be.compressed_ops,
            "cpu_threads": threads, "stats": fp8comm.get_stats(sub)}


def split_of_a_group_on_two_device_types():
    """A group holding the world's fp8 backend for both "cpu" and "cuda", as
    "cpu:fp8gloo,cuda:fp8nccl" does: torch's splitGroup calls split once per
    device type, and the transports must be split once."""
    c = ctx()
    calls = []

    def counting(parent, store, ranks, options):
        calls.append(list(ranks))
        return subgroups.split(parent, store, ranks, options)

    fp8comm._C._set_splitter(counting)
    try:
        pg = dist.ProcessGroup(dist.PrefixStore("two-devices/", dist.distributed_c10d._get_default_store()),
                               c.rank, c.world)
        pg._set_default_backend(CUSTOM)
        for device in ("cpu", "cuda"):
            pg._register_backend(torch.device(device), CUSTOM, fp8_backend(c.group))
        sub = pg.split_group(_mine(c.rank), group_name=_name("split-two-devices"))
    finally:
        subgroups.install()
    on_cpu, on_cuda = sub._get_backend(torch.device("cpu")), sub._get_backend(torch.device("cuda"))
    x = torch.full((N,), float(c.rank + 1))
    dist.all_reduce(x, group=sub)
    return {"calls": calls, "one_object": on_cpu is on_cuda, "type": type(on_cpu).__name__, "sum": x}


def barrier_device_ids():
    """The device_ids that reach the fp8ncclsim transport of fp8ncclsim
    groups: barrier() with none on a group bound to a device (as
    init_process_group(device_id=...) binds it), with ids given, and with
    none on the pool's unbound group."""
    c = ctx()
    base = dist.PrefixStore("barrier-bound/", dist.distributed_c10d._get_default_store())
    pg = dist.ProcessGroup(base, c.rank, c.world)
    pg._set_default_backend(CUSTOM)
    pg.bound_device_id = torch.device("cpu", 0)
    creation = dist.distributed_c10d._DistributedBackendOptions()
    creation.store = dist.PrefixStore("cpu/", base)
    creation.group_rank, creation.group_size = c.rank, c.world
    creation.timeout = datetime.timedelta(seconds=60)
    creation.group_id = "barrier-bound"
    creation.global_ranks_in_group = list(range(c.world))
    bound = fp8comm._testing._create_ncclsim(creation, None)
    pg._register_backend(torch.device("cpu"), CUSTOM, bound)
    seen = {}
    pg.barrier().wait()
    seen["bound, none given"] = bound.transport("cpu").barrier_device_ids()
    opts = dist.BarrierOptions()
    opts.device_ids = [3]
    pg.barrier(opts).wait()
    seen["bound, [3] given"] = bound.transport("cpu").barrier_device_ids()
    dist.barrier(group=c.group)
    seen["unbound, none given"] = fp8_backend(c.group).transport("cpu").barrier_device_ids()
    return seen


def split_source_under_eager_init():
    """What torch's new_group splits new NCCL groups from, the world bound
    to a device: fp8comm answers the fp8 backend's NCCL transport, none here
    (gloo, or the fp8ncclsim transport); torch's own answer is the fp8
    backend, which ProcessGroupNCCL cannot split from."""
    c10d = dist.distributed_c10d
    with cpu_as_accelerator():
        return {"seen": c10d._get_split_source(ctx().group),
                "torch": type(c10d._get_split_source.fp8comm_wraps(ctx().group)).__name__}
