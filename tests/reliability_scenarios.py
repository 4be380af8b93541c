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
def adversarial_input(rank: int, n: int, kind: str, dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 131 + rank)
    x = torch.randn(n, generator=gen)
    if kind == "wide":  # magnitudes across 60 decades
        x = x * torch.pow(10.0, torch.randint(-30, 30, (n,), generator=gen).float())
    elif kind == "subnormal":
        x = x * 1e-39
    elif kind == "huge":
        x = x * 1e37
    elif kind == "zeros":
        x = torch.where(torch.rand(n, generator=gen) < 0.5, torch.zeros(n), -torch.zeros(n))
    elif kind == "nonfinite":
        pick = torch.rand(n, generator=gen)
        x = torch.where(pick < 0.02, torch.full((n,), float("nan")), x)
        x = torch.where((pick >= 0.02) & (pick < 0.03), torch.full((n,), float("inf")), x)
    return x.to(dtype)


def segment_half_ulps(x: torch.Tensor, seg: int, block: int, fp8_dtype) -> torch.Tensor:
    """The FP8 half-ulp bound of each element, with blocks restarting every
    `seg` elements (wire segments)."""
    parts = [half_ulp(part.float(), block, fp8_dtype) for part in x.reshape(-1).split(seg)]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


def fuzz_case(op: str, n: int, kind: str, dtype_name: str, spec: str, seed: int):
    """One fuzzed collective on an extra fp8gloo group with Options `spec`;
    returns (output, error-bound violations, non-finite mismatch count)."""
    from scenarios import make_group

    c = ctx()
    pg = make_group(spec)
    opts = dict(item.split("=") for item in spec.split(";"))
    block = int(opts.get("block_size", 32))
    fp8_dtype = FP8[opts.get("fp8_dtype", "e4m3")]
    dtype = getattr(torch, dtype_name)
    P = c.world
    inputs = [adversarial_input(r, n if op != "reduce_scatter" else n * P, kind, dtype, seed) for r in range(P)]
    x = inputs[c.rank].clone()
    exact = sum(t.double() for t in inputs)
    if op == "all_reduce":
        dist.all_reduce(x, group=pg)
        out, ref = x, exact
        m = math.ceil(math.ceil(n / P) / block) * block  # the algorithm's segment length
        bound = sum(segment_half_ulps(t, m, block, fp8_dtype) for t in inputs)
        bound = bound + 2 * segment_half_ulps(exact.float(), m, block, fp8_dtype)
    elif op == "reduce_scatter":
        out = torch.empty(n, dtype=dtype)
        dist.reduce_scatter_tensor(out, x, group=pg)
        sl = slice(c.rank * n, (c.rank + 1) * n)
        ref = exact[sl]
        bound = sum(segment_half_ulps(t, n, block, fp8_dtype)[sl] for t in inputs)
    else:
        out = torch.empty(n * P, dtype=dtype)
        dist.all_gather_into_tensor(out, x, group=pg)
        ref = torch.cat([t.double() for t in inputs])
        bound = torch.cat([segment_half_ulps(t, n, block, fp8_dtype) for t in inputs])
    finite_ref = torch.isfinite(ref)
    # FP32 summation of P decoded pieces, then the cast to the output dtype.
    out_eps = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[dtype]
    slack = 4 * P * 2.0**-24 * sum(t.double().abs() for t in inputs).reshape(-1)
    if op == "reduce_scatter":
        slack = slack[c.rank * n : (c.rank + 1) * n]
    elif op == "all_gather":
        slack = torch.zeros_like(ref)
    out64 = out.double()
    tol = bound + slack + out_eps * ref.abs() + (6.0e-8 if dtype == torch.float16 else 0.0)
    in_range = finite_ref & (ref.abs() < (6.0e4 if dtype == torch.float16 else 3.0e38))
    violations = int(((out64 - ref).abs() > tol)[in_range & torch.isfinite(out64)].sum())
    nonfinite_mismatch = int((torch.isfinite(out64) != finite_ref)[in_range | ~finite_ref].sum())
    return out, violations, nonfinite_mismatch


def fuzz_passthrough(n: int, kind: str, dtype_name: str, seed: int):
    from scenarios import make_group

    c = ctx()
    pg = make_group("compress=none")
    dtype = getattr(torch, dtype_name)
    results = []
    for group in (pg, c.gloo):
        x = adversarial_input(c.rank, n, kind, dtype, seed)
        dist.all_reduce(x, group=group)
        out = torch.empty(n * c.world, dtype=dtype)
        dist.all_gather_into_tensor(out, adversarial_input(c.rank, n, kind, dtype, seed), group=group)
        results.append(torch.cat([x, out]))
    return results[0], results[1]
