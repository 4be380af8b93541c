"""torch.compile over fp8gloo groups, 2 real processes.

- The functional collectives (torch.distributed._functional_collectives:
  all_reduce, all_gather_tensor, reduce_scatter_tensor) run on an fp8gloo
  group eagerly and inside one torch.compile graph (inductor, fullgraph):
  compressed both ways (stats count each op as compressed), the compiled
  results equal the eager ones bit for bit, and both differ from plain gloo's
  exact results (FP8 was on the wire).
- fp8comm.functional on a plain group under torch.compile: a graph break,
  the call eager between the compiled parts, results equal to eager (and
  all_to_all_single_autograd's gradients equal eager's); FSDP2
  on a plain mesh with fp8comm.fsdp's reduce-scatter and compiled blocks
  trains exactly as eager (the comm runs outside the compiled blocks).
- An FSDP2 + Fp8Linear training step with every block compiled (as torchtitan
  compiles per block) trains with losses equal to the eager run's, the
  gradient reduce-scatters compressed, no graph break. The backend is
  "aot_eager" (dynamo + AOTAutograd, the same graph capture as inductor):
  inductor's C++ code generation for the forward and backward graphs costs
  about a minute of CPU per rank; run with FP8COMM_TEST_INDUCTOR=1 to use it
  (it gave the same losses, bit for bit, when measured).
"""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

import fp8comm
import fp8comm.fsdp
from tests.support.harness import PoolSpec, ctx
from tests.support.scenarios import fsdp as S
from tests.support.torch_features import torch_release

# One of the longest modules: it starts first (tests/conftest.py).
STARTS_FIRST = True


# ---------------------------------------------------------------- scenarios
# Run on every rank of the pool: module-level, the ranks import this module.
# torch.compile over functional collectives and over FSDP2 on an fp8gloo
# group; the model is scenarios/fsdp.py's tiny decoder.

_GROUPS: dict = {}

N = 4096  # elements per rank: above the group's min_numel (1024), a multiple of the block size


def compress_all_group():
    """An fp8gloo group that compresses all_gather too, created once per pool."""
    if "all" not in _GROUPS:
        _GROUPS["all"] = dist.new_group(backend="fp8gloo", pg_options=fp8comm.Options(compress="all", min_numel=1024))
    return _GROUPS["all"]


def _inputs(rank: int):
    gen = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(N, generator=gen), torch.randn(N, 8, generator=gen)


def _funcol_step(x, m, group):
    """Each functional collective once, with compute around them that is exact
    in FP32 (scaling by powers of two, adding small integers), so eager and
    compiled graphs must agree bit for bit."""
    import torch.distributed._functional_collectives as funcol

    # all_gather_tensor / reduce_scatter_tensor warn that *_single is their new
    # name; these are the names compiled code (DTensor, torchtitan) uses.
    ar = funcol.all_reduce(x * 2.0, "sum", group)
    ag = funcol.all_gather_tensor(m * 0.5, 0, group)
    rs = funcol.reduce_scatter_tensor(ag, "sum", 0, group)
    return ar + 1.0, ag, rs * 4.0


def funcol_eager_and_compiled(backend: str = "inductor"):
    """Runs _funcol_step eagerly, then compiled with ``backend``; returns the
    outputs, the stats after each and the gloo reference (exact results: the
    compressed ones must differ from them, proving FP8 was on the wire)."""
    import warnings

    import torch._dynamo

    warnings.filterwarnings("ignore", category=FutureWarning, module=__name__)
    c = ctx()
    group = compress_all_group()
    x, m = _inputs(c.rank)
    fp8comm.reset_stats(group)
    eager = [t.clone() for t in _funcol_step(x, m, group)]
    eager_stats = fp8comm.get_stats(group)

    torch._dynamo.reset()
    compiled_fn = torch.compile(_funcol_step, backend=backend, fullgraph=True)
    fp8comm.reset_stats(group)
    compiled = [t.clone() for t in compiled_fn(x, m, group)]
    compiled_stats = fp8comm.get_stats(group)

    exact = [t.clone() for t in _funcol_step(x, m, c.gloo)]
    return {"eager": eager, "compiled": compiled, "exact": exact,
            "eager_stats": eager_stats, "compiled_stats": compiled_stats}


def _fp8comm_functional_step(x, group):
    """fp8comm.functional.all_reduce on a plain group, with exact compute around it."""
    import fp8comm.functional

    y = x * 2.0
    fp8comm.functional.all_reduce(y, group=group, options=fp8comm.Options(min_numel=1024))
    return y + 1.0


