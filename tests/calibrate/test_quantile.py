"""QuantileSketch against numpy's exact quantiles within the stated bound; bounded memory; merging; state.
DyadicHistogram against a direct histogram of all the data; kl_divergences against a plain loop."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import load, save

from lowbit.calibrate import DyadicHistogram, GroupedQuantileSketch, QuantileSketch
from lowbit.calibrate.histogram import kl_divergences
from lowbit.calibrate.quantile import SMALLEST_NORMAL
from lowbit.errors import ConfigError

QUANTILES = [0.001, 0.5, 0.975, 0.9999]
DISTRIBUTIONS = {
    "normal": lambda rng, n: rng.standard_normal(n),
    "lognormal": lambda rng, n: rng.lognormal(0.0, 2.0, n),
    "uniform": lambda rng, n: rng.uniform(-3.0, 5.0, n),
}


def stated_bound(sorted_or_partitioned: np.ndarray, q: float, relative_error: float) -> float:
    """a * max(|x_(k)|, |x_(k+1)|) + 2^-126 with k = floor(q (n - 1)): the bound the docstring states."""
    n = sorted_or_partitioned.size
    k = math.floor(q * (n - 1))
    neighbours = sorted_or_partitioned[[k, min(k + 1, n - 1)]]
    return relative_error * float(np.abs(neighbours).max()) + SMALLEST_NORMAL


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_ten_million_values_within_the_stated_bound(name):
    rng = np.random.default_rng(7)
    values = DISTRIBUTIONS[name](rng, 10_000_000)
    sketch = QuantileSketch(relative_error=0.01)
    for batch in np.array_split(values, 4):
        sketch.update(torch.from_numpy(batch))
    n = values.size
    ranks = sorted({r for q in QUANTILES for r in (math.floor(q * (n - 1)), math.floor(q * (n - 1)) + 1)})
    partitioned = np.partition(values, ranks)  # the order statistics np.quantile interpolates between
    exact = np.quantile(values, QUANTILES)
    estimates = sketch.quantile(QUANTILES)
    for q, truth, estimate in zip(QUANTILES, exact, estimates):
        bound = stated_bound(partitioned, q, 0.01)
        assert abs(estimate - truth) <= bound * (1 + 1e-9), (name, q, estimate, truth, bound)
        assert bound <= sketch.error_bound(q) * (1 + 1e-9)
    assert sketch.count == n and sketch.min == values.min() and sketch.max == values.max()
    assert sketch.quantile(0.0) == values.min() and sketch.quantile(1.0) == values.max()
    # Memory: a window of keys per sign, set by the data's range of magnitudes (~1e-7 .. 1e5 here, about
    # 1,200 keys per sign at 1 %), never more than the float32 range allows, whatever the count.
    assert sketch.num_buckets <= 3000 < 2 * sketch.max_key + 1


def test_bucket_bound_is_documented_number():
    """2 * max_key + 1 = 17,607 counts for relative_error 0.01 (docs/calibration.md states it)."""
    assert 2 * QuantileSketch(0.01).max_key + 1 == 17_607


def test_memory_does_not_grow_with_count():
    sketch = QuantileSketch(0.02)
    generator = torch.Generator().manual_seed(3)
    sketch.update(torch.rand(1000, generator=generator) * 10 + 1)
    buckets = sketch.num_buckets
    for _ in range(20):
        sketch.update(torch.rand(200_000, generator=generator) * 10 + 1)  # same range: same window
    assert sketch.num_buckets <= buckets + 2 and sketch.count == 4_001_000


floats = st.floats(width=32, allow_nan=False, allow_infinity=False, allow_subnormal=True)


@given(st.lists(floats, min_size=1, max_size=60), st.floats(0.0, 1.0), st.sampled_from([1e-4, 0.01, 0.1, 0.5]))
def test_property_bound_holds_for_any_data(data, q, relative_error):
    values = np.array(data, dtype=np.float64)
    sketch = QuantileSketch(relative_error)
    sketch.update(torch.from_numpy(values))
    bound = stated_bound(np.sort(values), q, relative_error)
    assert abs(sketch.quantile(q) - np.quantile(values, q)) <= bound * (1 + 1e-9)
    assert bound <= sketch.error_bound(q) * (1 + 1e-9)


@given(st.floats(1e-37, 1e37), st.sampled_from([1e-4, 0.003, 0.05, 0.5]))
def test_property_representative_is_within_relative_error(value, relative_error):
    sketch = QuantileSketch(relative_error)
    key = sketch._keys(torch.tensor([value], dtype=torch.float64))
    representatives = sketch._representatives(torch.cat([key, -key]))  # negative keys: negative values
    assert torch.all((representatives - torch.tensor([value, -value])).abs() <= relative_error * value)


def test_merge_equals_one_sketch_of_everything():
    generator = torch.Generator().manual_seed(4)
    first, second = torch.randn(5000, generator=generator), torch.randn(3000, generator=generator) * 100
    whole, left, right = QuantileSketch(0.01), QuantileSketch(0.01), QuantileSketch(0.01)
    whole.update(torch.cat([first, second]))
    left.update(first)
    right.update(second)
    left.merge(right)
    for key, value in whole.state_dict().items():
        assert torch.equal(left.state_dict()[key], value), key
    assert left.quantile(QUANTILES) == whole.quantile(QUANTILES)
    with pytest.raises(ConfigError, match="merge"):
        left.merge(QuantileSketch(0.02))


def test_special_values_and_errors():
    sketch = QuantileSketch()
    with pytest.raises(ConfigError, match="no finite"):
        sketch.quantile(0.5)
    sketch.update(torch.tensor([math.nan, math.inf, -math.inf]))
    assert sketch.count == 0 and sketch.nonfinite == 3
    sketch.update(torch.tensor([0.0, 0.0, -0.0, 1e-40, 2.0]))
    assert sketch.quantile(0.5) == 0.0 and sketch.quantile(1.0) == 2.0 and sketch.count == 5
    sketch.update(torch.empty(0))
    assert sketch.count == 5
    with pytest.raises(ConfigError, match="q="):
        sketch.quantile(1.5)
    with pytest.raises(ConfigError, match="float32 range"):
        sketch.update(torch.tensor([1e300], dtype=torch.float64))
    with pytest.raises(ConfigError, match="relative_error"):
        QuantileSketch(0.0)


def test_state_round_trips_through_safetensors_and_json():
    sketch = QuantileSketch(0.01)
    sketch.update(torch.randn(10_000, generator=torch.Generator().manual_seed(5)))
    restored = QuantileSketch(0.01)
    restored.load_state_dict(load(save(sketch.state_dict())))
    assert restored.quantile(QUANTILES) == sketch.quantile(QUANTILES)
    from_json = QuantileSketch(0.01)
    from_json.load_state_dict(json.loads(json.dumps({k: v.tolist() for k, v in sketch.state_dict().items()})))
    assert from_json.quantile(QUANTILES) == sketch.quantile(QUANTILES)


def test_grouped_sketch_matches_one_sketch_per_group():
    values = torch.randn(3, 2000, generator=torch.Generator().manual_seed(6)) * torch.tensor([[1.0], [10.0], [0.1]])
    grouped = GroupedQuantileSketch(0.01, groups=3)
    grouped.update_groups(values)
    for row in range(3):
        single = QuantileSketch(0.01)
        single.update(values[row])
        assert grouped.quantile_per_group(0.9)[row].item() == single.quantile(0.9)


def test_dyadic_histogram_equals_a_direct_histogram_after_growth():
    """Rebinning by doubling is exact: the result equals binning all the data at the final width."""
    generator = torch.Generator().manual_seed(8)
    batches = [torch.randn(2, 500, generator=generator) * scale for scale in (1e-3, 1.0, 50.0, 3.0)]
    batches[1][0, :7] = math.nan
    histogram = DyadicHistogram(bins=64, groups=2)
    for batch in batches:
        histogram.update_groups(batch)
    everything = torch.cat(batches, 1).double()
    width = histogram.bin_width()
    assert torch.all(torch.frexp(width).mantissa == 0.5)  # powers of two
    for row in range(2):
        finite = everything[row][torch.isfinite(everything[row])]
        index = torch.floor(finite / width[row]).long() - histogram.low_index[row]
        assert torch.equal(torch.bincount(index, minlength=64), histogram.counts[row])
        assert histogram.low_index[row] <= 0 <= histogram.high_index[row]
        assert histogram.high_index[row] - histogram.low_index[row] + 1 > 32  # more than bins / 2 in use


def brute_force_divergence(histogram: np.ndarray, cut: int, levels: int) -> float:
    """The documented KL, written as plain loops over bins."""
    if histogram[:cut].sum() == 0:
        return math.inf  # Q has no mass at all
    p = histogram[:cut].astype(float)
    p[cut - 1] += histogram[cut:].sum()
    q = np.zeros(cut)
    for level in range(levels):
        start, end = level * cut // levels, (level + 1) * cut // levels
        support = [b for b in range(start, end) if p[b] > 0]
        for b in support:
            q[b] = histogram[start:end].sum() / len(support)
    p, q = p / p.sum(), q / histogram[:cut].sum()
    total = 0.0
    for pb, qb in zip(p, q):
        if pb > 0:
            total += math.inf if qb == 0 else pb * math.log(pb / qb)
    return total


@given(st.lists(st.integers(0, 30), min_size=4, max_size=24), st.integers(1, 4))
def test_property_kl_divergences_match_brute_force(counts, levels):
    histogram = np.array(counts)
    if histogram.sum() == 0 or histogram.size < levels:
        return
    found = kl_divergences(torch.tensor([counts]), levels)[0]
    for column, cut in enumerate(range(levels, histogram.size + 1)):
        expected = brute_force_divergence(histogram, cut, levels)
        if math.isinf(expected):
            assert math.isinf(found[column].item())
        else:
            assert found[column].item() == pytest.approx(expected, abs=1e-9)
