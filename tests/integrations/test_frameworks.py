"""The framework integrations of docs/integrations.md: each snippet of it,
run as printed there (CPU processes over fp8gloo: 2, or 4 for the 2x2 mesh),
trains and reports through fp8comm.get_stats() that its gradients went over
the wire FP8-compressed. The exact-blocks snippet (fp8comm.uncompressed,
track_error) also shows its metric exact and the gradients' SQNR; the
plain-mesh FSDP2 snippet (fp8comm.fsdp) compresses the shard dimension only,
and the DDP hook snippet (fp8comm.hooks) compresses on a plain gloo group.

Lightning (Fabric DDP, Trainer DDP with a validation loop; Lightning's FSDP
is GPU-only) and Accelerate are optional packages: their tests skip,
saying so, when the package is not installed. The recipes for DeepSpeed,
torchao and torchtitan are tests/integrations/test_recipe_*.py.
"""
import importlib.util
import pathlib
import re
import subprocess
import sys

import pytest

from tests.support import doc_snippets
from tests.support.doc_snippets import STATS

# One of the longest modules: it starts first (tests/conftest.py).
STARTS_FIRST = True

TIMEOUT_S = 300


def snippet(name: str) -> str:
    """The code block that follows ``<!-- snippet: name -->`` in the doc."""
    return doc_snippets.code_block(name)


def test_every_snippet_marker_is_tested():
    names = doc_snippets.marked("snippet")
    assert names == set(LAUNCH), names


# The third-party recipes (`recipe:` markers) and the modules that run them.
RECIPES = {"deepspeed_zero": "test_recipe_deepspeed.py", "torchao_fsdp2": "test_recipe_torchao.py",
           "torchtitan_moe": "test_recipe_torchtitan.py"}


def test_every_recipe_marker_is_tested():
    assert doc_snippets.marked("recipe") == set(RECIPES)
    here = pathlib.Path(__file__).parent
    for name, module in RECIPES.items():
        assert f'code_block("{name}", "recipe")' in (here / module).read_text(), (name, module)


def _env() -> dict:
    return doc_snippets.launch_env()


def _self_launched(path, env):
    """Lightning launches its own processes: the script is run once."""
    return [sys.executable, path]


def _torchrun(path, env, nproc=2):
    return doc_snippets.torchrun(path, env, nproc=nproc)


def _torchrun_2x2(path, env):
    """4 processes: a 2x2 mesh."""
    return _torchrun(path, env, nproc=4)


LAUNCH = {
    "fabric_ddp": ("lightning", _self_launched),
    "trainer_ddp": ("lightning", _self_launched),
    "accelerate_cpu": ("accelerate", _torchrun),
    "device_mesh_hsdp": ("torch", _torchrun_2x2),
    "exact_blocks": ("torch", _torchrun),  # fp8comm.uncompressed and track_error, no framework
    "fsdp2_plain_mesh": ("torch", _torchrun_2x2),  # fp8comm.fsdp on a plain mesh
    "ddp_hook": ("torch", _torchrun),  # fp8comm.hooks on a plain group
}


def _run(name, code, tmp_path):
    package, launch = LAUNCH[name]
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed (pip install lightning accelerate)")
    path = tmp_path / f"{name}.py"
    path.write_text(code)
    env = _env()
    return subprocess.run(launch(str(path), env), capture_output=True, text=True, timeout=TIMEOUT_S,
                          cwd=tmp_path, env=env)


# The snippets whose groups are plain gloo (fp8comm.fsdp on a plain mesh,
# fp8comm.hooks on a plain group): torch's teardown race can abort them at exit.
PLAIN_GLOO = {"fsdp2_plain_mesh", "ddp_hook"}


def _aborted_at_exit(out) -> bool:
    """torch's teardown race over plain gloo (doc_snippets.aborted_at_exit;
    the accelerate snippet over gloo: 2 of 15 runs on a 2-core Intel Xeon
    VM), after the snippet's final report."""
    return doc_snippets.aborted_at_exit(out) and len(STATS.findall(out.stdout)) == 1


@pytest.mark.parametrize("name", sorted(LAUNCH))
def test_snippet_trains_with_fp8_compressed_gradients(name, tmp_path):
    out = _run(name, snippet(name), tmp_path)
    log = out.stdout[-3000:] + out.stderr[-5000:]
    # A plain-gloo snippet may abort after its final report in torch's race, not the snippet's: its report stands.
    assert out.returncode == 0 or (name in PLAIN_GLOO and _aborted_at_exit(out)), log
    found = STATS.findall(out.stdout)
    assert len(found) == 1, log  # printed by rank 0 only
    calls, sent, uncompressed = map(int, found[0])
    assert calls >= 4, log  # at least one compressed gradient collective per step
    assert sent < 0.5 * uncompressed, log
    if name == "accelerate_cpu":
        assert "DistributedType.MULTI_CPU" in out.stdout, log  # Accelerate saw 2 processes, wrapped DDP
    if name == "device_mesh_hsdp":  # HSDP: reduce-scatters within "shard", all-reduces across "replicate"
        per_dim = dict(re.findall(r"mesh dim (\w+): (\d+) calls compressed", out.stdout))
        assert set(per_dim) == {"replicate", "shard"} and all(int(n) >= 4 for n in per_dim.values()), log
        assert int(re.search(r"FP8 GEMMs: (\d+)", out.stdout).group(1)) > 0, log
    if name == "fsdp2_plain_mesh":  # only the shard dimension's reduce-scatter is compressed
        assert "replicate dim compressors: 0" in out.stdout, log
    if name == "exact_blocks":  # the metric all-reduced in the block is exact; the gradients report SQNR
        assert "histogram exact: True" in out.stdout, log
        m = re.search(r"^all_reduce: (\d+) compressed, SQNR ([\d.]+) dB, (\d+) passed through$", out.stdout, re.M)
        assert m and (int(m.group(1)), int(m.group(3))) == (4, 1), log  # 4 gradient buckets; the metric
        assert 25.0 < float(m.group(2)) < 40.0, log


def test_trainer_sync_dist_on_fp8gloo(tmp_path):
    """Lightning asks backends not named "gloo" for AVG, also of its int64
    batch-size counter: fp8gloo averages integers as NCCL does."""
    code = snippet("trainer_ddp")
    old = 'self.log("val_loss", (self.net(x) - x).pow(2).mean())'  # epoch-level: syncs the batch-size counter
    assert old in code and "max_steps=4" in code
    code = code.replace(old, old[:-1] + ", sync_dist=True)").replace("max_steps=4", "max_steps=1")
    out = _run("trainer_ddp", code, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
