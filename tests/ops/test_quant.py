"""quantize / dequantize / fake_quantize against torch's own quantized tensors and fake-quantize ops."""

from __future__ import annotations

import warnings
from fractions import Fraction

import pytest
import torch
from helpers import DETERMINISTIC, reference_round
from hypothesis import given
from hypothesis import strategies as st

from lowbit import FormatError
from lowbit.ops import dequantize, fake_quantize, quantize
from lowbit.ops.quant import token_codes

SCALES = st.floats(2.0**-10, 10.0, width=32)


def _torch_quantized(x, scale, zero_point, dtype, axis=None):
    with warnings.catch_warnings():  # torch 2.13 warns that quantized tensors are deprecated
        warnings.simplefilter("ignore")
        if axis is None:
            return torch.quantize_per_tensor(x, scale, zero_point, dtype)
        return torch.quantize_per_channel(x, scale, zero_point, axis, dtype)


@given(st.integers(0, 2**31 - 1), SCALES, st.integers(-128, 127), st.sampled_from([torch.int8, torch.uint8]))
def test_quantize_per_tensor_matches_torch(seed, scale, zero_point, dtype):
    x = torch.randn(64, generator=torch.Generator().manual_seed(seed)) * scale * 60
    if dtype == torch.uint8:
        zero_point += 128
    ours = quantize(x, scale, zero_point, dtype=dtype)
    theirs = _torch_quantized(x, scale, zero_point, {torch.int8: torch.qint8, torch.uint8: torch.quint8}[dtype])
    assert torch.equal(ours, theirs.int_repr())
    assert torch.equal(dequantize(ours, scale, zero_point), theirs.dequantize())


@given(st.integers(0, 2**31 - 1), st.lists(SCALES, min_size=3, max_size=3), st.lists(st.integers(-20, 20), min_size=3, max_size=3))
def test_quantize_per_channel_matches_torch(seed, scales, zero_points):
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(seed)) * 50
    scale, zero_point = torch.tensor(scales), torch.tensor(zero_points)
    ours = quantize(x, scale, zero_point, axis=0)
    theirs = _torch_quantized(x, scale.double(), zero_point, torch.qint8, axis=0)
    assert torch.equal(ours, theirs.int_repr())
    assert torch.equal(dequantize(ours, scale, zero_point, axis=0), theirs.dequantize())


@given(st.integers(0, 2**31 - 1), SCALES, st.integers(-10, 10), st.sampled_from([(-128, 127), (0, 15), (-7, 7)]))
def test_fake_quantize_matches_torch(seed, scale, zero_point, qrange):
    x = torch.randn(100, generator=torch.Generator().manual_seed(seed)) * scale * 20
    zero_point = min(max(zero_point, qrange[0]), qrange[1])
    ours = fake_quantize(x, scale, zero_point, qmin=qrange[0], qmax=qrange[1])
    assert torch.equal(ours, torch.fake_quantize_per_tensor_affine(x, scale, zero_point, *qrange))
    per_channel = fake_quantize(x.reshape(4, 25), torch.full((4,), scale), torch.full((4,), zero_point), axis=0,
                                qmin=qrange[0], qmax=qrange[1])  # fmt: skip
    theirs = torch.fake_quantize_per_channel_affine(
        x.reshape(4, 25), torch.full((4,), scale), torch.full((4,), zero_point, dtype=torch.int32), 0, *qrange
    )
    assert torch.equal(per_channel, theirs)


@pytest.mark.parametrize("mode", DETERMINISTIC)
def test_every_rounding_mode_on_ties_and_off_ties(mode):
    scale = 0.25
    x = torch.tensor([k / 8 for k in range(-40, 41)])  # multiples of half a step: every tie
    codes = quantize(x, scale, 3, rounding=mode)
    expected = [min(max(reference_round(Fraction(k, 8) / Fraction(1, 4), mode) + 3, -128), 127) for k in range(-40, 41)]
    assert codes.tolist() == expected


