"""fp8nccl at world size 1 on one GPU (marked cuda; skipped without one).

The default group is "cpu:fp8gloo,cuda:fp8nccl", so one ProcessGroupFp8 holds
both transports: every collective runs on CUDA and on the CPU with the same data
and the results must agree bit for bit (the codecs are bit-identical and the
algorithm is the same)."""
import os

import pytest
import torch
import torch.distributed as dist

import fp8comm
from tests.support.groups import cuda_world_of_one

pytestmark = pytest.mark.cuda

if not (torch.cuda.is_available() and fp8comm._C.has_cuda and dist.is_nccl_available()):
    pytest.skip("needs a GPU, NCCL and fp8comm built with CUDA", allow_module_level=True)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(scope="module", autouse=True)
def world():
    with cuda_world_of_one():
        yield


def same_bits(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    return torch.equal(a.cpu().view(torch.uint8), b.cpu().view(torch.uint8))


def inputs(n, dtype, seed=0):
    return (torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 3).to(dtype)


def test_one_object_holds_both_transports():
    be_cpu = dist.group.WORLD._get_backend(torch.device("cpu"))
    be_cuda = dist.group.WORLD._get_backend(torch.device("cuda"))
    assert isinstance(be_cuda, fp8comm._C.ProcessGroupFp8)
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
    """The input is written on the caller's current stream right before each
    async call, behind a spin kernel: without the ready event (side stream
    waits for the caller's stream) the collective would read the old values;
    without Work.wait() making the caller's stream wait, the clone after it
    would read the tensor before the collective wrote it."""
    xs = [inputs(1 << 22, torch.float32, seed=s).cuda() for s in range(4)]
    expected = [x.cpu() * 2 for x in xs]
    for e in expected:
        dist.all_reduce(e)
    torch.cuda.synchronize()
    caller = torch.cuda.Stream()
    with torch.cuda.stream(caller):
        works = []
        for x in xs:
            torch.cuda._sleep(20_000_000)  # keep the caller's stream busy
            x.mul_(2)  # the write each collective must see
            works.append(dist.all_reduce(x, async_op=True))
        for w in works:
            w.wait()  # the caller's stream waits, the host does not
        results = [x.clone() for x in xs]
    caller.synchronize()
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


def compressed_calls():
    return fp8comm.get_stats()["calls_compressed"]


def test_all_reduce_coalesced_matches_cpu():
    sizes = [3000, 17, 5000]
    results = []
    before = compressed_calls()
    for device in ("cpu", "cuda"):
        xs = [inputs(n, torch.bfloat16, seed=i).to(device) for i, n in enumerate(sizes)]
        dist.all_reduce_coalesced(xs)
        results.append(xs)
    torch.cuda.synchronize()
    assert compressed_calls() == before + 2
    for a, b in zip(*results):
        assert same_bits(a, b)


@pytest.mark.parametrize("op", ["sum", "avg"])
def test_reduce_scatter_list_form_matches_cpu(op):
    reduce_op = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG}[op]
    x = inputs(40_000, torch.float16)
    outs = []
    before = compressed_calls()
    for device in ("cpu", "cuda"):
        out = torch.empty(40_000, dtype=torch.float16, device=device)
        dist.reduce_scatter(out, [x.to(device)], op=reduce_op)
        outs.append(out)
    torch.cuda.synchronize()
    assert compressed_calls() == before + 2
    assert same_bits(*outs)


@pytest.mark.parametrize("async_ops", [False, True])
def test_tensor_coalesced_forms_match_cpu(async_ops):
    """_coalescing_manager without a device calls reduce_scatter_tensor_coalesced
    and allgather_into_tensor_coalesced (torch's "fast path")."""
    a, b = inputs(20_000, torch.float32, seed=1), inputs(3000, torch.float32, seed=2)
    results = []
    stats_before = fp8comm.get_stats()["per_op"]
    for device in ("cpu", "cuda"):
        ra, rb = torch.empty(20_000, device=device), torch.empty(3000, device=device)
        ga, gb = torch.empty(20_000, device=device), torch.empty(3000, device=device)
        with dist._coalescing_manager(async_ops=async_ops) as cm:
            dist.reduce_scatter_tensor(ra, a.to(device))
            dist.reduce_scatter_tensor(rb, b.to(device))
        if async_ops:
            cm.wait()
        with dist._coalescing_manager(async_ops=async_ops) as cm:
            dist.all_gather_into_tensor(ga, a.to(device))
            dist.all_gather_into_tensor(gb, b.to(device))
        if async_ops:
            cm.wait()
        results.append((ra, rb, ga, gb))
    torch.cuda.synchronize()
    per_op = fp8comm.get_stats()["per_op"]
    for name in ("reduce_scatter_tensor_coalesced", "all_gather_into_tensor_coalesced"):
        was = stats_before.get(name, {"compressed": 0})["compressed"]
        assert per_op[name]["compressed"] == was + 4  # two tensors, on two devices
    for x, y in zip(*results):
        assert same_bits(x, y)


