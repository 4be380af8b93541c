"""Scenarios of the inter_node scope (DESIGN.md, "Topology") on simulated
nodes: the pool's group runs with FP8COMM_SCOPE=inter_node and
FP8COMM_LOCAL_SIZE=L, so ranks [bL, (b+1)L) are node b.

Each compressed op is compared with a model built from plain pieces: the
node's exact sum over a gloo group of the node's ranks, then the flat
compressed collective (an fp8 group in scope "all") among the ranks that
share a local index, then an exact gather inside the node. The design
promises bitwise equality with it."""
from __future__ import annotations

import datetime
import gc
import os
from typing import NamedTuple

import torch
import torch.distributed as dist

import fp8comm
from tests.support import ops
from tests.support.groups import inner_transports
from tests.support.harness import ctx
from tests.support.inputs import rank_input
from tests.support.reference import sqnr_db
from tests.support.scenarios import load

_GROUPS: dict = {}
FAMILIES = {
    "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_list": "reduce_scatter",
    "reduce_scatter_coalesced": "reduce_scatter",
    "all_gather_tensor": "all_gather",
    "all_gather_list": "all_gather",
    "all_gather_coalesced": "all_gather",
}


def local_size() -> int:
    return int(os.environ["FP8COMM_LOCAL_SIZE"])


