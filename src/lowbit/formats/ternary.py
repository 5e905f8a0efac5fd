"""Ternary: values {-1, 0, +1}, or {-alpha, 0, +alpha} with ``scaling_factor``.

y = +1 where x > delta, -1 where x < -delta, else 0 (symmetric, so q(-x) = -q(x)). The threshold delta
comes from, in order:

1. ``threshold`` (given; its magnitude is used);
2. the statistics MASE's stat-to-config writes (seed 002): 0.75 |mean|, else 0.75 |median|, else
   0.05 |max| ("NA" / None means absent). The magnitude is used because a negative statistic (e.g. a
   weight median of -0.0034) would otherwise make every element +-1, i.e. binary;
3. when none is given, the tensor itself, TWN-style: delta = 0.75 mean |x| (per tensor, or per index of
   ``axis``) over the finite elements (NaN and +-inf neither summed nor counted).

alpha = mean |x| over the finite elements above delta in each group (TWN's least-squares optimum; exact
when they are all equal, so re-quantizing is idempotent). Every mean here is the exact mean rounded once to
float32 (``means.rounded_mean``). Max = alpha (1 unscaled), zero is exact, no
subnormals. NaN stays NaN; +-inf become +-alpha (+-1 unscaled); an all-zero tensor gives zeros. Every
statistic is over the finite elements only, so the finite outputs are those of the tensor with its NaN and
+-inf removed (a group with no finite element has alpha 0). Works on
tensors of any rank. Unscaled with a fixed delta >= 1 the map is a threshold, not a rounding: +-1 itself
falls below delta, so it is not idempotent there.

A given ``alpha`` (calibrated: one number, or one per index of ``axis``; needs ``scaling_factor``) freezes
the scale only: delta still follows rules 1-3 above (so with neither ``threshold`` nor a statistic it is
still TWN's 0.75 mean |x| of each call's data), and the values are {-alpha, 0, +alpha}. The result is
idempotent when alpha > delta, which a calibrated alpha (a mean of magnitudes above delta) always is.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from lowbit.formats._base import (
    FormatSpec,
    check_axis,
    check_bool,
    check_float,
    check_int,
)
from lowbit.formats._registry import register
from lowbit.formats.binary import check_given_alpha, given_alpha, masked_mean, mean_abs
from lowbit.formats.blocking import (
    apply_blockwise,
    block_shape,
    can_branch_on_data,
    scaled_bits_per_element,
)
from lowbit.formats.means import rounded_mean
from lowbit.native import sign_log

# Threshold = factor * |statistic|, tried in this order (seed 002 / MASE 2023 priorities).
STATISTIC_FACTORS: tuple[tuple[str, float], ...] = (("mean", 0.75), ("median", 0.75), ("max", 0.05))
TWN_FACTOR = 0.75


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class Ternary(FormatSpec):
    """Threshold ternarisation, optionally scaled; thresholds from a value, statistics, or the data."""

    format_name = "ternary"
    roundings = ("nearest_even",)

    width: int = 2
    scaling_factor: bool = False
    threshold: float | None = None
    mean: float | None = None
    median: float | None = None
    max: float | None = None
    axis: int | None = None
    alpha: float | tuple[float, ...] | None = None

    def validate(self) -> None:
        check_int(self, "width", 2, 2)
        check_bool(self, "scaling_factor")
        check_float(self, "threshold", optional=True)
        if self.threshold is not None and self.threshold < 0:
            object.__setattr__(self, "threshold", -self.threshold)
        for name, _ in STATISTIC_FACTORS:
            check_float(self, name, optional=True)
        check_axis(self)
        check_given_alpha(self)

    @property
    def bits(self) -> int:
        return 2

    def bits_per_element(self, shape: tuple[int, ...] | None = None) -> float:
        """Two bits, plus a float32 scale per tensor / channel when ``scaling_factor`` is set (a given
        ``alpha`` is a parameter of the format: two bits)."""
        if shape is None or not self.scaling_factor or self.alpha is not None:
            return 2.0
        return scaled_bits_per_element(2, 32, shape, None, self.axis)

    @property
    def fixed_threshold(self) -> float | None:
        """The threshold from ``threshold`` or the statistics, or None (computed from the data)."""
        if self.threshold is not None:
            return self.threshold
        for name, factor in STATISTIC_FACTORS:
            value = getattr(self, name)
            if value is not None:
                return factor * abs(value)
        return None

    def value_set(self) -> torch.Tensor | None:
        unit = torch.tensor([-1.0, 0.0, 1.0], dtype=torch.float64)
        if not self.scaling_factor:
            return unit
        return unit * self.alpha[0] if self.alpha is not None and len(self.alpha) == 1 else None

    def _quantize(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        block = block_shape(x.shape, None, self.axis)
        if self.alpha is None:
            return apply_blockwise(x, block, self._ternarize)
        signs = apply_blockwise(x, block, self._signs)  # delta by the usual rule; the scale is frozen
        return torch.where(torch.isnan(x), x, signs * given_alpha(self, x))

    def _native(self, x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor | None:
        return sign_log.ternary(x, self.axis, self.fixed_threshold, self.scaling_factor, self.alpha)

    native_takes_halves = True

    def _delta(self, blocked: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
        """delta per block: the fixed threshold, or TWN's 0.75 mean |x|."""
        fixed = self.fixed_threshold
        if fixed is None:
            return TWN_FACTOR * mean_abs(blocked, dims)
        return torch.tensor(fixed, dtype=blocked.dtype, device=blocked.device)

    def _signs(self, blocked: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
        """-1, 0 or +1 per element by the threshold delta (given, from statistics, or TWN per block)."""
        return self._signs_by(blocked, self._delta(blocked, dims))

    @staticmethod
    def _signs_by(blocked: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return (blocked > delta).to(blocked.dtype) - (blocked < -delta).to(blocked.dtype)

    @staticmethod
    def _scale(blocked: torch.Tensor, signs: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
        """TWN's scale per block: mean |x| over the finite elements the signs select."""
        return masked_mean(blocked.abs(), (signs != 0) & torch.isfinite(blocked), dims)

    def _ternarize(self, blocked: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
        if can_branch_on_data(blocked):
            finite = self._finite_statistics(blocked, dims)
            if finite is not None:  # +-value where selected (the sign of x), +0 elsewhere (-0 + 0 is +0)
                return torch.copysign(finite[1], blocked).mul_(finite[2]).add_(0.0)
        delta = self._delta(blocked, dims)
        signs = self._signs_by(blocked, delta)
        if self.scaling_factor:
            signs = signs * self._scale(blocked, signs, dims)
        return torch.where(torch.isnan(blocked), blocked, signs)

    def _finite_statistics(self, blocked: torch.Tensor, dims: tuple[int, ...]):
        """``_ternarize``'s threshold, value and selection in fewer passes when every element is finite (None
        otherwise): the same delta and scale from one |x| tensor, and no ``where`` (slow on the CPU); |x| >
        delta selects both signs (delta >= 0). Returns (delta, value: the scale or 1, selected: 1.0 / 0.0)."""
        block_numel = math.prod(blocked.shape[d] for d in dims)
        if blocked.numel() == 0 or blocked.dtype == torch.float64:
            return None  # (float64: n equal values need not sum exactly; masked_mean's rule then)
        magnitude = blocked.abs()
        if not bool(torch.isfinite(magnitude.amax()).all()):  # NaN and inf propagate into the max
            return None
        fixed = self.fixed_threshold
        if fixed is None:
            delta = TWN_FACTOR * _plain_mean(magnitude, block_numel, dims)
        else:
            delta = torch.tensor(fixed, dtype=blocked.dtype, device=blocked.device)
        # 1.0 where |x| > delta, else 0.0: a comparison written straight into floats (a bool mask would be
        # converted on every use); the counts are exact float32 sums of ones up to 2^24 elements a block
        selected = torch.gt(magnitude, delta, out=torch.empty_like(magnitude))
        if self.scaling_factor:
            exact = block_numel <= 2**24
            count = selected.sum(dim=dims, keepdim=True, dtype=None if exact else torch.float64)
            value = _plain_mean(magnitude.mul_(selected), count, dims)
        else:
            value = torch.ones((), dtype=blocked.dtype, device=blocked.device)
        return delta, value, selected


def _plain_mean(kept: torch.Tensor, count, dims: tuple[int, ...]) -> torch.Tensor:
    """``masked_mean`` for finite float32 (or narrower) magnitudes already zero outside the selection. Its "all
    selected values equal: that value" rule needs no check: their exact mean is that value, which rounded_mean
    gives."""
    count = count.clamp(min=1) if isinstance(count, torch.Tensor) else max(1, count)
    return rounded_mean(kept, count, dims)
