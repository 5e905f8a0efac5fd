"""NVFP4 against an independent numpy + ml_dtypes oracle (over a million values: zero blocks and tensors,
saturation, blocks whose scale clamps at E4M3's smallest normal, ties of both roundings), its bits, its
storage and, where torchao installs, against torchao's own implementation."""

from __future__ import annotations

import functools
import math

import ml_dtypes
import numpy as np
import pytest
import torch

import lowbit
from helpers import assert_same

F32 = np.float32


# ---- the oracle: torchao 0.18's float32 recipe written with numpy and ml_dtypes' casts ---------------------
def oracle(x: np.ndarray) -> np.ndarray:
    """NVFP4 fake quantization of a float32 array along its last dimension (blocks of 16, tail padded)."""
    x = np.asarray(x, dtype=F32)
    finite = np.where(np.isfinite(x), np.abs(x), F32(0))
    amax = F32(finite.max()) if x.size else F32(0)
    shift = 0
    if 0 < amax < 2688 * 2.0**-126:  # lowbit's rule for tensors whose tensor scale would be subnormal
        shift = 100
        x = x * F32(2.0**100)
        finite = finite * F32(2.0**100)
        amax = F32(finite.max())
    pts = F32(amax / F32(2688)) if amax > 0 else F32(1)
    length = x.shape[-1]
    pad = (-length) % 16
    widths = [(0, 0)] * (x.ndim - 1) + [(0, pad)]
    blocks = np.pad(x, widths).reshape(*x.shape[:-1], -1, 16)
    block_amax = np.pad(finite, widths).reshape(blocks.shape).max(axis=-1)
    s8 = np.clip((block_amax / F32(6)) / pts, F32(2.0**-6), F32(448)).astype(ml_dtypes.float8_e4m3fn).astype(F32)
    r = (F32(1) / pts) / s8
    scaled = np.clip(blocks * r[..., None], F32(-6), F32(6))
    elements = scaled.astype(ml_dtypes.float4_e2m1fn).astype(F32)
    with np.errstate(over="ignore"):
        y = elements * (pts * s8)[..., None]
    if shift:
        y = (y.astype(np.float64) * 2.0**-shift).astype(F32)  # one rounding: exact in float64
    y = np.clip(y, -np.finfo(F32).max, np.finfo(F32).max)
    y = y.reshape(*x.shape[:-1], -1)[..., :length]
    return np.where(np.isnan(x), x, y)


