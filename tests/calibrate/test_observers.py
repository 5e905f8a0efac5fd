"""Observers against torch.ao's observers on the same data, against plain loops per block, and against
brute-force searches; non-finite rules, empty input, state round trips."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from safetensors.torch import load, save
from test_quantile import brute_force_divergence
from torch.ao.quantization import observer as torch_observers

from lowbit.calibrate import (
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MSEObserver,
    PercentileObserver,
    scale_zero_point,
)
from lowbit.errors import ConfigError

SCHEMES = {
    (False, False): torch.per_tensor_affine, (False, True): torch.per_tensor_symmetric,
    (True, False): torch.per_channel_affine, (True, True): torch.per_channel_symmetric,
}  # fmt: skip


def batches(seed: int, shape=(6, 5, 7), count: int = 5) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator) * (index + 1) + index * 0.3 for index in range(count)]


def reference_fake_quantize(x, scale: float, zero_point: int, q_min: int, q_max: int) -> np.ndarray:
    codes = np.clip(np.round(np.asarray(x, dtype=np.float64) / scale) + zero_point, q_min, q_max)
    return (codes - zero_point) * scale


def observe(observer, data):
    for batch in data:
        observer(batch)
    return observer


@pytest.mark.parametrize("moving", [False, True])
@pytest.mark.parametrize("dtype", [torch.qint8, torch.quint8])
@pytest.mark.parametrize("symmetric", [False, True])
def test_per_tensor_matches_torch_ao(moving, dtype, symmetric):
    """Same min / max and the same scale and zero point, bit for bit (the same float32 formulas)."""
    data = batches(0)
    scheme = SCHEMES[(False, symmetric)]
    if moving:
        theirs = torch_observers.MovingAverageMinMaxObserver(averaging_constant=0.3, dtype=dtype, qscheme=scheme)
        ours = MovingAverageMinMaxObserver(averaging_constant=0.3)
    else:
        theirs, ours = torch_observers.MinMaxObserver(dtype=dtype, qscheme=scheme), MinMaxObserver()
    observe(theirs, data), observe(ours, data)
    low, high = ours.min_max()
    assert low.shape == () and torch.equal(low, theirs.min_val) and torch.equal(high, theirs.max_val)
    scale, zero_point = ours.scale_zero_point(8, signed=dtype == torch.qint8, symmetric=symmetric)
    expected_scale, expected_zero_point = theirs.calculate_qparams()
    assert torch.equal(scale.reshape(1), expected_scale) and int(zero_point) == int(expected_zero_point)


@pytest.mark.parametrize("moving", [False, True])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("symmetric", [False, True])
def test_per_channel_matches_torch_ao(moving, axis, symmetric):
    data = batches(1)
    scheme = SCHEMES[(True, symmetric)]
    if moving:
        theirs = torch_observers.MovingAveragePerChannelMinMaxObserver(
            averaging_constant=0.01, ch_axis=axis, dtype=torch.qint8, qscheme=scheme
        )
        ours = MovingAverageMinMaxObserver(averaging_constant=0.01, axis=axis)
    else:
        theirs = torch_observers.PerChannelMinMaxObserver(ch_axis=axis, dtype=torch.qint8, qscheme=scheme)
        ours = MinMaxObserver(axis=axis)
    observe(theirs, data), observe(ours, data)
    low, high = ours.min_max()
    assert torch.equal(low, theirs.min_val) and torch.equal(high, theirs.max_val)
    scale, zero_point = ours.scale_zero_point(8, symmetric=symmetric)
    expected_scale, expected_zero_point = theirs.calculate_qparams()
    assert torch.equal(scale, expected_scale) and torch.equal(zero_point, expected_zero_point.to(torch.int64))


def test_per_block_ranges_match_a_loop_and_ignore_padding():
    data = [batch.abs() + 1.0 for batch in batches(2, shape=(5, 7))]  # all >= 1: zero padding would show
    ours = observe(MinMaxObserver(block_size=(2, 3)), data)
    low, high = ours.min_max()
    assert low.shape == (3, 3)
    stacked = torch.stack(data)
    for row in range(3):
        for column in range(3):
            block = stacked[:, 2 * row : 2 * row + 2, 3 * column : 3 * column + 3]
            assert low[row, column] == block.min() and high[row, column] == block.max()
    assert observe(MinMaxObserver(block_size=(-1, 4)), data).min_max().min.shape == (1, 2)


def test_nonfinite_values_are_ignored_or_rejected():
    x = torch.tensor([[1.0, math.nan, -2.0], [math.inf, math.nan, -math.inf]])
    ignoring = MinMaxObserver(axis=0)
    ignoring.update(x)
    assert ignoring.count == 2 and ignoring.nonfinite_count == 4
    low, high = ignoring.min_max()
    assert low.tolist() == [-2.0, 0.0] and high.tolist() == [1.0, 0.0]  # a channel with no finite values: (0, 0)
    strict = MinMaxObserver(nonfinite="error")
    strict.update(torch.ones(3))
    with pytest.raises(ConfigError, match="non-finite"):
        strict.update(x)
    assert strict.count == 3 and strict.min_max().min.item() == 1.0  # the rejected batch left no trace


@pytest.mark.parametrize(
    "kind", [MinMaxObserver, MovingAverageMinMaxObserver, PercentileObserver, MSEObserver, HistogramObserver]
)
def test_empty_input_and_no_data(kind):
    observer = kind()
    observer.update(torch.empty(0, 4))
    assert observer.count == 0
    with pytest.raises(ConfigError, match="seen no data"):
        observer.min_max()
    observer.update(torch.full((3,), math.nan))
    with pytest.raises(ConfigError, match="seen no data"):
        observer.scale_zero_point(8)
    observer.update(torch.zeros(4))  # an all-zero activation: a valid, tiny scale
    assert observer.min_max().min.item() == observer.min_max().max.item() == 0.0
    assert math.isfinite(float(observer.scale_zero_point(8).scale)) and observer.count == 4


def test_granularity_must_stay_the_same():
    observer = MinMaxObserver(axis=1)
    observer.update(torch.zeros(2, 3))
    with pytest.raises(ConfigError, match="shape"):
        observer.update(torch.zeros(2, 4))
    observer.update(torch.zeros(9, 3))  # the batch size may change per channel
    with pytest.raises(ConfigError, match="axis"):
        MinMaxObserver(axis=1.5)


FACTORIES = {
    "minmax": lambda: MinMaxObserver(axis=0),
    "moving": lambda: MovingAverageMinMaxObserver(block_size=(2, -1)),
    "percentile": lambda: PercentileObserver(percentile=99.0, axis=1),
    "mse": lambda: MSEObserver(bits=4, axis=0),
    "histogram": lambda: HistogramObserver(bits=4, bins=256),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_state_round_trips_and_resumes(name):
    """Through safetensors and JSON; an observer resumed from its state ends where an uninterrupted one does."""
    data = batches(3, shape=(4, 9))
    whole, first = FACTORIES[name](), FACTORIES[name]()
    observe(whole, data)
    observe(first, data[:2])
    resumed, from_json = FACTORIES[name](), FACTORIES[name]()
    resumed.load_state_dict(load(save(first.state_dict())))
    from_json.load_state_dict(json.loads(json.dumps({k: v.tolist() for k, v in first.state_dict().items()})))
    for observer in (resumed, from_json):
        observe(observer, data[2:])
        assert observer.count == whole.count
        for found, expected in zip(observer.min_max(), whole.min_max()):
            assert torch.equal(found, expected)
    whole.reset()
    with pytest.raises(ConfigError, match="seen no data"):
        whole.min_max()


def test_percentile_observer_within_the_sketch_bound():
    x = torch.randn(200_000, generator=torch.Generator().manual_seed(4), dtype=torch.float64).float()
    observer = observe(PercentileObserver(percentile=99.9, relative_error=0.01), x.split(50_000))
    low, high = observer.min_max()
    values = x.double().numpy()
    for found, q in ((low, 0.001), (high, 0.999)):
        exact = np.quantile(values, q)
        assert abs(found.item() - exact) <= 0.011 * abs(exact) + 1e-6
    exact_ends = observe(PercentileObserver(percentile=100.0), [x]).min_max()
    assert exact_ends.min.item() == x.min().item() and exact_ends.max.item() == x.max().item()


def actual_mse(x: np.ndarray, low: float, high: float, bits: int, signed: bool) -> float:
    scale, zero_point = scale_zero_point(low, high, bits, signed)
    q_min, q_max = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    return float(np.mean((reference_fake_quantize(x, float(scale), int(zero_point), q_min, q_max) - x) ** 2))


@pytest.mark.parametrize("bits", [3, 4, 8])
def test_mse_observer_picks_the_best_candidate_on_the_data(bits):
    """The histogram model chooses a range whose MSE on the actual data is within 2 % of the grid's best."""
    generator = torch.Generator().manual_seed(5)
    x = torch.cat([torch.randn(50_000, generator=generator), torch.tensor([25.0, -18.0, 40.0])])
    observer = observe(MSEObserver(bits=bits), x.split(10_000))
    low, high = (v.item() for v in observer.min_max())
    values = x.double().numpy()
    grid = [actual_mse(values, x.min().item() * j / 100, x.max().item() * j / 100, bits, True) for j in range(1, 101)]
    assert actual_mse(values, low, high, bits, True) <= min(grid) * 1.02
    assert high < 40.0 and low > -18.0  # the outliers are clipped


