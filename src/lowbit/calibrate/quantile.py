"""Bounded-memory summaries of a stream of values: a quantile sketch.

:class:`QuantileSketch` is a log-bucketed sketch in the style of DDSketch (Masson, Rim and Lee, VLDB 2019).
With relative error a, let g = (1 + a) / (1 - a). A finite value x with |x| >= 2^-126 goes to the bucket
i = ceil(log_g |x|) of its sign, which holds the magnitudes in (g^(i-1), g^i]; smaller magnitudes (zero,
subnormals) go to one zero bucket. A bucket is represented by 2 g^i / (g + 1), which is within a relative
a of every magnitude in (g^(i-1), g^i] (at both ends the distance is exactly a times the end), and 0 for
the zero bucket (within 2^-126 of its values).

**Bound.** ``quantile(q)`` estimates numpy's default (linear) quantile: with n values sorted as
x_(0) <= ... <= x_(n-1), h = q (n - 1), k = floor(h), t = h - k, the exact value is
v = (1 - t) x_(k) + t x_(k+1). The sketch keeps exact counts per bucket, so it finds the bucket that holds
x_(k) (and x_(k+1)) exactly, and interpolates the two representatives with the same t. Each is within
a |x| + 2^-126 of its order statistic, so

    |quantile(q) - v| <= a * max(|x_(k)|, |x_(k+1)|) + 2^-126.

x_(0) and x_(n-1) are tracked exactly and used as they are; the estimate is then clamped to the exact
[min, max], which only moves it closer to v. ``error_bound(q)``
returns a / (1 - a) * max(|r_k|, |r_(k+1)|) + (1 + a) 2^-126 with r the two representatives, an upper
bound of the right-hand side computable from the sketch (|x| <= |r| (g + 1) / 2 = |r| / (1 - a), and
|x| < 2^-126 where r = 0). Float64
rounding of the logarithm moves bucket edges by about 1e-14 relative; buckets are built with a relative
error a (1 - 1e-6) so that this slack stays inside the stated a (a >= 1e-4 is required).

**Memory.** Bucket keys are bounded by the float32 range (|x| < 2^128; larger finite values raise
ConfigError): K = ``max_key`` = ceil(128 ln 2 / ln g) - ceil(-126 ln 2 / ln g) + 1 keys per sign (8,803 for
a = 0.01). Each sign stores only the window of keys between its smallest and largest magnitude seen, plus
one zero count: about ln(max|x| / min|x|) / ln g counts per sign and group (~900 for normal data at 1 %),
at most 2 K + 1, whatever the number of values. NaN and +-inf are not counted as values; they are tallied in
``nonfinite``. Sketches with the same relative error merge exactly (counts add).

:class:`~lowbit.calibrate.histogram.DyadicHistogram` (its own module) shares the grouping helpers here.
"""

from __future__ import annotations

import math

import torch

from lowbit.errors import ConfigError, FormatError

SMALLEST_NORMAL = 2.0**-126  # magnitudes below this count as zero
_LARGEST_MAGNITUDE = 2.0**128  # float32's range: keeps the number of buckets bounded
_CHUNK = 1 << 22  # values per vectorised step: caps temporary memory, not the stream length


def float64_groups(values: torch.Tensor, groups: int, device: torch.device) -> torch.Tensor:
    if values.device.type == "meta" or device.type == "meta":
        raise FormatError("a quantile sketch or histogram cannot run on the meta device: the buckets it keeps "
                          "depend on the values; use the CPU or a GPU")  # fmt: skip
    values = values.detach().to(device, torch.float64)  # the sketch's device (the observer makes it the data's)
    if values.dim() != 2 or values.shape[0] != groups:
        raise ConfigError(f"expected values shaped [{groups}, n], got {tuple(values.shape)}")
    too_large = torch.isfinite(values) & (values.abs() >= _LARGEST_MAGNITUDE)
    if too_large.any():
        raise ConfigError(f"value {values[too_large][0].item()} is outside the float32 range the sketches cover")
    return values


