"""fp8gloo and fp8ncclsim with 2, 3 and 4 real processes: every compressed collective in every
form against an FP64 reference (SQNR) and across ranks (bitwise).

Every test also checks that the call really was compressed: the group's stats
count it as compressed under the entry point's name, and its SQNR is below what
any uncompressed path gives (bf16 rounding alone is above 45 dB), so none of
them passes with FP8COMM_COMPRESS=none."""
import pytest
import torch

from tests.support.harness import PoolSpec
from tests.support.scenarios import collectives
from tests.support.stats import calls as stats_calls

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
UNCOMPRESSED_SQNR_DB = 45.0


# fp8gloo, and fp8ncclsim: the same algorithms on the path fp8nccl takes
# (NCCL's traits and return contract over gloo, fp8comm/_testing.py).
POOLS = PoolSpec.grid(("fp8gloo", "fp8ncclsim"), (2, 3, 4), pg_options={"min_numel": 1024})


def assert_identical_across_ranks(tensors):
    for t in tensors[1:]:
        assert torch.equal(t.view(torch.uint8), tensors[0].view(torch.uint8))


def assert_compressed(results, op, calls=1):
    for r in results:
        stats = r.stats
        assert stats_calls(stats) == {op: {"compressed": calls, "passthrough": 0}}, stats["per_op"]
        assert stats["bytes_sent"] < 0.6 * stats["bytes_sent_uncompressed"]
        assert max(r.sqnrs_db if hasattr(r, "sqnrs_db") else [r.sqnr_db]) < UNCOMPRESSED_SQNR_DB


@pytest.mark.parametrize("dtype", DTYPES)
# 2_500_003: three chunks over gloo (csrc/algorithms/all_reduce.cpp), the last
# one ragged; one over NCCL (test_chunk_plan.py runs several).
@pytest.mark.parametrize("n", [4096, 100_003, 1 << 20, 2_500_003])
def test_all_reduce_sum(pool, n, dtype):
    results = pool.run(collectives.all_reduce, n, dtype)
    assert_compressed(results, "all_reduce")
    assert_identical_across_ranks([r.out for r in results])
    assert all(r.out.dtype == dtype for r in results)
    assert min(r.sqnr_db for r in results) >= 27.0


@pytest.mark.parametrize("op,factor_kind", [("avg", ""), ("premul_sum", "double"), ("premul_sum", "tensor")])
@pytest.mark.parametrize("n", [50_001, 2_200_001])
def test_all_reduce_avg_and_premul(pool, op, factor_kind, n):
    results = pool.run(collectives.all_reduce, n, torch.float32, op, factor_kind)
    assert_compressed(results, "all_reduce")
    assert_identical_across_ranks([r.out for r in results])
    assert min(r.sqnr_db for r in results) >= 27.0


def test_all_reduce_non_contiguous_in_place(pool):
    results = pool.run(collectives.all_reduce, 30_000, torch.float32, non_contiguous=True)
    assert_compressed(results, "all_reduce")
    assert_identical_across_ranks([r.out for r in results])
    assert min(r.sqnr_db for r in results) >= 27.0


def test_all_reduce_coalesced(pool):
    results = pool.run(collectives.all_reduce_coalesced, [3000, 17, 5000], torch.bfloat16)
    assert_compressed(results, "all_reduce_coalesced")
    for i in range(3):
        assert_identical_across_ranks([r.outs[i] for r in results])
    assert min(min(r.sqnrs_db) for r in results) >= 27.0


RS_NAMES = {"tensor": "reduce_scatter_tensor", "list": "reduce_scatter", "coalesced": "reduce_scatter_tensor_coalesced"}
AG_NAMES = {"tensor": "all_gather_into_tensor", "list": "all_gather", "coalesced": "all_gather_into_tensor_coalesced"}


@pytest.mark.parametrize("form", ["tensor", "list", "coalesced"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_scatter(pool, form, dtype):
    results = pool.run(collectives.reduce_scatter, 20_001, dtype, "sum", "", form)
    assert_compressed(results, RS_NAMES[form], calls=2 if form == "coalesced" else 1)
    assert all(r.out.dtype == dtype for r in results)
    assert min(r.sqnr_db for r in results) >= 30.0


# 700_001 per rank: two to four chunks of each segment over gloo (segments.h),
# the last ragged; one over NCCL (test_chunk_plan.py runs several).
@pytest.mark.parametrize("form", ["tensor", "list"])
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_reduce_scatter_in_chunks(pool, form, op):
    results = pool.run(collectives.reduce_scatter, 700_001, torch.float32, op, "", form)
    assert_compressed(results, RS_NAMES[form])
    assert min(r.sqnr_db for r in results) >= 30.0


@pytest.mark.parametrize("op,factor_kind", [("avg", ""), ("premul_sum", "double"), ("premul_sum", "tensor")])
def test_reduce_scatter_avg_and_premul(pool, op, factor_kind):
    results = pool.run(collectives.reduce_scatter, 8192, torch.float32, op, factor_kind)
    assert_compressed(results, "reduce_scatter_tensor")
    assert min(r.sqnr_db for r in results) >= 30.0


@pytest.mark.parametrize("form", ["tensor", "list"])
def test_reduce_scatter_non_contiguous(pool, form):
    """Stride-2 input and output: the output view is written, the memory next
    to it is not (checked in the scenario), the input is left as it was."""
    results = pool.run(collectives.reduce_scatter, 12_000, torch.float32, "sum", "", form, non_contiguous=True)
    assert_compressed(results, RS_NAMES[form])
    assert min(r.sqnr_db for r in results) >= 30.0


@pytest.mark.parametrize("form", ["tensor", "list", "coalesced"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_gather_compressed(pool, form, dtype):
    results = pool.run(collectives.all_gather, 10_007, dtype, form, "compress=all;min_numel=1024")
    assert_compressed(results, AG_NAMES[form], calls=2 if form == "coalesced" else 1)
    assert_identical_across_ranks([r.out for r in results])
    assert min(r.sqnr_db for r in results) >= 30.0


@pytest.mark.parametrize("form", ["tensor", "list"])
def test_all_gather_in_chunks_decodes_what_the_codec_encodes(pool, form):
    """700_001 elements per rank: two to four chunks, the last ragged (the
    group is an fp8gloo one: fp8_group). A chunk boundary is a block
    boundary, so every rank's slice of the output is bitwise the codec's
    round trip of that rank's input."""
    results = pool.run(collectives.all_gather, 700_001, torch.float32, form, "compress=all;min_numel=1024",
                       round_trip=True)
    assert_compressed(results, AG_NAMES[form])
    assert_identical_across_ranks([r.out for r in results])
    assert all(r.round_trip_equal for r in results)


@pytest.mark.parametrize("form", ["tensor", "list", "coalesced"])
def test_all_gather_non_contiguous(pool, form):
    results = pool.run(collectives.all_gather, 6000, torch.bfloat16, form, "compress=all;min_numel=1024",
                       non_contiguous=True)
    assert_compressed(results, AG_NAMES[form], calls=2 if form == "coalesced" else 1)
    assert_identical_across_ranks([r.out for r in results])
    assert min(r.sqnr_db for r in results) >= 30.0
