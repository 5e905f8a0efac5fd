"""encode(x, fmt).dequantize() equals lowbit.quantize(x, fmt) bit for bit, for every encodable format."""

from __future__ import annotations

import math

import pytest
import torch
from format_cases import CASE_IDS, CASES
from helpers import DETERMINISTIC

import lowbit
from lowbit.errors import FormatError
from lowbit.formats import get_format
from lowbit.qtensor import QTensor, encodable_formats, encode

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
SHAPES = [(6, 70), (3, 5, 33), (), (1,), (17,), (0, 4)]
# Formats whose codes have a NaN pattern; every other format refuses NaN.
NAN_FORMATS = {"e5m2", "e4m3", "mxfp8_e4m3", "mxfp8_e5m2"}


def bit_identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape, NaN positions, and every other element equal including the sign of zero."""
    if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a.isnan(), b.isnan()):
        return False
    a, b = a.masked_fill(a.isnan(), 0), b.masked_fill(b.isnan(), 0)
    return torch.equal(a, b) and torch.equal(torch.signbit(a), torch.signbit(b))


def data(shape, dtype, seed: int) -> torch.Tensor:
    """Mixed magnitudes, exact zeros of both signs and tiny values."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * torch.exp2(torch.randint(-6, 6, shape, generator=gen))
    flat = x.view(-1)
    if flat.numel() > 4:
        flat[0], flat[1], flat[2], flat[3] = 0.0, -0.0, -1e-30, 1e-30
    return x.to(dtype)


def check(x: torch.Tensor, name: str, **params) -> QTensor:
    expected = lowbit.quantize(x, name, **params)
    q = encode(x, name, **params)
    assert bit_identical(q.dequantize(), expected), (name, params, x.dtype, tuple(x.shape))
    assert q.shape == x.shape and q.dtype == x.dtype
    return q


def test_every_registered_format_has_a_codec():
    canonical = {get_format(name).format_name for name in lowbit.list_formats()}
    assert canonical <= set(encodable_formats())


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bit_identity_for_every_case(case, dtype):
    _, name, params, _ = case
    for index, shape in enumerate(SHAPES):
        check(data(shape, dtype, index), name, **params)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_infinities_and_extremes(case):
    _, name, params, _ = case
    x = data((4, 40), torch.float32, 7)
    x[0, :6] = torch.tensor([math.inf, -math.inf, 3.0e38, -3.4e38, 1e-45, -2.0**-130])
    check(x, name, **params)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_nan_is_encoded_or_refused(case):
    _, name, params, _ = case
    x = data((2, 32), torch.float32, 3)
    x[1, 5] = math.nan
    if name in NAN_FORMATS:
        q = check(x, name, **params)
        assert torch.isnan(q.dequantize()[1, 5])
    else:
        with pytest.raises(FormatError, match="NaN"):
            encode(x, name, **params)


ROUNDED = [("integer", {"width": 6, "frac_width": 3}), ("affine", {"bits": 4, "block_size": [2, 8]}),
           ("q4f", {"axis": 0}), ("minifloat_ieee", {"width": 6, "exponent_width": 3}),
           ("minifloat_denorm", {"width": 7, "exponent_width": 3, "exponent_bias": 2}),
           ("e2m1", {"block_size": [1, 16], "scale_dtype": "f16"}), ("log", {"width": 5}),
           ("block_fp", {"width": 6, "block_size": [4, 4]}), ("block_log", {"width": 4, "block_size": [8]}),
           ("block_minifloat", {"width": 6, "exponent_width": 2, "block_size": [2, 8]}),
           ("mxfp6_e2m3", {"block_size": 8}), ("mxint8", {"block_size": 16, "axis": 0})]  # fmt: skip


@pytest.mark.parametrize(("name", "params"), ROUNDED, ids=[n for n, _ in ROUNDED])
@pytest.mark.parametrize("rounding", DETERMINISTIC)
def test_every_rounding_mode(name, params, rounding):
    check(data((9, 37), torch.float32, 11), name, rounding=rounding, **params)


@pytest.mark.parametrize(("name", "params"), ROUNDED, ids=[n for n, _ in ROUNDED])
def test_stochastic_rounding_with_a_seed(name, params):
    x = data((5, 48), torch.float32, 5)
    expected = lowbit.quantize(x, name, rounding="stochastic", seed=42, **params)
    assert bit_identical(encode(x, name, rounding="stochastic", seed=42, **params).dequantize(), expected)
    gen_a, gen_b = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    expected = lowbit.quantize(x, name, rounding="stochastic", generator=gen_a, **params)
    assert bit_identical(encode(x, name, rounding="stochastic", generator=gen_b, **params).dequantize(), expected)


