"""The compressed all_to_all (DESIGN.md, "Algorithms"): all_to_all_single
with equal, uneven and zero-size splits and the list form, in every wire
format of the table and every codec dtype, on fp8gloo and fp8ncclsim
(fp8nccl's path), flat and in the inter_node scope (2 simulated nodes x 2).

Every result equals a model built by hand from the codec, bit for bit: each
slice from a peer is quantize_segments / dequantize_segments of that slice
alone (one segment per peer: blocks never straddle two peers' slices), this
rank's own slice is exact, and in the inter_node scope so is every slice from
a rank on this node. Split sizes that disagree raise the same error on every
rank before any data moves, and the group stays usable. The stats count what
the transport sent (tests/support/bytes_oracle.py). all_to_all is compressed
only where Options.compress names it: compress="all" passes it through."""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

import fp8comm
from fp8comm.codec import WIRE_FORMATS
from tests.support import bytes_oracle
from tests.support.harness import PoolSpec, ctx
from tests.support.inputs import rank_input, same_bits
from tests.support.reference import sqnr_db

WIDTH = 40  # elements a row: blocks of 16 or 32 cross rows, never slices
MIN_NUMEL = 64
A2A = "all_reduce,reduce_scatter,all_to_all"
E4M3_MIN_SQNR_DB = 31.0  # one E4M3 quantization of Gaussian data: 31.5 dB

POOLS = [
    PoolSpec(3, backend, pg_options={"min_numel": MIN_NUMEL, "compress": A2A}, env={"FP8COMM_LOCAL_SIZE": "1"},
             id=f"{backend}-3", attrs={"scope": "all"})
    for backend in ("fp8gloo", "fp8ncclsim")
] + [
    PoolSpec(4, backend, pg_options={"min_numel": MIN_NUMEL, "compress": A2A, "scope": "inter_node"},
             env={"FP8COMM_LOCAL_SIZE": "2"}, id=f"{backend}-2x2-inter_node", attrs={"scope": "inter_node"})
    for backend in ("fp8gloo", "fp8ncclsim")
]


# ---------------------------------------------------------------- scenarios
# Run on every rank of the pool: module-level, the ranks import this module.

_GROUPS: dict = {}


def _counts(stats: dict) -> tuple:
    """(compressed, passthrough) all_to_all calls in get_stats's per_op."""
    op = stats["per_op"].get("all_to_all", {})
    return op.get("compressed", 0), op.get("passthrough", 0)


def _group(scope: str, wire_format: str = "e4m3", **options):
    """An fp8 group over every rank (the pool's backend) that compresses
    all_to_all in `wire_format`; every rank creates the same ones in the same order."""
    key = (scope, wire_format, tuple(sorted(options.items())))
    if key not in _GROUPS:
        opts = {"min_numel": MIN_NUMEL, "compress": A2A, "scope": scope, "wire_format": wire_format, **options}
        _GROUPS[key] = dist.new_group(backend=dist.get_backend(ctx().group), pg_options=fp8comm.Options(**opts))
    return _GROUPS[key]


def _local() -> int:
    return int(os.environ.get("FP8COMM_LOCAL_SIZE", "1"))


def split_rows(kind: str, world: int, seed: int) -> list:
    """rows[s][d]: the rows rank s sends rank d. equal: the same everywhere;
    uneven: 1 to 80; zeros: 0 to 80 with many zeros, rank 0 sending none at all."""
    if kind == "equal":
        return [[24] * world for _ in range(world)]
    g = torch.Generator().manual_seed(seed)
    low = 1 if kind == "uneven" else 0
    rows = torch.randint(low, 81, (world, world), generator=g).tolist()
    if kind == "zeros":
        for s in range(world):
            for d in range(world):
                if (s + 2 * d) % 3 == 0 or s == 0:
                    rows[s][d] = 0
    return rows


def _input(rank: int, rows: list, dtype, seed: int) -> torch.Tensor:
    return rank_input(rank, sum(rows[rank]) * WIDTH, dtype, seed=seed).view(-1, WIDTH)


