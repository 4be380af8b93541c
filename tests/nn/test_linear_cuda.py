"""Fp8Linear's GEMMs on a GPU (marked cuda; skipped without one): what the
CPU cannot show, since torch's CPU _scaled_mm ignores use_fast_accum."""
import pytest
import torch

from fp8comm.nn import Fp8Linear
from tests.nn.test_linear import RECIPES, with_fast_accum
from tests.support.reference import sqnr_db

pytestmark = pytest.mark.cuda


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                    reason="needs a GPU with FP8 tensor cores (compute capability 8.9 or later)")
@pytest.mark.parametrize("recipe", RECIPES)
def test_fast_accum_output_is_close_to_full_accumulation_on_a_gpu(recipe):
    """Fast accumulation changes the output by far less than FP8 rounding does."""
    torch.manual_seed(0)
    layer = Fp8Linear(2048, 1024, bias=False, recipe=with_fast_accum(recipe, True, False, False), device="cuda",
                      dtype=torch.bfloat16)
    x = torch.randn(256, 2048, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        fast = layer(x)
        layer.recipe = with_fast_accum(recipe, False, False, False)
        full = layer(x)
    ref = x.double() @ layer.weight.double().t()
    assert sqnr_db(full, fast) >= 30.0
    assert sqnr_db(ref, fast) >= 18.0 and sqnr_db(ref, full) >= 18.0
