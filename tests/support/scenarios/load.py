"""Load scenarios (run on every rank of a DistPool): subgroup churn and the
soak of mixed collectives, each result checked, resources read as it goes."""
from __future__ import annotations

import ctypes
import hashlib
import os
from typing import Callable, NamedTuple

import torch
import torch.distributed as dist

import fp8comm
from tests.support.bounds import bound_violations
from tests.support.groups import fp8_group
from tests.support.harness import ctx
from tests.support.inputs import PREMUL_FACTORS, rank_input, same_bits
from tests.support.ops import OPS, Call, Issued, reduce_op, run

FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def _release_freed_heap():
    """Hands glibc's freed-but-cached heap pages back to the kernel, so that
    RSS counts live memory: without it, which sizes happened to be freed
    last decides how much cached heap RSS still shows."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: RSS includes the allocator's cache
        pass


def resources() -> dict:
    _release_freed_heap()
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    return {
        "rss_kib": int(status["VmRSS"].split()[0]),
        "threads": int(status["Threads"]),
        "fds": len(os.listdir("/proc/self/fd")),
    }


def subgroup_churn(cycles: int):
    """Creates, uses and destroys a subgroup `cycles` times; returns resources
    after a warm-up of 10 cycles and at the end."""
    c = ctx()
    marks = []
    for i in range(cycles):
        g = dist.new_group(backend="fp8gloo", pg_options=fp8comm.Options(min_numel=1))
        x = torch.full((20_000,), float(c.rank + 1))
        dist.all_reduce(x, group=g)
        assert x[0].item() == c.world * (c.world + 1) / 2, x[0].item()
        dist.destroy_process_group(g)
        if i == 9:
            marks.append(resources())
    marks.append(resources())
    return marks


# ------------------------------------------------------------------ soak
SOAK_KINDS = ["all_reduce", "all_reduce_coalesced", "reduce_scatter", "all_gather", "small", "int", "max",
              "broadcast"]
SOAK_AG_GROUP = "compress=all;min_numel=1024"  # all_gather compressed from 1024 elements


class Check(NamedTuple):
    kind: str  # the kind of check, e.g. "all_reduce_fp8" or "reduce_scatter_list_exact"
    ok: bool
    digest: str | None  # of a result that must be the same on every rank


class Planned(NamedTuple):
    issued: Issued
    check: Callable[[], list]  # -> [Check], once the call is done


class SoakResult(NamedTuple):
    calls: int  # collectives issued and checked
    marks: list  # resources at every fifth of the run and at the end
    failures: dict  # kind -> [the failed calls]
    checks: dict  # kind -> number of checks
    digests: list  # of every all_reduce and all_gather result, in order


def soak(ops: int, seed: int = 0):
    """`ops` mixed collectives: sizes (1 to 200k per rank, so both sides of
    min_numel), dtypes, SUM / AVG / PREMUL_SUM, tensor / list / coalesced
    forms, compressed and passthrough, async and sync, up to 4 in flight;
    each checked: compressed results element by element against the
    documented bound, passthrough ones bit for bit against plain gloo (or the
    exact local answer)."""
    c = ctx()
    rng = torch.Generator().manual_seed(seed)  # same sequence on every rank
    failures: dict = {}
    counts: dict = {}
    digests: list = []
    marks = []
    in_flight: list = []
    checked = 0

    def settle():
        nonlocal checked
        for planned, what in in_flight:
            if planned.issued.work is not None:
                planned.issued.work.wait()
            for check in planned.check():
                counts[check.kind] = counts.get(check.kind, 0) + 1
                if not check.ok:
                    failures.setdefault(check.kind, []).append(what)
                if check.digest is not None:
                    digests.append(check.digest)
            checked += 1
        in_flight.clear()

    def draw(k):
        return int(torch.randint(0, k, (1,), generator=rng))

    for i in range(ops):
        kind = SOAK_KINDS[draw(len(SOAK_KINDS))]
        n = 1 + draw([1000, 20_000, 200_000][draw(3)])  # both sides of min_numel (16384; 1024 for all_gather)
        dtype = [torch.float32, torch.bfloat16, torch.float16][draw(3)]
        reduce = ["sum", "avg", "premul_sum"][draw(3)]
        form = ["tensor", "list", "coalesced"][draw(3)]
        factor_kind = ["double", "tensor"][draw(2)]
        async_op = bool(draw(2))
        what = (i, kind, n, str(dtype), reduce, form, factor_kind, async_op)
        in_flight.append((_soak_op(kind, n, dtype, reduce, form, factor_kind, async_op, 1000 + i, c), what))
        if not async_op or len(in_flight) >= 4:
            settle()
        if (i + 1) % max(1, ops // 5) == 0:  # resources at 20%, 40%, ... of the run
            settle()
            marks.append(resources())
    settle()
    marks.append(resources())
    return SoakResult(checked, marks, failures, counts, digests)


def _digest(t: torch.Tensor) -> str:
    return hashlib.blake2b(t.contiguous().view(torch.uint8).numpy().tobytes(), digest_size=8).hexdigest()


def _soak_op(kind, n, dtype, reduce, form, factor_kind, async_op, seed, c) -> Planned:
    """Issues one collective of SOAK_KINDS through the ops table and plans its check."""
    g, P, rank = c.group, c.world, c.rank
    be = g._get_backend(torch.device("cpu"))
    factors = PREMUL_FACTORS[:P] if reduce == "premul_sum" else [1.0] * P
    div = P if reduce == "avg" else 1
    call = Call(g, rank, P, reduce_op(reduce, PREMUL_FACTORS[rank], factor_kind), async_op)
    fp8 = FP8[be.fp8_dtype]

    def inp(r, m, s=seed):
        return rank_input(r, m, dtype, s)

    def wired(m, s):  # what each rank puts on the wire
        return [inp(r, m, s).float() * factors[r] for r in range(P)]

    def exact(name, xs):
        """Plain gloo's SUM of the (pre-multiplied) inputs through op `name`,
        divided for AVG: bit for bit what the exact path must give."""
        pre = [x * factors[rank] if reduce == "premul_sum" else x.clone() for x in xs]
        outs = run(name, Call(c.gloo, rank, P), pre)
        return [o / div for o in outs] if reduce == "avg" else outs

    if kind in ("all_reduce", "all_reduce_coalesced"):
        sizes = [n] if kind == "all_reduce" else [n // 2 + 1, n // 5 + 1]
        xs = [inp(rank, m, seed + j) for j, m in enumerate(sizes)]
        compressed = sum(sizes) >= be.min_numel
        refs = None if compressed else exact(kind, xs)  # gloo's own op, which fp8gloo forwards (or emulates with)
        issued = OPS[kind](call, xs)

        def check():
            out = torch.cat(xs)
            if compressed:
                ys = [torch.cat(parts) for parts in zip(*[wired(m, seed + j) for j, m in enumerate(sizes)])]
                ok = bound_violations("all_reduce", ys, out, div, be.block_size, fp8, rank).ok
            else:
                ok = all(same_bits(x, r) for x, r in zip(xs, refs))
            return [Check(f"{kind}_{'fp8' if compressed else 'exact'}", ok, _digest(out))]
        return Planned(issued, check)
    if kind == "reduce_scatter":
        k = max(1, n // P)
        sizes = [k] if form == "tensor" else [k, k // 3 + 1]
        xs = [inp(rank, m * P, seed + j) for j, m in enumerate(sizes)]
        compressed = [m >= be.min_numel for m in sizes]
        # gloo's list form sums in another order than its tensor form; fp8gloo
        # forwards a SUM in the form it was given, and emulates AVG /
        # PREMUL_SUM with the tensor form.
        ref_name = "reduce_scatter_list" if form == "list" and reduce == "sum" else "reduce_scatter_tensor"
        refs = [None if comp else exact(ref_name, [x])[0] for x, comp in zip(xs, compressed)]
        issued = OPS[f"reduce_scatter_{form}"](call, xs)

        def check():
            results = []
            for j, (m, out, comp, ref) in enumerate(zip(sizes, issued.outputs, compressed, refs)):
                if comp:
                    ok = bound_violations("reduce_scatter", wired(m * P, seed + j), out, div, be.block_size, fp8,
                                          rank).ok
                else:
                    ok = same_bits(out, ref)
                results.append(Check(f"reduce_scatter_{form}_{'fp8' if comp else 'exact'}", ok, None))
            return results
        return Planned(issued, check)
    if kind == "all_gather":
        sizes = [n] if form == "tensor" else [n, n // 3 + 1]
        xs = [inp(rank, m, seed + j) for j, m in enumerate(sizes)]
        issued = OPS[f"all_gather_{form}"](Call(fp8_group(SOAK_AG_GROUP), rank, P, async_op=async_op), xs)

        def check():
            results = []
            for j, (m, out) in enumerate(zip(sizes, issued.outputs)):
                everyone = [inp(r, m, seed + j) for r in range(P)]
                if m >= 1024:
                    ok = bound_violations("all_gather", [e.float() for e in everyone], out, 1, 32,
                                          torch.float8_e4m3fn, rank).ok
                    results.append(Check(f"all_gather_{form}_fp8", ok, _digest(out)))
                else:
                    results.append(Check(f"all_gather_{form}_exact", same_bits(out, torch.cat(everyone)),
                                         _digest(out)))
            return results
        return Planned(issued, check)
    if kind == "small":  # a loss, a grad norm: under min_numel, exact
        x = inp(rank, 7)
        expect = exact("all_reduce", [x])[0]
        issued = OPS["all_reduce"](call, [x])
        return Planned(issued, lambda: [Check("small_exact", same_bits(x, expect), _digest(x))])
    if kind == "int":
        x = torch.full((n,), rank + 1, dtype=torch.int64)
        issued = OPS["all_reduce"](Call(g, rank, P, async_op=async_op), [x])
        total = P * (P + 1) // 2
        return Planned(issued, lambda: [Check("int_exact", bool((x == total).all()), _digest(x))])
    if kind == "max":
        x = inp(rank, n)
        ref = torch.stack([inp(r, n) for r in range(P)]).amax(0)
        issued = OPS["all_reduce"](Call(g, rank, P, reduce_op("max"), async_op), [x])
        return Planned(issued, lambda: [Check("max_exact", same_bits(x, ref), _digest(x))])
    x = inp(rank, n)
    issued = OPS["broadcast"](Call(g, rank, P, async_op=async_op, root=0), [x])
    return Planned(issued, lambda: [Check("broadcast_exact", same_bits(x, inp(0, n)), None)])
