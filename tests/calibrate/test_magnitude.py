"""MagnitudeObserver: exact means against float64 numpy, the histogram-based mean above a threshold within
its stated error, granularity, non-finite input and state round trips."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from safetensors.torch import load, save

from lowbit.calibrate import MagnitudeObserver
from lowbit.errors import ConfigError


def batches(seed: int, shape=(32, 24), count: int = 6) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator) * (index + 1) + 0.2 * index for index in range(count)]


def observe(observer: MagnitudeObserver, data) -> MagnitudeObserver:
    for batch in data:
        observer.update(batch)
    return observer


def test_means_are_exact_per_tensor_and_per_channel():
    data = batches(0)
    values = np.concatenate([b.numpy() for b in data]).astype(np.float64)  # [192, 24]
    whole = observe(MagnitudeObserver(), data)
    columns = observe(MagnitudeObserver(axis=1), data)
    assert whole.mean_abs().shape == () and columns.mean_abs().shape == (24,)
    assert whole.mean_abs().item() == np.float32(np.abs(values).mean())
    assert np.array_equal(columns.mean_abs().numpy(), np.abs(values).mean(0).astype(np.float32))
    positive = np.where(values > 0, values, 0).sum(0) / (values > 0).sum(0)
    assert np.array_equal(columns.mean_positive().numpy(), positive.astype(np.float32))
    low, high = columns.min_max()
    assert np.array_equal(low.numpy(), values.min(0).astype(np.float32))
    assert np.array_equal(high.numpy(), values.max(0).astype(np.float32))


@pytest.mark.parametrize("distribution", ["normal", "laplace"])
def test_mean_above_a_threshold_within_its_stated_error(distribution):
    generator = torch.Generator().manual_seed(1)
    if distribution == "normal":
        data = [torch.randn(100, 100, generator=generator) for _ in range(10)]
    else:  # Laplace by inverse CDF: heavier tails than the TWN paper's Gaussian
        data = [-torch.sign(u) * torch.log1p(-2 * u.abs()) for u in
                (torch.rand(100, 100, generator=generator) - 0.5 for _ in range(10))]  # fmt: skip
    observer = observe(MagnitudeObserver(), data)
    magnitudes = torch.cat([b.reshape(-1) for b in data]).double().abs()
    delta = 0.75 * observer.mean_abs()  # TWN's threshold
    exact = magnitudes[magnitudes > float(delta)].mean()
    estimate = observer.mean_abs_above(delta).double()
    assert abs(estimate - exact) / exact <= 3e-4, (float(estimate), float(exact))
    assert observer.mean_abs_above(0.0).item() == np.float32(magnitudes.mean().item())  # exact at 0
    assert observer.mean_abs_above(1e6).item() == 0.0  # nothing above


def test_per_block_shape_nonfinite_and_empty():
    observer = MagnitudeObserver(block_size=(2, 4))
    x = torch.arange(32.0).reshape(4, 8) - 10
    x[0, 0], x[3, 7] = math.nan, math.inf
    observer.update(x)
    observer.update(torch.empty(0, 8))
    assert observer.mean_abs().shape == (2, 2) and observer.nonfinite_count == 2
    first = x[:2, :4].reshape(-1)[1:]  # the NaN is not counted
    assert observer.mean_abs()[0, 0].item() == pytest.approx(first.abs().mean().item())
    with pytest.raises(ConfigError, match="seen no data"):
        MagnitudeObserver().mean_abs()
    with pytest.raises(ConfigError, match="bins=4 is invalid"):
        MagnitudeObserver(bins=4)


def test_state_round_trip_continues_exactly():
    data = batches(2)
    whole = observe(MagnitudeObserver(axis=0), data)
    resumed = MagnitudeObserver(axis=0)
    resumed.load_state_dict(load(save(observe(MagnitudeObserver(axis=0), data[:3]).state_dict())))
    observe(resumed, data[3:])
    for method in ("mean_abs", "mean_positive"):
        assert torch.equal(getattr(resumed, method)(), getattr(whole, method)())
    assert torch.equal(resumed.mean_abs_above(1.0), whole.mean_abs_above(1.0))
    assert torch.equal(resumed.min_max().max, whole.min_max().max)
