"""SmoothQuant (``smoothquant=alpha`` on int8_dynamic and w8a8_static): on a tiny random Llama whose norms make a
few activation channels 50x larger, the int8 model's logits come closer to the float model's; info names the
smoothed groups; bad alphas and a missing calibration_data are refused."""

from __future__ import annotations

import copy

import pytest
import torch

import lowbit
from lowbit.errors import ConfigError

transformers = pytest.importorskip("transformers")
import tiny_llama  # noqa: E402 (tests/ is on sys.path: conftest.py)


def outlier_llama():
    return tiny_llama.outlier_llama(50)


def _batches(count=4, seed=1):
    return tiny_llama.token_batches(count, 32, seed)


_error = tiny_llama.logits_error


@pytest.mark.parametrize("recipe", ["int8_dynamic", "w8a8_static"])
def test_smoothquant_reduces_int8_error(recipe):
    model = outlier_llama()
    ids = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        reference = model(ids).logits
    options = {"calibration_data": _batches()} if recipe == "w8a8_static" else {}
    plain = lowbit.quantize_(copy.deepcopy(model), recipe, **options)
    smoothed, info = lowbit.quantize_model(copy.deepcopy(model), recipe, smoothquant=0.5,
                                           calibration_data=_batches())  # fmt: skip
    assert len(info["smoothed"]) == 9 and info["smoothquant"] == 0.5
    assert info["smoothed"]["model.layers.1.self_attn.v_proj"] == ["model.layers.1.self_attn.o_proj"]
    assert _error(smoothed, reference, ids) < 0.7 * _error(plain, reference, ids)


def test_smoothing_keeps_float_function_before_rounding():
    from lowbit.flows.smoothing import smooth_quant

    model = outlier_llama().double()
    ids = _batches(1, 5)[0]
    with torch.no_grad():
        before = model(ids).logits
        smooth_quant(model, _batches(), 0.8)
        after = model(ids).logits
    assert float((after - before).norm() / before.norm()) < 1e-12


@pytest.mark.parametrize("recipe", ["int8_dynamic", "w8a8_static"])
@pytest.mark.parametrize("alpha", [0, 1.5, -0.5, True, "0.5"])
def test_bad_alpha_refused(recipe, alpha):
    with pytest.raises(ConfigError, match=f"{recipe}: smoothquant="):
        lowbit.flows.make_recipe(recipe, smoothquant=alpha, calibration_data=_batches(1))


def test_smoothquant_needs_calibration_data():
    with pytest.raises(ConfigError, match="int8_dynamic: smoothquant=0.5 needs calibration_data="):
        lowbit.flows.make_recipe("int8_dynamic", smoothquant=0.5)
    with pytest.raises(ConfigError, match="w8a8_static: smoothquant=0.5 needs calibration_data= and no calibration="):
        lowbit.flows.make_recipe("w8a8_static", smoothquant=0.5, calibration=object())
    recipe = lowbit.flows.make_recipe("int8_dynamic", smoothquant=1, calibration_data=_batches(1))
    assert recipe.to_dict()["smoothquant"] == 1 and "calibration_data" not in recipe.to_dict()