def test_batch_isend_irecv_to_self_on_fp8nccl():
    send = torch.arange(1000, dtype=torch.float32, device="cuda")
    recv = torch.full_like(send, -1.0)
    ops = [dist.P2POp(dist.isend, send, 0), dist.P2POp(dist.irecv, recv, 0)]
    try:
        works = dist.batch_isend_irecv(ops)
    except RuntimeError as e:  # NCCL or torch may refuse send-to-self at world size 1
        if "self" in str(e).lower() or "same" in str(e).lower():
            pytest.skip(f"send-to-self refused at world size 1: {str(e).splitlines()[0]}")
        raise
    for w in works:
        w.wait()
    torch.cuda.synchronize()
    assert torch.equal(recv, send)


def _mlp_cuda(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 8)).cuda()


def test_ddp_step_with_a_future_comm_hook_on_fp8nccl():
    """A comm hook that returns Work.get_future().then(...): DDP waits on the
    future on its stream and copies its value into the grads. The grads must be
    the plain grads through FP8 (close, not equal) on every step."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    plain = _mlp_cuda()
    model = DDP(_mlp_cuda())

    def hook(state, bucket):
        return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])

    model.register_comm_hook(None, hook)
    before = compressed_calls()
    gen = torch.Generator(device="cuda").manual_seed(3)
    for _ in range(3):
        x = torch.randn(256, 512, device="cuda", generator=gen)
        for m in (plain, model):
            m.zero_grad()
            m(x).square().mean().backward()
        torch.cuda.synchronize()
        sq = sqnr(torch.cat([p.grad.flatten() for p in plain.parameters()]),
                  torch.cat([q.grad.flatten() for q in model.module.parameters()]))
        assert 25.0 <= sq < 60.0, sq  # compressed (~31 dB at world size 1), and neither stale nor garbage
    assert compressed_calls() >= before + 3


def sqnr(ref, got):
    ref, got = ref.double().flatten(), got.double().flatten()
    return (10 * torch.log10(ref.square().sum() / (got - ref).square().sum())).item()


@pytest.mark.parametrize("form", ["all_reduce", "all_reduce_coalesced", "reduce_scatter_tensor", "reduce_scatter_list",
                                  "reduce_scatter_coalesced"])
@pytest.mark.parametrize("factor", ["float32-cuda", "float64-cuda", "float32-cpu"])
def test_premul_tensor_factor_outlives_an_async_call(form, factor):
    """The factor tensor (and the float32 copy the backend makes of it) is read
    on the side stream after the call returns. The side stream is held back
    behind a spin kernel; meanwhile the caller drops the factor and reuses every
    free small block on its stream for garbage. The result must still use the
    factor: the Work keeps it alive and marks it in use by the side stream."""
    dtype, device = factor.split("-")
    n = 20_000
    x = inputs(n, torch.float32, seed=7)

    def call(t, out, op):  # returns a Work or a coalescing manager
        if form == "all_reduce":
            return dist.all_reduce(t, op=op, async_op=True)
        if form == "all_reduce_coalesced":
            return dist.all_reduce_coalesced([t], op=op, async_op=True)
        if form == "reduce_scatter_tensor":
            return dist.reduce_scatter_tensor(out, t, op=op, async_op=True)
        if form == "reduce_scatter_list":
            return dist.reduce_scatter(out, [t], op=op, async_op=True)
        with dist._coalescing_manager(async_ops=True) as cm:
            dist.reduce_scatter_tensor(out, t, op=op)
        return cm

    expected_t, expected_out = x.clone(), torch.empty(n)
    call(expected_t, expected_out, dist._make_nccl_premul_sum(torch.tensor(0.25))).wait()
    expected = expected_t if form.startswith("all_reduce") else expected_out

    t, out = x.cuda(), torch.empty(n, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # few free small blocks left, so the garbage below takes them all
    before = compressed_calls()
    blocker = torch.cuda.Stream()
    with torch.cuda.stream(blocker):
        dummy = torch.ones(4096, device="cuda")  # made on the device: no host copy to wait for the spin
        torch.cuda._sleep(1_000_000_000)  # ~0.5 s
        held = dist.all_reduce(dummy, async_op=True)  # the side stream now waits for the spin
    op = dist._make_nccl_premul_sum(torch.tensor(0.25, dtype=getattr(torch, dtype), device=device))
    work = call(t, out, op)  # queued on the side stream behind `held`
    del op
    garbage = [torch.full((1,), 1000.0, device="cuda") for _ in range(16384)]
    work.wait()
    held.wait()
    torch.cuda.synchronize()
    assert compressed_calls() > before
    assert same_bits(t if form.startswith("all_reduce") else out, expected)
    del garbage


def _soak_step(i, kind, n, dtype, async_op):
    """Issues one collective on CUDA and computes what it must give (the same
    call on the CPU path for the compressed ones, the input for the exact ones).
    Returns [(work or None, result tensor, expected tensor)]."""
    x = inputs(n, dtype, seed=i)
    if kind in ("all_reduce", "all_reduce_avg", "all_reduce_premul", "small"):
        if kind == "small":
            x = x[:7].clone()
        op = {"all_reduce_avg": dist.ReduceOp.AVG,
              "all_reduce_premul": dist._make_nccl_premul_sum(0.5)}.get(kind, dist.ReduceOp.SUM)
        want = x.clone()
        dist.all_reduce(want, op=op)
        got = x.cuda()
        return [(dist.all_reduce(got, op=op, async_op=async_op), got, want)]
    if kind in ("reduce_scatter", "reduce_scatter_list", "all_gather", "all_gather_list"):
        want = torch.empty(n, dtype=dtype)
        got = torch.empty(n, dtype=dtype, device="cuda")
        if kind == "reduce_scatter":
            dist.reduce_scatter_tensor(want, x)
            work = dist.reduce_scatter_tensor(got, x.cuda(), async_op=async_op)
        elif kind == "reduce_scatter_list":
            dist.reduce_scatter(want, [x])
            work = dist.reduce_scatter(got, [x.cuda()], async_op=async_op)
        elif kind == "all_gather":
            dist.all_gather_into_tensor(want, x)
            work = dist.all_gather_into_tensor(got, x.cuda(), async_op=async_op)
        else:
            dist.all_gather([want], x)
            work = dist.all_gather([got], x.cuda(), async_op=async_op)
        return [(work, got, want)]
    if kind == "all_reduce_coalesced":
        parts = [x, inputs(n // 3 + 1, dtype, seed=i + 1)]
        wants = [p.clone() for p in parts]
        dist.all_reduce_coalesced(wants)
        gots = [p.cuda() for p in parts]
        work = dist.all_reduce_coalesced(gots, async_op=async_op)
        return [(work, gots[0], wants[0]), (None, gots[1], wants[1])]
    if kind == "int":
        want = torch.arange(n, dtype=torch.int64)
        got = want.cuda()
        return [(dist.all_reduce(got, async_op=async_op), got, want)]
    if kind == "max":
        got = x.cuda()
        return [(dist.all_reduce(got, op=dist.ReduceOp.MAX, async_op=async_op), got, x)]
    got = x.cuda()
    return [(dist.broadcast(got, src=0, async_op=async_op), got, x)]


SOAK_KINDS = ["all_reduce", "all_reduce_avg", "all_reduce_premul", "reduce_scatter", "reduce_scatter_list",
              "all_gather", "all_gather_list", "all_reduce_coalesced", "small", "int", "max", "broadcast"]


@pytest.mark.soak
def test_cuda_soak_mixed_collectives():
    """FP8COMM_CUDA_SOAK_OPS mixed collectives (300 in CI) at world size 1:
    compressed ones bit for bit against the CPU path of the same group, exact
    ones against their input; up to 6 async ones in flight; afterwards
    torch.cuda.memory_allocated is back where it started."""
    ops = int(os.environ.get("FP8COMM_CUDA_SOAK_OPS", "300"))
    rng = torch.Generator().manual_seed(0)
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    before = compressed_calls()
    in_flight = []
    checked = 0

    def settle():
        nonlocal checked
        for work, got, want in in_flight:
            if work is not None:
                work.wait()
        torch.cuda.synchronize()
        for _, got, want in in_flight:
            assert same_bits(got, want)
            checked += 1
        in_flight.clear()

    for i in range(ops):
        kind = SOAK_KINDS[int(torch.randint(0, len(SOAK_KINDS), (1,), generator=rng))]
        n = int(torch.randint(1, 200_000, (1,), generator=rng))
        dtype = DTYPES[int(torch.randint(0, 3, (1,), generator=rng))]
        async_op = bool(torch.randint(0, 2, (1,), generator=rng))
        in_flight += _soak_step(i, kind, n, dtype, async_op)
        if not async_op or len(in_flight) >= 6:
            settle()
    settle()
    torch.cuda.synchronize()
    assert checked >= ops
    assert compressed_calls() > before
    assert torch.cuda.memory_allocated() == start
