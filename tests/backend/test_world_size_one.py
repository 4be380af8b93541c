"""fp8gloo in a group of one (in this process). The own segment is never
quantized (DESIGN.md, "Algorithms"), so a reduce_scatter is exact, an
all_reduce quantizes once (the re-quantized sum), and an all_gather once; the
CUDA tests compare fp8nccl with exactly this path."""
import os
import tempfile

import pytest
import torch
import torch.distributed as dist

import fp8comm


@pytest.fixture(scope="module", autouse=True)
def group_of_one():
    d = tempfile.mkdtemp()
    dist.init_process_group("fp8gloo", init_method=f"file://{os.path.join(d, 's')}", rank=0, world_size=1,
                            pg_options=fp8comm.Options(min_numel=0, compress="all"))
    yield
    dist.destroy_process_group()


def once(x):
    """One quantization of x, decoded: blocks from element 0, as the backend cuts them."""
    codes, scales = fp8comm.quantize(x.reshape(-1))
    return fp8comm.dequantize(codes, scales, dtype=x.dtype).view(x.shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [1, 1000, (1 << 21) + 77])  # the last one spans several codec threads
def test_all_reduce_quantizes_once(dtype, n):
    x = torch.randn(n).to(dtype)
    y = x.clone()
    fp8comm.reset_stats()
    dist.all_reduce(y)
    assert torch.equal(y, once(x))
    stats = fp8comm.get_stats()
    assert stats["calls_compressed"] == 1 and stats["bytes_sent"] == 0


def test_all_reduce_premul_and_avg():
    x = torch.randn(5000)
    y = x.clone()
    dist.all_reduce(y, op=dist._make_nccl_premul_sum(0.25))
    assert torch.equal(y, once(x * 0.25))
    y = x.clone()
    dist.all_reduce(y, op=dist.ReduceOp.AVG)
    assert torch.equal(y, once(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reduce_scatter_is_exact(dtype):
    x = torch.randn(3001).to(dtype)
    out = torch.empty_like(x)
    dist.reduce_scatter_tensor(out, x)
    assert torch.equal(out, x)
    dist.reduce_scatter_tensor(out, x, op=dist._make_nccl_premul_sum(0.5))
    assert torch.equal(out, (x.float() * 0.5).to(dtype))
    listed = torch.empty_like(x)
    dist.reduce_scatter(listed, [x])
    assert torch.equal(listed, x)


def test_reduce_scatter_in_place():
    x = torch.randn(4096)
    expect = x.clone()
    dist.reduce_scatter_tensor(x, x)
    assert torch.equal(x, expect)


def test_all_gather_quantizes_once():
    x = torch.randn(777)
    out = torch.empty(777)
    dist.all_gather_into_tensor(out, x)
    assert torch.equal(out, once(x))
    outs = [torch.empty(777)]
    dist.all_gather(outs, x)
    assert torch.equal(outs[0], once(x))
