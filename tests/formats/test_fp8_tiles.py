"""FP8 (e4m3) with DeepSeek-V3's 128 x 128 weight tiles: ``scale_rule="amax"``, s = float32(amax / 448) per
tile, against a numpy + ml_dtypes oracle on over a million values; the covering rule stays the default."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

import lowbit
from lowbit import FormatError
from helpers import assert_same


# ---- issue 45: FP8 128 x 128 tiles with DeepSeek-V3's scale, float32(amax / 448) ---------------------------
def tile_oracle(w: np.ndarray, tile: int = 128) -> np.ndarray:
    """numpy + ml_dtypes: per tile s = float32(amax / 448) (smallest normal float32 for an all-zero or tiny
    tile), y = e4m3(clip(x / s, -448, 448)) * s; NaN stays, edge tiles partial."""
    out = np.empty_like(w)
    for row in range(0, w.shape[0], tile):
        for col in range(0, w.shape[1], tile):
            x = w[row : row + tile, col : col + tile]
            finite = np.abs(x[np.isfinite(x)])
            amax = np.float32(finite.max()) if finite.size else np.float32(0)
            s = max(np.float32(amax / np.float32(448)), np.finfo(np.float32).tiny)
            with np.errstate(invalid="ignore"):
                e = np.clip(x / s, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
            out[row : row + tile, col : col + tile] = np.where(np.isnan(x), x, e * s)
    return out


def tile_cases() -> np.ndarray:
    """1000 x 1050 float32 (1,050,000 values, partial edge tiles): Gaussian tiles of many scales, all-zero
    tiles, tiles with outliers, +-inf / NaN, tiny tiles (subnormal amax / 448) and x / s exactly on E4M3 ties."""
    rng = np.random.default_rng(45)
    w = rng.standard_normal((1000, 1050)).astype(np.float32)
    w *= np.float32(10.0) ** rng.integers(-30, 30, (8, 9)).repeat(128, 0)[:1000].repeat(128, 1)[:, :1050]
    w[:128, 128:256] = 0  # an all-zero tile
    w[128:256, :128] = (w[128:256, :128] * np.float32(1e-38)).astype(np.float32)  # subnormal scale
    w[256:384, 256:384] *= (rng.random((128, 128)) < 0.01) * 1000 + 1  # outliers
    w[5, 7], w[9, 300], w[600, 1000] = np.inf, -np.inf, np.nan
    ties = rng.integers(-447 * 16, 447 * 16, (128, 128)).astype(np.float32) / 16  # many x / s on E4M3 midpoints
    ties[0, 0] = 448.0  # s = 1
    w[384:512, 384:512] = ties
    return w


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tile_amax_scale_matches_the_oracle_on_a_million_values(dtype):
    x = torch.from_numpy(tile_cases()).to(dtype)
    expected = torch.from_numpy(tile_oracle(x.float().numpy())).to(dtype)
    got = lowbit.quantize(x, "e4m3", block_size=[128, 128], scale_rule="amax")
    assert_same(got, expected)
    assert x.numel() >= 1_000_000


def test_tile_scale_rules_differ_and_default_covers():
    x = torch.from_numpy(tile_cases()[:512, :512].copy())
    spec = lowbit.get_format("e4m3")(block_size=[128, 128], scale_rule="amax")
    amax_scales, covering = spec.scales(x), lowbit.get_format("e4m3")(block_size=[128, 128]).scales(x)
    assert amax_scales.shape == (4, 4) and amax_scales[0, 1] == torch.finfo(torch.float32).tiny  # zero tile
    tile_max = x.abs().nan_to_num(0, 0, 0).reshape(4, 128, 4, 128).amax((1, 3))
    assert ((covering * 448 >= tile_max) | (tile_max == 0)).all()  # the default never clamps the maximum
    assert_same(amax_scales[tile_max > 1e-30], (tile_max / 448)[tile_max > 1e-30])
    assert lowbit.get_format("e4m3")(block_size=[128, 128]).scale_rule == "covering"


def test_scale_rule_needs_derived_scales():
    with pytest.raises(FormatError, match="scale_rule"):
        lowbit.get_format("e4m3")(scale_rule="amax")
    with pytest.raises(FormatError, match="scale_rule"):
        lowbit.get_format("e4m3")(scale=0.5, scale_rule="amax")
    with pytest.raises(FormatError, match="scale_rule"):
        lowbit.get_format("e4m3")(block_size=[1, 32], scale_rule="nearest")


def test_tile_amax_stored_codes_decode_bit_for_bit():
    x = torch.from_numpy(tile_cases()[:200, :150].copy())
    x[x.isnan()] = 0
    x = x.clamp(-3e38, 3e38)
    stored = lowbit.qtensor.encode(x, "e4m3", block_size=[128, 128], scale_rule="amax")
    assert_same(stored.dequantize(), lowbit.quantize(x, "e4m3", block_size=[128, 128], scale_rule="amax"))
    assert stored.params["scale"].shape == (2, 2) and stored.params["scale"].dtype == torch.float32
