"""Scenarios for the reliability tests: dead peers, mismatched calls, leaks,
load, fuzz. They run on every rank of a DistPool."""
from __future__ import annotations

import math
import os
import threading
import time

import torch
import torch.distributed as dist

import fp8comm
from codec_reference import half_ulp, sqnr_db
from dist_harness import ctx
from scenarios import rank_input

FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


# ------------------------------------------------------------------ faults
def peer_dies(when: str, kind: str = "compressed", victim: int = 1):
    """`victim` exits before (or while) the others run an all_reduce: a
    compressed one, or a small PREMUL_SUM one that passes through (gloo has no
    PREMUL_SUM: fp8gloo sums a scaled copy). Survivors return (error text or
    None, seconds until the call returned, whether the failed call left the
    tensor as it was)."""
    c = ctx()
    n = 1 << 22 if kind == "compressed" else 1000
    op = dist.ReduceOp.SUM if kind == "compressed" else dist._make_nccl_premul_sum(0.5)
    x = rank_input(c.rank, n, torch.float32)
    if c.rank == victim:
        if when == "before":
            os._exit(17)
        threading.Timer(0.05, lambda: os._exit(17)).start()
    t0 = time.monotonic()
    for _ in range(2):  # a second call, in case the first completed before the death
        before = x.clone()
        try:
            dist.all_reduce(x, op=op, group=c.group)
        except RuntimeError as e:
            return str(e), time.monotonic() - t0, torch.equal(x, before)
    return None, time.monotonic() - t0, True


def peer_stuck(kind: str, stuck: int = 1, sleep_s: float = 7.0):
    """`stuck` sleeps instead of calling, then makes the call itself (its peers
    have given up by then, so it must fail within the timeout too). The others
    call with async_op=True: a compressed all_reduce (`kind` "compressed") or a
    small int64 one that passes through to gloo ("passthrough"). Returns
    (error text or None, where it was raised: "call" or "wait", seconds)."""
    c = ctx()
    n = 1 << 20 if kind == "compressed" else 100
    x = torch.ones(n) if kind == "compressed" else torch.ones(n, dtype=torch.int64)
    if c.rank == stuck:
        time.sleep(sleep_s)
    t0 = time.monotonic()
    where = "call"
    try:
        work = dist.all_reduce(x, group=c.group, async_op=True)
        where = "wait"
        work.wait()
        return None, where, time.monotonic() - t0
    except RuntimeError as e:
        return str(e), where, time.monotonic() - t0


def mismatched_numel(which: str = "fp8", op: str = "all_reduce"):
    """Rank 0 passes 40 000 elements, the others 80 000 (for fp8gloo: the wire
    segments differ in size), on the fp8 group or on plain gloo (`which`).
    Returns (error text or None, seconds)."""
    c = ctx()
    pg = c.group if which == "fp8" else c.gloo
    n = 40_000 if c.rank == 0 else 80_000
    x = torch.ones(n)
    t0 = time.monotonic()
    try:
        if op == "all_reduce":
            dist.all_reduce(x, group=pg)
        else:
            dist.reduce_scatter_tensor(torch.empty(n), torch.ones(n * c.world), group=pg)
        return None, time.monotonic() - t0
    except RuntimeError as e:
        return str(e), time.monotonic() - t0


def mismatched_dtype():
    """Same numel, float32 on rank 0 and bfloat16 elsewhere: FP8 wire segments
    do not depend on the source dtype, so each rank gets the sum in its dtype."""
    c = ctx()
    dtype = torch.float32 if c.rank == 0 else torch.bfloat16
    x = rank_input(c.rank, 50_000, dtype)
    dist.all_reduce(x, group=c.group)
    ref = sum(rank_input(r, 50_000, torch.float32 if r == 0 else torch.bfloat16).double() for r in range(c.world))
    return x.dtype, sqnr_db(ref, x)


def resources() -> dict:
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


