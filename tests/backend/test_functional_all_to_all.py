"""fp8comm.functional.all_to_all_single and all_to_all_single_autograd
(DESIGN.md, "Any group"): on a plain group (gloo, and the fp8ncclsim
transport standing for nccl), with equal, uneven and zero splits and 2-D
rows.

- Exact (options that do not name all_to_all; "all" does not): bitwise the
  reference model's result (each rank rebuilds every rank's input), which is
  torch's own all_to_all_single's too; the same through an fp8 group.
- Autograd: the forward and, with backward_options=None, the gradients are
  bitwise those of torch's _functional_collectives.all_to_all_single_autograd
  on the same ranks.
- Compressed (options naming all_to_all; these run once the backend
  compresses all_to_all): bitwise the fp8 group's result with the same
  options, this rank's own slice exact; an FP8 backward changes the
  gradients by the format's error only.
- Errors name the call, the argument and what to pass.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import fp8comm
import fp8comm.functional as F
from tests.backend.test_functional import _groups  # a plain and an fp8 group of the pool's ranks
from tests.support.harness import PoolSpec, ctx
from tests.support.inputs import rank_input, same_bits


# ---------------------------------------------------------------- scenarios
# Run on every rank of the pool: module-level, the ranks import this module.



def split_matrix(pattern: str, world: int) -> list[list[int]] | None:
    """Rows rank s sends rank d, [s][d]; None: equal slices (the split sizes left out)."""
    if pattern == "equal":
        return None
    if pattern == "uneven":
        return [[(3 * s + 5 * d) % 7 + 1 for d in range(world)] for s in range(world)]
    # zero: rank 1 sends nothing at all, even ranks keep nothing of their own;
    # every rank still receives rows from a rank of another node (2 x 2)
    return [[0 if s == 1 or (s == d and s % 2 == 0) else 2 * s + d + 3 for d in range(world)] for s in range(world)]


EQUAL_ROWS = 6  # per peer, when the splits are equal


def _sends(matrix, rank: int, world: int) -> list[int]:
    return [EQUAL_ROWS] * world if matrix is None else matrix[rank]


def _receives(matrix, rank: int, world: int) -> list[int]:
    return [EQUAL_ROWS] * world if matrix is None else [matrix[s][rank] for s in range(world)]


def _input(rank: int, world: int, matrix, trailing: tuple, dtype, seed: int = 5) -> torch.Tensor:
    rows = sum(_sends(matrix, rank, world))
    width = 1
    for t in trailing:
        width *= t
    return rank_input(rank, rows * width, dtype, seed=seed).view(rows, *trailing)


def reference(matrix, rank: int, world: int, trailing: tuple, dtype, seed: int = 5) -> torch.Tensor:
    """This rank's all_to_all_single result, built from every rank's input
    without communicating: rank s's rows for this rank, in rank order."""
    parts = []
    for s in range(world):
        x = _input(s, world, matrix, trailing, dtype, seed)
        sends = _sends(matrix, s, world)
        start = sum(sends[:rank])
        parts.append(x[start:start + sends[rank]])
    return torch.cat(parts)


def _split_args(matrix, rank: int, world: int):
    if matrix is None:
        return None, None
    return _receives(matrix, rank, world), _sends(matrix, rank, world)


def exact_all_to_all(pattern: str, trailing: tuple, dtype_name: str, async_op: bool, options: dict | None) -> dict:
    c = ctx()
    dtype = getattr(torch, dtype_name)
    matrix = split_matrix(pattern, c.world)
    plain, fp8 = _groups(options or {})
    x = _input(c.rank, c.world, matrix, trailing, dtype)
    out_sizes, in_sizes = _split_args(matrix, c.rank, c.world)
    rows = sum(_receives(matrix, c.rank, c.world))
    got = torch.full((rows, *trailing), -7.0).to(dtype)
    opts = fp8comm.Options(**options) if options is not None else None
    work = F.all_to_all_single(got, x, out_sizes, in_sizes, group=plain, async_op=async_op, options=opts)
    if async_op:
        work.wait()
    else:
        assert work is None
    torch_out = torch.empty_like(got)
    dist.all_to_all_single(torch_out, x, out_sizes, in_sizes, group=c.gloo)
    fp8_out = torch.empty_like(got)
    dist.all_to_all_single(fp8_out, x, out_sizes, in_sizes, group=fp8)
    want = reference(matrix, c.rank, c.world, trailing, dtype)
    stats = fp8comm.get_stats(plain)
    return {"reference": same_bits(got, want), "torch": same_bits(torch_out, want),
            "fp8_group": same_bits(fp8_out, want), "compressed": stats["calls_compressed"]}