def _by_hand(x: torch.Tensor, backend) -> torch.Tensor:
    """One wire segment of x, quantized and decoded by the codec's own operators."""
    n = x.numel()
    if n == 0:
        return x.reshape(-1).clone()
    fmt, block = backend.wire_format, backend.block_size
    segment = torch.empty(fp8comm.segment_bytes(n, block, fmt), dtype=torch.uint8)
    fp8comm.quantize_segments(x.reshape(-1), segment, 1, n, block_size=block, wire_format=fmt)
    out = torch.empty(n, dtype=x.dtype)
    fp8comm.dequantize_segments(segment, out, 1, n, block_size=block, wire_format=fmt)
    return out


class _Format:
    """A wire format and block size as _by_hand reads them off a backend."""

    def __init__(self, wire_format: str, block_size: int):
        self.wire_format, self.block_size = wire_format, block_size


def _on_my_node(r: int) -> bool:
    return r // _local() == ctx().rank // _local()


def model(rows: list, dtype, seed: int, backend, exact_inside: bool, node_format: str | None = None) -> tuple:
    """(this rank's output by the model, the exact output, which elements
    were quantized); with node_format, the slices from this node in that format."""
    c = ctx()
    got, exact, quantized = [], [], []
    for s in range(c.world):
        x = _input(s, rows, dtype, seed)
        begin = sum(rows[s][:c.rank])
        piece = x[begin:begin + rows[s][c.rank]].reshape(-1)
        inside = exact_inside and _on_my_node(s) and s != c.rank
        kept = s == c.rank or (inside and node_format is None)
        if inside and node_format is not None:
            got.append(_by_hand(piece, _Format(node_format, backend.block_size)))
        else:
            got.append(piece.clone() if kept else _by_hand(piece, backend))
        exact.append(piece)
        quantized.append(torch.full((piece.numel(),), not kept))
    return torch.cat(got), torch.cat(exact), torch.cat(quantized)


def _stats_oracle(group, rows: list, dtype, exact_inside: bool) -> tuple:
    c = ctx()
    backend = group._get_backend(torch.device("cpu"))
    wire = bytes_oracle.Wire(0, backend.block_size, lambda m: backend.wire_segment_bytes(m, "cpu"))
    sends = [n * WIDTH for n in rows[c.rank]]
    element_size = torch.empty(0, dtype=dtype).element_size()
    return bytes_oracle.all_to_all(c.world, c.rank, wire, sends, element_size, _on_my_node, exact_inside)


def single_form(scope: str, dtype, kind: str, seed: int = 1) -> list:
    """all_to_all_single in every wire format of the table: per format,
    whether the output equals the model bit for bit, the SQNR of the
    quantized elements, the stats counted and the oracle's."""
    c = ctx()
    rows = split_rows(kind, c.world, seed)
    sends, recvs = rows[c.rank], [rows[s][c.rank] for s in range(c.world)]
    results = []
    for fmt in WIRE_FORMATS:
        group = _group(scope, fmt)
        backend = group._get_backend(torch.device("cpu"))
        x = _input(c.rank, rows, dtype, seed)
        before = x.clone()
        out = torch.full((sum(recvs), WIDTH), 7.0, dtype=dtype)
        fp8comm.reset_stats(group)
        dist.all_to_all_single(out, x, recvs, sends, group=group)
        stats = fp8comm.get_stats(group)
        want, exact, quantized = model(rows, dtype, seed, backend, scope == "inter_node")
        results.append({
            "fmt": fmt, "same": same_bits(out.reshape(-1), want), "input_kept": same_bits(x, before),
            "sqnr": sqnr_db(exact[quantized], out.reshape(-1)[quantized]) if quantized.any() else float("inf"),
            "counts": _counts(stats),
            "counted": (stats["bytes_sent_intra_node"], stats["bytes_sent_inter_node"]),
            "oracle": _stats_oracle(group, rows, dtype, scope == "inter_node"),
            "uncompressed": stats["bytes_sent_uncompressed"],
            "plain": (sum(sends) - sends[c.rank]) * WIDTH * x.element_size(),
        })
    return results


