"""Integer linear / matmul / concat: the int_mm fast path equals the int64 reference exactly, the reference
equals numpy's int64 matmul, and requantization equals exact rational arithmetic (dyadic scales)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lowbit import FormatError
from lowbit.ops import AffineCodes, quantized_concat, quantized_linear, quantized_matmul
from lowbit.ops.integer import accumulate

DTYPES = st.sampled_from([torch.int8, torch.uint8])
RANGES = {torch.int8: (-128, 127), torch.uint8: (0, 255)}
from lowbit.ops import capabilities

# int_mm where its probe says it sums exactly on this CPU (oneDNN held to AVX2 saturates pairs of products)
INTEGER_PATHS = ("reference", "int_mm") if capabilities.probe("int_mm_exact") else ("reference",)


def _codes(generator, shape, dtype):
    low, high = RANGES[dtype]
    return torch.randint(low, high + 1, shape, generator=generator, dtype=torch.int16).to(dtype)


def _zero_point(draw, dtype, size=None):
    low, high = RANGES[dtype]
    if size is None:
        return draw(st.integers(low, high))
    return torch.tensor(draw(st.lists(st.integers(low, high), min_size=size, max_size=size)), dtype=torch.int32)


@st.composite
def linear_case(draw):
    seed = draw(st.integers(0, 2**31 - 1))
    m, k, n = draw(st.integers(1, 20)), draw(st.integers(1, 70)), draw(st.integers(1, 12))
    x_dtype, w_dtype = draw(DTYPES), draw(DTYPES)
    generator = torch.Generator().manual_seed(seed)
    x, w = _codes(generator, (m, k), x_dtype), _codes(generator, (n, k), w_dtype)
    per_channel = draw(st.booleans())
    w_zp = _zero_point(draw, w_dtype, n if per_channel else None)
    return x, _zero_point(draw, x_dtype), w, w_zp, generator


@given(linear_case())
def test_accumulator_paths_agree_with_numpy(case):
    x, x_zp, w, w_zp, _ = case
    w_zp_tensor = torch.as_tensor(w_zp, dtype=torch.int32)
    expected = (x.numpy().astype(np.int64) - x_zp) @ (w.numpy().astype(np.int64) - w_zp_tensor.numpy().reshape(-1, 1)).T
    for path in INTEGER_PATHS:
        got = accumulate(x, torch.tensor(x_zp), w, w_zp_tensor, path)
        assert got.dtype == torch.int64 and np.array_equal(got.numpy(), expected)


@given(linear_case(), st.booleans(), st.sampled_from([None, "float", "int32"]), st.sampled_from([None, torch.int8, torch.uint8]),
       st.sampled_from([torch.int8, torch.uint8, torch.float32]))  # fmt: skip
def test_fused_variants_identical_on_both_paths(case, relu, bias_kind, residual_dtype, output_dtype):
    x, x_zp, w, w_zp, generator = case
    n = w.shape[0]
    scale_x, scale_w = 0.02, torch.rand(n, generator=generator) * 0.01 + 1e-3
    bias = {None: None, "float": torch.randn(n, generator=generator),
            "int32": torch.randint(-5000, 5000, (n,), generator=generator, dtype=torch.int32)}[bias_kind]  # fmt: skip
    residual = None
    if residual_dtype is not None:
        residual = AffineCodes(_codes(generator, (x.shape[0], n), residual_dtype), 0.05, 3 if residual_dtype == torch.int8 else 130)
    output = {} if output_dtype == torch.float32 else {"output_scale": 0.07, "output_zero_point": 5, "output_dtype": output_dtype}
    results = [quantized_linear(x, scale_x, x_zp, w, scale_w, w_zp, bias, relu=relu, residual=residual, path=path, **output)
               for path in ("reference", "auto")]  # fmt: skip
    assert results[0].dtype == output_dtype and torch.equal(results[0], results[1])
    if relu and output_dtype != torch.float32:
        assert int(results[0].min()) >= 5  # ReLU: nothing below the output zero point


def _exact(acc: int, real_scale: Fraction, residual_real: Fraction, relu: bool, out_scale: Fraction, out_zp: int, qrange):
    real = acc * real_scale + residual_real
    if relu:
        real = max(real, Fraction(0))
    ratio = real / out_scale
    low = ratio.numerator // ratio.denominator
    rounded = low + 1 if ratio - low > Fraction(1, 2) or (ratio - low == Fraction(1, 2) and low % 2) else low
    return min(max(rounded + out_zp, qrange[0]), qrange[1])


@given(st.integers(0, 2**31 - 1), st.integers(1, 8), st.integers(-4, 4), st.booleans(), DTYPES)
def test_requantization_equals_exact_rationals(seed, k, shift, relu, output_dtype):
    generator = torch.Generator().manual_seed(seed)
    x, w = _codes(generator, (3, k), torch.uint8), _codes(generator, (2, k), torch.int8)
    scales = {"x": 2.0**-5, "w": torch.tensor([3 * 2.0**-7, 2.0**-6]), "out": 5 * 2.0**shift, "res": 2.0**-3}
    residual = AffineCodes(_codes(generator, (3, 2), torch.int8), scales["res"], -3)
    bias = torch.tensor([17, -400], dtype=torch.int32)
    got = quantized_linear(x, scales["x"], 100, w, scales["w"], 0, bias, relu=relu, residual=residual,
                           output_scale=scales["out"], output_zero_point=10, output_dtype=output_dtype)  # fmt: skip
    for m in range(3):
        for n in range(2):
            acc = sum((int(x[m, j]) - 100) * int(w[n, j]) for j in range(k)) + int(bias[n])
            real_scale = Fraction(scales["x"]) * Fraction(float(scales["w"][n]))
            residual_real = (int(residual.codes[m, n]) + 3) * Fraction(scales["res"])
            expected = _exact(acc, real_scale, residual_real, relu, Fraction(scales["out"]), 10, RANGES[output_dtype])
            assert int(got[m, n]) == expected


def test_float_output_and_matmul_and_batch_dims():
    generator = torch.Generator().manual_seed(0)
    a, b = _codes(generator, (2, 5, 16), torch.int8), _codes(generator, (16, 3), torch.int8)
    got = quantized_matmul(a, 0.5, 1, b, torch.tensor([0.25, 0.5, 1.0]), 0)
    expected = ((a.double() - 1) @ b.double()) * torch.tensor([0.125, 0.25, 0.5], dtype=torch.float64)
    assert got.shape == (2, 5, 3) and torch.equal(got, expected.float())


def test_concat_rescales_and_copies_exactly():
    first = AffineCodes(torch.tensor([[-128, 0, 1, 127]], dtype=torch.int8), 0.5, 0)
    second = AffineCodes(torch.tensor([[0, 11, 13, 255]], dtype=torch.uint8), 0.25, 10)
    out = quantized_concat([first, second], 0.5, 0, dim=0)
    assert out.dtype == torch.int8
    assert out[0].tolist() == [-128, 0, 1, 127]  # same parameters: copied
    assert out[1].tolist() == [-5, 0, 2, 122]  # (q - 10) * 0.25 / 0.5: -5, 0.5 -> 0, 1.5 -> 2, 122.5 -> 122
    unsigned = quantized_concat([first], 1.0, 128, dim=1, output_dtype=torch.uint8)
    assert unsigned.tolist() == [[64, 128, 128, 192]]  # -64, 0, 0.5 -> 0, 63.5 -> 64; plus 128


@pytest.mark.parametrize("call, message", [
    (lambda: quantized_linear(torch.zeros(2, 4, dtype=torch.int8), 1.0, 0, torch.zeros(3, 5, dtype=torch.int8), 1.0), "shape mismatch"),
    (lambda: quantized_linear(torch.zeros(2, 4), 1.0, 0, torch.zeros(3, 4, dtype=torch.int8), 1.0), "integer codes"),
    (lambda: quantized_linear(torch.zeros(2, 4, dtype=torch.int8), float("nan"), 0, torch.zeros(3, 4, dtype=torch.int8), 1.0), "finite"),
    (lambda: quantized_linear(torch.zeros(2, 4, dtype=torch.int8), 1.0, 0, torch.zeros(3, 4, dtype=torch.int8), torch.ones(2)), "do not match"),
    (lambda: quantized_linear(torch.zeros(2, 4, dtype=torch.uint8), 1.0, -1, torch.zeros(3, 4, dtype=torch.int8), 1.0), "zero_point"),
    (lambda: quantized_linear(torch.zeros(2, 4, dtype=torch.int8), 1.0, 0, torch.zeros(3, 4, dtype=torch.int8), 1.0,
                              output_dtype=torch.int8), "output_scale"),
    (lambda: quantized_linear(torch.zeros(2, 4, dtype=torch.int8), 1.0, 0, torch.zeros(3, 4, dtype=torch.int8), 1.0,
                              residual=(torch.zeros(2, 2, dtype=torch.int8), 1.0)), "residual"),
    (lambda: quantized_linear(torch.zeros(2, 4, dtype=torch.int8), 1.0, 0, torch.zeros(3, 4, dtype=torch.int8), 1.0,
                              bias=torch.ones(2)), "bias"),
    (lambda: quantized_linear(torch.zeros(2, 4, dtype=torch.int8), 1.0, 0, torch.zeros(3, 4, dtype=torch.int8), 1.0,
                              path="gpu"), "path"),
    (lambda: quantized_concat([], 1.0), "non-empty"),
    (lambda: quantized_concat([AffineCodes(torch.zeros(2, dtype=torch.int8), 1.0), AffineCodes(torch.zeros(2, 2, dtype=torch.int8), 1.0)], 1.0), "concatenate"),
])  # fmt: skip
def test_bad_input_raises_format_error(call, message):
    with pytest.raises(FormatError, match=message):
        call()