def test_mse_observer_refines_each_end_for_one_sided_outliers():
    """Shrinking both ends together also clips the clean side; refining each end finds the 2-D optimum."""
    generator = torch.Generator().manual_seed(2)
    x = torch.cat([torch.randn(50_000, generator=generator), torch.rand(10, generator=generator) * 35 + 5])
    values, low, high = x.double().numpy(), x.min().item(), x.max().item()
    joint = observe(MSEObserver(bits=6, refinements=0), [x]).min_max()
    refined = observe(MSEObserver(bits=6), [x]).min_max()
    refined_mse = actual_mse(values, refined.min.item(), refined.max.item(), 6, True)
    assert refined_mse < 0.95 * actual_mse(values, joint.min.item(), joint.max.item(), 6, True)
    grid = [actual_mse(values, low * i / 20, high * j / 20, 6, True) for i in range(1, 21) for j in range(1, 21)]
    assert refined_mse <= min(grid) * 1.01
    symmetric = observe(MSEObserver(bits=4, symmetric=True), [x]).min_max()
    assert symmetric.min.item() / low == pytest.approx(symmetric.max.item() / high)


def test_mse_observer_is_at_least_as_good_as_torch_ao_histogram_observer():
    """torch.ao's HistogramObserver minimises an L2 norm over its own histogram; on the data itself the
    exact-integral MSE search should do no worse."""
    generator = torch.Generator().manual_seed(6)
    data = [torch.randn(20_000, generator=generator) * 2 + 1 for _ in range(3)] + [torch.tensor([30.0, -9.0])]
    theirs = observe(torch_observers.HistogramObserver(dtype=torch.quint8), data)
    ours = observe(MSEObserver(bits=8, signed=False), data)
    values = torch.cat(data).double().numpy()
    their_scale, their_zero_point = theirs.calculate_qparams()
    their_output = reference_fake_quantize(values, float(their_scale), int(their_zero_point), 0, 255)
    their_mse = np.mean((their_output - values) ** 2)
    low, high = (v.item() for v in ours.min_max())
    assert actual_mse(values, low, high, 8, False) <= their_mse * 1.01


