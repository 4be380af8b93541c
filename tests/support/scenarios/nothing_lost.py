"""Scenarios of the "nothing lost" test (issue 6, item 4): every op fp8gloo
accepts, in every dtype gloo moves, on fp8gloo and on plain gloo with the same
inputs. They run on every rank of a DistPool."""
from __future__ import annotations

import torch
import torch.distributed as dist

import fp8comm
from tests.support.harness import ctx
from tests.support.scenarios.reliability import bound_violations

DTYPES = ["bool", "uint8", "int8", "int32", "int64", "float16", "bfloat16", "float32", "float64", "complex64",
          "float8_e4m3fn", "float8_e5m2"]
REDUCING = {"all_reduce_sum", "all_reduce_max", "all_reduce_avg", "all_reduce_premul", "all_reduce_coalesced",
            "reduce_scatter_tensor", "reduce_scatter_list", "reduce_scatter_coalesced", "reduce"}
OPS = sorted(REDUCING) + ["all_gather_tensor", "all_gather_list", "all_gather_coalesced", "all_gather_coalesced_lists",
                          "broadcast", "gather", "scatter", "all_to_all_single", "all_to_all_single_uneven",
                          "all_to_all", "send_recv", "batch_isend_irecv"]
# Compressed when the dtype is float32 / bfloat16 / float16 and the per-rank numel >= MIN_NUMEL.
COMPRESSED_OPS = {"all_reduce_sum", "all_reduce_avg", "all_reduce_premul", "all_reduce_coalesced",
                  "reduce_scatter_tensor", "reduce_scatter_list", "reduce_scatter_coalesced", "all_gather_tensor",
                  "all_gather_list", "all_gather_coalesced"}
MIN_NUMEL = 4096
SPEC = f"compress=all;min_numel={MIN_NUMEL}"
FLOAT8 = ("float8_e4m3fn", "float8_e5m2")


def value(rank: int, n: int, dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 31 + rank)
    x = torch.randn(n, generator=g) * 10
    if dtype == torch.bool:
        return x > 0
    if dtype.is_complex:
        return torch.complex(x, -2 * x).to(dtype)
    if dtype in (torch.uint8, torch.int8):
        return x.clamp(-40, 40).abs().to(dtype) if dtype == torch.uint8 else x.clamp(-40, 40).to(dtype)
    return x.to(dtype)


