"""docs/integrations.md's torchao recipe, run as printed there on 2 CPU
processes against torchao's wheel: float8 training with FSDP2 and torchao's
float8 weight all-gather over fp8gloo ends within 1% of gloo's loss, its
gradients' reduce-scatters compressed and the float8 all-gathers passed
through.
Skips where torchao is not installed."""
import re

import pytest

from tests.support import doc_snippets

pytestmark = pytest.mark.full

INSTALL = "pip install torchao==0.18.0 torch==2.13.0"
STEPS = 8


def _run(tmp_path, code, *args):
    doc_snippets.require("torchao", install=INSTALL)
    return doc_snippets.run_torchrun(code, tmp_path, "torchao_fsdp2", args=args)


def _loss(stdout, backend) -> float:
    m = re.search(rf"^{backend}: loss ([\d.]+)$", stdout, re.M)
    assert m, stdout
    return float(m.group(1))


def test_float8_fsdp2_over_fp8gloo_trains_like_gloo(tmp_path):
    code = doc_snippets.code_block("torchao_fsdp2", "recipe")
    fp8, gloo = _run(tmp_path, code), _run(tmp_path, code, "gloo")
    assert fp8.returncode == 0, doc_snippets.log(fp8)
    # The plain-gloo baseline may abort after its report in torch's teardown
    # race (doc_snippets.aborted_at_exit): its loss stands.
    excused = doc_snippets.aborted_at_exit(gloo) and re.search(r"^gloo: loss ", gloo.stdout, re.M)
    assert gloo.returncode == 0 or excused, doc_snippets.log(gloo)
    print(fp8.stdout, gloo.stdout, sep="\n")  # the numbers docs/integrations.md carries (pytest -s)
    fp8_loss, gloo_loss = _loss(fp8.stdout, "fp8gloo"), _loss(gloo.stdout, "gloo")
    assert abs(fp8_loss - gloo_loss) <= 0.01 * gloo_loss, (fp8_loss, gloo_loss)
    per_op = {op: (int(c), int(p)) for op, c, p in
              re.findall(r"^(\w+): (\d+) compressed, (\d+) passed through$", fp8.stdout, re.M)}
    assert per_op["reduce_scatter_tensor"][0] >= STEPS, fp8.stdout  # FSDP2's gradients, compressed
    assert per_op["all_gather_into_tensor"] == (0, per_op["all_gather_into_tensor"][1]) and \
        per_op["all_gather_into_tensor"][1] >= STEPS, fp8.stdout  # torchao's float8 bytes, as they are
    (calls, sent, uncompressed), = doc_snippets.STATS.findall(fp8.stdout)
    assert int(calls) >= STEPS and int(sent) < 0.75 * int(uncompressed), fp8.stdout

