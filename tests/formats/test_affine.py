"""Tests of the affine format with given parameters: codes q = clamp(round(x / scale) + zp), values
(q - zp) * scale. The API examples, exhaustive checks at power-of-two scales, torch.fake_quantize_* as an
oracle, the value set and bad parameters. Derived (min-max) parameters: test_affine_derived.py."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import lowbit
from lowbit import FormatError
from lowbit.formats import Affine
from lowbit.formats.rounding import ROUNDING_MODES

from helpers import DETERMINISTIC, code_limits, reference_round, short_scale


# ---- the API examples -----------------------------------------------------------------------------------------
def test_api_example_given_scale_signed():
    x = torch.tensor([0.0, 0.14, 0.16, -0.26, -13.5, 12.0, 1e6, -math.inf, math.inf])
    out = lowbit.quantize(x, "affine", bits=8, scale=0.1, zero_point=3)
    steps = torch.tensor([0, 1, 2, -3, -131, 120, 124, -131, 124], dtype=torch.float32)  # q - zp, q in [-128, 127]
    assert torch.equal(out, steps * torch.tensor(0.1))
    assert torch.isnan(lowbit.quantize(torch.tensor([math.nan]), "affine", bits=8, scale=0.1, zero_point=3)).all()


def test_api_example_given_scale_unsigned():
    x = torch.tensor([0.0, -0.2, -5.0, 25.0, 30.0, 3.14])
    out = lowbit.quantize(x, "affine", bits=8, signed=False, scale=0.1, zero_point=3)
    steps = torch.tensor([0, -2, -3, 250, 252, 31], dtype=torch.float32)  # q - zp, q in [0, 255]
    assert torch.equal(out, steps * torch.tensor(0.1))


def test_api_example_symmetric_per_channel():
    x = torch.tensor([[1.0, -0.45, 0.25, 0.3], [-14.0, 7.4, 3.2, 0.9]])
    out = lowbit.quantize(x, "affine", bits=4, symmetric=True, axis=0)
    # scale = max |row| / q_max, rounded down to 24 - 4 = 20 significant bits (1/7 is not exact; 2 is)
    s0, s1 = torch.tensor(short_scale(np.float32(1.0) / np.float32(7), 4)), torch.tensor(14.0) / 7
    expected = torch.stack([torch.tensor([7.0, -3.0, 2.0, 2.0]) * s0, torch.tensor([-7.0, 4.0, 2.0, 0.0]) * s1])
    assert torch.equal(out, expected)


def test_api_example_power_of_two_blocks():
    x = torch.cat([torch.linspace(-1, 3, 32), torch.linspace(-100, 10, 32)]).reshape(1, 64)
    out = lowbit.quantize(x, "affine", bits=4, block_size=[1, 32], power_of_two=True)
    for block, (low, high) in zip(out.split(32, dim=1), [(-1.0, 3.0), (-100.0, 10.0)]):
        scale = 2.0 ** math.ceil(math.log2((high - low) / 15))
        assert torch.all(torch.remainder(block, scale) == 0)  # on the power-of-two grid
    # Block 1: scale 0.5, zero point -6, so 3.0 is code 0. Block 2: scale 8, zero point 4: -100 / 8 = -12.5
    # rounds to -12 (even), code -8 = q_min, value -96.
    assert out[0, 31].item() == 3.0 and out[0, 32].item() == -96.0


# ---- exhaustive: power-of-two scales make every midpoint exact ------------------------------------------------
def zero_points(bits: int, signed: bool, narrow: bool) -> list[int]:
    """The extreme codes, zero and one more: every zero point kind, all inside the code range."""
    q_min, q_max = code_limits(bits, signed, narrow)
    return sorted({q_min, q_max, 0, min(1, q_max)})


GIVEN_CASES = [
    (bits, signed, narrow, zero_point)
    for bits in range(1, 9)
    for signed, narrow in ((True, False), (True, True), (False, False))
    if not (narrow and bits < 2)
    for zero_point in zero_points(bits, signed, narrow)
]


@pytest.mark.parametrize("bits, signed, narrow, zero_point", GIVEN_CASES)
def test_exhaustive_given_scale(bits, signed, narrow, zero_point):
    q_min, q_max = code_limits(bits, signed, narrow)
    quarters = [Fraction(m, 4) for m in range(4 * (q_min - zero_point - 2), 4 * (q_max - zero_point + 2) + 1)]
    for scale in (0.25, 2.0, 2.0**-7):
        x = torch.tensor([float(t) for t in quarters]) * scale
        params = dict(bits=bits, signed=signed, narrow_range=narrow, scale=scale, zero_point=zero_point)
        values = Affine(**params).value_set()
        assert values.tolist() == [(q - zero_point) * scale for q in range(q_min, q_max + 1)]
        for mode in DETERMINISTIC:
            spec = Affine(rounding=mode, **params)
            codes = [min(max(reference_round(t, mode) + zero_point, q_min), q_max) for t in quarters]
            expected = (torch.tensor(codes, dtype=torch.float32) - zero_point) * scale
            assert torch.equal(spec(x), expected), (params, mode)
            assert torch.equal(spec(values.float()), values.float())
        out = Affine(rounding="stochastic", **params)(x.repeat(4), seed=bits) / scale + zero_point
        t = x.repeat(4) / scale
        low = (torch.floor(t) + zero_point).clamp(q_min, q_max)
        assert torch.all((out == low) | (out == (torch.ceil(t) + zero_point).clamp(q_min, q_max)))


@pytest.mark.parametrize("scale", [0.1, 1 / 3, 1e-3, 7.7])
def test_every_value_of_an_awkward_scale_maps_to_itself(scale):
    for bits, signed, zero_point in ((8, True, 3), (8, False, 200), (4, True, -2), (2, False, 1)):
        spec = Affine(bits=bits, signed=signed, scale=scale, zero_point=zero_point)
        values = spec.value_set().float()
        for mode in ROUNDING_MODES:
            assert torch.equal(spec.replace(rounding=mode)(values, seed=0), values), (scale, bits, mode)


@pytest.mark.parametrize("scale", [0.1, 1 / 3, 7.7, 0.3])
def test_directed_modes_pick_the_grid_value_on_their_side(scale):
    """With a non-power-of-two scale x * (1/scale) is inexact; directed results still respect x exactly."""
    spec = Affine(bits=8, scale=scale, zero_point=-5)
    grid = spec.value_set().float()
    x = torch.cat([grid, grid.nextafter(grid + 1), grid.nextafter(grid - 1), (grid[1:] + grid[:-1]) / 2])
    x = x[(x >= grid[0]) & (x <= grid[-1])]
    below = grid[torch.searchsorted(grid, x, right=True) - 1]  # largest grid value <= x
    above = grid[torch.searchsorted(grid, x, right=False)]  # smallest grid value >= x
    expected = {"down": below, "up": above, "toward_zero": torch.where(x >= 0, below, above),
                "away_from_zero": torch.where(x >= 0, above, below)}  # fmt: skip
    for mode, want in expected.items():
        assert torch.equal(spec.replace(rounding=mode)(x), want), mode


# ---- oracle: torch.fake_quantize_* ---------------------------------------------------------------------------
ORACLE_SCALES = [0.1, 1 / 3, 1e-3, 7.7, 0.05, 2.0, 1e-5, 123.4, 0.3]
ORACLE_RANGES = [(8, True, 0), (8, True, 3), (8, True, -100), (8, False, 0), (8, False, 200), (4, False, 5),
                 (4, True, -3), (2, True, 1), (7, False, 127)]  # fmt: skip


def oracle_inputs(scale: float, zero_point: int, q_min: int, q_max: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    span = scale * (q_max - q_min)
    random = torch.randn(4000, generator=gen) * span
    codes = torch.randint(q_min - zero_point - 3, q_max - zero_point + 3, (1000,), generator=gen).float()
    s32 = torch.tensor(scale, dtype=torch.float32)
    ties = torch.cat([(codes + 0.5) * s32, (codes + 0.5) / (1 / s32)])  # exact or nearly exact ties
    far = torch.tensor([1e3, -1e3, 1e5, -1e5]) * span  # far out of range (x / scale still fits an int64)
    return torch.cat([random, ties, torch.nextafter(ties, ties + 1), torch.nextafter(ties, ties - 1), far, -random])


@pytest.mark.parametrize("scale", ORACLE_SCALES)
def test_per_tensor_matches_torch_fake_quantize(scale):
    for index, (bits, signed, zero_point) in enumerate(ORACLE_RANGES):
        q_min, q_max = code_limits(bits, signed)
        x = oracle_inputs(scale, zero_point, q_min, q_max, index)
        ours = lowbit.quantize(x, "affine", bits=bits, signed=signed, scale=scale, zero_point=zero_point)
        theirs = torch.fake_quantize_per_tensor_affine(x, scale, zero_point, q_min, q_max)
        assert torch.equal(ours, theirs), (scale, bits, signed, zero_point)


@pytest.mark.parametrize(
    "shape, axis", [((6, 40), 0), ((6, 40), 1), ((3, 5, 7), 1), ((3, 5, 7), -1), ((2, 3, 4, 5), 1)]
)
@pytest.mark.parametrize("bits, signed", [(8, True), (8, False), (4, True)])
def test_per_channel_matches_torch_fake_quantize(shape, axis, bits, signed):
    gen = torch.Generator().manual_seed(len(shape) * 10 + bits)
    channels = shape[axis]
    q_min, q_max = code_limits(bits, signed)
    scale = torch.tensor(ORACLE_SCALES * 5)[:channels] * (torch.rand(channels, generator=gen) + 0.5)
    zero_point = torch.randint(q_min, q_max + 1, (channels,), generator=gen, dtype=torch.int32)
    x = torch.randn(shape, generator=gen) * 300
    view = [1] * len(shape)
    view[axis] = -1
    x = torch.cat([x, (torch.round(x / scale.reshape(view)) + 0.5) * scale.reshape(view)], dim=axis - 1 if axis else 1)
    ours = lowbit.quantize(x, "affine", bits=bits, signed=signed, scale=scale.tolist(),
                           zero_point=zero_point.tolist(), axis=axis)  # fmt: skip
    theirs = torch.fake_quantize_per_channel_affine(x, scale, zero_point, axis % len(shape), q_min, q_max)
    assert torch.equal(ours, theirs)


def test_per_channel_scalar_zero_point_and_scale_broadcast():
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    scales = [0.1, 0.2, 0.3, 0.4]
    out = lowbit.quantize(x, "affine", scale=scales, zero_point=2, axis=0)
    theirs = torch.fake_quantize_per_channel_affine(x, torch.tensor(scales), torch.full((4,), 2, dtype=torch.int32),
                                                    0, -128, 127)  # fmt: skip
    assert torch.equal(out, theirs)


# ---- description ------------------------------------------------------------------------------------------------
def test_value_set_and_bits_per_element():
    assert Affine(bits=2, scale=0.5, zero_point=1).value_set().tolist() == [-1.5, -1.0, -0.5, 0.0]
    assert Affine(bits=2, narrow_range=True, scale=0.5).value_set().tolist() == [-0.5, 0.0, 0.5]
    assert Affine(bits=4).value_set() is None and Affine(bits=4, scale=[1.0, 2.0], axis=0).value_set() is None
    assert Affine(bits=4, scale=1.0, zero_point=[1, 2], axis=0).value_set() is None
    assert Affine(bits=2, scale=0.1, power_of_two=True).value_set().tolist() == [-0.25, -0.125, 0.0, 0.125]
    bf16_tenth = torch.tensor(0.1).to(torch.bfloat16).item()
    values = Affine(bits=2, scale=0.1, scale_dtype="bf16").value_set().tolist()
    assert values == [k * bf16_tenth for k in (-2, -1, 0, 1)]
    assert Affine(bits=4, scale=0.1).bits_per_element((8, 64)) == 4.0
    assert Affine(bits=4, symmetric=True, block_size=[1, 32]).bits_per_element((8, 64)) == 4 + 32 / 32
    assert Affine(bits=4, block_size=[1, 32], scale_dtype="bf16").bits_per_element((8, 64)) == 4 + (16 + 4) / 32
    assert Affine(bits=8, axis=0).bits_per_element((10, 100)) == 8 + (32 + 8) / 100


# ---- bad parameters ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "params, pattern",
    [
        ({"bits": 1.5}, "bits"),
        ({"bits": 0}, "bits"),
        ({"bits": 17}, "bits"),
        ({"scale": -1}, "scale"),
        ({"scale": math.nan}, "scale"),
        ({"scale": 0.0}, "scale"),
        ({"scale": math.inf}, "scale"),
        ({"scale": "a"}, "scale"),
        ({"scale": []}, "scale"),
        ({"scale": 0.1, "zero_point": 128}, "zero_point"),
        ({"scale": 0.1, "zero_point": -1, "signed": False}, "zero_point"),
        ({"scale": 0.1, "zero_point": 1.5}, "zero_point"),
        ({"scale": 0.1, "zero_point": 2, "symmetric": True}, "zero_point"),
        ({"zero_point": 2}, "zero_point"),
        ({"scale": 0.1, "block_size": [1, 32]}, "block_size"),
        ({"scale": [0.1, 0.2]}, "axis"),
        ({"scale": 0.1, "zero_point": [1, 2]}, "axis"),
        ({"narrow_range": True, "signed": False}, "narrow_range"),
        ({"bits": 1, "symmetric": True}, "symmetric"),
        ({"scale_dtype": "f8"}, "scale_dtype"),
        ({"block_size": [0, 4]}, "block_size"),
        ({"axis": "rows"}, "axis"),
        ({"symetric": True}, "did you mean 'symmetric'"),
    ],
)
def test_bad_parameters_name_the_parameter(params, pattern):
    with pytest.raises(FormatError, match=pattern):
        lowbit.quantize(torch.ones(4, 4), "affine", **params)


def test_per_channel_shape_mismatch_is_a_format_error():
    x = torch.ones(3, 5)
    with pytest.raises(FormatError, match=r"scale.*dimension 1 of size 5"):
        lowbit.quantize(x, "affine", scale=[0.1, 0.2, 0.3], axis=1)
    with pytest.raises(FormatError, match=r"zero_point.*dimension 0 of size 3"):
        lowbit.quantize(x, "affine", scale=0.1, zero_point=[1, 2], axis=0)
    with pytest.raises(FormatError, match="axis"):
        lowbit.quantize(x, "affine", scale=[0.1, 0.2, 0.3], axis=2)
    with pytest.raises(FormatError, match="size 1"):
        lowbit.quantize(torch.tensor(1.0), "affine", scale=[0.1, 0.2], axis=0)