def fp8comm_functional_compiled(backend: str = "aot_eager"):
    """fp8comm.functional's all_reduce on the plain gloo group, eagerly and
    compiled: dynamo does not trace into the backend call (it is not one of
    torch's functional collectives), so it breaks the graph there and runs
    the call eagerly between the compiled parts."""
    import torch._dynamo

    c = ctx()
    x, _ = _inputs(c.rank)
    eager = _fp8comm_functional_step(x, c.gloo)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(_fp8comm_functional_step, backend=backend)(x, c.gloo)
    return {"eager": eager, "compiled": compiled, "graph_breaks": sum(torch._dynamo.utils.counters["graph_break"].values()),
            "compressed": fp8comm.get_stats(c.gloo)["per_op"]["all_reduce"]["compressed"]}


def _a2a_options():
    """Options that compress all_to_all where this build's backend does, else None (exact)."""
    try:
        return fp8comm.Options(compress="all_to_all", min_numel=1024)
    except ValueError:
        return None


def _fp8comm_a2a_step(x, group, options):
    """fp8comm.functional.all_to_all_single_autograd (MoE dispatch and
    combine's call) with exact compute around it; returns the loss."""
    import fp8comm.functional

    y = fp8comm.functional.all_to_all_single_autograd(x * 2.0, None, None, group, options=options,
                                                      backward_options=options)
    return (y.sin() * 3.0).sum()


def fp8comm_a2a_autograd_compiled(backend: str = "aot_eager"):
    """The same step eagerly and compiled, forward and backward: a graph break
    at the call, its backward run by autograd as eager's."""
    import torch._dynamo

    c = ctx()
    x, _ = _inputs(c.rank)
    options = _a2a_options()
    out = {}
    for mode in ("eager", "compiled"):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        step = _fp8comm_a2a_step if mode == "eager" else torch.compile(_fp8comm_a2a_step, backend=backend)
        leaf = x.view(-1, 8).clone().requires_grad_(True)
        loss = step(leaf, c.gloo, options)
        loss.backward()
        out[mode] = {"loss": loss.detach(), "grad": leaf.grad,
                     "graph_breaks": sum(torch._dynamo.utils.counters["graph_break"].values())}
    out["compressed"] = fp8comm.get_stats(c.gloo)["per_op"].get("all_to_all", {}).get("compressed", 0)
    out["options"] = options is not None
    return out


