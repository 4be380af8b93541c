"""Scenario functions run on every rank of a DistPool (see dist_harness.py).

Inputs are drawn from per-rank seeds, so every rank can rebuild every other
rank's input and compute the FP64 reference without communicating.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

import fp8comm
from codec_reference import sqnr_db
from dist_harness import ctx


def rank_input(rank: int, n: int, dtype=torch.float32, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 7919 + rank)
    return (torch.randn(n, generator=gen) * scale).to(dtype)


def premul_factors(world: int, kind: str) -> list[float]:
    if kind == "double":
        return [0.5] * world
    if kind == "tensor":  # a different factor per rank, as NCCL allows
        return [0.25 * (r + 1) for r in range(world)]
    return [1.0] * world


def make_op(op: str, factor_kind: str, rank: int, world: int):
    if op == "sum":
        return dist.ReduceOp.SUM
    if op == "avg":
        return dist.ReduceOp.AVG
    if op == "premul_sum":
        f = premul_factors(world, factor_kind)[rank]
        return dist._make_nccl_premul_sum(torch.tensor(f) if factor_kind == "tensor" else f)
    return {"max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN, "product": dist.ReduceOp.PRODUCT}[op]


def reference_sum(n: int, dtype, op: str, factor_kind: str, world: int, seed: int = 0) -> torch.Tensor:
    factors = premul_factors(world, factor_kind) if op == "premul_sum" else [1.0] * world
    total = sum(rank_input(r, n, dtype, seed).double() * factors[r] for r in range(world))
    return total / world if op == "avg" else total


# Compressed-case scenarios also return the group's stats for the call
# (reset before it), so the tests can tell a compressed call from one that
# passed through.

def strided_view(values: torch.Tensor, fill: float = 9.0):
    """(a stride-2 view holding `values`, its base): the other half of the base
    is `fill`, to show a call wrote nowhere but into the view."""
    base = torch.full((values.numel(), 2), fill, dtype=values.dtype)
    base[:, 0] = values
    view = base[:, 0]
    assert not view.is_contiguous()
    return view, base


def neighbours_intact(base: torch.Tensor, fill: float = 9.0) -> bool:
    return bool((base[:, 1] == fill).all())


# ------------------------------------------------------------------ all_reduce
def all_reduce(n, dtype, op="sum", factor_kind="", seed=0, non_contiguous=False):
    c = ctx()
    x = rank_input(c.rank, n, dtype, seed)
    base = None
    if non_contiguous:
        x, base = strided_view(x)
    fp8comm.reset_stats(c.group)
    dist.all_reduce(x, op=make_op(op, factor_kind, c.rank, c.world), group=c.group)
    stats = fp8comm.get_stats(c.group)
    ref = reference_sum(n, dtype, op, factor_kind, c.world, seed)
    assert base is None or neighbours_intact(base)
    return x.contiguous(), sqnr_db(ref, x), stats


def all_reduce_coalesced(sizes, dtype, op="sum"):
    c = ctx()
    xs = [rank_input(c.rank, n, dtype, seed=i) for i, n in enumerate(sizes)]
    fp8comm.reset_stats(c.group)
    dist.all_reduce_coalesced(xs, op=make_op(op, "", c.rank, c.world), group=c.group)
    stats = fp8comm.get_stats(c.group)
    refs = [reference_sum(n, dtype, op, "", c.world, seed=i) for i, n in enumerate(sizes)]
    return [x for x in xs], [sqnr_db(r, x) for r, x in zip(refs, xs)], stats


# -------------------------------------------------------------- reduce_scatter
def reduce_scatter(k, dtype, op="sum", factor_kind="", form="tensor", seed=0, non_contiguous=False):
    """non_contiguous: the input and the output are stride-2 views; the call
    must write the output view and nothing next to it."""
    c = ctx()
    x = rank_input(c.rank, k * c.world, dtype, seed)
    out = torch.empty(k, dtype=dtype)
    bases = []
    if non_contiguous:
        x, in_base = strided_view(x)
        out, out_base = strided_view(out)
        bases = [in_base, out_base]
    rop = make_op(op, factor_kind, c.rank, c.world)
    fp8comm.reset_stats(c.group)
    if form == "tensor":
        dist.reduce_scatter_tensor(out, x, op=rop, group=c.group)
    elif form == "list":
        dist.reduce_scatter(out, list(x.chunk(c.world)), op=rop, group=c.group)
    else:  # coalesced: two reduce_scatters in one call
        out2 = torch.empty(k, dtype=dtype)
        with dist._coalescing_manager(group=c.group):
            dist.reduce_scatter_tensor(out, x, op=rop, group=c.group)
            dist.reduce_scatter_tensor(out2, x * 2, op=rop, group=c.group)
        ref2 = 2 * reference_sum(k * c.world, dtype, op, factor_kind, c.world, seed)[c.rank * k : (c.rank + 1) * k]
        assert sqnr_db(ref2, out2) >= 30
    stats = fp8comm.get_stats(c.group)
    assert all(neighbours_intact(b) for b in bases)
    assert not non_contiguous or torch.equal(x, rank_input(c.rank, k * c.world, dtype, seed))  # input unchanged
    ref = reference_sum(k * c.world, dtype, op, factor_kind, c.world, seed)[c.rank * k : (c.rank + 1) * k]
    return out.contiguous(), sqnr_db(ref, out), stats


# ------------------------------------------------------------------ all_gather
def all_gather(k, dtype, form="tensor", group="group", seed=0, non_contiguous=False):
    """non_contiguous: the input and the output(s) are stride-2 views."""
    c = ctx()
    pg = c.group if group == "group" else make_group(group)
    x = rank_input(c.rank, k, dtype, seed)
    bases = []

    def output(numel):
        out = torch.empty(numel, dtype=dtype)
        if non_contiguous:
            out, base = strided_view(out)
            bases.append(base)
        return out

    if non_contiguous:
        x, in_base = strided_view(x)
        bases.append(in_base)
    fp8comm.reset_stats(pg)
    if form == "tensor":
        out = output(k * c.world)
        dist.all_gather_into_tensor(out, x, group=pg)
    elif form == "list":
        outs = [output(k) for _ in range(c.world)]
        dist.all_gather(outs, x, group=pg)
        out = torch.cat(outs)
    else:  # coalesced
        out = output(k * c.world)
        out2 = output(k * c.world)
        with dist._coalescing_manager(group=pg):
            dist.all_gather_into_tensor(out, x, group=pg)
            dist.all_gather_into_tensor(out2, x * 4, group=pg)
        assert torch.equal(out2, out * 4)  # power-of-two scaling commutes exactly with the codec
    stats = fp8comm.get_stats(pg)
    assert all(neighbours_intact(b) for b in bases)
    ref = torch.cat([rank_input(r, k, dtype, seed).double() for r in range(c.world)])
    return out.contiguous(), sqnr_db(ref, out), stats


_GROUPS: dict = {}


def make_group(spec: str):
    """A cached extra fp8gloo group over all ranks with Options from `spec`."""
    if spec not in _GROUPS:
        kwargs = dict(item.split("=") for item in spec.split(";"))
        if "compress" in kwargs:
            kwargs["compress"] = kwargs["compress"].split(",")
        for key in ("block_size", "min_numel"):
            if key in kwargs:
                kwargs[key] = int(kwargs[key])
        _GROUPS[spec] = dist.new_group(backend="fp8gloo", pg_options=fp8comm.Options(**kwargs))
    return _GROUPS[spec]


# ------------------------------------------------------------ exact passthrough
def passthrough_vs_gloo(case: str):
    """Runs one collective on the fp8 group and on plain gloo with the same
    inputs; returns both results (they must be bitwise equal) and the fp8
    group's stats for the call."""
    c = ctx()
    fp8comm.reset_stats(c.group)
    results = []
    for pg in (c.group, c.gloo):
        results.append(_run_passthrough_case(case, pg, c.rank, c.world))
    return results[0], results[1], fp8comm.get_stats(c.group)


