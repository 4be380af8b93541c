"""fp8comm's compressed algorithms on CUDA tensors with 2, 3 and 4 processes
sharing GPU 0 (marked cuda; skipped without a GPU).

NCCL refuses two ranks on one device, so the transport here is gloo: the pool's
group is "fp8gloocuda" (ProcessGroupFp8 over ProcessGroupGloo, CUDA tensors;
registered by fp8comm._testing). Every collective, in every form, runs on CUDA
tensors through it and on CPU copies of the same inputs through a second group
over the same ranks, "fp8ncclsim" (CPU tensors over the fp8ncclsim transport,
gloo behaving as ProcessGroupNCCL does), with the same options. The algorithm and the
codec are the same on both paths (the CUDA kernels equal the CPU codec bit for
bit), so:

- each rank's CUDA result equals its CPU result bit for bit;
- all_reduce and all_gather results are bitwise identical on every rank;
- both groups count the call as compressed, under the same entry point (two
  passthroughs would agree trivially), and the result is close to the FP64
  reference (both paths wrong in the same way would not be);
- error feedback's residual (computed by tensor ops on the call's stream)
  equals the CPU path's bit for bit, over two steps.
"""
import pytest
import torch
import torch.distributed as dist

import fp8comm

pytestmark = pytest.mark.cuda

if not (torch.cuda.is_available() and fp8comm._C.has_cuda and dist.is_gloo_available()):
    pytest.skip("needs a GPU, gloo and fp8comm built with CUDA", allow_module_level=True)

from tests.support.harness import PoolSpec, ctx  # noqa: E402
from tests.support.inputs import rank_input  # noqa: E402
from tests.support.reference import sqnr_db  # noqa: E402
from tests.support.stats import calls as stats_calls  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# Every compressed collective; all_to_all compresses only when named ("all" leaves it out).
OPTIONS = {"min_numel": 1024, "compress": "all_reduce,reduce_scatter,all_gather,all_to_all"}
MIN_SQNR_DB = 25.0  # FP8 E4M3 through one or two quantizations: ~27-31 dB on randn


POOLS = [PoolSpec(world, "fp8gloocuda", pg_options=OPTIONS, id=str(world)) for world in (2, 3, 4)]


# ------------------------------------------------------------------ scenarios
# Run on every rank of the pool (module-level, so the workers can import them).

_SIM_GROUP = []


def sim_group():
    """The CPU reference group: "fp8ncclsim" over all ranks, the pool's options.
    Created by the first scenario, which every rank runs, so every rank calls
    new_group in the same order."""
    if not _SIM_GROUP:
        _SIM_GROUP.append(dist.new_group(backend="fp8ncclsim", pg_options=fp8comm.Options(**OPTIONS)))
    return _SIM_GROUP[0]


def inputs(rank, n, dtype, seed=0):
    return rank_input(rank, n, dtype, seed, scale=3.0)


def factor(rank):
    return 0.25 * (rank + 1)  # a different PREMUL_SUM factor per rank, as NCCL allows


def make_op(op, rank, device):
    if op == "sum":
        return dist.ReduceOp.SUM
    if op == "avg":
        return dist.ReduceOp.AVG
    if op == "premul":
        return dist._make_nccl_premul_sum(factor(rank))
    if op == "premul_tensor":  # the factor on the device of the call
        return dist._make_nccl_premul_sum(torch.tensor(factor(rank), device=device))
    raise ValueError(op)


def reference_sum(n, dtype, op, world, seed=0):
    """FP64 reduction of every rank's input under `op`."""
    total = sum(inputs(r, n, dtype, seed).double() * (factor(r) if op.startswith("premul") else 1.0)
                for r in range(world))
    return total / world if op == "avg" else total