def fsdp2_compiled_training(steps: int = 3, backend: str = "inductor", plain: bool = False):
    """FSDP2 (fully_shard per block, then the root) over the fp8gloo group,
    Fp8Linear block layers, every block compiled with torch.compile
    (``backend``) as torchtitan does; ``steps`` AdamW steps. ``plain``: over
    the plain gloo group with nn.Linear and fp8comm.fsdp's reduce-scatter
    instead. Returns the
    global mean losses, the eager run's losses for the same data, the group's
    stats of the compiled run and fp8comm.nn's counters."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    import torch._dynamo

    c = ctx()
    out = {}
    for mode in ("eager", "compiled"):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        model = S.build("plain" if plain else "fp8")
        group = c.gloo if plain else c.group
        mesh = DeviceMesh.from_group(group, "cpu")
        for i, block in enumerate(model.blocks):
            if mode == "compiled":
                block.compile(backend=backend)
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        if plain:
            fp8comm.fsdp.compress_communication(model, options=fp8comm.Options(min_numel=1024))
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        if fp8comm.registry.fp8_backends(group):
            fp8comm.reset_stats(group)
        fp8comm.nn.reset_linear_stats()
        losses = S.train_losses(model, opt, c.rank, steps)
        out[mode] = {"losses": losses, "stats": fp8comm.get_stats(group), "nn": fp8comm.nn.linear_stats(),
                     "frames": dict(torch._dynamo.utils.counters["frames"]),
                     "graph_breaks": dict(torch._dynamo.utils.counters["graph_break"])}
    return out


# -------------------------------------------------------------------- tests

OPS = ("all_reduce", "all_gather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced")


# One compile thread: no pool of compile workers to start on a small CI machine.
POOLS = [PoolSpec(2, "fp8gloo", pg_options={"min_numel": 1024}, env={"TORCHINDUCTOR_COMPILE_THREADS": "1"})]


def test_functional_collectives_compressed_and_compiled_bitwise_equal_to_eager(pool):
    results = pool.run(funcol_eager_and_compiled, backend="inductor", timeout=400)
    for r in results:
        for name, eager, compiled, exact in zip(("all_reduce", "all_gather", "reduce_scatter"),
                                                r["eager"], r["compiled"], r["exact"]):
            assert torch.equal(compiled, eager), f"{name}: compiled differs from eager"
            assert not torch.equal(eager, exact), f"{name}: equals plain gloo's exact result (not compressed?)"
            rel = ((eager - exact).norm() / exact.norm()).item()
            assert rel < 0.1, f"{name}: relative error {rel}"  # FP8-close, and laid out right
        for stats in (r["eager_stats"], r["compiled_stats"]):
            assert stats["calls_compressed"] == 3 and stats["calls_passthrough"] == 0, stats
            assert {op: stats["per_op"][op]["compressed"] for op in OPS} == dict.fromkeys(OPS, 1), stats
            assert stats["bytes_sent"] < 0.3 * stats["bytes_sent_uncompressed"], stats
        assert r["compiled_stats"] == r["eager_stats"]
    assert torch.equal(results[0]["compiled"][0], results[1]["compiled"][0])  # all_reduce: same bits on every rank


# On torch 2.11 (CPU) the aot_eager-compiled blocks give the same first loss
# and then drift from eager (4.648 against 4.600 at step 2); the same run with
# plain nn.Linear stays bitwise equal, and a compiled CPU _scaled_mm alone
# equals eager. Not yet isolated: strict, so a fix shows as XPASS.
@pytest.mark.xfail(torch_release() < (2, 13), strict=True,
                   reason="torch 2.11: compiled Fp8Linear blocks drift from eager after the first step (not isolated)")
def test_fsdp2_fp8_linear_training_step_under_torch_compile(pool):
    backend = "inductor" if os.environ.get("FP8COMM_TEST_INDUCTOR") == "1" else "aot_eager"
    results = pool.run(fsdp2_compiled_training, steps=3, backend=backend, timeout=500)
    for r in results:
        eager, compiled = r["eager"], r["compiled"]
        assert compiled["frames"].get("ok", 0) >= 2, compiled["frames"]  # the blocks were compiled
        assert compiled["graph_breaks"] == {}, compiled["graph_breaks"]
        assert compiled["losses"] == eager["losses"], (compiled["losses"], eager["losses"])
        assert compiled["losses"][-1] < compiled["losses"][0]  # it trains
        # gradient reduce-scatters FP8-compressed (3 per step: two blocks and the root)
        assert compiled["stats"]["per_op"]["reduce_scatter_tensor"]["compressed"] == 9, compiled["stats"]
        assert compiled["stats"] == eager["stats"]
        assert compiled["nn"]["fp8_calls"] == eager["nn"]["fp8_calls"] == 12  # 4 Fp8Linear x 3 steps
        assert compiled["nn"]["fallback_calls"] == 0


def test_fp8comm_functional_under_torch_compile_breaks_the_graph_and_equals_eager(pool):
    for r in pool.run(fp8comm_functional_compiled, timeout=400):
        assert torch.equal(r["compiled"], r["eager"])
        assert r["graph_breaks"] >= 1, r["graph_breaks"]  # the call ran eagerly between compiled parts
        assert r["compressed"] == 2, r  # the eager call and the compiled function's


def test_fp8comm_a2a_autograd_under_torch_compile_breaks_the_graph_and_equals_eager(pool):
    for r in pool.run(fp8comm_a2a_autograd_compiled, timeout=400):
        eager, compiled = r["eager"], r["compiled"]
        assert torch.equal(compiled["loss"], eager["loss"]) and torch.equal(compiled["grad"], eager["grad"])
        assert compiled["graph_breaks"] >= 1, compiled
        # compressed forward and backward, eager and compiled, where the build compresses all_to_all
        assert r["compressed"] == (4 if r["options"] else 0), r


def test_fsdp2_on_a_plain_mesh_with_fp8comm_fsdp_under_torch_compile(pool):
    # torchtitan's shape: blocks compiled, FSDP2 on a plain mesh, only the
    # gradients' reduce-scatter compressed. FSDP2 calls the comm outside the
    # compiled blocks, so nothing breaks their graphs.
    results = pool.run(fsdp2_compiled_training, steps=3, backend="aot_eager", plain=True, timeout=500)
    for r in results:
        eager, compiled = r["eager"], r["compiled"]
        assert compiled["frames"].get("ok", 0) >= 2, compiled["frames"]
        assert compiled["graph_breaks"] == {}, compiled["graph_breaks"]
        assert compiled["losses"] == eager["losses"], (compiled["losses"], eager["losses"])
        assert compiled["stats"]["per_op"]["reduce_scatter_tensor"]["compressed"] == 9, compiled["stats"]
        assert compiled["stats"] == eager["stats"]