def _model_groups(backend: str):
    """(flat fp8 group among this rank's local index, gloo group of this
    rank's node, flat fp8 group over every rank); every rank creates all."""
    if backend not in _GROUPS:
        c, L = ctx(), local_size()
        nodes = [list(range(b * L, (b + 1) * L)) for b in range(c.world // L)]
        flat = lambda: fp8comm.Options(scope="all", min_numel=0, compress="all")  # noqa: E731
        inter = [dist.new_group([node[l] for node in nodes], backend=backend, pg_options=flat()) for l in range(L)]
        intra = [dist.new_group(node, backend="gloo") for node in nodes]
        world = dist.new_group(backend=backend, pg_options=flat())
        _GROUPS[backend] = (inter[c.rank % L], intra[c.rank // L], world)
    return _GROUPS[backend]


def _premultiplied(x: torch.Tensor, reduce_kind: str, factor: float) -> torch.Tensor:
    return x.mul(factor) if reduce_kind == "premul_sum" else x.clone()


def _node_sum(x: torch.Tensor, intra) -> torch.Tensor:
    """The node's ranks' tensors added in rank order, as the exact
    reduce_scatter inside a node adds each segment's pieces."""
    pieces = [torch.empty_like(x) for _ in range(local_size())]
    dist.all_gather(pieces, x, group=intra)
    total = pieces[0] + pieces[1]
    for piece in pieces[2:]:
        total += piece
    return total


def _all_reduce_model(x, inter, intra, reduce_kind, factor):
    """The node's exact sum, chunk l through the flat all_reduce among local index l."""
    L, n = local_size(), x.numel()
    node_sum = _node_sum(_premultiplied(x, reduce_kind, factor), intra)
    k = -(-n // L)
    padded = x.new_zeros(L * k)
    padded[:n] = node_sum
    local = ctx().rank % L
    chunk = padded[local * k:(local + 1) * k].clone()
    dist.all_reduce(chunk, group=inter)
    chunks = [torch.empty_like(chunk) for _ in range(L)]
    dist.all_gather(chunks, chunk, group=intra)
    return torch.cat(chunks)[:n]


def _reduce_scatter_model(x, inter, intra, reduce_kind, factor):
    """The node's exact sum; the segments of the ranks with this local index
    (one per node) through the flat reduce_scatter among them."""
    c, L = ctx(), local_size()
    nodes, k = c.world // L, x.numel() // c.world
    node_sum = _node_sum(_premultiplied(x, reduce_kind, factor), intra)
    local = c.rank % L
    chunk = torch.cat([node_sum[(b * L + local) * k:(b * L + local + 1) * k] for b in range(nodes)])
    out = x.new_zeros(k)
    dist.reduce_scatter_tensor(out, chunk, group=inter)
    return out


def compressed_case(name: str, n: int, dtype, reduce_kind: str = "sum", factor: float = 0.37, tensors: int = 1):
    """Runs op `name` on the pool's group (inter_node scope) with `tensors`
    inputs of n elements per rank; returns this rank's outputs, the model's,
    the SQNR against FP64 and the stats."""
    c = ctx()
    family = FAMILIES[name]
    inter, intra, world = _model_groups(dist.get_backend(c.group))
    per_rank = n * c.world if family == "reduce_scatter" else n
    xs = [rank_input(c.rank, per_rank, dtype, seed=i + 1) for i in range(tensors)]
    op = ops.reduce_op(reduce_kind, factor)
    fp8comm.reset_stats(c.group)
    got = ops.run(name, ops.Call(c.group, c.rank, c.world, op=op), [x.clone() for x in xs])
    stats = fp8comm.get_stats(c.group)
    everyone = [[rank_input(r, per_rank, dtype, seed=i + 1).double() for r in range(c.world)] for i in range(tensors)]
    premul = factor if reduce_kind == "premul_sum" else 1.0
    divide = c.world if reduce_kind == "avg" else 1
    if family == "all_reduce":
        reference = [sum(inputs) * premul / divide for inputs in everyone]
        if name == "all_reduce_coalesced":
            whole = _all_reduce_model(torch.cat(xs), inter, intra, reduce_kind, factor)
            model = list(whole.split([x.numel() for x in xs]))
        else:
            model = [_all_reduce_model(x, inter, intra, reduce_kind, factor) for x in xs]
    elif family == "reduce_scatter":
        reference = [sum(inputs)[c.rank * n:(c.rank + 1) * n] * premul / divide for inputs in everyone]
        model = [_reduce_scatter_model(x, inter, intra, reduce_kind, factor) for x in xs]
    else:
        reference = [torch.cat(inputs) for inputs in everyone]
        model = []
        for x in xs:
            out = x.new_zeros(n * c.world)
            dist.all_gather_into_tensor(out, x, group=world)
            model.append(out)
    flat = lambda ts: torch.cat([t.reshape(-1) for t in ts])  # noqa: E731
    return {
        "result": flat(got),
        "model": flat(model) if reduce_kind != "avg" else None,
        "sqnr": sqnr_db(flat(reference), flat(got)),
        "stats": stats,
    }


def exact_case(name: str, n: int, dtype):
    """Op `name` on the pool's group and on the plain gloo group: the outputs."""
    c = ctx()
    xs = [rank_input(c.rank, n * c.world, dtype, seed=3)]
    got = ops.run(name, ops.Call(c.group, c.rank, c.world), [x.clone() for x in xs])
    plain = ops.run(name, ops.Call(c.gloo, c.rank, c.world), [x.clone() for x in xs])
    return [g.clone() for g in got], [p.clone() for p in plain]


def one_node_group(n: int):
    """A group of node 0's ranks in the inter_node scope: it passes through
    exactly. Returns (result equals gloo's bitwise, stats) on its members."""
    c, L = ctx(), local_size()
    ranks = list(range(L))
    group = dist.new_group(ranks, backend=dist.get_backend(c.group),
                           pg_options=fp8comm.Options(scope="inter_node", min_numel=0, compress="all"))
    plain = dist.new_group(ranks, backend="gloo")
    if c.rank not in ranks:
        return None
    x = rank_input(c.rank, n, torch.float32)
    expected = x.clone()
    dist.all_reduce(x, group=group)
    dist.all_reduce(expected, group=plain)
    return torch.equal(x, expected), fp8comm.get_stats(group)


def uneven_nodes_group():
    """A group of L + 1 ranks (a whole node and one rank of the next) in the
    inter_node scope: its members' creation raises. Returns the error text."""
    c, L = ctx(), local_size()
    try:
        dist.new_group(list(range(L + 1)), backend=dist.get_backend(c.group),
                       pg_options=fp8comm.Options(scope="inter_node"))
    except ValueError as e:
        return str(e)
    return None


def flat_scope_split(n: int):
    """all_reduce on a scope-"all" group over the simulated nodes: its bytes
    split by the share of peers on this rank's node."""
    c = ctx()
    group = _model_groups(dist.get_backend(c.group))[2]
    fp8comm.reset_stats(group)
    dist.all_reduce(rank_input(c.rank, n, torch.float32), group=group)
    return fp8comm.get_stats(group)


class Reached(NamedTuple):
    timeouts_s: dict  # each transport's own timeout after set_timeout, by role (groups.inner_transports)
    calls: dict  # (aborts, shutdowns) of each fp8ncclsim transport by role, after `how`; empty on fp8gloo
    leaked: dict  # threads and file descriptors the group left behind once gone (<= 0: none)


def transports_reached(how: str, timeout_s: float = 42.0):
    """An inter_node group over the pool's ranks runs a compressed
    all_reduce, is given a timeout of `timeout_s`, then is aborted
    (`how` "abort") or destroyed ("destroy"). What reached each of its
    transports, and what the second of two such groups left alive (the
    first warms up what any group leaves)."""
    c = ctx()
    backend = dist.get_backend(c.group)
    for _ in range(2):
        before = load.resources()
        group = dist.new_group(backend=backend, pg_options=fp8comm.Options(scope="inter_node", min_numel=1024))
        dist.all_reduce(rank_input(c.rank, 50_000, torch.float32), group=group)
        transports = inner_transports(group)
        group.set_timeout(datetime.timedelta(seconds=timeout_s))
        timeouts = {role: fp8comm._C.transport_options(t)._timeout.total_seconds() for role, t in transports.items()}
        if how == "abort":
            dist.distributed_c10d._abort_process_group(group)
        else:
            dist.destroy_process_group(group)
        calls = {role: (t.aborts(), t.shutdowns()) for role, t in transports.items() if hasattr(t, "aborts")}
        del group, transports
        gc.collect()
        after = load.resources()
    leaked = {key: after[key] - before[key] for key in ("threads", "fds")}
    return Reached(timeouts, calls, leaked)
