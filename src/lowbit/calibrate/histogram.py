"""DyadicHistogram: a mergeable histogram on bins of a power-of-two width (exact counts, bounded
memory), and the KL divergences that TensorRT-style histogram calibration minimises over its clipping points.

:class:`DyadicHistogram` keeps, per group, ``bins`` counts of bins [j w, (j + 1) w) anchored at zero, with
w a power of two. When the data outgrow the window, w doubles (as often as needed) and bins merge in pairs,
which is exact: every value stays counted in the bin that contains it, and the window (which always
contains 0) keeps more than bins / 2 bins in use. A value's bin is known to within one bin width.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from lowbit.calibrate.quantile import float64_groups, value_chunks
from lowbit.errors import ConfigError

class DyadicHistogram:
    """Per-group histograms of ``bins`` bins of width 2^exponent anchored at zero (see the module docstring).

    Column m of group g counts the values in [(low_index[g] + m) w[g], (low_index[g] + m + 1) w[g]) with
    w[g] = 2^exponent[g]; the occupied bins always span [low_index, high_index], which contains bin 0.
    """

    _START_EXPONENT = -160  # below every float32 magnitude: the first update picks the real width

    def __init__(self, bins: int = 2048, groups: int = 1, device: torch.device | str | None = None):
        if isinstance(bins, bool) or not isinstance(bins, int) or bins < 8:
            raise ConfigError(f"bins={bins!r} is invalid; expected an int >= 8")
        self.bins, self.groups = bins, groups
        self.device = torch.device("cpu" if device is None else device)  # values are moved here
        self.reset()

    def reset(self) -> None:
        device = self.device
        self.counts = torch.zeros(self.groups, self.bins, dtype=torch.int64, device=device)
        self.low_index = torch.zeros(self.groups, dtype=torch.int64, device=device)
        self.high_index = torch.zeros(self.groups, dtype=torch.int64, device=device)
        self.exponent = torch.full((self.groups,), self._START_EXPONENT, dtype=torch.int64, device=device)

    def bin_width(self) -> torch.Tensor:
        """w per group (float64 [groups])."""
        return torch.ldexp(torch.ones(self.groups, dtype=torch.float64, device=self.device), self.exponent)

    def update_groups(self, values: torch.Tensor) -> None:
        """Add values shaped [groups, n]; NaN / +-inf are ignored."""
        for chunk in value_chunks(float64_groups(values, self.groups, self.device)):
            finite = torch.isfinite(chunk)
            width = self.bin_width()
            low = torch.where(finite, chunk, math.inf).amin(1) / width
            high = torch.where(finite, chunk, -math.inf).amax(1) / width
            present = finite.any(1)
            low = torch.minimum(self.low_index.double(), torch.where(present, torch.floor(low), 0.0))
            high = torch.maximum(self.high_index.double(), torch.where(present, torch.floor(high), 0.0))
            self._rebin(low, high)
            index = torch.floor(chunk / self.bin_width().unsqueeze(1)) - self.low_index.unsqueeze(1)
            rows = torch.arange(self.groups, device=self.device).unsqueeze(1).expand_as(index)
            flat = rows[finite] * self.bins + index[finite].to(torch.int64)
            self.counts += torch.bincount(flat, minlength=self.groups * self.bins).reshape(self.groups, self.bins)

    def _rebin(self, low: torch.Tensor, high: torch.Tensor) -> None:
        """Double the widths until bins [low, high] (float64 indices at the current widths) fit, merging."""
        shift = self._shift_to_fit(low, high)
        factor = torch.ldexp(torch.ones_like(low), -shift)  # exact: floor(j / 2^k) below
        new_low = torch.floor(low * factor).to(torch.int64)
        self.high_index = torch.floor(high * factor).to(torch.int64)
        old_index = self.low_index.unsqueeze(1) + torch.arange(self.bins, device=self.device)  # [groups, bins]
        # An arithmetic shift is floor division by 2^k; k past 62 gives the same 0 / -1 as k = 62.
        new_column = (old_index >> shift.clamp(max=62).unsqueeze(1)) - new_low.unsqueeze(1)
        new_column = torch.where(self.counts > 0, new_column, 0)  # empty columns may fall outside
        merged = torch.zeros_like(self.counts).scatter_add_(1, new_column, self.counts)
        self.counts, self.low_index, self.exponent = merged, new_low, self.exponent + shift

    def _shift_to_fit(self, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
        """The smallest k >= 0 per group with floor(high / 2^k) - floor(low / 2^k) + 1 <= bins."""
        span = (high - low).clamp(min=1.0)
        shift = (torch.floor(torch.log2(span / self.bins)) - 1).clamp(min=0).to(torch.int64)  # a lower bound
        while True:
            factor = torch.ldexp(torch.ones_like(low), -shift)
            too_wide = torch.floor(high * factor) - torch.floor(low * factor) + 1 > self.bins
            if not too_wide.any():
                return shift
            shift = shift + too_wide.to(torch.int64)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"counts": self.counts.clone(), "low_index": self.low_index.clone(),
                "high_index": self.high_index.clone(), "exponent": self.exponent.clone()}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        def loaded(name: str, *shape: int) -> torch.Tensor:
            return torch.as_tensor(state[name], dtype=torch.int64, device=self.device).reshape(shape).clone()

        self.counts = loaded("counts", self.groups, self.bins)
        for name in ("low_index", "high_index", "exponent"):
            setattr(self, name, loaded(name, self.groups))


def kl_divergences(counts: torch.Tensor, levels: int) -> torch.Tensor:
    """KL(P || Q) of entropy calibration (Migacz, "8-bit inference with TensorRT", 2017) for every cut.

    ``counts`` [groups, bins] is a histogram of |x| starting at 0. Keeping i bins (column i - levels of
    the result, i = levels .. bins): P is the first i bins with the mass beyond them added to bin i - 1;
    Q merges the first i bins (without that outside mass) into ``levels`` runs of bins [floor(j i / levels),
    floor((j + 1) i / levels)) and spreads each run's mass evenly over the run's bins where P is nonzero.
    Both are normalised; KL = sum P log(P / Q) over P > 0, +inf where Q = 0 < P. Returns float64
    [groups, bins - levels + 1] (empty when bins < levels).
    """
    histogram = counts.to(torch.float64)
    groups, bins = histogram.shape
    cut = torch.arange(levels, bins + 1, device=counts.device)  # [cuts]
    level = torch.arange(levels, device=counts.device)
    run_start = (level * cut.unsqueeze(1)) // levels  # [cuts, levels]
    run_end = ((level + 1) * cut.unsqueeze(1)) // levels

    def prefix(values: torch.Tensor) -> torch.Tensor:  # prefix[:, i] = sum of the first i bins
        return F.pad(values.cumsum(1), (1, 0))

    mass_prefix, nonzero_prefix = prefix(histogram), prefix((histogram > 0).to(torch.float64))
    mass = mass_prefix[:, run_end] - mass_prefix[:, run_start]  # [groups, cuts, levels]
    nonzero = nonzero_prefix[:, run_end] - nonzero_prefix[:, run_start]
    total = mass_prefix[:, -1:]  # [groups, 1]
    outside = total - mass_prefix[:, cut]  # [groups, cuts]
    last_bin = histogram[:, cut - 1]
    nonzero[..., -1] += ((last_bin == 0) & (outside > 0)).to(torch.float64)  # P's last bin gains the outside
    p_mass = mass.clone()
    p_mass[..., -1] += outside
    p_log_p = prefix(_x_log_x(histogram))[:, cut - 1] + _x_log_x(last_bin + outside)  # sum of p log p
    q_per_bin = mass / (nonzero * mass_prefix[:, cut].unsqueeze(2))
    cross = torch.where(p_mass > 0, p_mass * torch.log(q_per_bin), 0.0).sum(2)  # sum of p log q
    divergence = (p_log_p - cross) / total - torch.log(total)
    return torch.where(torch.isnan(divergence), math.inf, divergence)


def _x_log_x(values: torch.Tensor) -> torch.Tensor:
    return torch.where(values > 0, values * torch.log(values), 0.0)


__all__ = ["DyadicHistogram", "kl_divergences"]
