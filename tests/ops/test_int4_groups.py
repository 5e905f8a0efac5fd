"""int4 group ranges (lowbit.ops.int4.quantize_groups) against a per-group reference written out plainly: the
min-max range widened to include 0, then with the search every (low, high) shrunk by 5 % steps to 70 %, the
first pair in order (low's factor outer) with the least (importance-weighted) squared error kept."""

from __future__ import annotations

import pytest
import torch

from lowbit.ops.int4 import SHRINK_STEPS, quantize_groups


def reference_group(values: torch.Tensor, weights: torch.Tensor, scale_dtype: torch.dtype, search: bool):
    """(codes, scale, zero point) of one group [g], float32 arithmetic as the int4 format defines it."""
    low0, high0 = min(float(values.min()), 0.0), max(float(values.max()), 0.0)
    best = None
    for low_factor in SHRINK_STEPS if search else (1.0,):
        for high_factor in SHRINK_STEPS if search else (1.0,):
            low = torch.tensor(low0, dtype=torch.float32) * low_factor
            high = torch.tensor(high0, dtype=torch.float32) * high_factor
            scale = torch.clamp((high - low) * (1.0 / 15), min=torch.finfo(torch.float32).tiny)
            scale = scale.to(scale_dtype).float()
            scale = scale if float(scale) > 0 else torch.tensor(1.0)
            inverse = 1.0 / scale
            zero_point = torch.clamp(-torch.round(low * inverse), 0, 15)
            codes = torch.clamp(torch.round(values * inverse) + zero_point, 0, 15)
            error = float((((codes - zero_point) * scale - values).square() * weights).sum())
            if best is None or error < best[0]:
                best = (error, codes, scale, zero_point)
    return best[1:]


@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("search", [True, False])
@pytest.mark.parametrize("weighted", [True, False])
def test_quantize_groups_matches_the_per_group_reference(scale_dtype, search, weighted):
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(4, 32, generator=generator) * torch.logspace(-6, 2, 4).unsqueeze(1)
    weight[0, :8] = 0.0  # an all-zero group
    weight[1, 8:16] = weight[1, 8:16].abs()  # a group with no negatives: low stays 0
    weight[2] = weight[2].round()
    importance = torch.rand(32, generator=generator) if weighted else None
    if weighted:
        importance[:8] = 0.0  # every pair's error 0 in the first groups: the first pair, the whole range, wins
    codes, scale, zero_point = quantize_groups(weight, 8, scale_dtype, search, importance)
    assert codes.dtype == zero_point.dtype == torch.uint8 and scale.dtype == scale_dtype
    for row in range(4):
        for group in range(4):
            columns = slice(8 * group, 8 * group + 8)
            weights = torch.ones(8) if importance is None else importance[columns]
            want = reference_group(weight[row, columns], weights, scale_dtype, search)
            assert torch.equal(codes[row, columns].float(), want[0]), (row, group)
            assert float(scale[row, group].float()) == float(want[1]), (row, group)
            assert float(zero_point[row, group]) == float(want[2]), (row, group)