def _autograd_run(fn, matrix, trailing, dtype, group, **kwargs):
    """fn's forward of this rank's input, and the input's gradient for the
    loss sum(y * w) (w rank-dependent)."""
    c = ctx()
    x = _input(c.rank, c.world, matrix, trailing, dtype).requires_grad_(True)
    out_sizes, in_sizes = _split_args(matrix, c.rank, c.world)
    y = fn(x, out_sizes, in_sizes, group, **kwargs)
    w = rank_input(c.rank + 100, y.numel(), dtype, seed=9).view(y.shape)
    (y * w).sum().backward()
    return y.detach().clone(), x.grad.clone()


def autograd_equals_torch(pattern: str, trailing: tuple, dtype_name: str, where: str) -> dict:
    """``where``: a plain group, a 1-D DeviceMesh over it, or an fp8 group
    (whose exact backward runs in an uncompressed block)."""
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import DeviceMesh

    c = ctx()
    dtype = getattr(torch, dtype_name)
    matrix = split_matrix(pattern, c.world)
    plain, fp8 = _groups({"compress": "all", "min_numel": 0})
    group = {"group": plain, "mesh": DeviceMesh.from_group(plain, "cpu"), "fp8_group": fp8}[where]
    y, grad = _autograd_run(F.all_to_all_single_autograd, matrix, trailing, dtype, group)
    torch_y, torch_grad = _autograd_run(funcol.all_to_all_single_autograd, matrix, trailing, dtype, c.gloo)
    return {"forward": same_bits(y, torch_y), "grad": same_bits(grad, torch_grad),
            "shape": list(y.shape) == list(torch_y.shape), "grad_fn": type(y).__name__}


def compressed_equals_fp8_group(pattern: str, wire_format: str, dtype_name: str, scope: str) -> dict:
    c = ctx()
    dtype = getattr(torch, dtype_name)
    options = {"compress": "all_to_all", "min_numel": 0, "wire_format": wire_format, "scope": scope}
    matrix = split_matrix(pattern, c.world)
    plain, fp8 = _groups(options)
    trailing = (64,)
    x = _input(c.rank, c.world, matrix, trailing, dtype)
    out_sizes, in_sizes = _split_args(matrix, c.rank, c.world)
    got = torch.empty((sum(_receives(matrix, c.rank, c.world)), *trailing), dtype=dtype)
    want = torch.empty_like(got)
    F.all_to_all_single(got, x, out_sizes, in_sizes, group=plain, options=fp8comm.Options(**options))
    dist.all_to_all_single(want, x, out_sizes, in_sizes, group=fp8)
    exact = reference(matrix, c.rank, c.world, trailing, dtype)
    receives = _receives(matrix, c.rank, c.world)
    own = slice(sum(receives[:c.rank]), sum(receives[:c.rank + 1]))
    error = (got.float() - exact.float()).norm() / exact.float().norm().clamp_min(1e-30)
    return {"same": same_bits(got, want), "own_exact": same_bits(got[own], exact[own]),
            "changed": not same_bits(got, exact), "relative_error": error.item(),
            "compressed": fp8comm.get_stats(plain)["calls_compressed"]}