@pytest.mark.parametrize("stochastic", [False, True])
@pytest.mark.parametrize("bipolar", [False, True])
def test_binary_variants(stochastic, bipolar):
    x = data((4, 30), torch.float32, 2)
    for params in ({}, {"scaling_factor": True}, {"scaling_factor": True, "axis": 1}):
        expected = lowbit.quantize(x, "binary", seed=1, stochastic=stochastic, bipolar=bipolar, **params)
        q = encode(x, "binary", seed=1, stochastic=stochastic, bipolar=bipolar, **params)
        assert bit_identical(q.dequantize(), expected) and q.bits == 1


def test_ternary_and_residual_variants():
    x = data((6, 20), torch.float64, 4)
    for params in ({"scaling_factor": True, "axis": 0}, {"mean": 0.3}, {"median": -0.2, "scaling_factor": True}):
        check(x, "ternary", **params)
    # A scaled block whose only large elements are infinite: alpha = 0 and -inf becomes -0.0.
    check(torch.tensor([[0.0, -math.inf, math.inf, 0.0]]), "ternary", scaling_factor=True, threshold=0.5)
    for levels in (1, 3, 5):
        assert check(x, "binary_residual", levels=levels).bits == levels
    check(x, "binary_residual", levels=2, means=[0.7, 0.2])