def _issue(kind, pg, device, rank, world, k, dtype, op, async_op, seed):
    """Runs one collective (per-rank input of k elements, or k * world for the
    reduce_scatters) on `pg` with tensors on `device`; returns (outputs, the
    FP64 references of the outputs). Waits for async work with Work.wait()
    (or the coalescing manager's wait()), which orders the caller's stream."""
    def inp(n, s=seed):
        return inputs(rank, n, dtype, s).to(device)

    def done(work):
        if async_op:
            work.wait()

    rop = make_op(op, rank, device)
    if kind == "all_reduce":
        x = inp(k)
        done(dist.all_reduce(x, op=rop, group=pg, async_op=async_op))
        return [x], [reference_sum(k, dtype, op, world, seed)]
    if kind == "all_reduce_coalesced":
        sizes = [k, 17, k // 2 + 1]
        xs = [inp(n, seed + i) for i, n in enumerate(sizes)]
        done(dist.all_reduce_coalesced(xs, op=rop, group=pg, async_op=async_op))
        return xs, [reference_sum(n, dtype, op, world, seed + i) for i, n in enumerate(sizes)]
    if kind == "all_reduce_coalescing_manager":
        xs = [inp(k, seed), inp(k // 3 + 1, seed + 1)]
        with dist._coalescing_manager(group=pg, async_ops=async_op) as cm:
            for x in xs:
                dist.all_reduce(x, op=rop, group=pg)
        done(cm)
        return xs, [reference_sum(x.numel(), dtype, op, world, seed + i) for i, x in enumerate(xs)]
    if kind.startswith("reduce_scatter"):
        xs = [inp(k * world, seed), inp(k * world, seed + 1)]
        outs = [torch.empty(k, dtype=dtype, device=device) for _ in xs]
        if kind == "reduce_scatter_tensor":
            xs, outs = xs[:1], outs[:1]
            done(dist.reduce_scatter_tensor(outs[0], xs[0], op=rop, group=pg, async_op=async_op))
        elif kind == "reduce_scatter_list":
            xs, outs = xs[:1], outs[:1]
            done(dist.reduce_scatter(outs[0], list(xs[0].chunk(world)), op=rop, group=pg, async_op=async_op))
        else:  # reduce_scatter_coalescing_manager
            with dist._coalescing_manager(group=pg, async_ops=async_op) as cm:
                for out, x in zip(outs, xs):
                    dist.reduce_scatter_tensor(out, x, op=rop, group=pg)
            done(cm)
        refs = [reference_sum(k * world, dtype, op, world, seed + i)[rank * k:(rank + 1) * k] for i in range(len(outs))]
        return outs, refs
    if kind.startswith("all_gather"):
        xs = [inp(k, seed), inp(k, seed + 1)]
        if kind == "all_gather_into_tensor":
            out = torch.empty(k * world, dtype=dtype, device=device)
            done(dist.all_gather_into_tensor(out, xs[0], group=pg, async_op=async_op))
            outs = [out]
        elif kind == "all_gather_list":
            parts = [torch.empty(k, dtype=dtype, device=device) for _ in range(world)]
            done(dist.all_gather(parts, xs[0], group=pg, async_op=async_op))
            outs = [torch.cat(parts)]
        else:  # all_gather_coalescing_manager
            outs = [torch.empty(k * world, dtype=dtype, device=device) for _ in xs]
            with dist._coalescing_manager(group=pg, async_ops=async_op) as cm:
                for out, x in zip(outs, xs):
                    dist.all_gather_into_tensor(out, x, group=pg)
            done(cm)
        refs = [torch.cat([inputs(r, k, dtype, seed + i).double() for r in range(world)])
                for i in range(len(outs))]
        return outs, refs
    if kind.startswith("all_to_all"):
        # Uneven splits (a zero-size slice among them) that every rank derives alike:
        # rank s sends split(s, d) elements to rank d.
        def split(s, d):
            return 0 if (s + d) % 3 == 2 else k // (world + 1) + 97 * s + 31 * d

        send = [split(rank, d) for d in range(world)]
        recv = [split(s, rank) for s in range(world)]
        x = inp(sum(send))
        out = torch.empty(sum(recv), dtype=dtype, device=device)
        if kind == "all_to_all_single":
            done(dist.all_to_all_single(out, x, recv, send, group=pg, async_op=async_op))
        else:  # all_to_all_list
            parts = [torch.empty(n, dtype=dtype, device=device) for n in recv]
            done(dist.all_to_all(parts, list(x.split(send)), group=pg, async_op=async_op))
            out = torch.cat(parts)
        ref = torch.cat([inputs(s, sum(split(s, d) for d in range(world)), dtype, seed).double()
                         [sum(split(s, d) for d in range(rank)):][:split(s, rank)] for s in range(world)])
        return [out], [ref]
    raise ValueError(kind)


def cuda_vs_cpu(kind, k, dtype, op="sum", async_op=False, seed=0):
    """Runs `kind` on CUDA through the pool's group and on the CPU through the
    sim group. Returns {"cuda": outputs, "cpu": outputs, "stats": {...},
    "sqnr": [...], "on_cuda": bool}, outputs as CPU tensors."""
    c = ctx()
    torch.cuda.set_device(0)
    sim = sim_group()
    result = {"stats": {}}
    for name, pg, device in (("cuda", c.group, "cuda"), ("cpu", sim, "cpu")):
        fp8comm.reset_stats(pg)
        outs, refs = _issue(kind, pg, device, c.rank, c.world, k, dtype, op, async_op, seed)
        result["stats"][name] = fp8comm.get_stats(pg)
        if name == "cuda":
            result["on_cuda"] = all(o.is_cuda for o in outs)
            result["sqnr"] = [sqnr_db(ref, o.cpu()) for ref, o in zip(refs, outs)]
        result[name] = [o.cpu() for o in outs]  # .cpu() runs on the current stream, after Work.wait()
    return result


# ------------------------------------------------------------------ checks

def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def check(results, kind):
    for rank, r in enumerate(results):
        assert r["on_cuda"], rank
        assert len(r["cuda"]) == len(r["cpu"]) > 0
        for i, (g, c) in enumerate(zip(r["cuda"], r["cpu"])):
            assert same_bits(g, c), f"rank {rank}, output {i}: the CUDA result differs from the CPU path's"
        cuda_stats, cpu_stats = r["stats"]["cuda"], r["stats"]["cpu"]
        assert cuda_stats["calls_compressed"] >= 1 and cuda_stats["calls_passthrough"] == 0, cuda_stats
        assert stats_calls(cuda_stats) == stats_calls(cpu_stats), (cuda_stats["per_op"], cpu_stats["per_op"])
        assert min(r["sqnr"]) >= MIN_SQNR_DB, r["sqnr"]
    if not kind.startswith(("reduce_scatter", "all_to_all")):  # every rank holds the same result
        for rank, r in enumerate(results[1:], start=1):
            for g, g0 in zip(r["cuda"], results[0]["cuda"]):
                assert same_bits(g, g0), f"rank {rank} differs from rank 0"


@pytest.mark.parametrize("op", ["sum", "avg", "premul", "premul_tensor"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce(pool, dtype, op):
    check(pool.run(cuda_vs_cpu, "all_reduce", 100_003, dtype, op), "all_reduce")


@pytest.mark.parametrize("n", [1031, 3 * 4096 + 1, 1 << 20])
@pytest.mark.parametrize("async_op", [False, True])
def test_all_reduce_sizes_sync_and_async(pool, n, async_op):
    check(pool.run(cuda_vs_cpu, "all_reduce", n, torch.float32, "sum", async_op), "all_reduce")


@pytest.mark.parametrize("kind", ["all_reduce_coalesced", "all_reduce_coalescing_manager"])
@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_all_reduce_coalesced_forms(pool, kind, async_op, dtype):
    check(pool.run(cuda_vs_cpu, kind, 30_001, dtype, "sum", async_op), kind)


RS_FORMS = ["reduce_scatter_tensor", "reduce_scatter_list", "reduce_scatter_coalescing_manager"]
AG_FORMS = ["all_gather_into_tensor", "all_gather_list", "all_gather_coalescing_manager"]


@pytest.mark.parametrize("kind", RS_FORMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_scatter_forms(pool, kind, dtype):
    check(pool.run(cuda_vs_cpu, kind, 20_001, dtype), kind)


@pytest.mark.parametrize("op", ["avg", "premul", "premul_tensor"])
@pytest.mark.parametrize("kind", ["reduce_scatter_tensor", "reduce_scatter_list"])
def test_reduce_scatter_avg_and_premul(pool, kind, op):
    check(pool.run(cuda_vs_cpu, kind, 8193, torch.float32, op), kind)


@pytest.mark.parametrize("kind", AG_FORMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_gather_forms(pool, kind, dtype):
    check(pool.run(cuda_vs_cpu, kind, 10_007, dtype), kind)


@pytest.mark.parametrize("kind", ["all_to_all_single", "all_to_all_list"])
@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_to_all_forms(pool, kind, async_op, dtype):
    """Uneven splits with a zero-size slice; this rank's own slice is exact."""
    check(pool.run(cuda_vs_cpu, kind, 30_011, dtype, "sum", async_op), kind)


@pytest.mark.parametrize("kind", ["reduce_scatter_tensor", "reduce_scatter_coalescing_manager",
                                  "all_gather_into_tensor", "all_gather_list"])
def test_async_forms(pool, kind):
    check(pool.run(cuda_vs_cpu, kind, 12_345, torch.bfloat16, "sum", True), kind)


def residual_cuda_vs_cpu(kind, k, dtype, op, residual_dtype, async_op):
    """Error feedback (fp8comm.functional's residual=, on the groups' own
    backends) on CUDA and on the CPU path, two steps: outputs and residuals."""
    import fp8comm.functional as F

    c = ctx()
    torch.cuda.set_device(0)
    result = {}
    for name, pg, device in (("cuda", c.group, "cuda"), ("cpu", sim_group(), "cpu")):
        n = k * c.world if kind == "reduce_scatter_tensor" else k
        residual = torch.zeros(n, dtype=residual_dtype, device=device)
        outs = []
        for step in range(2):
            x = inputs(c.rank, n, dtype, seed=step).to(device)
            rop = make_op(op, c.rank, device)
            if kind == "all_reduce":
                work = F.all_reduce(x, rop, group=pg, async_op=async_op, residual=residual)
                out = x
            else:
                out = torch.empty(k, dtype=dtype, device=device)
                work = F.reduce_scatter_tensor(out, x, rop, group=pg, async_op=async_op, residual=residual)
            if async_op:
                work.wait()
            outs += [out.cpu().clone(), residual.cpu().clone()]  # the CPU path's are the tensors the next step updates
        result[name] = outs
    return result


@pytest.mark.pools("3")
@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter_tensor"])
@pytest.mark.parametrize("op", ["sum", "avg", "premul_tensor"])
@pytest.mark.parametrize("dtype,residual_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16)])
def test_error_feedback_residual_on_cuda_equals_cpu(pool, kind, op, dtype, residual_dtype):
    for rank, r in enumerate(pool.run(residual_cuda_vs_cpu, kind, 30_001, dtype, op, residual_dtype, op == "avg")):
        for i, (g, c) in enumerate(zip(r["cuda"], r["cpu"])):
            assert same_bits(g, c), f"rank {rank}, {'residual' if i % 2 else 'output'} of step {i // 2}"
        assert r["cuda"][1].abs().sum() > 0, rank  # something was kept
