"""int4_weight_only(symmetric=True): codes -7..7 around zero (zero point 7), bit for bit the simulated affine
4-bit symmetric format; refusals for the methods that search asymmetric grids."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import lowbit
from lowbit.errors import ConfigError
from lowbit.ops import Int4WeightOnlyLinear


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 16))


@pytest.mark.parametrize("scale_dtype", ["bf16", "f16", "f32"])
def test_symmetric_codes_equal_the_simulated_format(scale_dtype):
    model = _model()
    quantized = lowbit.quantize_(copy.deepcopy(model), "int4_weight_only", symmetric=True, group_size=16,
                                 scale_dtype=scale_dtype)  # fmt: skip
    for index in (0, 2):
        module = quantized[index]
        assert isinstance(module, Int4WeightOnlyLinear)
        assert torch.all(module.weight_zero_point == 7) and int(module.codes().max()) <= 14
        simulated = lowbit.quantize(model[index].weight.detach(), "affine", bits=4, signed=True, symmetric=True,
                                    block_size=(1, 16), scale_dtype=scale_dtype)  # fmt: skip
        assert torch.equal(module.dequantized_weight(), simulated)
        signed = module.signed_codes()
        assert signed is not None and int(signed.min()) >= -7 and int(signed.max()) <= 7


def test_asymmetric_codes_have_no_signed_form_and_methods_are_checked():
    asymmetric = lowbit.quantize_(_model(), "int4_weight_only", group_size=16)
    assert asymmetric[0].signed_codes() is None  # zero points other than 7 / 8 with codes up to 15
    with pytest.raises(ConfigError, match="symmetric=True"):
        lowbit.quantize_(_model(), "int4_weight_only", symmetric=True, method="hqq")