def _run_passthrough_case(case, pg, rank, world):
    def inp(n, dtype=torch.float32):
        return rank_input(rank, n, dtype, seed=3)

    if case.startswith("all_reduce_"):
        _, _, dtype_name, op = case.split("_", 3)
        dtype = getattr(torch, dtype_name)
        x = inp(5000).mul(100).to(dtype) if not dtype.is_floating_point else inp(5000, dtype)
        dist.all_reduce(x, op=make_op(op, "", rank, world), group=pg)
        return x
    if case == "sparse_all_reduce":  # e.g. sparse embedding gradients under DDP: gloo sums them
        x = torch.sparse_coo_tensor(torch.tensor([[1, 5 + rank, 9]]), inp(3), (40,))
        dist.all_reduce(x, group=pg)
        return x.coalesce().to_dense()
    if case == "small_all_reduce":  # below min_numel: a loss, a grad norm
        x = inp(1000)
        dist.all_reduce(x, group=pg)
        return x
    if case == "small_reduce_scatter":
        out = torch.empty(100)
        dist.reduce_scatter_tensor(out, inp(100 * world), group=pg)
        return out
    if case == "all_gather_default":  # all_gather compression is opt-in
        out = torch.empty(5000 * world)
        dist.all_gather_into_tensor(out, inp(5000), group=pg)
        return out
    if case == "all_gather_fp8":  # float8 moves as bytes
        x = inp(5000).to(torch.float8_e4m3fn)
        out = torch.empty(5000 * world, dtype=torch.float8_e4m3fn)
        if pg is ctx().gloo:  # plain gloo has no float8 types: the reference moves bytes
            dist.all_gather_into_tensor(out.view(torch.uint8), x.view(torch.uint8), group=pg)
        else:
            dist.all_gather_into_tensor(out, x, group=pg)
        return out.view(torch.uint8)
    if case == "broadcast":
        x = inp(3000)
        dist.broadcast(x, src=world - 1, group=pg)
        return x
    if case == "reduce":
        x = inp(3000)
        dist.reduce(x, dst=0, group=pg)
        return x
    if case == "gather":
        outs = [torch.empty(300) for _ in range(world)] if rank == 0 else None
        dist.gather(inp(300), outs, dst=0, group=pg)
        return torch.cat(outs) if outs else torch.empty(0)
    if case == "scatter":
        out = torch.empty(300)
        dist.scatter(out, [inp(300) * r for r in range(world)] if rank == 0 else None, src=0, group=pg)
        return out
    if case == "all_to_all_single":
        out = torch.empty(64 * world)
        dist.all_to_all_single(out, inp(64 * world), group=pg)
        return out
    if case == "all_to_all":
        outs = [torch.empty(40) for _ in range(world)]
        dist.all_to_all(outs, list(inp(40 * world).chunk(world)), group=pg)
        return torch.cat(outs)
    if case == "send_recv":
        x = inp(20000)
        if rank == 0:
            dist.send(x, dst=1, group=pg)
        elif rank == 1:
            dist.recv(x, src=0, group=pg)
        return x
    if case == "barrier":
        dist.barrier(group=pg)
        return torch.ones(1)
    if case == "zero_size":
        x = torch.empty(0)
        dist.all_reduce(x, group=pg)
        out = torch.empty(0)
        dist.reduce_scatter_tensor(out, torch.empty(0), group=pg)
        return x
    raise ValueError(case)