# ------------------------------------------------------------------ load
def soak(ops: int, seed: int = 0):
    """`ops` mixed collectives — sizes, dtypes, ops, passthrough ones, async
    and sync, several in flight — each checked against its reference. Returns
    (checked count, resources at every fifth of the run, worst SQNR per kind)."""
    c = ctx()
    rng = torch.Generator().manual_seed(seed)  # same sequence on every rank
    worst: dict = {}
    marks = []
    in_flight: list = []
    checked = 0

    def settle():
        nonlocal checked
        for work, check in in_flight:
            work.wait()
            kind, value = check()
            worst[kind] = min(worst.get(kind, float("inf")), value)
            checked += 1
        in_flight.clear()

    for i in range(ops):
        kind = ["all_reduce", "reduce_scatter", "all_gather", "small", "int", "max", "broadcast"][
            int(torch.randint(0, 7, (1,), generator=rng))
        ]
        n = int(torch.randint(1, 200_000, (1,), generator=rng)) * (1 if kind != "reduce_scatter" else c.world)
        dtype = [torch.float32, torch.bfloat16, torch.float16][int(torch.randint(0, 3, (1,), generator=rng))]
        async_op = bool(torch.randint(0, 2, (1,), generator=rng))
        seed_i = 1000 + i
        in_flight.append(_soak_op(kind, n, dtype, async_op, seed_i, c))
        if not async_op or len(in_flight) >= 4:
            settle()
        if (i + 1) % max(1, ops // 5) == 0:  # resources at 20%, 40%, ... of the run
            settle()
            marks.append(resources())
    settle()
    marks.append(resources())
    return checked, marks, worst


class _Done:
    def wait(self):
        return True


def _soak_op(kind, n, dtype, async_op, seed, c):
    g = c.group
    if kind == "all_reduce":
        x = rank_input(c.rank, n, dtype, seed)
        ref = sum(rank_input(r, n, dtype, seed).double() for r in range(c.world))
        w = dist.all_reduce(x, group=g, async_op=async_op) or _Done()
        return w, lambda: ("all_reduce_sqnr", sqnr_db(ref, x) if n >= 1024 else 99.0)
    if kind == "reduce_scatter":
        k = n // c.world
        x = rank_input(c.rank, n, dtype, seed)
        out = torch.empty(k, dtype=dtype)
        ref = sum(rank_input(r, n, dtype, seed).double() for r in range(c.world))[c.rank * k : (c.rank + 1) * k]
        w = dist.reduce_scatter_tensor(out, x, group=g, async_op=async_op) or _Done()
        return w, lambda: ("reduce_scatter_sqnr", sqnr_db(ref, out) if k >= 1024 else 99.0)
    if kind == "all_gather":
        x = rank_input(c.rank, n, dtype, seed)
        out = torch.empty(n * c.world, dtype=dtype)
        ref = torch.cat([rank_input(r, n, dtype, seed) for r in range(c.world)])
        w = dist.all_gather_into_tensor(out, x, group=g, async_op=async_op) or _Done()
        return w, lambda: ("all_gather_exact", 1.0 if torch.equal(out, ref) else 0.0)  # passthrough by default
    if kind == "small":
        x = rank_input(c.rank, 7, dtype, seed)
        expect = x.clone()
        dist.all_reduce(expect, group=c.gloo)
        w = dist.all_reduce(x, group=g, async_op=async_op) or _Done()
        return w, lambda: ("small_exact", 1.0 if torch.equal(x, expect) else 0.0)
    if kind == "int":
        x = torch.full((n,), c.rank + 1, dtype=torch.int64)
        w = dist.all_reduce(x, group=g, async_op=async_op) or _Done()
        total = c.world * (c.world + 1) // 2
        return w, lambda: ("int_exact", 1.0 if bool((x == total).all()) else 0.0)
    if kind == "max":
        x = rank_input(c.rank, n, dtype, seed)
        ref = torch.stack([rank_input(r, n, dtype, seed) for r in range(c.world)]).amax(0)
        w = dist.all_reduce(x, op=dist.ReduceOp.MAX, group=g, async_op=async_op) or _Done()
        return w, lambda: ("max_exact", 1.0 if torch.equal(x, ref) else 0.0)
    x = rank_input(c.rank, n, dtype, seed)
    src_value = rank_input(0, n, dtype, seed)
    w = dist.broadcast(x, src=0, group=g, async_op=async_op) or _Done()
    return w, lambda: ("broadcast_exact", 1.0 if torch.equal(x, src_value) else 0.0)


# ------------------------------------------------------------------ fuzz
# Per dtype: a subnormal magnitude and a huge one (fp16's range is not fp32's:
# 1e-39 is 0 in fp16, 1e37 is Inf), and the decades "wide" spans.
SUBNORMAL = {torch.float32: 1e-39, torch.bfloat16: 1e-39, torch.float16: 1e-6}
HUGE = {torch.float32: 1e37, torch.bfloat16: 1e37, torch.float16: 1e4}
DECADES = {torch.float32: (-30, 30), torch.bfloat16: (-30, 30), torch.float16: (-7, 4)}
# Half the smallest subnormal step of the output dtype: the absolute rounding floor.
SUBNORMAL_STEP = {torch.float32: 2.0**-149, torch.bfloat16: 2.0**-133, torch.float16: 2.0**-24}
OUT_EPS = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
PATTERNS = ["randn", "wide", "subnormal", "huge", "zeros", "nonfinite", "mixed"]


def adversarial_input(rank: int, n: int, kind: str, dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 131 + rank)
    x = torch.randn(n, generator=gen)
    lo, hi = DECADES[dtype]
    if kind == "wide":  # magnitudes across the dtype's decades
        x = x * torch.pow(10.0, torch.randint(lo, hi, (n,), generator=gen).float())
    elif kind == "subnormal":
        x = x * SUBNORMAL[dtype]
    elif kind == "huge":
        x = x * HUGE[dtype]
    elif kind == "zeros":
        x = torch.where(torch.rand(n, generator=gen) < 0.5, torch.zeros(n), -torch.zeros(n))
    elif kind == "nonfinite":
        pick = torch.rand(n, generator=gen)
        x = torch.where(pick < 0.02, torch.full((n,), float("nan")), x)
        x = torch.where((pick >= 0.02) & (pick < 0.03), torch.full((n,), float("inf")), x)
        x = torch.where((pick >= 0.03) & (pick < 0.035), torch.full((n,), float("-inf")), x)
    elif kind == "mixed":  # every special value in one tensor, so blocks mix them
        pick = torch.randint(0, 6, (n,), generator=gen)
        x = torch.where(pick == 1, x * SUBNORMAL[dtype], x)
        x = torch.where(pick == 2, x * HUGE[dtype], x)
        x = torch.where(pick == 3, torch.zeros(n) * torch.sign(x), x)
        x = torch.where(pick == 4, x * 10.0 ** lo, x)
    out = x.to(dtype)
    assert kind != "subnormal" or dtype == torch.float32 or bool((out != 0).any()) or n < 8
    return out


def segment_half_ulps(x: torch.Tensor, seg: int, block: int, fp8_dtype) -> torch.Tensor:
    """The FP8 half-ulp bound of each element, with blocks restarting every
    `seg` elements (wire segments)."""
    parts = [half_ulp(part.float(), block, fp8_dtype) for part in x.reshape(-1).split(seg)]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


FACTORS = [0.5, 0.75, 1.25, 1.0]  # one PREMUL_SUM factor per rank (float32 numbers)


def _reduce_op(reduce: str, factor_kind: str, rank: int, dtype):
    if reduce == "sum":
        return dist.ReduceOp.SUM
    if reduce == "avg":
        return dist.ReduceOp.AVG
    f = FACTORS[rank]
    return dist._make_nccl_premul_sum(torch.tensor(f) if factor_kind == "tensor" else f)


def fuzz_case(op: str, form: str, reduce: str, fmt: str, n: int, pattern: str, dtype_name: str, block: int,
              factor_kind: str, seed: int):
    """One fuzzed collective (op in form `form`, reduce kind `reduce`) on an
    extra fp8gloo group that compresses everything (min_numel 1) in `fmt` with
    `block`-element blocks. Each output is checked element by element against
    the exact FP64 result with the documented bound (docs/reliability.md).
    Returns (outputs, bound violations, non-finite position mismatches,
    calls counted as compressed)."""
    from scenarios import make_group

    c = ctx()
    P = c.world
    pg = make_group(f"compress=all;min_numel=1;block_size={block};fp8_dtype={fmt}")
    fp8_dtype = FP8[fmt]
    dtype = getattr(torch, dtype_name)
    rop = _reduce_op(reduce, factor_kind, c.rank, dtype)
    factors = FACTORS[:P] if reduce == "premul_sum" else [1.0] * P
    div = P if reduce == "avg" else 1
    # Coalesced forms move two tensors (of n and n // 3 + 1 elements) in one call.
    sizes = [n, n // 3 + 1] if form != "tensor" else [n]
    if op == "all_reduce" and form == "list":
        raise ValueError("all_reduce has no list form")
    per_rank = [[adversarial_input(r, m * (P if op == "reduce_scatter" else 1), pattern, dtype, seed + i)
                 for r in range(P)] for i, m in enumerate(sizes)]
    mine = [inputs[c.rank].clone() for inputs in per_rank]
    fp8comm.reset_stats(pg)
    if op == "all_reduce":
        if form == "tensor":
            dist.all_reduce(mine[0], op=rop, group=pg)
        else:
            dist.all_reduce_coalesced(mine, op=rop, group=pg)
        outs = mine
    elif op == "reduce_scatter":
        outs = [torch.empty(m, dtype=dtype) for m in sizes]
        if form == "tensor":
            dist.reduce_scatter_tensor(outs[0], mine[0], op=rop, group=pg)
        elif form == "list":
            for out, x in zip(outs, mine):
                dist.reduce_scatter(out, list(x.chunk(P)), op=rop, group=pg)
        else:
            with dist._coalescing_manager(group=pg):
                for out, x in zip(outs, mine):
                    dist.reduce_scatter_tensor(out, x, op=rop, group=pg)
    else:
        outs = [torch.empty(m * P, dtype=dtype) for m in sizes]
        if form == "tensor":
            dist.all_gather_into_tensor(outs[0], mine[0], group=pg)
        elif form == "list":
            for out, x in zip(outs, mine):
                dist.all_gather(list(out.chunk(P)), x, group=pg)
        else:
            with dist._coalescing_manager(group=pg):
                for out, x in zip(outs, mine):
                    dist.all_gather_into_tensor(out, x, group=pg)
    stats = fp8comm.get_stats(pg)

    # What each rank put on the wire: its input times its factor, in FP32.
    scaled = [[(t.float() * factors[r]) for r, t in enumerate(inputs)] for inputs in per_rank]
    if op == "all_reduce":  # a coalesced all_reduce is one all_reduce of the concatenation
        scaled = [[torch.cat([s[r] for s in scaled]) for r in range(P)]]
        outs_checked = [torch.cat([o.reshape(-1) for o in outs])]
    else:
        outs_checked = outs
    violations = 0
    nonfinite_mismatch = 0
    for k, (ys, out) in enumerate(zip(scaled, outs_checked)):
        m = ys[0].numel() if op != "reduce_scatter" else ys[0].numel() // P
        exact = sum(y.double() for y in ys) / div
        slack = 4 * P * 2.0**-24 * sum(y.double().abs() for y in ys) / div
        if op == "all_reduce":
            seg = math.ceil(math.ceil(m / P) / block) * block  # the algorithm's segment length
            bound = sum(segment_half_ulps(y, seg, block, fp8_dtype) for y in ys) / div
            bound = bound + 2 * segment_half_ulps(exact.float(), seg, block, fp8_dtype)
            ref = exact
        elif op == "reduce_scatter":
            sl = slice(c.rank * m, (c.rank + 1) * m)
            bound = sum(segment_half_ulps(y, m, block, fp8_dtype)[sl] for y in ys) / div
            ref, slack = exact[sl], slack[sl]
        else:
            ref = torch.cat([y.double() for y in ys])
            bound = torch.cat([segment_half_ulps(y, m, block, fp8_dtype) for y in ys])
            slack = torch.zeros_like(ref)
        out64 = out.double().reshape(-1)
        tol = bound + slack + OUT_EPS[dtype] * ref.abs() + SUBNORMAL_STEP[dtype]
        finite_ref = torch.isfinite(ref)
        in_range = finite_ref & (ref.abs() < torch.finfo(dtype).max / 2)
        violations += int(((out64 - ref).abs() > tol)[in_range & torch.isfinite(out64)].sum())
        violations += int((~torch.isfinite(out64) & in_range).sum())  # a finite result must stay finite
        nonfinite_mismatch += int((torch.isfinite(out64) & ~finite_ref).sum())
    return outs, violations, nonfinite_mismatch, stats["calls_compressed"]


def fuzz_passthrough(n: int, kind: str, dtype_name: str, seed: int):
    """all_reduce and all_gather of adversarial values on a group with
    compression off, and on plain gloo: (fp8 result, gloo result, stats)."""
    from scenarios import make_group

    c = ctx()
    pg = make_group("compress=none")
    dtype = getattr(torch, dtype_name)
    results = []
    fp8comm.reset_stats(pg)
    for group in (pg, c.gloo):
        x = adversarial_input(c.rank, n, kind, dtype, seed)
        dist.all_reduce(x, group=group)
        out = torch.empty(n * c.world, dtype=dtype)
        dist.all_gather_into_tensor(out, adversarial_input(c.rank, n, kind, dtype, seed), group=group)
        results.append(torch.cat([x, out]))
    return results[0], results[1], fp8comm.get_stats(pg)


def min_numel_boundary(op: str, min_numel: int, numel: int):
    """One collective of `numel` elements per rank on a group that compresses
    everything from `min_numel`, and the same on plain gloo: (fp8 result, gloo
    result, stats)."""
    from scenarios import make_group

    c = ctx()
    P = c.world
    pg = make_group(f"compress=all;min_numel={min_numel}")
    x = rank_input(c.rank, numel * (P if op == "reduce_scatter" else 1), torch.float32, seed=11)
    fp8comm.reset_stats(pg)
    results = []
    for group in (pg, c.gloo):
        if op == "all_reduce":
            out = x.clone()
            dist.all_reduce(out, group=group)
        elif op == "all_reduce_coalesced":  # per-rank numel is the total of the tensors
            parts = [x[: numel // 2].clone(), x[numel // 2 :].clone()]
            dist.all_reduce_coalesced(parts, group=group)
            out = torch.cat(parts)
        elif op == "reduce_scatter":
            out = torch.empty(numel)
            dist.reduce_scatter_tensor(out, x, group=group)
        else:
            out = torch.empty(numel * P)
            dist.all_gather_into_tensor(out, x, group=group)
        results.append(out)
    return results[0], results[1], fp8comm.get_stats(pg)