def test_histogram_observer_threshold_matches_brute_force_kl():
    generator = torch.Generator().manual_seed(7)
    x = torch.cat([torch.randn(3000, generator=generator), torch.tensor([9.0])])
    observer = observe(HistogramObserver(bits=3, bins=64), [x])
    low, high = observer.min_max()
    width = observer.histogram.bin_width().item()
    histogram = np.bincount(np.floor(x.abs().double().numpy() / width).astype(int))  # independent binning
    levels = 4  # 2^(bits - 1)
    divergences = [brute_force_divergence(histogram, cut, levels) for cut in range(levels, histogram.size + 1)]
    threshold = (levels + int(np.argmin(divergences))) * width
    assert threshold < 9.0
    assert high.item() == pytest.approx(min(threshold, x.max().item()))
    assert low.item() == pytest.approx(max(-threshold, x.min().item()))


def test_histogram_observer_keeps_exact_range_of_few_bins_and_reruns_per_target():
    observer = observe(HistogramObserver(bits=8, bins=64), [torch.tensor([0.0, 1.0, 2.0, -3.0])])  # 64 < 128 levels
    assert observer.min_max().min.item() == -3.0 and observer.min_max().max.item() == 2.0
    wide = observe(HistogramObserver(bits=8), [torch.randn(10_000, generator=torch.Generator().manual_seed(8))])
    assert wide.min_max(bits=2).max < wide.min_max().max  # fewer levels: a lower threshold
    assert wide.min_max(bits=2).max.item() == pytest.approx(wide.scale_zero_point(bits=2).scale.item() * 1.5)
    with pytest.raises(ConfigError, match="unknown keyword"):
        wide.min_max(bitz=2)