def list_form(scope: str, dtype, seed: int = 2) -> tuple:
    """dist.all_to_all with one tensor per rank each way: (whether every
    output equals all_to_all_single's with the same slices, stats)."""
    c = ctx()
    rows = split_rows("zeros", c.world, seed)
    sends, recvs = rows[c.rank], [rows[s][c.rank] for s in range(c.world)]
    group = _group(scope)
    x = _input(c.rank, rows, dtype, seed)
    single = torch.zeros(sum(recvs), WIDTH, dtype=dtype)
    dist.all_to_all_single(single, x, recvs, sends, group=group)
    outs = [torch.full((n, WIDTH), 3.0, dtype=dtype) for n in recvs]
    fp8comm.reset_stats(group)
    dist.all_to_all(outs, list(x.split(sends)), group=group)
    stats = fp8comm.get_stats(group)
    return same_bits(torch.cat(outs), single), stats


def mismatched(scope: str) -> str:
    """Rank 0 expects one row too many from rank 1: every rank's error, then
    whether a correct call on the same group still works."""
    c = ctx()
    group = _group(scope)
    rows = split_rows("equal", c.world, 0)
    sends, recvs = rows[c.rank], [rows[s][c.rank] for s in range(c.world)]
    if c.rank == 0:
        recvs[1] += 1
    x = _input(c.rank, rows, torch.float32, 5)
    out = torch.full((sum(recvs), WIDTH), 7.0)
    try:
        dist.all_to_all_single(out, x, recvs, sends, group=group)
        error = None
    except RuntimeError as e:
        error = str(e)
    untouched = bool((out == 7.0).all())
    recvs = [rows[s][c.rank] for s in range(c.world)]
    good = torch.zeros(sum(recvs), WIDTH)
    dist.all_to_all_single(good, x, recvs, sends, group=group)
    want, _, _ = model(rows, torch.float32, 5, group._get_backend(torch.device("cpu")), scope == "inter_node")
    return error, untouched, same_bits(good.reshape(-1), want)


