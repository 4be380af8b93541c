"""A scenario shared by tests/backend/test_chunk_plan.py and
test_inter_node_scope.py (run on every rank of a DistPool): a compressed collective of the collectives scenarios, with the
inner calls it issued on each of the group's transports. Every inner
backend's sequence number counts the collectives issued on it."""
from __future__ import annotations

from typing import Any, NamedTuple

import torch

from tests.support.groups import inner_transports
from tests.support.harness import ctx
from tests.support.scenarios import collectives


class Counted(NamedTuple):
    outcome: Any  # what the collectives scenario returned
    calls: dict  # inner calls by transport: "group", and in the inter_node scope "intra" and "inter"
    chunk_numel: int  # the group transport's traits (TransportTraits::chunk_numel)


def counted(scenario: str, *args, **kwargs) -> Counted:
    """collectives.<scenario>(*args, **kwargs) on the pool's group, counted."""
    c = ctx()
    inner = inner_transports(c.group)
    before = {role: t._get_sequence_number_for_group() for role, t in inner.items()}
    outcome = getattr(collectives, scenario)(*args, **kwargs)
    calls = {role: t._get_sequence_number_for_group() - before[role] for role, t in inner.items()}
    chunk_numel = c.group._get_backend(torch.device("cpu")).transport_traits("cpu")["chunk_numel"]
    return Counted(outcome, calls, chunk_numel)