def test_affine_spec_from_observers_matches_torch_fake_quantize():
    w = torch.randn(8, 32, generator=torch.Generator().manual_seed(9))
    observer = observe(MinMaxObserver(axis=0), [w])
    spec = observer.affine_spec(bits=8, symmetric=True)
    scale, zero_point = observer.scale_zero_point(8, symmetric=True)
    expected = torch.fake_quantize_per_channel_affine(w, scale, zero_point.to(torch.int32), 0, -128, 127)
    assert torch.equal(spec(w), expected)
    with pytest.raises(ConfigError, match="per-block"):
        observe(MinMaxObserver(block_size=(1, 8)), [w]).affine_spec(bits=8)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("kind", ["uniform", "gaussian"])
def test_histogram_observer_agrees_with_torch_ao_on_light_tails(kind, symmetric):
    """Oracle: torch.ao's HistogramObserver (L2 search) on the same batches. Without heavy tails both keep
    (nearly) the data's range: the quantized ranges agree within 2 % (gaussian asymmetric: 10 %, KL
    trims the sparse last bins on both sides, torch.ao mostly on one)."""
    generator = torch.Generator().manual_seed(0)
    make = {"uniform": lambda: torch.rand(20_000, generator=generator) * 6 - 3,
            "gaussian": lambda: torch.randn(20_000, generator=generator) * 2}[kind]  # fmt: skip
    data = [make() for _ in range(3)]
    scheme = (torch.qint8, torch.per_tensor_symmetric) if symmetric else (torch.quint8, torch.per_tensor_affine)
    theirs = observe(torch_observers.HistogramObserver(dtype=scheme[0], qscheme=scheme[1]), data)
    scale, zero_point = (float(v) for v in theirs.calculate_qparams())
    q_min, q_max = (-128, 127) if symmetric else (0, 255)
    their_low, their_high = (q_min - zero_point) * scale, (q_max - zero_point) * scale
    low, high = (v.item() for v in observe(HistogramObserver(bits=8, signed=symmetric, symmetric=symmetric), data).min_max())
    tolerance = 0.10 if (kind, symmetric) == ("gaussian", False) else 0.02
    assert low == pytest.approx(their_low, rel=tolerance)
    assert high == pytest.approx(their_high, rel=tolerance)


def test_histogram_observer_clips_heavy_tails_where_torch_ao_keeps_them():
    """The documented difference: on Laplace data KL (entropy) calibration clips the sparse tail that
    torch.ao's L2 search keeps, but not below 80 % of torch.ao's range, and never beyond the data."""
    torch.manual_seed(0)
    data = [torch.distributions.Laplace(0.0, 1.0).sample((20_000,)) for _ in range(3)]
    theirs = observe(torch_observers.HistogramObserver(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric), data)
    their_threshold = float(theirs.calculate_qparams()[0]) * 127.5
    high = observe(HistogramObserver(bits=8, signed=True, symmetric=True), data).min_max().max.item()
    assert 0.8 * their_threshold <= high < their_threshold
    assert high <= max(float(d.abs().max()) for d in data)