def decided_together(scope: str, compress: bool) -> tuple:
    """Rank 0's input is above min_numel=1000, the others' (3 rows for each
    rank) below; the group's mean input is above it where `compress`. Every
    rank takes the path the mean says: (compressed, passthrough, whether the
    output equals the model or, passed through, is exact)."""
    c = ctx()
    group = _group(scope, min_numel=1000)
    rows = [[3] * c.world for _ in range(c.world)]
    rows[0] = [(4000 if compress else 2000) // WIDTH // c.world] * c.world
    sends, recvs = rows[c.rank], [rows[s][c.rank] for s in range(c.world)]
    x = _input(c.rank, rows, torch.float32, 6)
    out = torch.zeros(sum(recvs), WIDTH)
    fp8comm.reset_stats(group)
    dist.all_to_all_single(out, x, recvs, sends, group=group)
    stats = fp8comm.get_stats(group)
    compressed, passed = _counts(stats)
    want, exact, _ = model(rows, torch.float32, 6, group._get_backend(torch.device("cpu")), scope == "inter_node")
    return compressed, passed, same_bits(out.reshape(-1), want if compressed else exact)


def passes_through(scope: str) -> tuple:
    """compress="all" leaves all_to_all exact; so does an int32 tensor where
    all_to_all is named. (results exact, per-op counts)."""
    c = ctx()
    every = _group(scope, compress="all")
    named = _group(scope)
    rows = split_rows("uneven", c.world, 3)
    sends, recvs = rows[c.rank], [rows[s][c.rank] for s in range(c.world)]
    same, counts = [], []
    for group, dtype in ((every, torch.float32), (named, torch.int32)):
        x = (_input(c.rank, rows, torch.float32, 3) * 100).to(dtype)
        out = torch.zeros(sum(recvs), WIDTH, dtype=dtype)
        fp8comm.reset_stats(group)
        dist.all_to_all_single(out, x, recvs, sends, group=group)
        stats = fp8comm.get_stats(group)
        exact = torch.cat([_input(s, rows, torch.float32, 3)[sum(rows[s][:c.rank]):][:rows[s][c.rank]].reshape(-1)
                           for s in range(c.world)])
        same.append(same_bits(out.reshape(-1), (exact * 100).to(dtype)))
        counts.append(_counts(stats))
    return same, counts


def node_format(scope: str) -> bool:
    """inter_node with node_wire_format="e5m2": the slices inside a node in
    E5M2, those between nodes in E4M3; whether the output equals that model."""
    c = ctx()
    group = _group(scope, node_wire_format="e5m2")
    rows = split_rows("uneven", c.world, 7)
    sends, recvs = rows[c.rank], [rows[s][c.rank] for s in range(c.world)]
    x = _input(c.rank, rows, torch.bfloat16, 7)
    out = torch.zeros(sum(recvs), WIDTH, dtype=torch.bfloat16)
    dist.all_to_all_single(out, x, recvs, sends, group=group)
    want, _, _ = model(rows, torch.bfloat16, 7, group._get_backend(torch.device("cpu")), True, "e5m2")
    return same_bits(out.reshape(-1), want)


def stochastic(scope: str) -> tuple:
    """E4M3 with stochastic rounding: (differs from the nearest model, SQNR)."""
    c = ctx()
    group = _group(scope, rounding="stochastic", rounding_seed=5)
    rows = split_rows("uneven", c.world, 4)
    sends, recvs = rows[c.rank], [rows[s][c.rank] for s in range(c.world)]
    x = _input(c.rank, rows, torch.float32, 4)
    out = torch.zeros(sum(recvs), WIDTH)
    dist.all_to_all_single(out, x, recvs, sends, group=group)
    nearest, exact, quantized = model(rows, torch.float32, 4, group._get_backend(torch.device("cpu")),
                                      scope == "inter_node")
    out = out.reshape(-1)
    return not same_bits(out, nearest), sqnr_db(exact[quantized], out[quantized])


# -------------------------------------------------------------------- tests
@pytest.mark.parametrize("kind", ["equal", "uneven", "zeros"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_every_format_equals_the_codec_by_hand(pool, dtype, kind):
    """Each format of the table, bit for bit the model; E4M3 keeps 31 dB; the
    stats count the transport's bytes, as the oracle gives them."""
    for rank, results in enumerate(pool.run(single_form, pool.scope, dtype, kind, timeout=300)):
        for r in results:
            where = (rank, r["fmt"], kind)
            assert r["same"] and r["input_kept"], where
            assert r["counts"] == (1, 0), where
            assert r["counted"] == r["oracle"], (where, r["counted"], r["oracle"])
            assert r["uncompressed"] == r["plain"], where
            if r["fmt"] == "e4m3" and dtype == torch.float32:
                assert r["sqnr"] >= E4M3_MIN_SQNR_DB, (where, r["sqnr"])


def test_the_list_form_is_the_single_form(pool):
    for same, stats in pool.run(list_form, pool.scope, torch.float32):
        assert same
        assert _counts(stats) == (1, 0) and stats["calls_passthrough"] == 0, stats


def test_mismatched_splits_raise_on_every_rank(pool):
    results = pool.run(mismatched, pool.scope, timeout=60)
    errors = {error for error, _, _ in results}
    assert len(errors) == 1 and None not in errors, errors
    error = errors.pop()
    assert (f"fp8comm all_to_all: rank 1 sends {24 * WIDTH} elements to rank 0" in error
            and f"rank 0 expects {25 * WIDTH} from rank 1" in error), error
    for _, untouched, recovered in results:
        assert untouched and recovered


@pytest.mark.parametrize("compressed", [False, True])
def test_the_size_rule_reads_the_group_mean(pool, compressed):
    """One rank above min_numel and the others below: every rank decides the
    same (else some would pass through while others compress, and hang)."""
    for got, passed, right in pool.run(decided_together, pool.scope, compressed):
        assert (got, passed) == ((1, 0) if compressed else (0, 1))
        assert right


def test_compress_all_does_not_compress_all_to_all(pool):
    for same, counts in pool.run(passes_through, pool.scope):
        assert same == [True, True]
        assert counts == [(0, 1), (0, 1)]


@pytest.mark.pools(*[p.id for p in POOLS if p.attrs["scope"] == "inter_node"])
def test_node_wire_format_compresses_the_slices_inside_a_node(pool):
    assert all(pool.run(node_format, pool.scope))


def test_stochastic_rounding(pool):
    for differs, sqnr in pool.run(stochastic, pool.scope):
        assert differs and sqnr >= 27.0, sqnr


def test_all_means_what_it_meant_and_all_to_all_is_named():
    assert fp8comm.Options(compress="all").resolved().compress == ("all_reduce", "reduce_scatter", "all_gather")
    named = fp8comm.Options(compress="all_to_all,all_reduce").resolved()
    assert named.compress == ("all_reduce", "all_to_all")
