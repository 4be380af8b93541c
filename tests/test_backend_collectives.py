"""fp8gloo with 2, 3 and 4 real processes: every compressed collective in every
form against an FP64 reference (SQNR) and across ranks (bitwise)."""
import pytest
import torch

import scenarios
from dist_harness import DistPool

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(scope="module", params=[2, 3, 4])
def pool(request):
    p = DistPool(request.param, backend="fp8gloo", pg_options={"min_numel": 1024})
    yield p
    p.close()


def assert_identical_across_ranks(tensors):
    for t in tensors[1:]:
        assert torch.equal(t.view(torch.uint8), tensors[0].view(torch.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [4096, 100_003, 1 << 20])
def test_all_reduce_sum(pool, n, dtype):
    results = pool.run(scenarios.all_reduce, n, dtype)
    assert_identical_across_ranks([r[0] for r in results])
    assert all(r[0].dtype == dtype for r in results)
    assert min(r[1] for r in results) >= 27.0


@pytest.mark.parametrize("op,factor_kind", [("avg", ""), ("premul_sum", "double"), ("premul_sum", "tensor")])
def test_all_reduce_avg_and_premul(pool, op, factor_kind):
    results = pool.run(scenarios.all_reduce, 50_001, torch.float32, op, factor_kind)
    assert_identical_across_ranks([r[0] for r in results])
    assert min(r[1] for r in results) >= 27.0


def test_all_reduce_non_contiguous_in_place(pool):
    results = pool.run(scenarios.all_reduce, 30_000, torch.float32, non_contiguous=True)
    assert_identical_across_ranks([r[0] for r in results])
    assert min(r[1] for r in results) >= 27.0


def test_all_reduce_coalesced(pool):
    results = pool.run(scenarios.all_reduce_coalesced, [3000, 17, 5000], torch.bfloat16)
    for i in range(3):
        assert_identical_across_ranks([r[0][i] for r in results])
    assert min(min(r[1]) for r in results) >= 27.0


@pytest.mark.parametrize("form", ["tensor", "list", "coalesced"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_scatter(pool, form, dtype):
    results = pool.run(scenarios.reduce_scatter, 20_001, dtype, "sum", "", form)
    assert all(r[0].dtype == dtype for r in results)
    assert min(r[1] for r in results) >= 30.0


@pytest.mark.parametrize("op,factor_kind", [("avg", ""), ("premul_sum", "double"), ("premul_sum", "tensor")])
def test_reduce_scatter_avg_and_premul(pool, op, factor_kind):
    results = pool.run(scenarios.reduce_scatter, 8192, torch.float32, op, factor_kind)
    assert min(r[1] for r in results) >= 30.0


@pytest.mark.parametrize("form", ["tensor", "list", "coalesced"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_gather_compressed(pool, form, dtype):
    results = pool.run(scenarios.all_gather, 10_007, dtype, form, "compress=all;min_numel=1024")
    assert_identical_across_ranks([r[0] for r in results])
    assert min(r[1] for r in results) >= 30.0