def value_chunks(values: torch.Tensor):
    step = max(1, _CHUNK // max(values.shape[0], 1))
    for start in range(0, values.shape[1], step):
        yield values[:, start : start + step]


class _KeyWindow:
    """Counts of the bucket keys low_key .. low_key + width - 1 of one sign, per group; grows to fit."""

    def __init__(self, groups: int, device: torch.device):
        self.groups, self.low_key = groups, 1
        self.counts = torch.zeros(groups, 0, dtype=torch.int64, device=device)  # [groups, width]

    @property
    def width(self) -> int:
        return self.counts.shape[1]

    def widen(self, low_key: int, high_key: int) -> None:
        """Cover [low_key, high_key] as well (existing counts keep their keys)."""
        if self.width:
            low_key, high_key = min(self.low_key, low_key), max(self.low_key + self.width - 1, high_key)
        if self.width and (low_key, high_key) == (self.low_key, self.low_key + self.width - 1):
            return
        wider = torch.zeros(self.groups, high_key - low_key + 1, dtype=torch.int64, device=self.counts.device)
        offset = self.low_key - low_key
        wider[:, offset : offset + self.width] = self.counts
        self.low_key, self.counts = low_key, wider

    def add(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        if keys.numel():
            self.widen(int(keys.min()), int(keys.max()))
            flat = rows * self.width + (keys - self.low_key)
            self.counts += torch.bincount(flat, minlength=self.groups * self.width).reshape(self.groups, self.width)

    def merge(self, other: _KeyWindow) -> None:
        if other.width:
            self.widen(other.low_key, other.low_key + other.width - 1)
            offset = other.low_key - self.low_key
            self.counts[:, offset : offset + other.width] += other.counts

    def keys(self) -> torch.Tensor:
        return torch.arange(self.low_key, self.low_key + self.width, device=self.counts.device)


class GroupedQuantileSketch:
    """One log-bucketed quantile sketch per group (channel or block), updated together; see the module
    docstring for the buckets and the error bound. ``update_groups`` takes values shaped [groups, n].

    The counts live on ``device`` (default CPU; observers give the data's), and values are moved there.
    The buckets depend on the values, so a sketch cannot run on the meta device (FormatError)."""

    def __init__(self, relative_error: float = 0.01, groups: int = 1, device: torch.device | str | None = None):
        if not 1e-4 <= relative_error <= 0.5:
            raise ConfigError(f"relative_error={relative_error!r} is invalid; expected a number in [1e-4, 0.5]")
        if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
            raise ConfigError(f"groups={groups!r} is invalid; expected an int >= 1")
        self.relative_error = float(relative_error)
        self.groups, self.device = groups, torch.device("cpu" if device is None else device)
        internal = self.relative_error * (1 - 1e-6)  # absorbs float64 rounding of bucket edges
        self._gamma = (1 + internal) / (1 - internal)
        self._log_gamma = math.log(self._gamma)
        self._first_index = math.ceil(math.log(SMALLEST_NORMAL) / self._log_gamma)
        self.max_key = math.ceil(math.log(_LARGEST_MAGNITUDE) / self._log_gamma) - self._first_index + 1
        self.reset()

    def reset(self) -> None:
        device = self.device
        self.negative, self.positive = _KeyWindow(self.groups, device), _KeyWindow(self.groups, device)  # keys of |x|
        self.zeros = torch.zeros(self.groups, dtype=torch.int64, device=device)  # |x| < 2^-126
        self.count_per_group = torch.zeros(self.groups, dtype=torch.int64, device=device)
        self.nonfinite_per_group = torch.zeros(self.groups, dtype=torch.int64, device=device)
        self.min_per_group = torch.full((self.groups,), math.inf, dtype=torch.float64, device=device)
        self.max_per_group = torch.full((self.groups,), -math.inf, dtype=torch.float64, device=device)

    @property
    def num_buckets(self) -> int:
        """Counts stored per group (the keys seen so far, per sign); never above 2 * max_key + 1."""
        return self.negative.width + 1 + self.positive.width

    # ---- updates ----------------------------------------------------------------------------------------
    def update_groups(self, values: torch.Tensor) -> None:
        """Add values shaped [groups, n]; NaN / +-inf are tallied as non-finite and otherwise ignored."""
        for chunk in value_chunks(float64_groups(values, self.groups, self.device)):
            finite = torch.isfinite(chunk)
            self.nonfinite_per_group += (~finite).sum(1)
            self.count_per_group += finite.sum(1)
            self.min_per_group = torch.minimum(self.min_per_group, torch.where(finite, chunk, math.inf).amin(1))
            self.max_per_group = torch.maximum(self.max_per_group, torch.where(finite, chunk, -math.inf).amax(1))
            magnitude = torch.where(finite, chunk.abs(), 0.0)
            small = magnitude < SMALLEST_NORMAL
            self.zeros += (finite & small).sum(1)
            keys = self._keys(magnitude)
            rows = torch.arange(self.groups, device=self.device).unsqueeze(1).expand_as(keys)
            for window, sign in ((self.positive, chunk > 0), (self.negative, chunk < 0)):
                chosen = finite & sign & ~small
                window.add(keys[chosen], rows[chosen])

    def _keys(self, magnitude: torch.Tensor) -> torch.Tensor:
        """Bucket keys k >= 1 of magnitudes >= 2^-126 (bucket i = ceil(log_g |x|) is key i - first + 1)."""
        index = torch.ceil(torch.log(magnitude.clamp(min=SMALLEST_NORMAL)) / self._log_gamma)
        return (index - (self._first_index - 1)).clamp(min=1).to(torch.int64)

    def merge(self, other: GroupedQuantileSketch) -> None:
        """Add another sketch's counts (same relative error and groups): exact, as if it saw both streams."""
        if other.relative_error != self.relative_error or other.groups != self.groups:
            raise ConfigError(
                f"cannot merge a sketch with relative_error={other.relative_error}, groups={other.groups} into "
                f"one with relative_error={self.relative_error}, groups={self.groups}"
            )
        self.negative.merge(other.negative)
        self.positive.merge(other.positive)
        self.zeros += other.zeros
        self.count_per_group += other.count_per_group
        self.nonfinite_per_group += other.nonfinite_per_group
        self.min_per_group = torch.minimum(self.min_per_group, other.min_per_group)
        self.max_per_group = torch.maximum(self.max_per_group, other.max_per_group)

    # ---- queries ------------------------------------------------------------------------------------------
    def _ordered(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Counts [groups, buckets] and signed keys [buckets] of every bucket, in increasing value order."""
        counts = torch.cat([self.negative.counts.flip(1), self.zeros.unsqueeze(1), self.positive.counts], 1)
        zero = torch.zeros(1, dtype=torch.int64, device=self.device)
        keys = torch.cat([-self.negative.keys().flip(0), zero, self.positive.keys()])
        return counts, keys

    def _representatives(self, keys: torch.Tensor) -> torch.Tensor:
        index = keys.abs().to(torch.float64) + (self._first_index - 1)
        magnitude = torch.exp(index * self._log_gamma) * (2 / (self._gamma + 1))
        return torch.where(keys == 0, 0.0, magnitude * torch.sign(keys.to(torch.float64)))

    def _order_statistics(self, q: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Representatives of x_(k) and x_(k+1) per group [groups, 2], their ranks, and the weight t."""
        if not 0.0 <= q <= 1.0:
            raise ConfigError(f"quantile q={q!r} is invalid; expected a number in [0, 1]")
        last = (self.count_per_group - 1).clamp(min=0).to(torch.float64)
        position = q * last
        below = torch.floor(position)
        ranks = torch.stack([below, torch.minimum(below + 1, last)], dim=1).to(torch.int64)  # [groups, 2]
        counts, keys = self._ordered()
        columns = torch.searchsorted(counts.cumsum(1), ranks, right=True).clamp(max=keys.numel() - 1)
        return self._representatives(keys[columns]), ranks, position - below

    def quantile_per_group(self, q: float) -> torch.Tensor:
        """Estimate of numpy's linear quantile per group (float64 [groups]); NaN for a group with no data."""
        pair, ranks, weight = self._order_statistics(q)
        # The smallest and largest values are known exactly: use them instead of their buckets.
        pair = torch.where(ranks == 0, self.min_per_group.unsqueeze(1), pair)
        pair = torch.where(ranks == (self.count_per_group - 1).unsqueeze(1), self.max_per_group.unsqueeze(1), pair)
        estimate = pair[:, 0] + weight * (pair[:, 1] - pair[:, 0])
        estimate = torch.minimum(torch.maximum(estimate, self.min_per_group), self.max_per_group)
        return torch.where(self.count_per_group > 0, estimate, math.nan)

    def error_bound_per_group(self, q: float) -> torch.Tensor:
        """An upper bound of |quantile_per_group(q) - exact quantile| per group (see the module docstring)."""
        pair, _, _ = self._order_statistics(q)
        largest = pair.abs().amax(1)
        error = self.relative_error
        bound = largest * (error / (1 - error)) + (1 + error) * SMALLEST_NORMAL
        return torch.where(self.count_per_group > 0, bound, math.nan)

    # ---- state --------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        """Plain tensors only (safetensors / JSON friendly)."""
        state = {"relative_error": torch.tensor(self.relative_error, dtype=torch.float64), "zeros": self.zeros,
                 "count": self.count_per_group, "nonfinite": self.nonfinite_per_group, "min": self.min_per_group,
                 "max": self.max_per_group}  # fmt: skip
        for name, window in (("negative", self.negative), ("positive", self.positive)):
            state[f"{name}_counts"], state[f"{name}_low_key"] = window.counts, torch.tensor(window.low_key)
        return {key: value.clone() for key, value in state.items()}

    def load_state_dict(self, state: dict) -> None:
        saved = float(torch.as_tensor(state["relative_error"], dtype=torch.float64))
        if saved != self.relative_error:
            raise ConfigError(f"state has relative_error={saved}; this sketch has {self.relative_error}")
        for name, window in (("negative", self.negative), ("positive", self.positive)):
            counts = torch.as_tensor(state[f"{name}_counts"], dtype=torch.int64, device=self.device)
            window.counts = counts.reshape(self.groups, -1).clone()
            window.low_key = int(torch.as_tensor(state[f"{name}_low_key"]))

        def per_group(key: str, dtype: torch.dtype) -> torch.Tensor:
            return torch.as_tensor(state[key], dtype=dtype, device=self.device).reshape(self.groups).clone()

        self.zeros, self.count_per_group = per_group("zeros", torch.int64), per_group("count", torch.int64)
        self.nonfinite_per_group = per_group("nonfinite", torch.int64)
        self.min_per_group, self.max_per_group = per_group("min", torch.float64), per_group("max", torch.float64)


class QuantileSketch(GroupedQuantileSketch):
    """A streaming quantile sketch with relative value error ``relative_error`` (see the module docstring).

    >>> sketch = QuantileSketch(relative_error=0.01)
    >>> sketch.update(torch.randn(10_000))
    >>> median = sketch.quantile(0.5)     # within 0.01 * |x_(k)| of np.quantile(x, 0.5)
    """

    def __init__(self, relative_error: float = 0.01, device: torch.device | str | None = None):
        super().__init__(relative_error, groups=1, device=device)

    def update(self, values: torch.Tensor) -> None:
        """Add every element of ``values`` (any shape); NaN / +-inf are tallied in ``nonfinite`` only."""
        self.update_groups(torch.as_tensor(values).reshape(1, -1))

    def _require_data(self) -> None:
        if self.count == 0:
            raise ConfigError("the sketch has seen no finite values")

    def quantile(self, q: float | list[float]) -> float | list[float]:
        """The q-quantile (q in [0, 1]; a list gives a list), numpy's linear interpolation, within the bound."""
        self._require_data()
        if isinstance(q, (list, tuple)):
            return [float(self.quantile_per_group(float(item))[0]) for item in q]
        return float(self.quantile_per_group(float(q))[0])

    def error_bound(self, q: float) -> float:
        """An upper bound of |quantile(q) - np.quantile(values, q)|."""
        self._require_data()
        return float(self.error_bound_per_group(float(q))[0])

    @property
    def count(self) -> int:
        return int(self.count_per_group[0])

    @property
    def nonfinite(self) -> int:
        return int(self.nonfinite_per_group[0])

    @property
    def min(self) -> float:
        self._require_data()
        return float(self.min_per_group[0])

    @property
    def max(self) -> float:
        self._require_data()
        return float(self.max_per_group[0])


__all__ = ["GroupedQuantileSketch", "QuantileSketch", "SMALLEST_NORMAL", "float64_groups", "value_chunks"]