def tie_tensor(rng: np.random.Generator) -> np.ndarray:
    """amax 2688 (pts = 1): blocks whose s8 is a power of two put x * r exactly on E2M1 midpoints, and
    blocks whose block_amax / 6 lies exactly between two E4M3 values tie the scale rounding."""
    rows = []
    midpoints = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=F32)
    for power in range(-6, 7):  # s8 = 2^power: block_amax = 6 * 2^power
        row = rng.choice(midpoints, 16) * F32(2.0**power) * rng.choice([-1, 1], 16).astype(F32)
        row[0] = 6 * 2.0**power
        rows.append(row)
    e4m3 = np.arange(0, 126, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    e4m3 = e4m3[e4m3 >= 2.0**-6]
    for low, high in zip(e4m3[:-1], e4m3[1:], strict=True):  # s8 ties: block_amax = 6 * midpoint
        row = rng.standard_normal(16).astype(F32) * F32(low)
        row[0] = F32(6 * (low + high) / 2)
        rows.append(row)
    tensor = np.concatenate(rows).reshape(-1, 16)
    tensor[0, 1] = 2688.0  # the tensor maximum
    return tensor


@functools.lru_cache(maxsize=1)
def oracle_cases() -> tuple[np.ndarray, ...]:
    """64 tensors of 16384 values (and a few odd ones): 1,048,576 + values."""
    rng = np.random.default_rng(45)
    cases = []
    for index in range(64):
        scale = F32(10.0 ** rng.uniform(-30, 30))
        x = (rng.standard_normal((128, 128)) * scale).astype(F32)
        x[rng.random(128) < 0.1, :16] = 0  # zero blocks
        x[rng.random(128) < 0.05, 16:32] *= F32(1e-6)  # blocks whose scale clamps at 2^-6
        heavy = rng.standard_t(2, (128, 128)).astype(F32) * scale  # outliers far from the rest
        x[:, 64:] = np.where(rng.random((128, 64)) < 0.5, heavy[:, 64:], x[:, 64:])
        if index % 8 == 0:
            x[3, 5], x[7, 9], x[9, 2] = np.inf, -np.inf, np.nan
        cases.append(x)
    cases.append(tie_tensor(rng))
    cases.append(np.zeros((4, 32), F32))
    cases.append(np.array([[3e38, -3.4e38, 1.0, 2e38]], F32))  # the result saturates at float32 max
    cases.append(np.array([1e-45, -3e-45, 2e-40, 0.0, 7e-38], F32))  # tiny: the 2^100 rule
    cases.append(rng.standard_normal((3, 5, 37)).astype(F32))  # a short last block
    return tuple(cases)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_the_oracle_bit_for_bit(dtype):
    total = 0
    for x in oracle_cases():
        tensor = torch.from_numpy(x).to(dtype)
        expected = torch.from_numpy(oracle(tensor.float().numpy())).to(dtype)
        assert_same(lowbit.quantize(tensor, "nvfp4"), expected)
        total += x.size
    assert total >= 1_000_000


def test_tie_tensor_has_ties_of_both_roundings():
    """The tie tensor really exercises the ties (x * r on an E2M1 midpoint, block_amax / 6 on an E4M3 one)."""
    x = tie_tensor(np.random.default_rng(0))
    r = 1.0 / np.abs(x).max(axis=1) * 6  # pts = 1: r = 1 / s8 where s8 = block_amax / 6 is on the grid
    assert np.isin(np.abs(x[:13] * r[:13, None]), [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]).sum() > 100
    assert F32(x[13, 0] / 6) not in np.arange(0, 126, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(F32)


def test_special_values():
    y = lowbit.quantize(torch.tensor([[math.nan, math.inf, -math.inf, 1.0, -0.0] + [0.0] * 11]), "nvfp4")
    assert math.isnan(y[0, 0]) and y[0, 1] == 1.0 and y[0, 2] == -1.0 and y[0, 3] == 1.0
    assert torch.signbit(y[0, 4])
    assert_same(lowbit.quantize(torch.zeros(3, 20), "nvfp4"), torch.zeros(3, 20))
    assert_same(lowbit.quantize(torch.full((2,), math.nan), "nvfp4"), torch.full((2,), math.nan))


def test_bits_per_element():
    spec = lowbit.get_format("nvfp4")()
    assert spec.bits == 4 and spec.bits_per_element() == 4.5
    assert spec.bits_per_element((64, 64)) == 4.5 + 32 / 4096
    assert spec.bits_per_element((2, 20)) == 4 + (8 * 4 + 32) / 40  # 20 = one block of 16 + one of 4


def test_gradient_is_straight_through():
    x = torch.randn(4, 32, requires_grad=True)
    lowbit.quantize(x, "nvfp4").sum().backward()
    assert_same(x.grad, torch.ones(4, 32))


def test_stored_codes_decode_bit_for_bit():
    x = torch.from_numpy(oracle_cases()[1][:, :100].copy())
    x[0, 0] = math.nan
    with pytest.raises(lowbit.FormatError, match="NaN"):
        lowbit.qtensor.encode(x, "nvfp4")
    x[0, 0] = 1.0
    for tensor in (x, torch.tensor([1e-45, 3e-45]), torch.zeros(5, 16), x.bfloat16(), torch.tensor(2.5)):
        stored = lowbit.qtensor.encode(tensor, "nvfp4")
        assert_same(stored.dequantize(), lowbit.quantize(tensor, "nvfp4"))
    stored = lowbit.qtensor.encode(torch.randn(64, 256), "nvfp4")
    assert stored.bits == 4 and stored.params["block_scale"].dtype == torch.uint8
    assert stored.nbytes == 64 * 256 // 2 + 64 * 16 + 4 + 2  # codes, E4M3 scales, tensor scale, shift


def test_against_torchao():
    """torchao's own NVFP4 (two-level scaling with its per-tensor scale) where torchao is installed."""
    nvfp4 = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")
    kernels = pytest.importorskip("torchao.prototype.mx_formats.kernels")
    x = torch.from_numpy(oracle_cases()[1])
    pts = nvfp4.per_tensor_amax_to_scale(x.abs().max())
    scales, packed = nvfp4.nvfp4_quantize(x, 16, pts)
    elements = kernels.f4_unpacked_to_f32(kernels.unpack_uint4(packed)).reshape(128, 8, 16)
    expected = (elements * (pts * scales.to(torch.float32)).reshape(128, 8, 1)).reshape(128, 128)
    assert_same(lowbit.quantize(x, "nvfp4"), expected)
