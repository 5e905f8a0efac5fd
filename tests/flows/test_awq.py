"""AWQ (``int4_weight_only`` with method="awq" / "awq+gptq"): on a tiny random Llama with activation outlier
channels the int4 model's logits come closer to the float model's than plain rounding's; the folded scales keep
the float function; info names each group's exponent; a missing calibration_data is refused."""

from __future__ import annotations

import copy
import re

import pytest
import torch

import lowbit
from lowbit.errors import ConfigError

transformers = pytest.importorskip("transformers")
import tiny_llama  # noqa: E402 (tests/ is on sys.path: conftest.py)

GROUP = 32


def outlier_llama():
    return tiny_llama.outlier_llama(10)


def _batches(count=16, seed=1):
    return tiny_llama.token_batches(count, 64, seed)


_error = tiny_llama.logits_error


@pytest.fixture(scope="module")
def setting():
    model = outlier_llama()
    ids = torch.randint(0, 128, (2, 48), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        reference = model(ids).logits
    return model, ids, reference


def _quantized(model, method, **options):
    data = {} if method == "round" else {"calibration_data": _batches()}
    return lowbit.quantize_model(copy.deepcopy(model), "int4_weight_only", group_size=GROUP, method=method,
                                 **data, **options)  # fmt: skip


def test_awq_no_worse_than_round(setting):
    model, ids, reference = setting
    plain = _quantized(model, "round", search=False)[0]
    awq, info = _quantized(model, "awq")
    assert len(info["awq"]) == 9 and all(0 <= entry["alpha"] < 1 for entry in info["awq"].values())
    assert all(entry["error_ratio"] <= 1 for entry in info["awq"].values())
    assert _error(awq, reference, ids) < _error(plain, reference, ids)
    scaled_only = _quantized(model, "awq", search=False)[0]
    assert _error(scaled_only, reference, ids) < _error(plain, reference, ids)


def test_awq_then_gptq(setting):
    model, ids, reference = setting
    plain = _quantized(model, "round", search=False)[0]
    both, info = _quantized(model, "awq+gptq")
    assert len(info["awq"]) == 9
    assert _error(both, reference, ids) < _error(plain, reference, ids)


def test_awq_scales_keep_the_float_function():
    from lowbit.flows.awq import awq_scale, int4_rounded

    model = outlier_llama().double()
    ids = _batches(1, 5)[0]
    targets = {name: module for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    with torch.no_grad():
        before = model(ids).logits
        info, power = awq_scale(model, targets, _batches(), lambda w: int4_rounded(w, GROUP, torch.float32))
        after = model(ids).logits
    assert any(entry["alpha"] > 0 for entry in info["awq"].values())
    assert float((after - before).norm() / before.norm()) < 1e-12
    assert set(power) == set(targets)


@pytest.mark.parametrize("method", ["awq", "awq+gptq"])
def test_awq_needs_calibration_data(method):
    with pytest.raises(ConfigError, match=re.escape(f"int4_weight_only: method='{method}' needs calibration_data=")):
        lowbit.flows.make_recipe("int4_weight_only", method=method)
