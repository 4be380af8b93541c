"""fp8nccl at world size 1 on one GPU (marked cuda; skipped without one).

The default group is "cpu:fp8gloo,cuda:fp8nccl", so one ProcessGroupFP8 holds
both transports: every collective runs on CUDA and on the CPU with the same data
and the results must agree bit for bit (the codecs are bit-identical and the
algorithm is the same)."""
import os
import tempfile

import pytest
import torch
import torch.distributed as dist

import fp8comm

pytestmark = pytest.mark.cuda

if not (torch.cuda.is_available() and fp8comm._C.has_cuda and dist.is_nccl_available()):
    pytest.skip("needs a GPU, NCCL and fp8comm built with CUDA", allow_module_level=True)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(scope="module", autouse=True)
def world():
    d = tempfile.mkdtemp()
    torch.cuda.set_device(0)
    dist.init_process_group(
        "cpu:fp8gloo,cuda:fp8nccl",
        init_method=f"file://{os.path.join(d, 'store')}",
        rank=0,
        world_size=1,
        pg_options=fp8comm.Options(min_numel=1024, compress="all"),
    )
    yield
    dist.destroy_process_group()


def same_bits(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    return torch.equal(a.cpu().view(torch.uint8), b.cpu().view(torch.uint8))


def inputs(n, dtype, seed=0):
    return (torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 3).to(dtype)


def test_one_object_holds_both_transports():
    be_cpu = dist.group.WORLD._get_backend(torch.device("cpu"))
    be_cuda = dist.group.WORLD._get_backend(torch.device("cuda"))
    assert isinstance(be_cuda, fp8comm._C.ProcessGroupFP8)
    assert be_cpu is be_cuda or be_cpu.stats() == be_cuda.stats()
    assert be_cuda.name() == "fp8nccl"
    assert be_cuda.transport("cuda").name() == "nccl" and be_cuda.transport("cpu").name() == "gloo"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["sum", "avg", "premul"])
def test_all_reduce_matches_cpu(dtype, op):
    x = inputs(100_003, dtype)
    reduce_op = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "premul": dist._make_nccl_premul_sum(0.5)}[op]
    cpu, gpu = x.clone(), x.cuda()
    dist.all_reduce(cpu, op=reduce_op)
    dist.all_reduce(gpu, op=reduce_op)
    assert same_bits(cpu, gpu)


def test_premul_tensor_factor_on_device():
    x = inputs(50_000, torch.float32)
    cpu, gpu = x.clone(), x.cuda()
    dist.all_reduce(cpu, op=dist._make_nccl_premul_sum(torch.tensor(0.25)))
    dist.all_reduce(gpu, op=dist._make_nccl_premul_sum(torch.tensor(0.25, device="cuda")))
    assert same_bits(cpu, gpu)


@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_scatter_and_all_gather_match_cpu(dtype):
    x = inputs(70_001, dtype)
    outs = []
    for device in ("cpu", "cuda"):
        rs = torch.empty(70_001, dtype=dtype, device=device)
        dist.reduce_scatter_tensor(rs, x.to(device))
        ag = torch.empty(70_001, dtype=dtype, device=device)
        dist.all_gather_into_tensor(ag, x.to(device))
        lst = [torch.empty(70_001, dtype=dtype, device=device)]
        dist.all_gather(lst, x.to(device))
        outs.append((rs, ag, lst[0]))
    for a, b in zip(*outs):
        assert same_bits(a, b)


def test_passthrough_ops_on_cuda():
    x = torch.arange(10, device="cuda")
    dist.all_reduce(x)
    assert torch.equal(x, torch.arange(10, device="cuda"))
    y = torch.randn(100, device="cuda", dtype=torch.float64)
    ref = y.clone()
    dist.all_reduce(y, op=dist.ReduceOp.MAX)
    dist.broadcast(y, src=0)
    assert torch.equal(y, ref)
    f8 = torch.randn(4096, device="cuda").to(torch.float8_e4m3fn)
    out = torch.empty_like(f8)
    dist.all_gather_into_tensor(out, f8)
    assert torch.equal(out.view(torch.uint8), f8.view(torch.uint8))
    dist.barrier(device_ids=[0])


def test_async_ops_run_on_a_side_stream_and_wait_on_the_current_stream():
    xs = [inputs(1 << 20, torch.float32, seed=s).cuda() for s in range(4)]
    expected = [x.cpu() for x in xs]
    for e in expected:
        dist.all_reduce(e)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        works = [dist.all_reduce(x, async_op=True) for x in xs]
        for w in works:
            w.wait()  # the side stream waits, the host does not
        results = [x * 1 for x in xs]
    side.synchronize()
    for w in works:
        assert w.is_completed()
    for r, e in zip(results, expected):
        assert same_bits(r, e)
    fut = dist.all_reduce(xs[0], async_op=True).get_future()
    assert fut.wait()[0] is xs[0]


def test_sync_op_runs_on_the_current_stream():
    x = inputs(200_000, torch.bfloat16).cuda()
    e = x.cpu()
    dist.all_reduce(e)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = x * 1
        dist.all_reduce(y)
        z = y.clone()
    s.synchronize()
    assert same_bits(z, e)


def test_ddp_step_on_fp8nccl():
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8)).cuda())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fp8comm.reset_stats()
    for _ in range(3):
        loss = model(torch.randn(64, 512, device="cuda")).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    assert fp8comm.get_stats()["per_op"]["all_reduce"]["compressed"] >= 3


def test_no_memory_left_behind():
    x = inputs(1 << 20, torch.float32).cuda()
    dist.all_reduce(x)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for _ in range(20):
        dist.all_reduce(x, async_op=True).wait()
        out = torch.empty_like(x)
        dist.reduce_scatter_tensor(out, x)
    torch.cuda.synchronize()
    del out
    assert torch.cuda.memory_allocated() == before
