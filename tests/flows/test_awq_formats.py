"""AWQ for the format recipe (``quantize_(model, FORMAT, roles=["weight"], method="awq" | "awq+gptq",
calibration_data=...)``): the scale search measures the weight format's own rounding; on a tiny random Llama
with activation outlier channels the NVFP4 / MXFP4 weights then give logits closer to the float model's than
plain rounding's, and AWQ + GPTQ closer still than rounding; the folded scales keep the float function."""

from __future__ import annotations

import copy
import re

import pytest
import torch

import lowbit
from lowbit.errors import ConfigError

transformers = pytest.importorskip("transformers")
import tiny_llama  # noqa: E402 (tests/ is on sys.path: conftest.py)


@pytest.fixture(scope="module")
def setting():
    model = tiny_llama.outlier_llama(10)
    ids = torch.randint(0, 128, (2, 48), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        reference = model(ids).logits
    return model, ids, reference


def _quantized(model, name, method):
    data = {} if method == "round" else {"calibration_data": tiny_llama.token_batches(16, 64, 1)}
    return lowbit.quantize_model(copy.deepcopy(model), name, roles=["weight"], method=method, **data)


@pytest.mark.parametrize("name", ["nvfp4", "mxfp4_e2m1"])
def test_awq_on_a_format_is_closer_than_rounding(setting, name):
    model, ids, reference = setting
    plain = _quantized(model, name, "round")[0]
    awq, info = _quantized(model, name, "awq")
    assert info["awq"] and all(entry["error_ratio"] <= 1 for entry in info["awq"].values())
    assert tiny_llama.logits_error(awq, reference, ids) < tiny_llama.logits_error(plain, reference, ids)
    both, info = _quantized(model, name, "awq+gptq")
    assert info["awq"] and info["gptq"]["layers"]
    assert tiny_llama.logits_error(both, reference, ids) < tiny_llama.logits_error(plain, reference, ids)


def test_the_folded_scales_keep_the_float_function(setting):
    model, ids, reference = setting
    scaled, _ = lowbit.quantize_model(copy.deepcopy(model), "nvfp4", roles=["weight"], method="awq",
                                      calibration_data=tiny_llama.token_batches(4, 64, 1))  # fmt: skip
    for module in scaled.modules():  # the same model with the weights' format switched off
        if hasattr(module, "formats"):
            module.formats = type(module.formats)()
    with torch.no_grad():
        assert torch.allclose(scaled(ids).logits, reference, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", ["awq", "awq+gptq"])
def test_awq_needs_data_and_a_weight_role(method):
    model = tiny_llama.outlier_llama(10)
    with pytest.raises(ConfigError, match=re.escape(f"method='{method}' needs calibration_data=")):
        lowbit.quantize_(model, "nvfp4", roles=["weight"], method=method)
    with pytest.raises(ConfigError, match="has no 'weight'"):
        lowbit.quantize_(model, "nvfp4", roles=["data_in"], method=method, calibration_data=[])
