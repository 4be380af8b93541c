"""fp8nccl at world size 1 on one GPU: no host syncs, and CUDA-graph capture
(marked cuda; skipped without a GPU).

- Compressed collectives never block the host (DESIGN.md, "Streams and Work"):
  a loop of them, sync and async, every form and PREMUL_SUM with a CPU or a
  CUDA factor, runs under torch.cuda.set_sync_debug_mode("error"), which makes
  every synchronizing CUDA call made through torch (a blocking copy, .item(),
  a stream synchronize) raise. Inputs are made and results checked outside
  that mode; the results must equal the CPU path of the same group bit for bit,
  and every call must have been compressed.
- A compressed all_reduce under torch.cuda.graph capture either captures and
  then replays with the right result on new inputs, or fails at capture with
  an error that names fp8comm. Which of the two happened is printed.

The default group is "cpu:fp8gloo,cuda:fp8nccl", as in test_backend_cuda.py.
"""
import contextlib

import pytest
import torch
import torch.distributed as dist

import fp8comm
from tests.support.groups import cuda_world_of_one

pytestmark = pytest.mark.cuda

if not (torch.cuda.is_available() and fp8comm._C.has_cuda and dist.is_nccl_available()):
    pytest.skip("needs a GPU, NCCL and fp8comm built with CUDA", allow_module_level=True)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
N = 50_001
LOOPS = 3


@pytest.fixture(scope="module", autouse=True)
def world():
    with cuda_world_of_one():
        warm_up()
        yield


def warm_up():
    """One call of each kind first, so that one-time setup (the NCCL
    communicator, side streams, allocator pools) is not what the tests see."""
    x = torch.randn(N, device="cuda")
    dist.all_reduce(x)
    out = torch.empty(N, device="cuda")
    dist.reduce_scatter_tensor(out, x)
    dist.all_gather_into_tensor(out, x)
    torch.cuda.synchronize()


