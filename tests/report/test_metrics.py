"""The report's metric functions on hand-made tensors (every expected value worked out in the test)."""

from __future__ import annotations

import math

import pytest
import torch

import lowbit
from lowbit.formats import resolve
from lowbit.report.metrics import ErrorSums, clamped_count, storage_bits_per_element, storage_bytes
from lowbit.report import relative_error, sqnr_db


def test_sqnr_and_relative_error_by_hand():
    f = torch.tensor([3.0, 4.0])
    q = torch.tensor([3.0, 4.5])  # signal 25, noise 0.25
    assert sqnr_db(f, q) == pytest.approx(20.0, rel=1e-12)
    assert relative_error(f, q) == pytest.approx(0.1, rel=1e-12)
    assert sqnr_db(f, f) == math.inf and relative_error(f, f) == 0.0


def test_error_sums_leave_out_and_count_non_finite_values():
    sums = ErrorSums()
    sums.add(torch.tensor([3.0, 4.0, 1.0, float("nan")]), torch.tensor([3.0, 4.5, float("nan"), 2.0]))
    assert (sums.elements, sums.nonfinite, sums.float_nonfinite) == (2, 1, 1)
    assert sums.sqnr_db == pytest.approx(20.0, rel=1e-12)


def test_bits_per_element_include_scales_and_zero_points():
    per_channel = resolve("affine", bits=4, symmetric=True, axis=0)
    assert storage_bits_per_element(per_channel, (10, 20)) == 4 + 32 * 10 / 200
    asymmetric_blocks = resolve("affine", bits=4, block_size=[1, 8], scale_dtype="bf16")
    assert storage_bits_per_element(asymmetric_blocks, (10, 20)) == 4 + (16 + 4) * 10 * 3 / 200  # 20 -> 3 blocks
    static = resolve("affine", bits=8, scale=[0.1, 0.2], zero_point=[3, -1], axis=0)
    assert storage_bits_per_element(static, (2, 50)) == 8 + (2 * 32 + 2 * 8) / 100
    assert storage_bits_per_element(resolve("mxfp4_e2m1"), (4, 64)) == 4 + 8 / 32
    assert storage_bits_per_element(None, (3,)) == 32.0 and storage_bits_per_element(None, (3,), 16) == 16.0
    assert storage_bytes(4.25, 64) == 34 and storage_bytes(4.0, 3) == 2  # 12 bits -> 2 bytes


def test_clamped_count_on_a_fixed_grid():
    spec = resolve("integer", width=4, frac_width=1)  # [-4, 3.5], steps of 0.5
    x = torch.tensor([-4.3, -4.2, 3.7, 3.8, 0.0, float("inf"), float("nan")])
    assert clamped_count(spec, x) == 2  # -4.3 and 3.8: more than a quarter beyond; inf / NaN are not counted


def test_clamped_count_with_given_per_channel_scales():
    spec = resolve("affine", bits=4, symmetric=True, scale=[1.0, 0.1], axis=0)  # [-8, 7] and [-0.8, 0.7]
    x = torch.tensor([[7.4, -8.4], [0.76, -0.86]])
    assert clamped_count(spec, x) == 2  # 0.76 > 0.75 and -0.86 < -0.85; row 0 is within half a step


def test_min_max_scales_do_not_clamp():
    x = torch.tensor([0.0, 0.25, 0.5, 1.0, 1.0])
    for spec in (resolve("affine", bits=8), resolve("affine", bits=4, symmetric=True)):
        assert clamped_count(spec, x) == 0
    assert lowbit.quantize(x, "affine", bits=8).max() < 1.0  # the top code sits a hair below 1