@pytest.mark.parametrize("scale_dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("name", ["affine", "q4s", "q8f", "e4m3", "e2m1"])
def test_scales_are_stored_in_their_scale_dtype(name, scale_dtype):
    q = check(data((8, 64), torch.float32, 1), name, block_size=[2, 32], scale_dtype=scale_dtype)
    expected = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[scale_dtype]
    assert q.params["scale"].dtype == expected
    assert q.block == (2, 32) and q.params["scale"].shape == (4, 2)


@pytest.mark.parametrize("shape", [(7, 9, 13), (5, 33), (3, 1, 2, 17)])
def test_nd_blocks_on_odd_shapes(shape):
    x = data(shape, torch.float32, 8)
    for name, params in [("affine", {"bits": 3, "block_size": [3, 4]}), ("q2f", {"block_size": [2, 2, 5]}),
                         ("e5m2", {"block_size": [4, 3], "saturate": False}), ("block_fp", {"block_size": [2, 8]}),
                         ("block_log", {"block_size": [2, 3, 4]}), ("affine", {"bits": 5, "skip_first_dim": True,
                                                                               "block_size": [1, 8]})]:  # fmt: skip
        check(x, name, **params)


def test_given_scale_per_channel():
    x = data((3, 10), torch.float32, 9)
    q = check(x, "affine", bits=8, scale=[0.1, 0.02, 0.5], zero_point=[3, -4, 0], axis=0)
    assert q.params["scale"].shape == (3, 1) and q.params["zero_point"].tolist() == [[3], [-4], [0]]
    check(x, "affine", bits=4, signed=False, scale=0.25, zero_point=7, power_of_two=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_given_scales_and_alphas_per_tensor_and_per_channel(dtype):
    """Calibrated (frozen) parameters: OCP scales, binary / ternary alphas (see lowbit.calibrate.specs)."""
    x = data((3, 10), dtype, 12) * 40  # beyond the given ranges too: saturation is encoded as well
    x[0, :3] = torch.tensor([math.inf, -math.inf, 0.0], dtype=dtype)
    scales = [0.1, 0.02, 3.0]
    for name in ("e5m2", "e4m3", "e3m2", "e2m3", "e2m1"):
        q = check(x, name, scale=scales, axis=0)
        assert q.params["scale"].shape == (3, 1) and q.params["scale"].dtype == torch.float32 and q.block == (1, 10)
        assert q.params["scale"].flatten().tolist() == torch.tensor(scales).tolist()
        check(x, name, scale=0.37, scale_dtype="bf16")
    check(x, "e4m3", scale=[0.5], axis=1, saturate=False, rounding="toward_zero")
    for params in ({"alpha": [0.5, 2.0, 1.0], "axis": 0}, {"alpha": 0.3, "bipolar": False}):
        check(x, "binary", scaling_factor=True, **params)
    for params in ({"alpha": [0.5, 2.0, 1.0], "axis": 0}, {"alpha": 0.75, "threshold": 0.2}):
        check(x, "ternary", scaling_factor=True, **params)


def test_e5m2_without_saturation_keeps_infinities():
    x = torch.tensor([1e6, -1e6, math.inf, 2.0, -0.0])
    q = check(x, "e5m2", saturate=False)
    assert q.codes.tolist()[:3] == [0x7C, 0xFC, 0x7C]
    check(torch.tensor([[1e6, 3.0, -math.inf]]), "e4m3", saturate=False, axis=0)


def test_two_complement_codes_record_negative_zeros():
    x = torch.tensor([-0.01, 0.01, -0.0, 0.0, -3.0])
    q = check(x, "integer", width=4, frac_width=1)
    assert q.zero_sign is not None and q.zero_sign.tolist() == [True, False, True, False, False]
    plain = encode(x, "integer", width=4, frac_width=1, signed_zero=False)
    assert plain.zero_sign is None
    assert torch.equal(plain.dequantize(), lowbit.quantize(x, "integer", width=4, frac_width=1))  # -0 == 0
    assert not torch.signbit(plain.dequantize()[0])
    assert encode(x, "affine", bits=4).zero_sign is None  # affine never produces -0


def test_codes_are_the_natural_integer_encodings():
    x = torch.tensor([0.5, -1.0, 1.75, -2.0])
    assert encode(x, "integer", width=4, frac_width=2).codes.tolist() == [2, -4, 7, -8]
    ref = torch.tensor([448.0, -0.001953125, 1.0, -0.0])
    assert encode(ref, "e4m3").codes.tolist() == ref.to(torch.float8_e4m3fn).view(torch.uint8).tolist()
    assert encode(torch.tensor([1.0, -0.25, 0.0]), "log", width=4).codes.tolist() == [3, 8 | 1, 0]  # bias 3
    q = encode(torch.tensor([[1.0, -0.5, 0.25, 0.0]]), "block_fp", width=4, block_size=[4])
    assert q.params["exponent"].tolist() == [[0]] and q.codes.tolist() == [[4, 8 | 2, 1, 0]]
    mx = encode(torch.tensor([6.0, -3.0, 0.5, 0.0]), "mxfp4_e2m1", block_size=4)
    assert mx.params["scale"].tolist() == [127] and mx.codes.tolist() == [0b0111, 0b1101, 0b0001, 0]


def test_unencodable_formats_and_values_raise_clear_errors():
    import dataclasses

    from lowbit.formats import FormatSpec

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Halves(FormatSpec):
        format_name = "halves_for_test"

        def _quantize(self, x, generator):
            return torch.round(x * 2) / 2

    with pytest.raises(FormatError, match="halves_for_test: no integer encoding"):
        encode(torch.ones(3), Halves())
    with pytest.raises(FormatError, match="floating-point tensor"):
        encode(torch.ones(3, dtype=torch.int32), "q8s")


# ---- property test: random float32 data, specials included, against lowbit.quantize -------------------------
from hypothesis import given
from hypothesis import strategies as st

FINITE_OR_INF = st.one_of(st.floats(width=32, allow_nan=False, allow_infinity=True),
                          st.sampled_from([0.0, -0.0, 1e-45, -2.0**-130, 3.4e38, -3.4e38]))  # fmt: skip


@given(st.sampled_from(CASES), st.lists(FINITE_OR_INF, min_size=1, max_size=48), st.sampled_from([(-1,), (2, -1)]))
def test_property_bit_identity_on_arbitrary_floats(case, values, layout):
    _, name, params, _ = case
    x = torch.tensor(values, dtype=torch.float32)
    if layout == (2, -1):
        x = torch.cat([x, x.flip(0)]).reshape(2, -1)
    check(x, name, **params)


def test_wide_integer_codes_need_float64():
    x = torch.tensor([1e30, -1e30, 0.5])
    with pytest.raises(FormatError, match="outside the 32-bit range.*use float64"):
        encode(x, "integer", width=32, frac_width=0)
    check(x.double(), "integer", width=32, frac_width=0)


@pytest.mark.parametrize("block", [[1], [1, 32, 1], [32, 1, 1]])
def test_a_stored_block_of_the_wrong_rank_fails_the_load_with_a_format_error(block):
    """A header's block has one entry per dimension of the codes; one with fewer or more entries (a damaged or
    hand-edited file) was cut silently to the codes' rank before, and must fail as a FormatError."""
    x = data((6, 64), torch.float32, seed=3)
    tensors, header = encode(x, get_format("mxfp4_e2m1")()).to_state()
    assert header["block"] == [1, 32]
    QTensor.from_state(tensors, header)  # the stored block loads
    header["block"] = block
    with pytest.raises(FormatError, match="does not fit codes of shape"):
        QTensor.from_state(tensors, header)