def autograd_compressed(wire_format: str) -> dict:
    """Forward in `wire_format`, backward exact, then backward in `wire_format`
    too: the exact-backward gradients are bitwise torch's; the compressed
    ones differ from them by the format's error, this rank's own rows exact."""
    import torch.distributed._functional_collectives as funcol

    c = ctx()
    options = fp8comm.Options(compress="all_to_all", min_numel=0, wire_format=wire_format)
    matrix = split_matrix("uneven", c.world)
    plain, _ = _groups({})
    trailing = (64,)
    y, grad_exact = _autograd_run(F.all_to_all_single_autograd, matrix, trailing, torch.float32, plain,
                                  options=options)
    _, grad_fp8 = _autograd_run(F.all_to_all_single_autograd, matrix, trailing, torch.float32, plain,
                                options=options, backward_options=options)
    _, torch_grad = _autograd_run(funcol.all_to_all_single_autograd, matrix, trailing, torch.float32, c.gloo)
    x = _input(c.rank, c.world, matrix, trailing, torch.float32)
    out_sizes, in_sizes = _split_args(matrix, c.rank, c.world)
    direct = torch.empty_like(y)
    F.all_to_all_single(direct, x, out_sizes, in_sizes, group=plain, options=options)
    sends = _sends(matrix, c.rank, c.world)
    own = slice(sum(sends[:c.rank]), sum(sends[:c.rank + 1]))
    error = (grad_fp8 - torch_grad).norm() / torch_grad.norm()
    return {"forward_is_the_call": same_bits(y, direct), "exact_grad": same_bits(grad_exact, torch_grad),
            "fp8_grad_changed": not same_bits(grad_fp8, torch_grad), "relative_error": error.item(),
            "own_grad_exact": same_bits(grad_fp8[own], torch_grad[own])}


