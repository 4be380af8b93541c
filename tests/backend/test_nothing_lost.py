"""Nothing lost: every op fp8gloo accepts, in every dtype
gloo moves (float8 as bytes), against plain gloo on the same inputs, at a size
under min_numel and one above it. Exact paths must give plain gloo's bytes;
compressed paths (float32 / bfloat16 / float16 all_reduce, reduce_scatter and
all_gather above min_numel) every element within the documented bound of the
exact result; where plain gloo cannot do the op (float8 reductions,
PREMUL_SUM of integers), fp8gloo must refuse too, with its own clear error.
AVG of integers, which plain gloo lacks, is checked against its sum divided
by the group size, truncated toward zero (NCCL's integer average)."""
import pytest

from tests.support.harness import PoolSpec
from tests.support.scenarios import nothing_lost as nl
from tests.support.torch_features import gloo_has_list_all_to_all

SIZES = [300, nl.MIN_NUMEL + 904]
CASES = [(op, dtype, n) for op in nl.OPS for dtype in nl.DTYPES for n in SIZES]
CODEC_DTYPES = {"float32", "bfloat16", "float16"}


POOLS = [PoolSpec(world, "fp8gloo", id=str(world)) for world in (2, 3)]


@pytest.fixture(scope="module")
def verdicts(pool):
    return pool.run(nl.nothing_lost, CASES, timeout=300)


def expected_verdict(op, dtype, n):
    if dtype in nl.FLOAT8 and op in nl.REDUCING:
        return "both refuse"  # gloo has no float8 arithmetic; fp8gloo says so where the call enters
    if op == "all_reduce_avg" and dtype == "bool":
        return "both refuse"  # no average of booleans; fp8gloo refuses before writing
    if op == "all_reduce_premul" and dtype not in CODEC_DTYPES | {"float64", "complex64"}:
        return "both refuse"  # gloo cannot pre-multiply integers; fp8gloo refuses before writing
    if op == "all_reduce_max" and dtype == "complex64":
        return "both refuse"  # torch itself refuses MAX of complex
    if op == "gather" and dtype == "complex64":
        return "both refuse"  # gloo's gather has no complex type
    if op == "all_to_all" and not gloo_has_list_all_to_all():
        return "both refuse"  # this torch's gloo has no list form; fp8gloo passes it through
    if op in nl.COMPRESSED_OPS and dtype in CODEC_DTYPES and n >= nl.MIN_NUMEL:
        return "bound"
    if op in nl.COMPRESSED_OPS and not op.startswith("reduce_scatter") and dtype == "complex64" and n >= nl.MIN_NUMEL:
        # torch.distributed hands complex tensors of all_reduce / all_gather to the
        # backend as view_as_real float32 views: compressed like float32 (of 2n numbers)
        return "bound"
    return "bitwise"


def test_every_op_and_dtype_against_plain_gloo(verdicts):
    lost = {}
    for rank, per_case in enumerate(verdicts):
        for case, verdict in per_case.items():
            op, dtype, n = case.split(":")
            if verdict.kind != expected_verdict(op, dtype, int(n)):
                lost[f"rank {rank} {case}"] = verdict
    assert not lost, lost
