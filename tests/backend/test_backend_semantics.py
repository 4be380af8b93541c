"""fp8gloo and fp8ncclsim (fp8nccl's path on the CPU): exact passthrough, non-finite values, async Works and futures,
stats, and DDP / FSDP2 training — with real processes."""
import pytest
import torch

from tests.support.harness import PoolSpec
from tests.support.scenarios import collectives, semantics
from tests.support.torch_features import NO_GLOO_LIST_ALL_TO_ALL, gloo_has_list_all_to_all

PASSTHROUGH_CASES = list(semantics.PASSTHROUGH_CASES)


POOLS = PoolSpec.grid(("fp8gloo", "fp8ncclsim"), (2, 3), pg_options={"min_numel": 4096})


@pytest.mark.parametrize("case", PASSTHROUGH_CASES)
def test_passthrough_is_bitwise_plain_gloo(pool, case):
    if case == "all_to_all" and not gloo_has_list_all_to_all():
        pytest.skip(NO_GLOO_LIST_ALL_TO_ALL)
    for r in pool.run(semantics.passthrough_vs_gloo, case):
        assert r.got.dtype == r.expected.dtype
        assert torch.equal(r.got.view(torch.uint8), r.expected.view(torch.uint8))
        assert r.stats["calls_compressed"] == 0, r.stats
        assert r.stats["calls_passthrough"] >= (0 if case == "send_recv" else 1), r.stats  # a third rank sits out
        assert r.stats["bytes_sent"] == r.stats["bytes_sent_uncompressed"]


@pytest.mark.parametrize("case", ["small_all_reduce", "all_reduce_float64_sum", "all_reduce_float32_max"])
def test_passthrough_is_counted(pool, case):
    for stats in pool.run(semantics.stats_of_last, case):
        assert stats["calls_passthrough"] == 1 and stats["calls_compressed"] == 0
        assert stats["bytes_sent"] == stats["bytes_sent_uncompressed"]


AVG_PREMUL_CASES = [
    (form, dtype, op, factor_kind)
    for form in ["all_reduce", "all_reduce_coalesced", "reduce_scatter_tensor", "reduce_scatter_list",
                 "reduce_scatter_tensor_coalesced"]
    for dtype in ["float64", "float32"]
    for op, factor_kind in [("avg", ""), ("premul_sum", "double"), ("premul_sum", "tensor")]
]


@pytest.mark.parametrize("form,dtype,op,factor_kind", AVG_PREMUL_CASES)
def test_avg_and_premul_passthrough_are_exact(pool, form, dtype, op, factor_kind):
    """gloo has no AVG / PREMUL_SUM; fp8gloo's emulation on the exact path
    keeps the double factor and multiplies in the tensor's own dtype, so
    float64 results are bit for bit plain gloo's SUM of the pre-multiplied
    inputs (a float32 factor would be off by ~1e-8 relative)."""
    for r in pool.run(semantics.avg_premul_passthrough, form, dtype, op, factor_kind):
        assert r.got.dtype == r.expected.dtype
        assert torch.equal(r.got, r.expected)
        assert r.stats["calls_compressed"] == 0 and r.stats["calls_passthrough"] >= 1


@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter", "all_gather"])
def test_non_finite_positions_survive(pool, kind):
    results = pool.run(collectives.non_finite, kind)
    for r in results:  # the compressed path, not an exact passthrough
        assert r.stats["calls_compressed"] == 1 and r.stats["calls_passthrough"] == 0
    masks = [r.mask for r in results]
    n, world = 8192, pool.world
    expected = torch.zeros_like(masks[0])
    if kind == "all_reduce":
        expected[[5, n + 9, 2 * n - 1, 17]] = True
        for m in masks:
            assert torch.equal(m, expected)
    elif kind == "reduce_scatter":
        for rank, m in enumerate(masks):
            bad = {5, n + 9, 2 * n - 1, 17}
            idx = [i - rank * n for i in bad if rank * n <= i < (rank + 1) * n]
            exp = torch.zeros(n, dtype=torch.bool)
            exp[idx] = True
            assert torch.equal(m, exp)
    else:
        span = n * world
        expected[[5, n + 9, 2 * n - 1]] = True
        expected[(world - 1) * span + 17] = True
        for m in masks:
            assert torch.equal(m, expected)


def test_async_ops_in_flight_and_futures(pool):
    for r in pool.run(collectives.async_in_flight):
        assert min(r.sqnrs_db) >= 27.0 and max(r.sqnrs_db) < 45.0
        assert r.stats["calls_compressed"] == 5 and r.stats["calls_passthrough"] == 0


@pytest.mark.parametrize("hook", ["none", "future"])
def test_ddp_replicas_stay_bitwise_identical(pool, hook):
    results = pool.run(semantics.ddp_train, 20, hook)
    params = [r.params for r in results]
    for p in params[1:]:
        assert torch.equal(p.view(torch.int32), params[0].view(torch.int32))
    assert results[0].stats["calls_compressed"] >= 20  # gradient buckets went compressed
    losses = results[0].losses
    assert losses[-1] < losses[0]  # and it learns


def test_fsdp2_tracks_plain_gloo(pool):
    fp8 = pool.run(semantics.fsdp2_train, "fp8")
    gloo = pool.run(semantics.fsdp2_train, "gloo")
    fp8_losses, gloo_losses = fp8[0].losses, gloo[0].losses
    assert fp8[0].stats["per_op"]["reduce_scatter_tensor"]["compressed"] > 0
    assert fp8_losses[-1] < 0.5 * fp8_losses[0]
    assert abs(fp8_losses[-1] - gloo_losses[-1]) <= 0.02 * gloo_losses[-1]