def run_op(op: str, dtype, n: int, pg, rank: int, world: int, premul_factor: float | None = None,
           as_bytes: bool = False):
    """Runs `op` on `pg` with this rank's inputs; returns the flat result (what
    the op wrote on this rank). premul_factor: the reference of PREMUL_SUM
    (inputs multiplied by it, then summed). as_bytes: move the same data as
    uint8 (plain gloo's only way to move float8)."""
    wire = torch.uint8 if as_bytes else dtype

    def inp(r, m, seed=0):
        t = value(r, m, dtype, seed)
        return t.view(torch.uint8) if as_bytes else t

    def zeros(m):
        return torch.zeros(m, dtype=wire)

    x = inp(rank, n)
    if op.startswith("all_reduce") and op != "all_reduce_coalesced":
        kind = op.split("_")[-1]
        rop = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG,
               "premul": dist._make_nccl_premul_sum(0.1 + rank)}[kind]
        if premul_factor is not None:
            x, rop = x * premul_factor, dist.ReduceOp.SUM
        dist.all_reduce(x, op=rop, group=pg)
        return x
    if op == "all_reduce_coalesced":
        xs = [x[: n // 3].clone(), x[n // 3 :].clone()]
        dist.all_reduce_coalesced(xs, group=pg)
        return torch.cat(xs)
    if op == "reduce":
        dist.reduce(x, dst=world - 1, group=pg)
        return x
    if op.startswith("reduce_scatter"):
        x = inp(rank, n * world)
        out = zeros(n)
        if op == "reduce_scatter_tensor":
            dist.reduce_scatter_tensor(out, x, group=pg)
        elif op == "reduce_scatter_list":
            dist.reduce_scatter(out, list(x.chunk(world)), group=pg)
        else:
            with dist._coalescing_manager(group=pg):
                dist.reduce_scatter_tensor(out, x, group=pg)
        return out
    if op in ("all_gather_tensor", "all_gather_coalesced"):
        out = zeros(n * world)
        if op == "all_gather_tensor":
            dist.all_gather_into_tensor(out, x, group=pg)
        else:
            with dist._coalescing_manager(group=pg):
                dist.all_gather_into_tensor(out, x, group=pg)
        return out
    if op == "all_gather_list":
        outs = [zeros(n) for _ in range(world)]
        dist.all_gather(outs, x, group=pg)
        return torch.cat(outs)
    if op == "all_gather_coalesced_lists":  # the deprecated list-of-lists form
        y = inp(rank, 7, seed=1)
        outs = [[zeros(n), zeros(7)] for _ in range(world)]
        dist.all_gather_coalesced(outs, [x, y], group=pg)
        return torch.cat([t for pair in outs for t in pair])
    if op == "broadcast":
        dist.broadcast(x, src=world - 1, group=pg)
        return x
    if op == "gather":
        outs = [zeros(n) for _ in range(world)] if rank == 0 else None
        dist.gather(x, outs, dst=0, group=pg)
        return torch.cat(outs) if outs else zeros(0)
    if op == "scatter":
        out = zeros(n)
        dist.scatter(out, [inp(r, n, seed=2) for r in range(world)] if rank == 0 else None, src=0, group=pg)
        return out
    if op == "all_to_all_single":
        out = zeros(n * world)
        dist.all_to_all_single(out, inp(rank, n * world), group=pg)
        return out
    if op == "all_to_all_single_uneven":  # rank r sends r + 1 + j elements to rank j
        sends = [rank + 1 + j for j in range(world)]
        recvs = [r + 1 + rank for r in range(world)]
        out = zeros(sum(recvs))
        dist.all_to_all_single(out, inp(rank, sum(sends)), recvs, sends, group=pg)
        return out
    if op == "all_to_all":
        outs = [zeros(n) for _ in range(world)]
        dist.all_to_all(outs, list(inp(rank, n * world).chunk(world)), group=pg)
        return torch.cat(outs)
    if op == "send_recv":
        if rank == 0:
            dist.send(x, dst=1, group=pg)
        elif rank == 1:
            dist.recv(x, src=0, group=pg)
        return x
    if op == "batch_isend_irecv":
        recv = zeros(n)
        ops = [dist.P2POp(dist.isend, x, (rank + 1) % world, group=pg),
               dist.P2POp(dist.irecv, recv, (rank - 1) % world, group=pg)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return recv
    raise ValueError(op)


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype != torch.bool else t


def nothing_lost(cases):
    """For each (op, dtype name, n): the op on fp8gloo and on plain gloo.
    Returns {case: verdict}: "bitwise" (exact path, same bytes as plain gloo),
    "bound" (compressed, every element within the documented bound of the exact
    result), "both refuse" (plain gloo cannot either; fp8gloo says why), or a
    string starting with "LOST" that says what differs."""
    c = ctx()
    P = c.world
    pg = _group()
    verdicts = {}
    for op, dtype_name, n in cases:
        dtype = getattr(torch, dtype_name)
        fp8comm.reset_stats(pg)
        try:
            got = run_op(op, dtype, n, pg, c.rank, P)
            fp8_error = None
        except (RuntimeError, ValueError, TypeError) as e:
            got, fp8_error = None, str(e).splitlines()[0]
        stats = fp8comm.get_stats(pg)
        compressed = stats["calls_compressed"] > 0
        # The reference: plain gloo, moving float8 as bytes (it has no float8
        # types), summing inputs times the factor for PREMUL_SUM (it has none).
        as_bytes = dtype_name in FLOAT8 and op not in REDUCING
        emulated = op == "all_reduce_premul" and (dtype.is_floating_point or dtype.is_complex) and not as_bytes
        try:
            ref = run_op(op, dtype, n, c.gloo, c.rank, P, premul_factor=(0.1 + c.rank) if emulated else None,
                         as_bytes=as_bytes)
            ref = ref.view(dtype) if as_bytes else ref
            gloo_error = None
        except (RuntimeError, ValueError, TypeError) as e:
            ref, gloo_error = None, str(e).splitlines()[0]
        # In step before the next case. Not on c.gloo: after one of its ops has
        # failed, a gloo barrier may re-raise that failure on some ranks only.
        dist.barrier(group=_sync_group())
        case = f"{op}:{dtype_name}:{n}"
        if fp8_error is not None or gloo_error is not None:
            if fp8_error is not None and gloo_error is not None:
                verdicts[case] = ("both refuse", fp8_error)
            else:
                verdicts[case] = f"LOST: fp8gloo error {fp8_error!r}, plain gloo error {gloo_error!r}"
            continue
        if compressed:
            verdicts[case] = _within_bound(op, dtype, n, got, c.rank, P)
        elif torch.equal(_as_bytes(got), _as_bytes(ref)):
            verdicts[case] = "bitwise"
        else:
            verdicts[case] = "LOST: differs from plain gloo"
    return verdicts


def _real(t: torch.Tensor) -> torch.Tensor:
    """torch.distributed hands complex tensors to the backend as
    view_as_real float views, which fp8gloo compresses like any float32."""
    return torch.view_as_real(t).reshape(-1) if t.is_complex() else t


def _within_bound(op, dtype, n, got, rank, P):
    block, fp8 = 32, torch.float8_e4m3fn
    got = _real(got)
    if op.startswith("all_gather"):
        ys = [_real(value(r, n, dtype)).float() for r in range(P)]
        v, m = bound_violations("all_gather", ys, got, 1, block, fp8, rank)
    elif op.startswith("reduce_scatter"):
        ys = [_real(value(r, n * P, dtype)).float() for r in range(P)]
        v, m = bound_violations("reduce_scatter", ys, got, 1, block, fp8, rank)
    else:
        factors = [0.1 + r for r in range(P)] if op == "all_reduce_premul" else [1.0] * P
        ys = [_real(value(r, n, dtype)).float() * factors[r] for r in range(P)]
        v, m = bound_violations("all_reduce", ys, got, P if op == "all_reduce_avg" else 1, block, fp8, rank)
    return "bound" if v == 0 and m == 0 else f"LOST: {v} elements outside the bound, {m} non-finite mismatches"


_GROUP = []


def _group():
    if not _GROUP:
        _GROUP.append(dist.new_group(backend="fp8gloo", pg_options=fp8comm.Options(compress="all",
                                                                                   min_numel=MIN_NUMEL)))
    return _GROUP[0]


_SYNC = []


def _sync_group():
    if not _SYNC:
        _SYNC.append(dist.new_group(backend="gloo"))
    return _SYNC[0]
