"""CPU all_reduces larger than one chunk run pipelined, chunk by chunk
(csrc/backend/compressed_algorithms.cpp). The result must be bitwise what
DESIGN.md's algorithm gives applied to each chunk alone, modeled in Python from
the codec ops: the pipelining reorders work, never the arithmetic."""
import pytest
import torch

import chunk_scenarios
from chunk_scenarios import CHUNK, PAIR_ENV
from dist_harness import DistPool


# 2 and 3 ranks, and 2 with the opt-in two-rank exchange (FP8COMM_PAIR_ALLREDUCE=1)
@pytest.fixture(scope="module", params=[2, 3, "2-pair"])
def pool(request):
    pair = request.param == "2-pair"
    p = DistPool(2 if pair else request.param, backend="fp8gloo", env={PAIR_ENV: "1"} if pair else None)
    yield p
    p.close()


def same_bits(a, b):
    nan = torch.isnan(a)
    return torch.equal(nan, torch.isnan(b)) and torch.equal(a[~nan], b[~nan]) and torch.equal(
        torch.signbit(a[~nan]), torch.signbit(b[~nan]))


# one chunk exactly, several chunks with an uneven tail (not a multiple of P or of the block)
@pytest.mark.parametrize("n", [CHUNK, 3 * CHUNK + 12_345])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_all_reduce_equals_the_algorithm_chunk_by_chunk(pool, n, dtype):
    results = pool.run(chunk_scenarios.chunked_all_reduce, n, dtype, seed=n % 7)
    for got, expect, compressed in results:
        assert compressed == 1
        assert same_bits(got, expect)
        assert torch.isnan(got).any() or torch.isinf(got).any()  # the non-finite inputs came through
    for got, _, _ in results[1:]:
        assert same_bits(got, results[0][0])


def test_chunked_all_reduce_avg(pool):
    results = pool.run(chunk_scenarios.chunked_all_reduce, 2 * CHUNK + 99, torch.float32, seed=1, avg=True)
    for got, expect, _ in results:
        assert same_bits(got, expect)


def test_chunked_all_reduce_of_a_matrix(pool):
    """Chunks cut the flattened tensor, whatever its shape."""
    results = pool.run(chunk_scenarios.chunked_all_reduce, 3 * CHUNK + 1544, torch.float32, seed=2, cols=1000)
    for got, expect, compressed in results:
        assert compressed == 1 and same_bits(got, expect)