def test_groups_nan_inf_and_zero_point_code():
    x = torch.tensor([[0.1, -0.2, 100.0, -100.0, float("nan"), float("inf"), 0.0, 0.3]])
    scale = torch.tensor([[0.1, 0.5]])
    codes = quantize(x, scale, torch.tensor([[0, 2]]), group_size=4, dtype=torch.int8)
    assert codes.tolist() == [[1, -2, 127, -128, 2, 127, 2, 3]]
    back = dequantize(codes, scale, torch.tensor([[0, 2]]), group_size=4)
    assert back[0, 4].item() == 0.0 and back[0, 0].item() == pytest.approx(0.1)


def test_token_codes_symmetric_and_centred():
    x = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0], [3.0, 4.0, 5.0]])
    sym = token_codes(x)
    assert sym.codes[0].tolist() == [64, -127, 32] and sym.codes[1].tolist() == [0, 0, 0]
    centred = token_codes(x, symmetric=False)
    assert centred.codes[2].tolist() == [-127, 0, 127]
    assert torch.allclose(centred.codes.float() * centred.scale + centred.offset, x, atol=0.02)


@pytest.mark.parametrize("call, message", [
    (lambda: quantize(torch.ones(3), float("nan")), "finite"),
    (lambda: quantize(torch.ones(3), 0.0), "finite"),
    (lambda: quantize(torch.ones(3), 1.0, 300), "zero_point"),
    (lambda: quantize(torch.ones(3), 1.0, 0.5), "integers"),
    (lambda: quantize(torch.ones(2, 3), torch.ones(3), axis=0), "do not match"),
    (lambda: quantize(torch.ones(2, 3), torch.ones(2)), "axis"),
    (lambda: quantize(torch.ones(2, 6), torch.ones(2, 2), group_size=4), "divisible"),
    (lambda: quantize(torch.ones(3, dtype=torch.int32), 1.0), "floating-point"),
    (lambda: quantize(torch.ones(3), 1.0, dtype=torch.float16), "not supported"),
    (lambda: quantize(torch.ones(3), 1.0, qmin=5, qmax=1), "qmin"),
    (lambda: quantize(torch.ones(3), 1.0, rounding="nearest_odd"), "rounding"),
    (lambda: dequantize(torch.ones(3), 1.0), "integer codes"),
])  # fmt: skip
def test_bad_input_raises_format_error(call, message):
    with pytest.raises(FormatError, match=message):
        call()


def test_fake_quantize_equals_the_affine_format_with_the_same_scale_nan_included():
    """One rounding rule: ops.fake_quantize and lowbit.quantize(x, "affine", scale=...) agree bit for bit."""
    import lowbit

    x = torch.randn(6, 40, generator=torch.Generator().manual_seed(3)) * 3
    x[1, 3], x[2, 5], x[4, 7] = float("nan"), float("inf"), float("-inf")
    for scale, zero_point in ((0.05, 0), (0.0123, 7), (0.2, -20)):
        ours = fake_quantize(x, scale, zero_point, qmin=-128, qmax=127)
        spec = lowbit.quantize(x, "affine", bits=8, scale=scale, zero_point=zero_point)
        assert torch.equal(ours.isnan(), spec.isnan())
        assert torch.equal(torch.nan_to_num(ours), torch.nan_to_num(spec))


def test_one_scale_zero_point_type_and_one_int4_packing():
    from lowbit.calibrate.builders import ScaleZeroPoint
    from lowbit.formats.affine import AffineParameters
    from lowbit.ops import kernels
    from lowbit.ops.quant import QParams
    from lowbit.qtensor.packing import pack_codes, unpack_codes

    assert ScaleZeroPoint is AffineParameters and QParams is AffineParameters
    codes = torch.randint(0, 16, (6, 64), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    packed = kernels.pack_nibbles(codes)
    stream = pack_codes(codes, 4, signed=False, layout="uint8")
    assert torch.equal(packed.reshape(-1), stream.words)
    assert torch.equal(kernels.unpack_nibbles(packed), codes)
    assert torch.equal(unpack_codes(stream).to(torch.uint8), codes)