def stats_of_last(case: str):
    """Stats of the fp8 group after running `case` once on it."""
    c = ctx()
    fp8comm.reset_stats(c.group)
    _run_passthrough_case(case, c.group, c.rank, c.world)
    return fp8comm.get_stats(c.group)


# --------------------------------------------------------------- non-finite
def non_finite(kind: str, n: int = 8192):
    c = ctx()
    pg = make_group("compress=all;min_numel=1024")
    x = rank_input(c.rank, n * c.world, torch.float32)
    bad = {0: float("nan"), 1: float("inf"), 2: float("-inf")}
    if c.rank == 0:  # one rank's input carries the bad values
        x[[5, n + 9, 2 * n - 1]] = torch.tensor([bad[0], bad[1], bad[0]])
    if c.rank == c.world - 1:
        x[[17]] = bad[2]
    fp8comm.reset_stats(pg)
    if kind == "all_reduce":
        dist.all_reduce(x, group=pg)
        return ~torch.isfinite(x), fp8comm.get_stats(pg)
    if kind == "reduce_scatter":
        out = torch.empty(n)
        dist.reduce_scatter_tensor(out, x, group=pg)
        return ~torch.isfinite(out), fp8comm.get_stats(pg)
    out = torch.empty(n * c.world * c.world)
    dist.all_gather_into_tensor(out, x, group=pg)
    return ~torch.isfinite(out), fp8comm.get_stats(pg)


