"""Registers the fp8nccl (CUDA) and fp8gloo (CPU) backends with torch.distributed.

Each creator builds the inner transport exactly as torch builds its own nccl /
gloo backends, then wraps it in the C++ ProcessGroupFp8 (DESIGN.md, "Layers").
"""
from __future__ import annotations

import json
import os
import socket
import types

import torch.distributed as dist

from . import _C, state_dict_exact
from .options import Options
from .registry import fp8_backends
from .topology import Topology, node_name

BACKENDS = {"fp8gloo": "cpu", "fp8nccl": "cuda"}


def _default_group_options() -> Options | None:
    """The options of the default group's fp8 backend, if it has one."""
    if not dist.is_initialized():
        return None
    found = fp8_backends(functional=False)
    return found[0].options if found else None


def _options_of(pg_options) -> Options:
    """A group created without pg_options takes the default group's fp8
    options, as a split group takes its parent's (DeviceMesh's dimension
    groups: new_group when lazily initialized, split_group under eager init);
    without an fp8 default group, the environment's."""
    if pg_options is None:
        pg_options = _default_group_options() or Options()
    if not isinstance(pg_options, Options):
        raise TypeError(
            f"fp8comm: pg_options must be fp8comm.Options, got {type(pg_options).__name__}; "
            "pass fp8comm.Options(...) to init_process_group / new_group"
        )
    return pg_options.resolved()


def _global_ranks(opts) -> list[int]:
    """The group's global ranks; torch passes none for the default group,
    whose ranks are all (an inner backend's split maps ranks through them)."""
    return list(opts.global_ranks_in_group) or list(range(opts.group_size))


def gloo_transport(opts):
    if not dist.is_gloo_available():
        raise RuntimeError("fp8gloo needs torch.distributed with gloo, which this torch build lacks")
    inner = dist.ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    inner.options.global_ranks_in_group = _global_ranks(opts)
    inner.options.group_name = opts.group_id
    return inner


def _nccl_transport(opts, split_from_world: bool = True):
    if not dist.is_nccl_available():
        raise RuntimeError("fp8nccl needs torch.distributed with NCCL (a CUDA build of torch)")
    nccl_opts = dist.ProcessGroupNCCL.Options()
    nccl_opts.is_high_priority_stream = False
    nccl_opts._timeout = opts.timeout
    nccl_opts.global_ranks_in_group = _global_ranks(opts)
    nccl_opts.group_name = opts.group_id
    split_from = _nccl_split_source() if split_from_world else None
    if split_from is not None:  # as torch creates its own NCCL groups under eager init
        nccl_opts.split_from = split_from
        nccl_opts.split_color = dist.distributed_c10d._process_group_color(nccl_opts.global_ranks_in_group)
    return dist.ProcessGroupNCCL(opts.store, opts.group_rank, opts.group_size, nccl_opts)


def _nccl_split_source():
    """Under eager init (init_process_group(..., device_id=...)) the default
    group's NCCL communicator, which a new group's NCCL transport splits from:
    new_group has the ranks outside the new group take part in that split
    (subgroups.py). None otherwise."""
    c10d = dist.distributed_c10d
    if not dist.is_initialized() or c10d._get_default_group().bound_device_id is None:
        return None
    source = c10d._get_split_source(c10d._get_default_group())
    return source if isinstance(source, dist.ProcessGroupNCCL) else None


def _global_rank(dist_backend_opts) -> int:
    ranks = list(dist_backend_opts.global_ranks_in_group or [])
    return ranks[dist_backend_opts.group_rank] if ranks else dist_backend_opts.group_rank


def _exchange_with_every_rank(dist_backend_opts, options: Options) -> tuple[str, list[dict]]:
    """Every rank publishes its options fingerprint, its host name and its
    node's name through the group's store and reads all the others' (one
    round trip); a mismatch of options raises on every rank, naming the
    option. Returns this creation's store prefix and each rank's
    {"options": ..., "host": ..., "node": ...}."""
    store, rank, size = dist_backend_opts.store, dist_backend_opts.group_rank, dist_backend_opts.group_size
    # One generation per group creation on this store: keys of an earlier
    # group created over the same store are never read.
    generation = (store.add("fp8comm/options/creations", 1) - 1) // size
    prefix = f"fp8comm/options/{generation}/"
    mine = {
        "options": options.fingerprint(),
        "host": socket.gethostname(),
        "node": node_name(_global_rank(dist_backend_opts)),
    }
    store.set(prefix + str(rank), json.dumps(mine, sort_keys=True))
    published = [json.loads(store.get(prefix + str(r))) for r in range(size)]
    mismatch = _C.fingerprint_mismatch([p["options"] for p in published], rank)
    if mismatch is not None:
        raise ValueError(mismatch)
    return prefix, published


def _ranks_on_this_host(published: list[dict], rank: int) -> int:
    """Processes on this host that run a codec: torchrun's LOCAL_WORLD_SIZE
    where set, else this group's ranks with this rank's host name."""
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if local.isdigit() and int(local) > 0:
        return int(local)
    return sum(1 for p in published if p["host"] == published[rank]["host"])