def same_bits(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    return torch.equal(a.cpu().contiguous().view(torch.uint8), b.cpu().contiguous().view(torch.uint8))


def compressed_calls():
    return fp8comm.get_stats()["calls_compressed"]


@contextlib.contextmanager
def no_host_sync():
    """Any synchronizing CUDA call made through torch inside raises."""
    torch.cuda.synchronize()
    before = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(before)


def test_the_sync_check_catches_a_sync():
    x = torch.ones(4, device="cuda")
    with no_host_sync():
        with pytest.raises(RuntimeError, match="synchronizing"):
            x.sum().item()
        with pytest.raises(RuntimeError, match="synchronizing"):
            torch.ones(4).cuda()  # a blocking host-to-device copy


def device_inputs(n, dtype, count, seed):
    """`count` CUDA inputs, made before the check (a host-to-device copy blocks)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [(torch.randn(n, device="cuda", generator=gen) * 3).to(dtype) for _ in range(count)]


def run_loop(issue, inputs, async_op):
    """Calls issue(x, async_op) -> (work or None, result tensor) on a clone of
    every input, LOOPS times over, under no_host_sync(); waits with
    Work.wait() inside. Returns [(input clone, result)] and the number of
    compressed calls counted."""
    before = compressed_calls()
    done = []
    with no_host_sync():
        for _ in range(LOOPS):
            pending = []
            for x in inputs:
                src = x.clone()  # made on the device: no sync
                work, result = issue(src.clone(), async_op)
                pending.append((work, src, result))
            for work, src, result in pending:
                if work is not None:
                    work.wait()
                done.append((src, result))
    torch.cuda.synchronize()
    return done, compressed_calls() - before


def check_against_cpu(done, cpu_issue):
    for src, result in done:
        _, expected = cpu_issue(src.cpu(), False)
        assert same_bits(result, expected)


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["sum", "avg", "premul_float"])
def test_all_reduce_does_not_sync(op, dtype, async_op):
    rop = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "premul_float": dist._make_nccl_premul_sum(0.5)}[op]

    def issue(x, a):
        return dist.all_reduce(x, op=rop, async_op=a), x

    done, compressed = run_loop(issue, device_inputs(N, dtype, 2, seed=1), async_op)
    assert compressed == 2 * LOOPS
    check_against_cpu(done, issue)


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("factor_on", ["cuda", "cpu"])
def test_premul_sum_tensor_factor_does_not_sync(factor_on, async_op):
    """The factor is a tensor on the GPU, or a CPU tensor: neither needs the
    host to wait for the device (a CPU factor's value is already on the host)."""
    factor = torch.full((), 0.25, device=factor_on)  # made before the check (torch.full copies nothing)

    def issue(x, a):
        return dist.all_reduce(x, op=dist._make_nccl_premul_sum(factor), async_op=a), x

    done, compressed = run_loop(issue, device_inputs(N, torch.float32, 2, seed=2), async_op)
    assert compressed == 2 * LOOPS
    cpu_factor = torch.full((), 0.25)
    for src, result in done:
        expected = src.cpu()
        dist.all_reduce(expected, op=dist._make_nccl_premul_sum(cpu_factor))
        assert same_bits(result, expected)


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("form", ["reduce_scatter_tensor", "reduce_scatter_list", "all_gather_into_tensor",
                                  "all_gather_list"])
def test_reduce_scatter_and_all_gather_do_not_sync(form, async_op):
    def issue(x, a):
        out = torch.empty_like(x)
        if form == "reduce_scatter_tensor":
            return dist.reduce_scatter_tensor(out, x, async_op=a), out
        if form == "reduce_scatter_list":
            return dist.reduce_scatter(out, [x], async_op=a), out
        if form == "all_gather_into_tensor":
            return dist.all_gather_into_tensor(out, x, async_op=a), out
        return dist.all_gather([out], x, async_op=a), out

    done, compressed = run_loop(issue, device_inputs(N, torch.bfloat16, 2, seed=3), async_op)
    assert compressed == 2 * LOOPS
    check_against_cpu(done, issue)


@pytest.mark.parametrize("async_op", [False, True])
def test_coalesced_forms_do_not_sync(async_op):
    """all_reduce_coalesced, and the coalescing manager's reduce_scatter and
    all_gather (one work for the group of calls)."""
    def issue(x, a):
        parts = [x[: N // 2].clone(), x[N // 2:].clone()]
        work = dist.all_reduce_coalesced(parts, async_op=a)
        return work, parts

    def issue_cm(x, a, collective):
        outs = [torch.empty(N // 2, device=x.device, dtype=x.dtype), torch.empty(N - N // 2, device=x.device,
                                                                                  dtype=x.dtype)]
        with dist._coalescing_manager(async_ops=a) as cm:
            collective(outs[0], x[: N // 2].clone())
            collective(outs[1], x[N // 2:].clone())
        return (cm if a else None), outs

    inputs = device_inputs(N, torch.float32, 1, seed=4)
    for fn in (issue,
               lambda x, a: issue_cm(x, a, dist.reduce_scatter_tensor),
               lambda x, a: issue_cm(x, a, dist.all_gather_into_tensor)):
        done, compressed = run_loop(fn, inputs, async_op)
        assert compressed >= LOOPS
        for src, results in done:
            _, expected = fn(src.cpu(), False)
            for r, e in zip(results, expected):
                assert same_bits(r, e)


def _messages(exc):
    """The messages of an exception and of those it was raised from or during."""
    seen = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return " | ".join(f"{type(e).__name__}: {e}" for e in seen)


# Last in the file: a capture that fails may leave the NCCL communicator unusable.
def test_cuda_graph_capture_of_a_compressed_all_reduce(record_property):
    """Either the capture works and each replay all-reduces the static input
    (checked bit for bit against the CPU path, on three new inputs), or the
    capture fails with an error naming fp8comm. Both are accepted; which one
    happened is printed and recorded as the junit property
    cuda_graph_capture. Anything else fails: an unclear error, a wrong
    replay, a replay that did nothing."""
    inputs = device_inputs(N, torch.float32, 3, seed=5)
    static = inputs[0].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graph asks
        dist.all_reduce(static)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    before = compressed_calls()
    try:
        with torch.cuda.graph(graph):
            dist.all_reduce(static)
    except Exception as e:  # noqa: BLE001  (any capture failure must name fp8comm)
        message = _messages(e)
        print(f"CUDA graph capture of a compressed all_reduce: refused: {message}")
        record_property("cuda_graph_capture", f"refused: {message}")
        assert "fp8comm" in message, f"capture failed with an error that does not name fp8comm: {message}"
        torch.cuda.synchronize()  # the device is still usable
        return
    assert compressed_calls() == before + 1  # the captured call took the compressed path
    print("CUDA graph capture of a compressed all_reduce: captured")
    for x in inputs:
        static.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        expected = x.cpu()
        dist.all_reduce(expected)
        assert same_bits(static, expected)
        assert not same_bits(static, x)  # the replay did all-reduce (FP8 changes random data)
    record_property("cuda_graph_capture", "captured; replays equal the CPU path")
