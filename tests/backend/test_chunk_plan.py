"""The chunks of a compressed collective follow the transport's traits
(TransportTraits::chunk_numel): 1M elements in all over gloo, 16M over NCCL
(fp8ncclsim: fp8nccl's path). A chunk is one exchange per phase, so the
inner calls each transport counts (its sequence number) show the plan.
Results over two NCCL chunks are checked as the collective tests check
them; the inter_node scope's plan is tested in test_inter_node_scope.py."""
import torch

from tests.support.harness import PoolSpec
from tests.support.scenarios import chunk_plan

CHUNK_NUMEL = {"fp8gloo": 1 << 20, "fp8ncclsim": 1 << 24}

# Two ranks, each op a bit over one NCCL chunk: 17 chunks over gloo, 2 over NCCL.
ALL_REDUCE_NUMEL = (1 << 24) + 1001  # chunks of 2 segments of 2^19 / 2^23 elements
SEGMENT_NUMEL = (1 << 23) + 1001  # each rank's segment: chunks of 2^19 / 2^23 elements
CHUNKS = {"fp8gloo": 17, "fp8ncclsim": 2}


POOLS = [PoolSpec(2, backend, pg_options={"min_numel": 1024, "compress": "all"}, id=backend)
         for backend in ("fp8gloo", "fp8ncclsim")]


def check_plan(pool, results, calls_per_chunk):
    for r in results:
        assert r.chunk_numel == CHUNK_NUMEL[pool.backend]
        assert r.calls == {"group": calls_per_chunk * CHUNKS[pool.backend]}, r.calls


def test_all_reduce_chunks(pool):
    """An exchange and a gather per chunk; bitwise the same on both ranks."""
    results = pool.run(chunk_plan.counted, "all_reduce", ALL_REDUCE_NUMEL, torch.float32, timeout=300)
    check_plan(pool, results, calls_per_chunk=2)
    outs = [r.outcome.out for r in results]
    assert torch.equal(outs[0].view(torch.uint8), outs[1].view(torch.uint8))
    assert min(r.outcome.sqnr_db for r in results) >= 27.0


def test_reduce_scatter_chunks(pool):
    results = pool.run(chunk_plan.counted, "reduce_scatter", SEGMENT_NUMEL, torch.float32, timeout=300)
    check_plan(pool, results, calls_per_chunk=1)
    assert min(r.outcome.sqnr_db for r in results) >= 30.0


def test_all_gather_chunks(pool):
    """A chunk boundary is a block boundary: each rank's slice of the output
    is bitwise the codec's round trip of that rank's input."""
    results = pool.run(chunk_plan.counted, "all_gather", SEGMENT_NUMEL, torch.float32, round_trip=True,
                       timeout=300)
    check_plan(pool, results, calls_per_chunk=1)
    assert all(r.outcome.round_trip_equal for r in results)
    assert torch.equal(results[0].outcome.out, results[1].outcome.out)
