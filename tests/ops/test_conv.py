"""Integer conv2d: exact against float64 F.conv2d on the zero-point-shifted codes; both paths identical."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given
from hypothesis import strategies as st

from lowbit import FormatError
from lowbit.ops import AffineCodes, quantized_conv2d

RANGES = {torch.int8: (-128, 127), torch.uint8: (0, 255)}
from lowbit.ops import capabilities

# int_mm where its probe says it sums exactly on this CPU (oneDNN held to AVX2 saturates pairs of products)
INTEGER_PATHS = ("reference", "int_mm") if capabilities.probe("int_mm_exact") else ("reference",)


@st.composite
def conv_case(draw):
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    groups = draw(st.sampled_from([1, 2]))
    channels, outputs = groups * draw(st.integers(1, 3)), groups * draw(st.integers(1, 3))
    kernel = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    x_dtype, w_dtype = draw(st.sampled_from(list(RANGES))), draw(st.sampled_from(list(RANGES)))
    size = (draw(st.integers(1, 2)), channels, draw(st.integers(3, 7)), draw(st.integers(3, 7)))
    x = torch.randint(*RANGES[x_dtype], size, generator=generator, dtype=torch.int16).to(x_dtype)
    w = torch.randint(*RANGES[w_dtype], (outputs, channels // groups, *kernel), generator=generator, dtype=torch.int16).to(w_dtype)
    geometry = {"stride": draw(st.sampled_from([1, 2, (1, 2)])), "padding": draw(st.sampled_from([0, 1, (2, 0)])),
                "dilation": draw(st.sampled_from([1, 2])), "groups": groups}  # fmt: skip
    x_zp = draw(st.integers(*RANGES[x_dtype]))
    w_zp = torch.randint(-3, 4, (outputs,), generator=generator, dtype=torch.int32) + (128 if w_dtype == torch.uint8 else 0)
    return x, x_zp, w, w_zp, geometry, generator


@given(conv_case())
def test_sums_equal_float64_convolution(case):
    x, x_zp, w, w_zp, geometry, _ = case
    shifted_x = (x.double() - x_zp)
    shifted_w = w.double() - w_zp.double().reshape(-1, 1, 1, 1)
    try:
        expected = F.conv2d(shifted_x, shifted_w, **geometry)  # padding with 0 = padding x with its zero point
    except RuntimeError:  # the kernel does not fit the padded input: lowbit says so too
        with pytest.raises(FormatError, match="does not fit"):
            quantized_conv2d(x, 1.0, x_zp, w, 1.0, 0, **geometry)
        return
    for path in INTEGER_PATHS:
        got = quantized_conv2d(x, 1.0, x_zp, w, torch.ones(w.shape[0]), w_zp, path=path, **geometry)
        assert torch.equal(got, expected.float())


@given(conv_case(), st.booleans(), st.sampled_from([None, torch.int8, torch.uint8]), st.sampled_from([torch.int8, torch.uint8, torch.float32]))
def test_fused_variants_identical_on_both_paths(case, relu, residual_dtype, output_dtype):
    x, x_zp, w, w_zp, geometry, generator = case
    bias = torch.randn(w.shape[0], generator=generator) * 10
    assume(all(size > (k - 1) * geometry["dilation"] for size, k in zip(x.shape[2:], w.shape[2:])))
    shape = F.conv2d(torch.zeros(x.shape), torch.zeros(w.shape), **geometry).shape
    residual = None
    if residual_dtype is not None:
        residual = AffineCodes(torch.randint(*RANGES[residual_dtype], shape, generator=generator, dtype=torch.int16).to(residual_dtype), 0.3, 7)
    output = {} if output_dtype == torch.float32 else {"output_scale": 0.9, "output_zero_point": 3, "output_dtype": output_dtype}
    results = [quantized_conv2d(x, 0.05, x_zp, w, 0.02, w_zp, bias, relu=relu, residual=residual, path=path, **geometry, **output)
               for path in ("reference", "auto")]  # fmt: skip
    assert results[0].shape == shape and results[0].dtype == output_dtype
    assert torch.equal(results[0], results[1])


def test_residual_and_relu_in_real_terms():
    x = torch.full((1, 1, 2, 2), 3, dtype=torch.uint8)
    w = torch.ones(1, 1, 1, 1, dtype=torch.int8)
    residual = AffineCodes(torch.tensor([[[[-10, 0], [2, 4]]]], dtype=torch.int8), 0.5, 0)
    out = quantized_conv2d(x, 1.0, 1, w, 1.0, 0, relu=True, residual=residual)  # 2 + residual, then ReLU
    assert out.tolist() == [[[[0.0, 2.0], [3.0, 4.0]]]]


@pytest.mark.parametrize("call, message", [
    (lambda: quantized_conv2d(torch.zeros(1, 3, 4, 4, dtype=torch.int8), 1.0, 0, torch.zeros(2, 2, 1, 1, dtype=torch.int8), 1.0), "shape mismatch"),
    (lambda: quantized_conv2d(torch.zeros(3, 4, 4, dtype=torch.int8), 1.0, 0, torch.zeros(2, 3, 1, 1, dtype=torch.int8), 1.0), "needs x"),
    (lambda: quantized_conv2d(torch.zeros(1, 3, 2, 2, dtype=torch.int8), 1.0, 0, torch.zeros(2, 3, 3, 3, dtype=torch.int8), 1.0), "does not fit"),
    (lambda: quantized_conv2d(torch.zeros(1, 3, 4, 4, dtype=torch.int8), 1.0, 0, torch.zeros(2, 3, 1, 1, dtype=torch.int8), 1.0, stride=(1,)), "stride"),
    (lambda: quantized_conv2d(torch.zeros(1, 4, 4, 4, dtype=torch.int8), 1.0, 0, torch.zeros(2, 2, 1, 1, dtype=torch.int8), 1.0, groups=0), "groups"),
])  # fmt: skip
def test_bad_input_raises_format_error(call, message):
    with pytest.raises(FormatError, match=message):
        call()
