"""Stats count the bytes the transports sent (csrc/algorithms/transport.h,
route.h), and they are the bytes the stats formulas gave before
(tests/support/bytes_oracle.py): every compressed collective in every form,
in both scopes, on fp8gloo and fp8ncclsim (fp8nccl's path), over 4 ranks as
2 simulated nodes x 2, so bytes split between the node and the others.

The sizes cut a call into one chunk and into several over gloo (1M elements
a chunk in all), with a last block and a last chunk cut short."""
import torch

from tests.support.harness import PoolSpec
from tests.support.scenarios import bytes_counted
from tests.support.scenarios.topology import FAMILIES

# Elements per rank of each input: a few blocks and a partial one; and
# several gloo chunks both flat (all ranks' segments of a chunk: 2^18
# elements each over 4 ranks) and by node (2^19 each over the 2 nodes; all_reduce's
# hop carries 1/2 of the tensor).
SMALL = 5_003
LARGE = {"all_reduce": 2_200_001, "reduce_scatter": 600_001, "all_gather": 600_001}


def cases():
    for name, family in FAMILIES.items():
        tensors = 2 if name.endswith("coalesced") else 1
        for dtype in (torch.float32, torch.bfloat16):
            yield name, [SMALL + 37 * i for i in range(tensors)], dtype
        yield name, [LARGE[family] + 37 * i for i in range(tensors)], torch.float32


POOLS = [PoolSpec(4, backend, pg_options={"min_numel": 1024, "compress": "all"},
                  env={"FP8COMM_SCOPE": scope, "FP8COMM_LOCAL_SIZE": "2"}, id=f"{backend}-{scope}",
                  attrs={"scope": scope})
         for backend in ("fp8gloo", "fp8ncclsim") for scope in ("all", "inter_node")]


def test_stats_are_the_bytes_the_formulas_gave(pool):
    results = pool.run(bytes_counted.compare_all, pool.scope, list(cases()), timeout=600)
    for rank, compared in enumerate(results):
        for c in compared:
            assert c.counted == c.formula, (rank, c.case, c.counted, c.formula)
            assert c.formula[0] > 0 and c.formula[1] > 0, (rank, c.case)
