"""Scenarios for the reliability tests: dead peers, mismatched calls, leaks,
load, fuzz. They run on every rank of a DistPool."""
from __future__ import annotations

import ctypes
import hashlib
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
    for _ in range(100):  # calls until the death lands in one (a call takes ~10 ms, the victim dies at 50 ms)
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


# ------------------------------------------------------------------ load
SOAK_KINDS = ["all_reduce", "all_reduce_coalesced", "reduce_scatter", "all_gather", "small", "int", "max",
              "broadcast"]
SOAK_AG_GROUP = "compress=all;min_numel=1024"  # all_gather compressed from 1024 elements


def soak(ops: int, seed: int = 0):
    """`ops` mixed collectives — sizes (1 to 200k per rank, so both sides of
    min_numel), dtypes, SUM / AVG / PREMUL_SUM, tensor / list / coalesced
    forms, compressed and passthrough, async and sync, up to 4 in flight —
    each checked: compressed results element by element against the
    documented bound, passthrough ones bit for bit against plain gloo (or the
    exact local answer). Returns (checked count, resources at every fifth of
    the run, {kind: [the failed ops]}, {kind: checks}, digests of every
    all_reduce and all_gather result in order (to compare across ranks))."""
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
        for work, check, what in in_flight:
            if work is not None:
                work.wait()
            for kind, ok, digest in check():
                counts[kind] = counts.get(kind, 0) + 1
                if not ok:
                    failures.setdefault(kind, []).append(what)
                if digest is not None:
                    digests.append(digest)
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
        in_flight.append(_soak_op(kind, n, dtype, reduce, form, factor_kind, async_op, 1000 + i, c) + (what,))
        if not async_op or len(in_flight) >= 4:
            settle()
        if (i + 1) % max(1, ops // 5) == 0:  # resources at 20%, 40%, ... of the run
            settle()
            marks.append(resources())
    settle()
    marks.append(resources())
    return checked, marks, failures, counts, digests


def _digest(t: torch.Tensor) -> str:
    return hashlib.blake2b(t.contiguous().view(torch.uint8).numpy().tobytes(), digest_size=8).hexdigest()


def _bitwise(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def _soak_op(kind, n, dtype, reduce, form, factor_kind, async_op, seed, c):
    """Issues one collective; returns (its Work or None, a check returning
    [(kind, ok, digest or None)])."""
    from scenarios import make_group

    g, P, rank = c.group, c.world, c.rank
    be = g._get_backend(torch.device("cpu"))
    factors = FACTORS[:P] if reduce == "premul_sum" else [1.0] * P
    div = P if reduce == "avg" else 1
    rop = _reduce_op(reduce, factor_kind, rank, dtype)
    fp8 = FP8[be.fp8_dtype]

    def inp(r, m, s=seed):
        return rank_input(r, m, dtype, s)

    def wired(m, s=seed):  # what each rank puts on the wire
        return [inp(r, m, s).float() * factors[r] for r in range(P)]

    def exact_reference(xs_pre, op):
        """Plain gloo's SUM of the (pre-multiplied) inputs, divided for AVG:
        bit for bit what the exact path must give."""
        if op == "all_reduce":
            ref = xs_pre.clone()
            dist.all_reduce(ref, group=c.gloo)
        else:
            ref = torch.empty(xs_pre.numel() // P, dtype=dtype)
            dist.reduce_scatter_tensor(ref, xs_pre, group=c.gloo)
        return ref / div if reduce == "avg" else ref

    if kind == "all_reduce":
        x = inp(rank, n)
        compressed = n >= be.min_numel
        ref = None if compressed else exact_reference(x * factors[rank] if reduce == "premul_sum" else x, "all_reduce")
        w = dist.all_reduce(x, op=rop, group=g, async_op=async_op)

        def check():
            if compressed:
                v, m = bound_violations("all_reduce", wired(n), x, div, be.block_size, fp8, rank)
                ok = v == 0 and m == 0
            else:
                ok = _bitwise(x, ref)
            return [(f"all_reduce_{'fp8' if compressed else 'exact'}", ok, _digest(x))]
        return w, check
    if kind == "all_reduce_coalesced":
        sizes = [n // 2 + 1, n // 5 + 1]
        xs = [inp(rank, m, seed + j) for j, m in enumerate(sizes)]
        compressed = sum(sizes) >= be.min_numel
        refs = None
        if not compressed:  # gloo's all_reduce_coalesced, which fp8gloo forwards (or emulates AVG / PREMUL with)
            refs = [x * factors[rank] if reduce == "premul_sum" else x.clone() for x in xs]
            dist.all_reduce_coalesced(refs, group=c.gloo)
            refs = [r / div for r in refs] if reduce == "avg" else refs
        w = dist.all_reduce_coalesced(xs, op=rop, group=g, async_op=async_op)

        def check():
            out = torch.cat(xs)
            if compressed:
                ys = [torch.cat(parts) for parts in zip(*[wired(m, seed + j) for j, m in enumerate(sizes)])]
                v, m = bound_violations("all_reduce", ys, out, div, be.block_size, fp8, rank)
                ok = v == 0 and m == 0
            else:
                ok = all(_bitwise(x, r) for x, r in zip(xs, refs))
            return [(f"all_reduce_coalesced_{'fp8' if compressed else 'exact'}", ok, _digest(out))]
        return w, check
    if kind == "reduce_scatter":
        k = max(1, n // P)
        sizes = [k] if form == "tensor" else [k, k // 3 + 1]
        xs = [inp(rank, m * P, seed + j) for j, m in enumerate(sizes)]
        outs = [torch.empty(m, dtype=dtype) for m in sizes]
        compressed = [m >= be.min_numel for m in sizes]

        def rs_reference(x):
            # gloo's list form sums in another order than its tensor form; fp8gloo
            # forwards a SUM in the form it was given, and emulates AVG /
            # PREMUL_SUM with the tensor form.
            if form == "list" and reduce == "sum":
                ref = torch.empty(x.numel() // P, dtype=dtype)
                dist.reduce_scatter(ref, list(x.chunk(P)), group=c.gloo)
                return ref
            return exact_reference(x * factors[rank] if reduce == "premul_sum" else x, "rs")

        refs = [None if comp else rs_reference(x) for x, comp in zip(xs, compressed)]
        w = None
        if form == "tensor":
            w = dist.reduce_scatter_tensor(outs[0], xs[0], op=rop, group=g, async_op=async_op)
        elif form == "list":
            for out, x in zip(outs, xs):
                w = dist.reduce_scatter(out, list(x.chunk(P)), op=rop, group=g, async_op=async_op)
                if w is not None and out is not outs[-1]:
                    w.wait()
        else:
            with dist._coalescing_manager(group=g, async_ops=async_op) as cm:
                for out, x in zip(outs, xs):
                    dist.reduce_scatter_tensor(out, x, op=rop, group=g)
            w = cm if async_op else None

        def check():
            results = []
            for j, (m, out, comp, ref) in enumerate(zip(sizes, outs, compressed, refs)):
                if comp:
                    v, mm = bound_violations("reduce_scatter", wired(m * P, seed + j), out, div, be.block_size, fp8,
                                             rank)
                    ok = v == 0 and mm == 0
                else:
                    ok = _bitwise(out, ref)
                results.append((f"reduce_scatter_{form}_{'fp8' if comp else 'exact'}", ok, None))
            return results
        return w, check
    if kind == "all_gather":
        pg = make_group(SOAK_AG_GROUP)
        sizes = [n] if form == "tensor" else [n, n // 3 + 1]
        xs = [inp(rank, m, seed + j) for j, m in enumerate(sizes)]
        outs = [torch.empty(m * P, dtype=dtype) for m in sizes]
        w = None
        if form == "tensor":
            w = dist.all_gather_into_tensor(outs[0], xs[0], group=pg, async_op=async_op)
        elif form == "list":
            for out, x in zip(outs, xs):
                w = dist.all_gather(list(out.chunk(P)), x, group=pg, async_op=async_op)
                if w is not None and out is not outs[-1]:
                    w.wait()
        else:
            with dist._coalescing_manager(group=pg, async_ops=async_op) as cm:
                for out, x in zip(outs, xs):
                    dist.all_gather_into_tensor(out, x, group=pg)
            w = cm if async_op else None

        def check():
            results = []
            for j, (m, out) in enumerate(zip(sizes, outs)):
                everyone = [inp(r, m, seed + j) for r in range(P)]
                if m >= 1024:
                    v, mm = bound_violations("all_gather", [e.float() for e in everyone], out, 1, 32,
                                             torch.float8_e4m3fn, rank)
                    ok = v == 0 and mm == 0
                    results.append((f"all_gather_{form}_fp8", ok, _digest(out)))
                else:
                    results.append((f"all_gather_{form}_exact", _bitwise(out, torch.cat(everyone)), _digest(out)))
            return results
        return w, check
    if kind == "small":  # a loss, a grad norm: under min_numel, exact
        x = inp(rank, 7)
        expect = exact_reference(x * factors[rank] if reduce == "premul_sum" else x.clone(), "all_reduce")
        w = dist.all_reduce(x, op=rop, group=g, async_op=async_op)
        return w, lambda: [("small_exact", _bitwise(x, expect), _digest(x))]
    if kind == "int":
        x = torch.full((n,), rank + 1, dtype=torch.int64)
        w = dist.all_reduce(x, group=g, async_op=async_op)
        total = P * (P + 1) // 2
        return w, lambda: [("int_exact", bool((x == total).all()), _digest(x))]
    if kind == "max":
        x = inp(rank, n)
        ref = torch.stack([inp(r, n) for r in range(P)]).amax(0)
        w = dist.all_reduce(x, op=dist.ReduceOp.MAX, group=g, async_op=async_op)
        return w, lambda: [("max_exact", _bitwise(x, ref), _digest(x))]
    x = inp(rank, n)
    w = dist.broadcast(x, src=0, group=g, async_op=async_op)
    return w, lambda: [("broadcast_exact", _bitwise(x, inp(0, n)), None)]


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
    violations = nonfinite_mismatch = 0
    for ys, out in zip(scaled, outs_checked):
        v, m = bound_violations(op, ys, out, div, block, fp8_dtype, c.rank)
        violations += v
        nonfinite_mismatch += m
    return outs, violations, nonfinite_mismatch, stats["calls_compressed"]


def bound_violations(op: str, ys: list, out: torch.Tensor, div: int, block: int, fp8_dtype, rank: int):
    """Checks one compressed collective's output on this rank element by
    element against the exact FP64 result and the documented bound
    (docs/reliability.md, "Error bounds"). ys: what each rank put on the wire
    (its input times its PREMUL_SUM factor, in FP32): for all_reduce the whole
    tensor, for reduce_scatter the whole input, for all_gather the input. div:
    the group size for AVG, else 1. Returns (bound violations, non-finite
    results where the exact one is finite or the reverse)."""
    P = len(ys)
    dtype = out.dtype
    m = ys[0].numel() if op != "reduce_scatter" else ys[0].numel() // P
    if op == "all_gather":
        ref = torch.cat([y.double() for y in ys])
        bound = torch.cat([segment_half_ulps(y, m, block, fp8_dtype) for y in ys])
        slack = torch.zeros_like(ref)
    else:
        exact = sum(y.double() for y in ys) / div
        slack = 4 * P * 2.0**-24 * sum(y.double().abs() for y in ys) / div  # FP32 summation
        if op == "all_reduce":
            seg = math.ceil(math.ceil(m / P) / block) * block  # the algorithm's segment length
            first = sum(segment_half_ulps(y, seg, block, fp8_dtype) for y in ys) / div
            # The FP32 sum s of the decoded pieces is re-quantized: at most half an
            # ulp of s under its block's scale. |s| <= |exact| + first (+ slack)
            # element by element, and half_ulp grows with the element and with its
            # block's max, so the half ulp of that upper bound bounds the second error.
            # (Where pieces cancel, s can be several binades above the exact sum.)
            upper = (exact.abs() + first + slack).float()
            bound = first + segment_half_ulps(upper, seg, block, fp8_dtype)
            ref = exact
        else:
            sl = slice(rank * m, (rank + 1) * m)
            bound = sum(segment_half_ulps(y, m, block, fp8_dtype)[sl] for y in ys) / div
            ref, slack = exact[sl], slack[sl]
    out64 = out.double().reshape(-1)
    # The result v before the cast to the output dtype is within bound + slack
    # of ref, so the cast adds at most eps * (|ref| + bound + slack) (cancelling
    # sums make |v| much larger than |ref|).
    within = bound + slack
    tol = within + OUT_EPS[dtype] * (ref.abs() + within) + SUBNORMAL_STEP[dtype]
    finite_ref = torch.isfinite(ref)
    in_range = finite_ref & (ref.abs() < torch.finfo(dtype).max / 2)
    violations = int(((out64 - ref).abs() > tol)[in_range & torch.isfinite(out64)].sum())
    violations += int((~torch.isfinite(out64) & in_range).sum())  # a finite result must stay finite
    return violations, int((torch.isfinite(out64) & ~finite_ref).sum())


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