def _size_cpu_threads(options: Options, published: list[dict], rank: int) -> None:
    """The CPU codec's threads (DESIGN.md, "CPU threads"): Options.cpu_threads
    / FP8COMM_CPU_THREADS when given, else this process's share of the host's
    cores, never more than an earlier group chose."""
    if options.cpu_threads is not None:
        _C.set_cpu_threads(options.cpu_threads)
        return
    share = max(1, _C.available_cores() // _ranks_on_this_host(published, rank))
    _C.set_cpu_threads(min(share, _C.cpu_threads()))


def _subgroup_transport(make_transport, dist_backend_opts, prefix: str, ranks: list[int], name: str):
    """An inner backend among `ranks` (group ranks, this one included) of
    the group being created, over its own part of the group's store."""
    parent = list(dist_backend_opts.global_ranks_in_group or range(dist_backend_opts.group_size))
    opts = types.SimpleNamespace(
        store=dist.PrefixStore(prefix + name + "/", dist_backend_opts.store),
        group_rank=ranks.index(dist_backend_opts.group_rank),
        group_size=len(ranks),
        timeout=dist_backend_opts.timeout,
        global_ranks_in_group=[parent[r] for r in ranks],
        group_id=f"{dist_backend_opts.group_id}:{name}",
    )
    inner = make_transport(opts)
    inner._set_sequence_number_for_group()
    return inner


def _set_up_nodes(backend, device, options, dist_backend_opts, published, prefix, make_transport) -> None:
    """Tells the backend where the group's ranks live and, in the inter_node
    scope over several nodes of several ranks, gives it the inner backends
    among each node's ranks and among the ranks that share a local index
    (DESIGN.md, "Topology")."""
    rank = dist_backend_opts.group_rank
    topology = Topology.from_names([p["node"] for p in published])
    inter_node = options.scope == "inter_node"
    if inter_node and not topology.uniform:
        sizes = {p["node"]: 0 for p in published}
        for p in published:
            sizes[p["node"]] += 1
        raise ValueError(
            "fp8comm: Options.scope='inter_node' needs the same number of this group's ranks on every node, got "
            + ", ".join(f"{count} on {node}" for node, count in sizes.items())
            + "; use scope='all' for this group, or create it over whole nodes"
        )
    nodes, local = topology.nodes, topology.local_size
    group_ranks = [topology.rank_at(b, l) for b in range(nodes) for l in range(local)] if topology.uniform else []
    backend.set_topology(nodes, len(topology.ranks_on(topology.node_of[rank])), local if topology.uniform else 0,
                         group_ranks)
    if not (inter_node and nodes > 1 and local > 1):
        return  # one rank per node: the flat algorithms; one node: passthrough
    my_node, my_local = topology.node_of[rank], topology.local_of[rank]
    intra = _subgroup_transport(make_transport, dist_backend_opts, prefix, topology.ranks_on(my_node),
                                f"intra{my_node}")
    inter = _subgroup_transport(make_transport, dist_backend_opts, prefix,
                                [topology.rank_at(b, my_local) for b in range(nodes)], f"inter{my_local}")
    backend.add_node_transports(device, intra, inter)


def _node_nccl_transport(opts):
    """An inter_node scope's NCCL transport: created, never split from the
    world's communicator (a split would need every world rank to take part)."""
    return _nccl_transport(opts, split_from_world=False)


# Makers of node transports like a given inner backend, by its type, for
# backends other than torch's gloo and NCCL (fp8comm._testing adds its own).
NODE_TRANSPORT_MAKERS: dict = {}


def node_transport_of(inner):
    """A maker of inner backends of `inner`'s kind (the inter_node scope's
    node transports of a group whose transport is `inner`)."""
    for kind, maker in NODE_TRANSPORT_MAKERS.items():
        if isinstance(inner, kind):
            return maker
    return gloo_transport if inner.name() == "gloo" else _node_nccl_transport


def create(device: str, dist_backend_opts, pg_options, make_transport=None, inner=None, borrowed=False):
    """make_transport(dist_backend_opts) builds an inner backend: the group's
    own unless `inner` is given (a split gives it), and in the inter_node
    scope its node transports; by default torch's gloo for "cpu" and NCCL
    for "cuda". `borrowed`: `inner` is another group's backend
    (fp8comm.functional), whose sequence numbers are that group's."""
    options = _options_of(pg_options)
    state_dict_exact.install()  # before any state dict can be gathered through this group
    prefix, published = _exchange_with_every_rank(dist_backend_opts, options)
    _size_cpu_threads(options, published, dist_backend_opts.group_rank)
    if inner is None:
        inner = (make_transport or (gloo_transport if device == "cpu" else _nccl_transport))(dist_backend_opts)
    if not borrowed:  # torch only does this for backends it names "gloo" / "nccl"
        inner._set_sequence_number_for_group()
    backend = _C.attach_or_create(
        dist_backend_opts.store,
        dist_backend_opts.group_rank,
        dist_backend_opts.group_size,
        dist_backend_opts.group_id,
        device,
        inner,
        options,
    )
    node_transport = make_transport or (gloo_transport if device == "cpu" else _node_nccl_transport)
    _set_up_nodes(backend, device, options, dist_backend_opts, published, prefix, node_transport)
    return backend


def _create_fp8gloo(dist_backend_opts, pg_options):
    return create("cpu", dist_backend_opts, pg_options)


def _create_fp8nccl(dist_backend_opts, pg_options):
    return create("cuda", dist_backend_opts, pg_options)


def register() -> None:
    """Registers both backends; safe to call more than once."""
    creators = {"fp8gloo": _create_fp8gloo, "fp8nccl": _create_fp8nccl}
    for name, device in BACKENDS.items():
        if name.upper() in dist.Backend._plugins:
            continue
        dist.Backend.register_backend(name, creators[name], extended_api=True, devices=[device])
