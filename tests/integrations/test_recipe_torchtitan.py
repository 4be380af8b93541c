"""docs/integrations.md's torchtitan recipe, run as printed there on 2 CPU
processes against torchtitan 0.3.0's wheel: its MoE layer with expert
parallelism trains within 1% of the exact loss with E4M3 dispatch (a
dispatcher calling fp8comm.functional) and with E4M3 dispatch and combine on
its default spmd_types path (an fp8 EP group whose compress names
all_to_all), every data all_to_all compressed, the token counts exact.
Skips where torchtitan or spmd_types is not installed. torchtitan's
token_dispatcher imports triton for its GPU kernels; where triton is not
installed the ranks get an empty stand-in (the all_to_all path never calls
it)."""
import importlib.util
import re

import pytest

from tests.support import doc_snippets

pytestmark = pytest.mark.full

INSTALL = "pip install tyro spmd_types==0.2.3 torch==2.13.0 && pip install --no-deps torchtitan==0.3.0"
STEPS = 8

# Where triton is not installed: runs the recipe after importing torchtitan's
# token dispatcher with a stand-in `triton` (every attribute a callable that
# returns another, enough for its kernel definitions), then removes the
# stand-in, so torch still finds no triton (torch's inductor is imported
# first, while there is none, and decides so).
WITH_TRITON_STAND_IN = """import runpy
import sys
import types

# torch looks for triton in these (torchtitan's FlexAttention compiles at import): before the stand-in exists
import torch._inductor.compile_fx  # noqa: F401
import torch._inductor.runtime.triton_compat  # noqa: F401


class Anything:
    def __call__(self, *args, **kwargs):
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else Anything()

    def __getattr__(self, name):
        return Anything()


class StandIn(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Anything()


sys.modules["triton"], sys.modules["triton.language"] = StandIn("triton"), StandIn("triton.language")
sys.modules["triton"].language = sys.modules["triton.language"]
import torchtitan.models.common.token_dispatcher  # noqa: E402,F401  (its MinimalAsyncEP kernels import triton)
del sys.modules["triton"], sys.modules["triton.language"]
runpy.run_path(sys.argv.pop(1), run_name="__main__")
"""


def test_moe_dispatch_and_combine_in_fp8_train_like_exact(tmp_path):
    doc_snippets.require("torchtitan", "spmd_types", "tyro", install=INSTALL)
    code = doc_snippets.code_block("torchtitan_moe", "recipe")
    if importlib.util.find_spec("triton") is None:
        (tmp_path / "recipe.py").write_text(code)
        out = doc_snippets.run_torchrun(WITH_TRITON_STAND_IN, tmp_path, "with_triton_stand_in",
                                        args=[str(tmp_path / "recipe.py")])
    else:
        out = doc_snippets.run_torchrun(code, tmp_path, "torchtitan_moe")
    assert out.returncode == 0, doc_snippets.log(out)
    print(out.stdout)  # the numbers docs/integrations.md carries (pytest -s)
    exact = float(re.search(r"^exact loss ([\d.]+)$", out.stdout, re.M).group(1))
    runs = {name: (float(loss), int(calls), int(sent), int(total), per_op) for name, loss, calls, sent, total, per_op in
            re.findall(r"^(E4M3 dispatch(?: and combine)?) loss ([\d.]+); fp8comm: calls_compressed=(\d+) "
                       r"bytes_sent=(\d+) of (\d+); (.*)$", out.stdout, re.M)}
    assert set(runs) == {"E4M3 dispatch", "E4M3 dispatch and combine"}, out.stdout
    for name, (loss, calls, sent, total, per_op) in runs.items():
        assert abs(loss - exact) <= 0.01 * exact, (name, loss, exact)
        assert sent < 0.5 * total, (name, sent, total)
    # the dispatch's forward, each step
    assert runs["E4M3 dispatch"][1] == STEPS and runs["E4M3 dispatch"][4] == \
        f"all_to_all {STEPS} compressed 0 passed through", out.stdout
    # dispatch and combine, forward and backward, each step; the integer token counts exact
    assert runs["E4M3 dispatch and combine"][1] == 4 * STEPS and runs["E4M3 dispatch and combine"][4] == \
        f"all_to_all {4 * STEPS} compressed {STEPS} passed through", out.stdout