# -------------------------------------------------------------- async and futures
def async_in_flight(n: int = 20_000):
    c = ctx()
    xs = [rank_input(c.rank, n, torch.float32, seed=s) for s in range(4)]
    outs = [torch.empty(n // c.world * c.world // c.world) for _ in range(2)]
    fp8comm.reset_stats(c.group)
    works = [dist.all_reduce(x, group=c.group, async_op=True) for x in xs[:2]]
    rs_in = [rank_input(c.rank, len(outs[0]) * c.world, torch.float32, seed=10 + i) for i in range(2)]
    works += [dist.reduce_scatter_tensor(o, i, group=c.group, async_op=True) for o, i in zip(outs, rs_in)]
    futs = [w.get_future() for w in works]
    for w in works:
        w.wait()
        assert w.is_completed() and w.is_success()
    for f in futs:
        assert f.done()
    values = futs[0].wait()
    assert isinstance(values, list) and values[0] is xs[0]
    chained = dist.all_reduce(xs[2], group=c.group, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    doubled = chained.wait()
    sq = [sqnr_db(reference_sum(n, torch.float32, "sum", "", c.world, seed=s), xs[s]) for s in range(3)]
    sq.append(sqnr_db(2 * reference_sum(n, torch.float32, "sum", "", c.world, seed=2), doubled))
    return sq, fp8comm.get_stats(c.group)


# ------------------------------------------------------------------ training
def _mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(128, 256), torch.nn.GELU(), torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 8)
    )


def ddp_train(steps: int = 20, hook: str = "none"):
    from torch.nn.parallel import DistributedDataParallel as DDP

    c = ctx()
    model = DDP(_mlp(), process_group=c.group)
    if hook == "future":  # a comm hook built on Work.get_future(), as users write them
        def allreduce_hook(state, bucket):
            t = bucket.buffer().div_(c.world)
            return dist.all_reduce(t, group=c.group, async_op=True).get_future().then(lambda f: f.value()[0])
        model.register_comm_hook(None, allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    fp8comm.reset_stats(c.group)
    gen = torch.Generator().manual_seed(100 + c.rank)
    losses = []
    for _ in range(steps):
        x = torch.randn(32, 128, generator=gen)
        y = torch.randn(32, 8, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return flat, losses, fp8comm.get_stats(c.group)


def fsdp2_train(which: str, steps: int = 30):
    """A small MLP under fully_shard on the fp8 group or on plain gloo; returns
    the global mean loss per step."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    c = ctx()
    pg = c.group if which == "fp8" else c.gloo
    mesh = DeviceMesh.from_group(pg, "cpu")
    model = _mlp(seed=1)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(200 + c.rank)
    target = torch.nn.Linear(128, 8)
    torch.nn.init.normal_(target.weight, std=0.2, generator=torch.Generator().manual_seed(5))
    losses = []
    for _ in range(steps):
        x = torch.randn(64, 128, generator=gen)
        with torch.no_grad():
            y = target(x)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, group=c.gloo)
        losses.append(mean.item() / c.world)
    stats = fp8comm.get_stats(c.group) if which == "fp8" else None
    return losses, stats


# ------------------------------------------------------------- setup and options
def stats_after_all_reduce(n: int, dtype):
    c = ctx()
    fp8comm.reset_stats(c.group)
    x = rank_input(c.rank, n, dtype)
    dist.all_reduce(x, group=c.group)
    return fp8comm.get_stats(c.group)


def backend_properties(spec: str | None = None):
    c = ctx()
    pg = make_group(spec) if spec else c.group
    be = pg._get_backend(torch.device("cpu"))
    return {
        "name": be.name(),
        "block_size": be.block_size,
        "fp8_dtype": be.fp8_dtype,
        "min_numel": be.min_numel,
        "compressed_ops": be.compressed_ops,
    }


def compress_none_passes_everything_through():
    c = ctx()
    pg = make_group("compress=none")
    fp8comm.reset_stats(pg)
    x = rank_input(c.rank, 100_000, torch.float32)
    ref = x.clone()
    dist.all_reduce(x, group=pg)
    dist.all_reduce(ref, group=c.gloo)
    out = torch.empty(50_000)
    dist.reduce_scatter_tensor(out, rank_input(c.rank, 50_000 * c.world, torch.float32), group=pg)
    return torch.equal(x, ref), fp8comm.get_stats(pg)


def group_identity():
    c = ctx()
    g = dist.new_group(backend="fp8gloo", group_desc="fp8-test-group")
    x = torch.ones(10)
    dist.all_reduce(x, group=g)
    be = g._get_backend(torch.device("cpu"))
    uid, desc = be.transport_identity("cpu")
    name = g.group_name
    dist.destroy_process_group(g)
    return uid, desc, name, x


def subgroup_of_first_two(repeats: int = 1):
    """new_group over ranks [0, 1], created and destroyed `repeats` times."""
    c = ctx()
    out = []
    for i in range(repeats):
        g = dist.new_group(ranks=[0, 1], backend="fp8gloo", pg_options=fp8comm.Options(min_numel=1))
        if c.rank < 2:
            x = torch.full((5000,), float(c.rank + 1 + i))
            dist.all_reduce(x, group=g)
            out.append(x[0].item())
            dist.destroy_process_group(g)
    return out


def _bad_calls(c):
    """name -> (the tensors the call could write, the call). Every call is
    wrong on this rank in a way this rank can see."""
    w, g = c.world, c.group
    be = g._get_backend(torch.device("cpu"))

    def S(n, dtype=torch.float32):  # a sentinel-filled tensor the call must leave alone
        return torch.full((n,), 7.0).to(dtype)

    def f8(n):
        return torch.full((n,), 3.0).to(torch.float8_e4m3fn)

    def coalesced(pairs, kind, op=dist.ReduceOp.SUM):
        with dist._coalescing_manager(group=g):
            for out, inp in pairs:
                if kind == "rs":
                    dist.reduce_scatter_tensor(out, inp, op=op, group=g)
                else:
                    dist.all_gather_into_tensor(out, inp, group=g)

    premul = dist._make_nccl_premul_sum(0.5)
    calls = {}
    o = S(100)
    calls["rs_size"] = ([o], lambda: dist.reduce_scatter_tensor(o, torch.randn(100 * w + 1), group=g))
    o1 = S(10_000, torch.bfloat16)
    calls["rs_dtype"] = ([o1], lambda: dist.reduce_scatter_tensor(o1, torch.randn(10_000 * w), group=g))
    o2 = S(100 * w + 3)
    calls["ag_size"] = ([o2], lambda: dist.all_gather_into_tensor(o2, torch.randn(100), group=g))
    o3 = S(100 * w, torch.float16)
    calls["ag_dtype"] = ([o3], lambda: dist.all_gather_into_tensor(o3, torch.randn(100), group=g))
    l1 = [S(100) for _ in range(w + 1)]
    calls["ag_list_len"] = (l1, lambda: dist.all_gather(l1, torch.randn(100), group=g))
    l2 = [S(101) for _ in range(w)]
    calls["ag_list_size"] = (l2, lambda: dist.all_gather(l2, torch.randn(100), group=g))
    # (dist.all_gather / dist.reduce_scatter refuse mixed dtypes in Python
    # already; the backend's own check is reached by calling it directly)
    l3 = [S(100, torch.bfloat16) for _ in range(w)]
    calls["ag_list_dtype"] = (l3, lambda: be.allgather([l3], [torch.randn(100)]))
    o4 = S(5000)
    calls["rs_list_size"] = ([o4], lambda: dist.reduce_scatter(o4, [torch.randn(5001)] * w, group=g))
    o5 = S(5000)
    calls["rs_list_dtype"] = ([o5], lambda: be.reduce_scatter([o5], [[torch.randn(5000).bfloat16()] * w]))
    # float8 reductions, in every form that reduces
    t1 = f8(10)
    calls["fp8_reduce"] = ([t1], lambda: dist.all_reduce(t1, group=g))
    t2 = f8(10)
    calls["fp8_reduce_premul"] = ([t2], lambda: dist.all_reduce(t2, op=premul, group=g))
    t3 = [f8(10), f8(30)]
    calls["fp8_all_reduce_coalesced"] = (t3, lambda: dist.all_reduce_coalesced(t3, op=premul, group=g))
    o6 = f8(100)
    calls["fp8_rs_list"] = ([o6], lambda: dist.reduce_scatter(o6, [f8(100)] * w, group=g))
    o7 = f8(100)
    calls["fp8_rs_coalesced"] = ([o7], lambda: coalesced([(o7, f8(100 * w))], "rs", dist.ReduceOp.AVG))
    t4 = f8(100)
    calls["fp8_reduce_op"] = ([t4], lambda: dist.reduce(t4, dst=0, group=g))
    # a coalesced call whose second pair is bad: the first (compressible) one is not issued either
    o8, o9 = S(20_000), S(100)
    calls["rs_coalesced_second_bad"] = (
        [o8, o9], lambda: coalesced([(o8, torch.randn(20_000 * w)), (o9, torch.randn(100 * w + 1))], "rs"))
    o10, o11 = S(20_000 * w), S(100 * w, torch.bfloat16)
    calls["ag_coalesced_second_bad"] = (
        [o10, o11], lambda: coalesced([(o10, torch.randn(20_000)), (o11, torch.randn(100))], "ag"))
    # tensors whose elements share memory (plain gloo crashes the process on them)
    base1, base2, base3 = S(1), S(1), S(1)
    calls["ar_expanded"] = ([base1], lambda: dist.all_reduce(base1.expand(20_000), group=g))
    calls["ar_expanded_small"] = ([base2], lambda: dist.all_reduce(base2.expand(100), group=g))
    calls["ag_expanded_output"] = (
        [base3], lambda: dist.all_gather_into_tensor(base3.expand(100 * w), torch.randn(100), group=g))
    # wrong devices. torch's dispatcher sends meta tensors given to dist.* to its own
    # meta kernels, so the backend is called directly here.
    o12 = S(100)
    calls["device_ag"] = ([], lambda: be._allgather_base(torch.empty(100 * w, device="meta"), torch.randn(100)))
    calls["device_rs"] = ([o12], lambda: be._reduce_scatter_base(o12, torch.empty(100 * w, device="meta")))
    calls["device_ar"] = ([], lambda: be.allreduce([torch.empty(100, device="meta")]))
    # refused by the inner gloo backend itself
    t5 = torch.full((100,), 7, dtype=torch.int64)
    calls["avg_int_gloo"] = ([t5], lambda: dist.all_reduce(t5, op=dist.ReduceOp.AVG, group=g))
    return calls


def bad_inputs():
    """Each bad call must raise on this rank before anything is sent, without
    writing any tensor (never a partial write) and without being counted in
    the stats; afterwards a correct collective still works. Returns
    ({name: (error text or None, every watched tensor untouched)}, stats after
    the bad calls, SQNR of the next collective)."""
    c = ctx()
    fp8comm.reset_stats(c.group)
    results = {}
    for name, (watched, call) in _bad_calls(c).items():
        before = [t.clone() for t in watched]
        try:
            call()
            error = None
        except (RuntimeError, ValueError) as e:
            error = str(e)
        untouched = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(watched, before))
        results[name] = (error, untouched)
    stats = fp8comm.get_stats(c.group)
    x = rank_input(c.rank, 20_000, torch.float32)
    dist.all_reduce(x, group=c.group)
    return results, stats, sqnr_db(reference_sum(20_000, torch.float32, "sum", "", c.world), x)


def reinit_in_same_process(init_file: str):
    """destroy_process_group(), then init_process_group again, then work."""
    import dist_harness

    c = ctx()
    dist.destroy_process_group()
    dist.init_process_group("fp8gloo", init_method=f"file://{init_file}", rank=c.rank, world_size=c.world)
    gloo = dist.new_group(backend="gloo")
    dist_harness._CTX = dist_harness.Context(c.rank, c.world, dist.group.WORLD, gloo)
    x = rank_input(c.rank, 50_000, torch.float32)
    dist.all_reduce(x)
    return sqnr_db(reference_sum(50_000, torch.float32, "sum", "", c.world), x), fp8comm.get_stats()


# ------------------------------------------------- AVG / PREMUL_SUM passthrough
def avg_premul_passthrough(form: str, dtype_name: str, op: str, factor_kind: str = ""):
    """AVG / PREMUL_SUM on tensors that pass through (float64 always; float32
    here under min_numel) over gloo, which has neither: returns (fp8gloo
    result, reference, stats). The reference is plain gloo's SUM of each
    rank's input multiplied by its factor in the input's own dtype (then
    divided by the group size for AVG) — bit for bit what the design promises."""
    c = ctx()
    w = c.world
    dtype = getattr(torch, dtype_name)
    factor = 0.1 * (c.rank + 1)  # one factor per rank, as NCCL allows; 0.1 is not a float32 number
    if op == "avg":
        rop = dist.ReduceOp.AVG
    else:
        rop = dist._make_nccl_premul_sum(torch.tensor(factor, dtype=dtype) if factor_kind == "tensor" else factor)
    n = 999
    x = rank_input(c.rank, n * w, dtype, seed=5)
    pre = x * factor if op == "premul_sum" else x.clone()
    fp8comm.reset_stats(c.group)
    if form == "all_reduce":
        got = x.clone()
        dist.all_reduce(got, op=rop, group=c.group)
        ref = pre
        dist.all_reduce(ref, group=c.gloo)
    elif form == "all_reduce_coalesced":
        got = [x[:n].clone(), x[n:].clone()]
        dist.all_reduce_coalesced(got, op=rop, group=c.group)
        got = torch.cat(got)
        ref = [pre[:n].clone(), pre[n:].clone()]
        dist.all_reduce_coalesced(ref, group=c.gloo)
        ref = torch.cat(ref)
    else:
        got = torch.empty(n, dtype=dtype)
        if form == "reduce_scatter_tensor":
            dist.reduce_scatter_tensor(got, x, op=rop, group=c.group)
        elif form == "reduce_scatter_list":
            dist.reduce_scatter(got, list(x.chunk(w)), op=rop, group=c.group)
        else:  # reduce_scatter_tensor_coalesced
            with dist._coalescing_manager(group=c.group):
                dist.reduce_scatter_tensor(got, x, op=rop, group=c.group)
        ref = torch.empty(n, dtype=dtype)
        dist.reduce_scatter_tensor(ref, pre, group=c.gloo)
    if op == "avg":
        ref = ref / w
    return got, ref, fp8comm.get_stats(c.group)


def stats_of_coalesced(kind: str):
    """Stats of one coalesced call (two tensors: one compressible, one under
    min_numel) on a group that compresses everything from 1024 elements."""
    c = ctx()
    pg = make_group("compress=all;min_numel=1024")
    w = c.world
    fp8comm.reset_stats(pg)
    with dist._coalescing_manager(group=pg):
        for k in (5000, 100):
            if kind == "reduce_scatter":
                dist.reduce_scatter_tensor(torch.empty(k), torch.randn(k * w), group=pg)
            elif kind == "all_gather":
                dist.all_gather_into_tensor(torch.empty(k * w), torch.randn(k), group=pg)
            else:
                dist.all_reduce(torch.randn(k), group=pg)
    return fp8comm.get_stats(pg)
