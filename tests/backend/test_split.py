"""Splitting fp8 groups, 4 real processes, on fp8gloo and
on fp8ncclsim (fp8nccl's path: the fp8ncclsim transport splits as NCCL does).

torch splits a group where its backend can (``supports_splitting``):
``torch.distributed.split_group``, and DeviceMesh under eager init. A split
group must be an fp8 group of the same kind with the parent's options, and
compute what a group created with new_group over the same ranks computes,
bit for bit, compressed. torch's split_group needs an accelerator and a bound
device; here the CPU stands in for one (tests/support/groups.py). The world's
options are not the defaults, so that carrying them is seen.

Also here: fp8nccl's barrier names its device to NCCL when the caller gave
none (Lightning gives device ids only to a backend named "nccl").
"""
from __future__ import annotations

import datetime
import inspect

import pytest
import torch
import torch.distributed as dist

import fp8comm
import fp8comm._testing
from fp8comm import subgroups
from tests.support.groups import cpu_as_accelerator
from tests.support.harness import PoolSpec, ctx
from tests.support.inputs import rank_input
from tests.support.reference import sqnr_db
from tests.support.torch_features import SPLIT_NEEDS_CUDA, split_group_takes_the_bound_device

# ---------------------------------------------------------------- scenarios
# Run on every rank of the pool: module-level, the ranks import this module.

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
    backend, which ProcessGroupNCCL cannot split from (torch 2.15, which is
    also asked for the backend it will create, answers None itself)."""
    c10d = dist.distributed_c10d
    torchs = c10d._get_split_source.fp8comm_wraps
    args = (ctx().group, "nccl") if "requested_backend" in inspect.signature(torchs).parameters else (ctx().group,)
    with cpu_as_accelerator():
        return {"seen": c10d._get_split_source(*args), "torch": type(torchs(*args)).__name__,
                "asks_backend": len(args) == 2}


# ---------------------------------------------------------------- tests

OPTIONS = {"block_size": 64, "wire_format": "e5m2", "min_numel": 1024, "compress": "all"}
OPS = ("all_reduce", "reduce_scatter", "all_gather")
MIN_SQNR_DB = 20.0  # E5M2 through one or two quantizations: ~25 dB on randn


POOLS = [PoolSpec(4, backend, pg_options=OPTIONS, id=backend) for backend in ("fp8gloo", "fp8ncclsim")]


def check_split_group(results, backend):
    for rank, r in enumerate(results):
        assert r["type"] == "ProcessGroupFp8" and r["name"] == "fp8gloo", r
        assert (r["rank"], r["size"]) == (rank % 2, 2)
        assert r["same_options"], r["options"]
        assert r["traits"] == r["parent_traits"]  # fp8ncclsim's split keeps NCCL's traits
        if backend == "fp8ncclsim":
            assert r["traits"]["reduces_avg_and_premul"] and not r["traits"]["segment_headers"]
        for op in OPS:
            assert torch.equal(r["got"][op], r["ref"][op]), f"rank {rank} {op}: differs from new_group's"
            assert sqnr_db(r["exact"][op], r["got"][op]) > MIN_SQNR_DB, op
            assert not torch.equal(r["got"][op].double(), r["exact"][op]), f"{op}: exact (not compressed?)"
        stats = r["stats"]
        assert stats["calls_compressed"] == 3 and stats["calls_passthrough"] == 0, stats
        assert stats["bytes_sent"] < 0.3 * stats["bytes_sent_uncompressed"], stats
    for a, b in ((0, 1), (2, 3)):  # all_reduce: the same bits on every rank of a split
        assert torch.equal(results[a]["got"]["all_reduce"], results[b]["got"]["all_reduce"])


def test_split_through_the_backend_api(pool):
    check_split_group(pool.run(split_through_backend_api, pool.backend, seed=1), pool.backend)


def test_torch_split_group(pool):
    if not split_group_takes_the_bound_device():
        pytest.skip(SPLIT_NEEDS_CUDA)
    results = pool.run(split_through_torch_split_group, pool.backend, seed=2)
    check_split_group(results, pool.backend)
    for rank, r in enumerate(results):
        assert r["backend_string"] == pool.backend  # what the parent was created with
        assert r["global_ranks"] == SPLITS[rank // 2]


def test_ranks_outside_the_split_get_no_group(pool):
    results = pool.run(split_leaves_out_the_other_ranks)
    assert results[2] is None and results[3] is None
    assert torch.equal(results[0], torch.full((N,), 3.0)) and torch.equal(results[1], results[0])


def test_options_given_at_the_split_are_used(pool):
    for r in pool.run(split_with_options, rank_dependent=False):
        assert r["error"] is None, r["error"]
        assert (r["block_size"], r["min_numel"], r["ops"]) == (32, 0, ["all_reduce"])
        assert r["cpu_threads"] == 1  # sized as at any group's creation
        assert r["stats"]["calls_compressed"] == 1, r["stats"]  # 256 elements: min_numel 0 compresses them


def test_ranks_that_split_with_different_options_all_raise(pool):
    for rank, r in enumerate(pool.run(split_with_options, rank_dependent=True)):
        assert r["error"] is not None, f"rank {rank} split with mismatched options"
        assert "min_numel: rank 0 has" in r["error"] and "same fp8comm.Options" in r["error"], r["error"]


def test_a_group_on_two_device_types_splits_its_transports_once(pool):
    for rank, r in enumerate(pool.run(split_of_a_group_on_two_device_types)):
        assert r["calls"] == [SPLITS[rank // 2]], r["calls"]  # torch asked twice, the transports split once
        assert r["one_object"] and r["type"] == "ProcessGroupFp8"
        assert torch.equal(r["sum"], torch.full((N,), float(sum(SPLITS[rank // 2]) + 2)))


def test_new_groups_never_split_from_an_fp8_backend(pool):
    for r in pool.run(split_source_under_eager_init):
        torchs = "NoneType" if r["asks_backend"] else "ProcessGroupFp8"
        assert (r["seen"], r["torch"]) == (None, torchs), r


def test_barrier_names_the_device_to_nccl(pool):
    if pool.backend != "fp8ncclsim":
        pytest.skip("device ids matter to NCCL only")
    for seen in pool.run(barrier_device_ids):
        assert seen == {"bound, none given": [0], "bound, [3] given": [3], "unbound, none given": []}, seen
