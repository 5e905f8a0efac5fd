"""The search observers: MSEObserver (the range whose quantization error over a histogram of x is least) and
HistogramObserver (TensorRT-style: the clipping point of |x| with the least KL divergence); both keep exact
running min / max and a DyadicHistogram per group."""

from __future__ import annotations

import math

import torch

from lowbit.calibrate import builders
from lowbit.calibrate.histogram import DyadicHistogram, kl_divergences
from lowbit.calibrate.observers import MinMaxObserver, Observer, prefixed
from lowbit.errors import ConfigError
from lowbit.formats.integer import code_range

class _HistogramSearch(Observer):
    """Shared by the search observers: exact running min / max plus a DyadicHistogram per group."""

    _magnitudes = False  # True: histogram |x| (KL) instead of x (MSE)
    _needs_values = True

    def __init__(self, *, bits: int = 8, signed: bool = True, symmetric: bool = False, power_of_two: bool = False,
                 narrow_range: bool = False, bins: int = 2048, **granularity):  # fmt: skip
        super().__init__(**granularity)
        self.target = {"bits": bits, "signed": signed, "symmetric": symmetric, "power_of_two": power_of_two,
                       "narrow_range": narrow_range}  # fmt: skip
        builders.scale_zero_point(0.0, 0.0, **self.target)  # validates the target format now
        self.bins = bins
        DyadicHistogram(bins)  # validates bins now

    def _reset_statistics(self) -> None:
        self.extremes, self.histogram = MinMaxObserver(), None

    def _start(self, groups: int, device: torch.device | None = None) -> None:
        self.extremes._start(groups, device)
        self.histogram = DyadicHistogram(self.bins, groups, device)

    def _observe(self, values: torch.Tensor, clean: bool) -> None:
        self.extremes._observe(values, clean)
        self.histogram.update_groups(values.abs() if self._magnitudes else values)

    def _observed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact (min, max) per group, (0, 0) for a group without finite values."""
        low, high = self.extremes.low, self.extremes.high
        return torch.where(torch.isfinite(low), low, 0.0), torch.where(torch.isfinite(high), high, 0.0)

    def _statistics(self) -> dict[str, torch.Tensor]:
        state = {"min": self.extremes.low.clone(), "max": self.extremes.high.clone()}
        state.update({f"histogram.{key}": value for key, value in self.histogram.state_dict().items()})
        return state

    def _load_statistics(self, state: dict) -> None:
        self.extremes._load_statistics(state)
        self.histogram.load_state_dict(prefixed(state, "histogram."))

    def _group_chunks(self, cost_per_group: int):
        """Slices of groups small enough that each of the search's temporaries stays near 2^20 elements."""
        size = max(1, (1 << 20) // max(cost_per_group, 1))
        for start in range(0, self.histogram.groups, size):
            yield slice(start, start + size)


class MSEObserver(_HistogramSearch):
    """The clipping range minimising the expected quantize-dequantize MSE for the target format.

    Grid: low in {f min}, high in {f max}, f = j / num_candidates for j = 1 .. num_candidates (default 100:
    1 %, 2 %, ..., 100 % of each end). First both ends shrink together ([f min, f max], the whole search for
    symmetric targets, whose scale depends on max(|low|, |high|) only); for asymmetric targets each end is
    then searched with the other fixed, ``refinements`` times (default 2), so that one-sided outliers are
    clipped on their side only. Each step keeps the current range among its candidates, so the modelled
    MSE never rises. A candidate's MSE is the exact integral of the squared error over a histogram of the
    data (``bins`` dyadic bins, each bin's values spread uniformly; :func:`builders.expected_squared_error`),
    with scale and zero point from the builders. Ties go to the widest range.
    """

    def __init__(self, *, num_candidates: int = 100, refinements: int = 2, **options):
        for name, value, least in (("num_candidates", num_candidates, 1), ("refinements", refinements, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(f"{name}={value!r} is invalid; expected an int >= {least}")
        self.num_candidates, self.refinements = num_candidates, refinements
        super().__init__(**options)

    def _range(self, **target) -> tuple[torch.Tensor, torch.Tensor]:
        low, high = self._observed()
        fractions = torch.arange(self.num_candidates, 0, -1, dtype=torch.float32, device=low.device)
        fractions = fractions / self.num_candidates  # widest first
        low_grid, high_grid = low.unsqueeze(1) * fractions, high.unsqueeze(1) * fractions  # [g, c]
        low, high = self._best(low_grid, high_grid, target)
        for _ in range(0 if target["symmetric"] else self.refinements):
            low, _ = self._best(low_grid, high.unsqueeze(1).expand_as(high_grid), target)
            _, high = self._best(low.unsqueeze(1).expand_as(low_grid), high_grid, target)
        return low, high

    def _best(self, lows: torch.Tensor, highs: torch.Tensor, target: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """The candidate range (one of [g, c]) with the least expected MSE per group."""
        scale, zero_point = builders.scale_zero_point(lows, highs, **target)
        q_min, q_max = code_range(target["bits"], target["signed"], target["narrow_range"])
        width = self.histogram.bin_width()
        best = torch.empty(lows.shape[0], dtype=torch.int64, device=lows.device)
        for part in self._group_chunks(lows.shape[1] * self.bins):
            error = builders.expected_squared_error(
                self.histogram.counts[part], self.histogram.low_index[part] * width[part], width[part],
                scale[part], zero_point[part], q_min, q_max,
            )  # fmt: skip
            best[part] = error.argmin(1)  # the first minimum: the widest of equally good ranges
        rows = torch.arange(lows.shape[0], device=lows.device)
        return lows[rows, best], highs[rows, best]


class HistogramObserver(_HistogramSearch):
    """Entropy calibration as in TensorRT: the magnitude threshold T minimising KL(P || Q) between the
    histogram of |x| and its quantization to ``levels`` = 2^(bits-1) (signed) or 2^bits (unsigned) levels
    (:func:`lowbit.calibrate.histogram.kl_divergences`, searched over every bin edge T = i w from
    ``levels`` bins up to the last occupied one). The range is [max(min, -T), min(max, T)]; data that
    occupy no more bins than there are levels keep their exact range. ``bins`` defaults to 4096, so that
    at least 2048 bins (TensorRT's histogram size) are in use after the dyadic rebinning.
    """

    _magnitudes = True

    def __init__(self, *, bins: int = 4096, **options):
        super().__init__(bins=bins, **options)

    def _range(self, **target) -> tuple[torch.Tensor, torch.Tensor]:
        low, high = self._observed()
        levels = 2 ** (target["bits"] - 1) if target["signed"] else 2 ** target["bits"]
        used = self.histogram.high_index + 1  # |x| starts at bin 0
        threshold = torch.maximum(-low, high).to(torch.float64)
        width = self.histogram.bin_width()
        for part in self._group_chunks(max(self.bins - levels + 1, 1) * levels * 8):
            bins = int(used[part].max())
            if bins <= levels:
                continue
            divergence = kl_divergences(self.histogram.counts[part, :bins], levels)  # [g, cuts]
            cuts = torch.arange(levels, bins + 1, device=used.device)
            divergence = torch.where(cuts <= used[part].unsqueeze(1), divergence, math.inf)
            chosen = cuts[divergence.argmin(1)]
            clipped = torch.minimum(chosen * width[part], threshold[part])
            threshold[part] = torch.where(used[part] > levels, clipped, threshold[part])
        threshold = threshold.to(torch.float32)
        return torch.maximum(low, -threshold), torch.minimum(high, threshold)


__all__ = ["HistogramObserver", "MSEObserver"]
