"""lowbit.ops.gptq_formats: GPTQ rounding onto any format's grid.

Identity: with an identity Hessian (no correlations, so no error moves) GPTQ is the format's plain rounding bit
for bit, for every family, in order and with static groups, with any damping. Accuracy: on correlated inputs
GPTQ's output error is below plain rounding's. Representability: the rounded weight is on the format's own
grid, so rounding it again gives it back (asymmetric affine groups excepted, see flows.gptq_formats).
"""

from __future__ import annotations

import pytest
import torch

from lowbit.errors import ConfigError, FormatError
from lowbit.formats import resolve
from lowbit.ops.gptq import gptq_quantize
from lowbit.ops.gptq_formats import column_rounder, gptq_round, settled

FORMATS = {
    "mxfp4_e2m1": ("mxfp4_e2m1", {}),
    "mxint8": ("mxint8", {}),
    "mxfp8_e4m3": ("mxfp8_e4m3", {}),
    "mxfp6_e3m2 ceil": ("mxfp6_e3m2", {"scale_rule": "ceil"}),
    "e4m3": ("e4m3", {}),
    "e4m3 per row": ("e4m3", {"axis": 0}),
    "e4m3 blocks": ("e4m3", {"block_size": [1, 32]}),
    "minifloat": ("minifloat_ieee", {"width": 6, "exponent_width": 3}),
    "minifloat denorm": ("minifloat_denorm", {"width": 5, "exponent_width": 2}),
    "affine int3 g64": ("affine", {"bits": 3, "block_size": [1, 64]}),
    "affine int4 symmetric per channel": ("affine", {"bits": 4, "symmetric": True, "axis": 0}),
    "affine int8 per tensor": ("affine", {"bits": 8}),
    "affine int5 toward_zero": ("affine", {"bits": 5, "block_size": [1, 32], "rounding": "toward_zero"}),
    "affine bf16 scales": ("affine", {"bits": 4, "signed": False, "block_size": [1, 32], "scale_dtype": "bf16"}),
    "fixed point": ("integer", {"width": 6, "frac_width": 4}),
    "block_fp": ("block_fp", {"width": 5, "exponent_width": 8, "block_size": [1, 16]}),
    "block_fp tiles": ("block_fp", {"width": 4, "exponent_width": 8, "block_size": [4, 8]}),
    "log": ("log", {"width": 5}),
    "nvfp4": ("nvfp4", {}),  # the tensor scale from the weight before any update, block scales in order
}
ALWAYS_ON_GRID = [label for label in FORMATS if label not in ("affine int3 g64", "affine int5 toward_zero",
                                                                 "affine bf16 scales")]  # fmt: skip


def _spec(label):
    name, params = FORMATS[label]
    return resolve(name, **params)


def _weight(rows=40, columns=160, seed=0):
    return torch.randn(rows, columns, generator=torch.Generator().manual_seed(seed)) * 0.05


def _correlated(columns=160, rows=600, seed=1):
    """Inputs whose features share a few latent directions (strong off-diagonal H), and their H."""
    generator = torch.Generator().manual_seed(seed)
    latent = torch.randn(rows, 8, generator=generator) @ torch.randn(8, columns, generator=generator)
    inputs = latent + 0.3 * torch.randn(rows, columns, generator=generator)
    return inputs, 2 * inputs.T.double() @ inputs.double() / rows


@pytest.mark.parametrize("label", list(FORMATS))
@pytest.mark.parametrize("static_groups", [False, True])
def test_identity_hessian_gives_plain_rounding_bit_for_bit(label, static_groups):
    spec, weight = _spec(label), _weight()
    expected = spec.quantize(weight)
    for damping in (0.01, 1e5):
        rounded = gptq_round(weight, torch.eye(160), spec, damping=damping, static_groups=static_groups)
        assert torch.equal(rounded, expected), (label, damping, int((rounded != expected).sum()))


@pytest.mark.parametrize("label", ["mxfp4_e2m1", "affine int3 g64", "e4m3", "block_fp"])
def test_act_order_with_identity_hessian_is_plain_rounding(label):
    spec, weight = _spec(label), _weight()
    hessian = torch.diag(torch.linspace(3.0, 0.5, 160))  # diagonal: act_order permutes, nothing moves
    assert torch.equal(gptq_round(weight, hessian, spec, act_order=True), spec.quantize(weight))


@pytest.mark.parametrize("label", list(FORMATS))
def test_gptq_lowers_the_output_error_on_correlated_inputs(label):
    spec, weight = _spec(label), _weight()
    inputs, hessian = _correlated()

    def error(quantized):
        return float(((weight - quantized) @ inputs.T).square().mean())

    plain = error(spec.quantize(weight))
    for options in ({}, {"static_groups": True}, {"act_order": True}):
        rounded = gptq_round(weight, hessian, spec, damping=0.01, **options)
        assert error(rounded) < 0.97 * plain, (label, options, error(rounded), plain)


@pytest.mark.parametrize("label", ALWAYS_ON_GRID)
def test_the_rounded_weight_is_its_own_rounding(label):
    spec, weight = _spec(label), _weight()
    _, hessian = _correlated()
    for options in ({}, {"static_groups": True}, {"act_order": True}):
        rounded = gptq_round(weight, hessian, spec, damping=0.01, **options)
        again, moved = settled(spec, weight, rounded)
        assert moved == 0 and torch.equal(again, rounded), (label, options, moved)


def test_asymmetric_affine_settles_onto_the_format_grid():
    spec, weight = _spec("affine int3 g64"), _weight()
    _, hessian = _correlated()
    stored, moved = settled(spec, weight, gptq_round(weight, hessian, spec, damping=0.01))
    assert moved < weight.numel() // 10
    assert torch.equal(spec.quantize(stored), stored)  # what the layer stores is a fixed point of the format


def test_partial_last_block_and_dead_inputs():
    spec, weight = _spec("mxfp4_e2m1"), _weight(columns=72)  # 32 + 32 + 8
    assert torch.equal(gptq_round(weight, torch.eye(72), spec), spec.quantize(weight))
    inputs, _ = _correlated(columns=72)
    inputs[:, 5] = 0.0  # an input that is always zero: its weights do not matter and become 0
    hessian = 2 * inputs.T.double() @ inputs.double() / inputs.shape[0]
    rounded = gptq_round(weight, hessian, spec)
    assert torch.all(rounded[:, 5] == 0) and torch.equal(spec.quantize(rounded), rounded)


def test_int4_gptq_is_unchanged_by_the_shared_checks():
    """ops.gptq's int4 path (Int4WeightOnly method='gptq') keeps its own rounding; a weight whose columns
    are not a multiple of the group size is still refused there."""
    weight, (_, hessian) = _weight(columns=64), _correlated(columns=64)
    result = gptq_quantize(weight, hessian, 32, damping=0.01)
    assert result.codes.shape == (40, 64) and result.scale.shape == (40, 2)
    with pytest.raises(FormatError, match="not divisible by group_size"):
        gptq_quantize(_weight(columns=48), torch.eye(48), 32)


@pytest.mark.parametrize("name, params", [("ternary", {}), ("nf4", {}), ("block_log", {"width": 4}),
                                          ("mxfp4_e2m1", {"rounding": "stochastic"})])  # fmt: skip
def test_formats_without_a_fixed_scale_rounding_are_refused(name, params):
    spec = resolve(name, **params)
    with pytest.raises(ConfigError, match=spec.format_name):
        column_rounder(spec, (8, 64))