def _message(fn) -> str:
    try:
        fn()
    except (TypeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def errors() -> dict:
    """Each documented refusal, on every rank (all are raised before any
    communication, so a refused call leaves the group usable)."""
    c = ctx()
    plain, _ = _groups({})
    w = c.world
    x = torch.zeros(2 * w, 4)
    out = torch.zeros(2 * w, 4)
    a2a, auto = F.all_to_all_single, F.all_to_all_single_autograd
    found = {
        "group": _message(lambda: a2a(out, x, group="ep")),
        "options": _message(lambda: a2a(out, x, group=plain, options="e4m3")),
        "count": _message(lambda: a2a(out, x, [2 * w], [2 * w], group=plain)),
        "sum": _message(lambda: a2a(out, x, None, [1] * w, group=plain)),
        "negative": _message(lambda: a2a(out, x, None, [-1] + [2] * (w - 2) + [w + 3], group=plain)),
        "tensor": _message(lambda: a2a(out, x, None, torch.full((w,), 2), group=plain)),
        "not_divisible": _message(lambda: a2a(torch.zeros(2 * w + 1, 4), torch.zeros(2 * w + 1, 4), group=plain)),
        "dtype": _message(lambda: a2a(out.double(), x, group=plain)),
        "rows": _message(lambda: a2a(torch.zeros(2 * w, 3), x, group=plain)),
        "scalar": _message(lambda: a2a(torch.zeros(()), torch.zeros(()), group=plain)),
        "one_none": _message(lambda: auto(x, None, [2] * w, plain)),
        "all_is_not_a2a": _message(lambda: auto(x, None, None, plain, options=fp8comm.Options(compress="all"))),
        "backward_unnamed": _message(lambda: auto(x, None, None, plain,
                                                  backward_options=fp8comm.Options(wire_format="e5m2"))),
    }
    # the group still works after every refusal
    got = torch.empty_like(x)
    F.all_to_all_single(got, x + c.rank, group=plain)
    found["still_works"] = bool((got.view(w, 2, 4)[:, 0, 0] == torch.arange(w, dtype=torch.float32)).all())
    return found


# ---------------------------------------------------------------- tests

POOLS = [
    PoolSpec(3, "fp8gloo", id="gloo-3"),
    PoolSpec(4, "fp8ncclsim", env={"FP8COMM_LOCAL_SIZE": "2"}, id="ncclsim-nodes-2x2",
             attrs={"scope": "inter_node"}),
]
PATTERNS = ["equal", "uneven", "zero"]


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("trailing", [(), (5,)], ids=["1d", "2d"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("options", [None, {"compress": "all", "min_numel": 0}], ids=["env", "all"])
def test_exact_is_the_reference_and_torchs_result(pool, pattern, trailing, dtype, async_op, options):
    # compress="all" does not include all_to_all (it is opt-in by name): exact
    for r in pool.run(exact_all_to_all, pattern, trailing, dtype, async_op, options):
        assert r == {"reference": True, "torch": True, "fp8_group": True, "compressed": 0}, r


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("trailing", [(8,), (2, 3)], ids=["tokens", "3d"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("where", ["group", "mesh", "fp8_group"])
def test_autograd_is_torchs_forward_and_backward(pool, pattern, trailing, dtype, where):
    for r in pool.run(autograd_equals_torch, pattern, trailing, dtype, where):
        assert r["forward"] and r["grad"] and r["shape"], r


def test_errors_name_the_call_and_the_remedy(pool):
    for r in pool.run(errors):
        assert r.pop("still_works"), r
        expected = {
            "group": "TypeError: fp8comm.functional.all_to_all_single: group must be a torch.distributed ProcessGroup",
            "options": "TypeError: fp8comm.functional.all_to_all_single: options must be fp8comm.Options",
            "count": f"has 1 sizes but the group has {pool.world} ranks; pass one row count per rank",
            "sum": f"input_split_sizes {[1] * pool.world} sum to {pool.world} rows but input has {2 * pool.world}",
            "negative": "has a negative size",
            "tensor": "input_split_sizes must be a list of ints, got a tensor; pass input_split_sizes.tolist()",
            "not_divisible": f"which the group's {pool.world} ranks cannot split equally; pass output_split_sizes",
            "dtype": "TypeError: fp8comm.functional.all_to_all_single: output is torch.float64 but input is "
                     "torch.float32",
            "rows": "output's rows hold 3 elements",
            "scalar": "output is a scalar",
            "one_none": "ValueError: fp8comm.functional.all_to_all_single_autograd: output_split_sizes and "
                        "input_split_sizes must both be lists or both None",
            "all_is_not_a2a": "options compress 'all_reduce,reduce_scatter,all_gather' does not name 'all_to_all'",
            "backward_unnamed": "backward_options compress 'all_reduce,reduce_scatter' does not name 'all_to_all'",
        }
        for name, text in expected.items():
            assert text in r[name], (name, r[name])


def test_errors_without_a_group():
    with pytest.raises(TypeError, match=r"fp8comm.functional.all_to_all_single: output must be a torch.Tensor"):
        F.all_to_all_single([torch.ones(4)], torch.ones(4))
    with pytest.raises(TypeError, match=r"all_to_all_single_autograd: group must be a torch.distributed "):
        F.all_to_all_single_autograd(torch.ones(4), None, None, "ep")


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("wire_format", ["e4m3", "e5m2", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_compressed_is_the_fp8_groups_result_own_slice_exact(pool, pattern, wire_format, dtype):
    scope = getattr(pool, "scope", "all")
    for r in pool.run(compressed_equals_fp8_group, pattern, wire_format, dtype, scope):
        assert r["same"] and r["own_exact"], r
        assert r["compressed"] == 1 and r["changed"], r
        assert r["relative_error"] < (0.08 if wire_format.startswith("e") else 0.3), r


@pytest.mark.parametrize("wire_format", ["e4m3", "mxfp4"])
def test_autograd_backward_in_fp8_changes_gradients_by_the_formats_error(pool, wire_format):
    for r in pool.run(autograd_compressed, wire_format):
        assert r["forward_is_the_call"] and r["exact_grad"], r
        assert r["fp8_grad_changed"] and r["own_grad_exact"], r
        assert r["relative_error"] < (0.05 if wire_format == "e4m3" else 0.2), r
