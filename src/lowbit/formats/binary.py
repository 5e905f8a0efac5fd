"""Binary formats: ``binary`` (one bit per element) and ``binary_residual`` (L residual sign levels).

``binary``
    Value set: bipolar {-1, +1} (x >= 0 -> +1, so both +0 and -0 -> +1) or unipolar {0, 1} (x > 0 -> 1).
    With ``scaling_factor`` the values are {-alpha, +alpha} / {0, alpha}, one alpha per tensor (or per index
    of ``axis``): bipolar alpha = mean |x|, unipolar alpha = mean of the positive x (the exact mean rounded
    once to float32, ``means.rounded_mean``). Both are the scale that minimises the squared error for the
    chosen signs, and re-quantizing gives the same alpha (idempotent).
    Stochastic rounding (``stochastic=True`` or ``rounding="stochastic"``) picks the high value with
    probability clamp((x / alpha + 1) / 2, 0, 1) (bipolar) or clamp(x / alpha, 0, 1) (unipolar), so
    E[y] = x inside [-alpha, alpha] / [0, alpha]: unbiased. Max = alpha (1 unscaled), no subnormals; zero is
    not representable in bipolar mode (it becomes +alpha). NaN stays NaN; +-inf take their sign's value.
    Non-finite elements are left out of alpha (neither summed nor counted), so the finite outputs are those
    of the tensor with them removed; NaN stays NaN and +-inf become the value of their sign.
    A given ``alpha`` (calibrated: one number, or one per index of ``axis``; needs ``scaling_factor``) is
    used as it is, whatever the data: the signs are chosen as above and take the values +-alpha / {0, alpha}.

``binary_residual`` (ReActNet / LUTNet residual sign)
    Value set: every signed sum +-m_1 +- m_2 ... +- m_L of the magnitudes ``means`` (2^L values when those
    sums are distinct; MASE's default magnitudes (L, L-1, ..., 1) / sum give the uniform grid k / sum, i.e.
    L(L+1)/2 + 1 values, which is 2^L only for L <= 2). Max = sum of the magnitudes. Each x goes to the
    nearest value of the exact grid (the float64 sums, compared with x exactly, then rounded to x's dtype),
    ties away from zero, and +-0 on a tie at zero by its sign bit (+0 -> the residual sign's sign(0) = +1,
    -0 -> its mirror image): the result is sign-symmetric for every input. For MASE's default magnitudes
    this is the greedy residual sign r = x; s_l = sign(r) m_l; r -= s_l; y = sum s_l except at exact
    negative ties. Out-of-range values and +-inf saturate to +-max, NaN stays NaN, zero is exact only when
    some signed sum is zero.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math

import torch

from lowbit.errors import FormatError
from lowbit.formats._base import (
    FormatSpec,
    check_axis,
    check_bool,
    check_given_scales,
    check_int,
    check_optional,
    is_number,
)
from lowbit.formats._nearest_table import nearest_index, thresholds
from lowbit.formats._registry import register
from lowbit.formats.blocking import (
    apply_blockwise,
    block_shape,
    can_branch_on_data,
    given_per_axis,
    scaled_bits_per_element,
)
from lowbit.formats.means import rounded_mean
from lowbit.native import sign_log

_COUNTED_GRID_SIZE = 16


def masked_mean(magnitude: torch.Tensor, selected: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """Mean of ``magnitude`` (>= 0, finite where selected) over the selected elements of each block: the exact
    mean rounded once to float32 (``means.rounded_mean``). No selection gives 0.

    When every selected magnitude is equal the mean is that value exactly, so quantizing an already
    quantized tensor reproduces its scale bit for bit (the rule below also covers float64 tensors).
    """
    kept = torch.where(selected, magnitude, torch.zeros_like(magnitude))
    count = selected.sum(dim=dims, keepdim=True).clamp(min=1)
    mean = rounded_mean(kept, count, dims)
    if magnitude.dtype != torch.float64 and can_branch_on_data(magnitude):
        return mean  # exact there: equal values' mean is that value, so the rule below needs no extra passes
    top = kept.amax(dim=dims, keepdim=True)
    bottom = torch.where(selected, magnitude, torch.full_like(magnitude, math.inf)).amin(dim=dims, keepdim=True)
    return torch.where(top == bottom, top, mean)


def mean_abs(blocked: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """mean |x| per block over the finite elements: NaN and +-inf are neither summed nor counted, so the
    finite outputs are those of the block with its non-finite elements removed (docs/formats.md, "Non-finite
    input"). Counted as 0, a NaN (which stays NaN) would shrink alpha, and the output would give a smaller
    alpha on a second pass; an inf becomes +-alpha, which a second pass counts at alpha: the same mean.
    """
    finite = torch.isfinite(blocked)
    magnitude = torch.where(finite, blocked.abs(), torch.zeros_like(blocked))
    return masked_mean(magnitude, finite, dims)


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class Binary(FormatSpec):
    """Sign binarisation, bipolar {-1, +1} or unipolar {0, 1}, optionally scaled (see the module doc)."""

    format_name = "binary"
    roundings = ("nearest_even", "stochastic")

    width: int = 1
    bipolar: bool = True
    stochastic: bool = False
    scaling_factor: bool = False
    axis: int | None = None
    alpha: float | tuple[float, ...] | None = None

    def validate(self) -> None:
        check_int(self, "width", 1, 1)
        for name in ("bipolar", "stochastic", "scaling_factor"):
            check_bool(self, name)
        check_axis(self)
        check_given_alpha(self)
        # One truth for stochastic: the flag (MASE's key) and rounding="stochastic" mean the same.
        if self.stochastic or self.rounding == "stochastic":
            object.__setattr__(self, "stochastic", True)
            object.__setattr__(self, "rounding", "stochastic")

    @property
    def bits(self) -> int:
        return 1

    def bits_per_element(self, shape: tuple[int, ...] | None = None) -> float:
        """One bit, plus a float32 scale per tensor / channel when ``scaling_factor`` is set (a given
        ``alpha`` is a parameter of the format, as ``affine``'s given scale: one bit)."""
        if shape is None or not self.scaling_factor or self.alpha is not None:
            return 1.0
        return scaled_bits_per_element(1, 32, shape, None, self.axis)

    def value_set(self) -> torch.Tensor | None:
        unit = torch.tensor([-1.0, 1.0] if self.bipolar else [0.0, 1.0], dtype=torch.float64)
        if not self.scaling_factor:
            return unit
        return unit * self.alpha[0] if self.alpha is not None and len(self.alpha) == 1 else None

    def _quantize(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        if not self.scaling_factor:
            return self._binarize(x, torch.ones((), dtype=x.dtype, device=x.device), generator)
        if self.alpha is not None:
            return self._binarize(x, given_alpha(self, x), generator)
        block = block_shape(x.shape, None, self.axis)
        return apply_blockwise(x, block, lambda b, dims: self._binarize(b, self._scale(b, dims), generator))

    def _native(self, x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor | None:
        if self.stochastic:
            return None
        return sign_log.binary(x, self.axis, self.bipolar, self.scaling_factor, self.alpha)

    native_takes_halves = True

    def _scale(self, blocked: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
        """alpha per block: the least-squares scale of the signs this format will choose."""
        if self.bipolar:
            return mean_abs(blocked, dims)
        return masked_mean(blocked, torch.isfinite(blocked) & (blocked > 0), dims)

    def _binarize(self, x: torch.Tensor, alpha: torch.Tensor, generator) -> torch.Tensor:
        low = -1.0 if self.bipolar else 0.0
        if self.stochastic:
            unit = x / torch.where(alpha > 0, alpha, torch.ones_like(alpha))
            p_high = ((unit + 1) / 2 if self.bipolar else unit).clamp(0, 1)
            high = torch.rand(x.shape, generator=generator, dtype=x.dtype, device=x.device) < p_high
        else:
            high = x >= 0 if self.bipolar else x > 0
        out = torch.where(high, alpha, low * alpha)
        return torch.where(torch.isnan(x), x, out)


def check_given_alpha(spec: FormatSpec) -> None:
    """``alpha``: None, or given scales (finite, in float32's normal range) that need ``scaling_factor``."""
    if check_given_scales(spec, "alpha") is not None and not spec.scaling_factor:
        raise FormatError(f"{spec.format_name}: alpha={spec.alpha!r} needs scaling_factor=True (alpha is the scale)")


def given_alpha(spec: FormatSpec, x: torch.Tensor) -> torch.Tensor:
    """The given ``alpha`` in x's dtype, shaped to broadcast over ``x`` (per tensor or along ``axis``)."""
    return given_per_axis(spec.alpha, x, spec.axis, f"{spec.format_name}: alpha")


@functools.lru_cache(maxsize=64)
def residual_values(means: tuple[float, ...]) -> tuple[float, ...]:
    """The distinct signed sums +-m_1 +- ... +- m_L, sorted ascending.

    Each sum is computed exactly (fsum) and sums closer than 1e-9 of the total are merged, keeping the
    smaller magnitude: e.g. 1/2 - 1/3 - 1/6 is 2.8e-17 in floats but must be the value zero. Merging the
    magnitudes and mirroring them keeps the set exactly sign-symmetric.
    """
    tolerance = 1e-9 * math.fsum(means)
    signs = itertools.product((-1.0, 1.0), repeat=len(means))
    magnitudes = sorted({abs(math.fsum(s * m for s, m in zip(pattern, means, strict=True))) for pattern in signs})
    kept: list[float] = []
    for value in magnitudes:
        value = 0.0 if value <= tolerance else value
        if not kept or value - kept[-1] > tolerance:
            kept.append(value)
    return tuple([-v for v in reversed(kept) if v > 0] + kept)


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class BinaryResidual(FormatSpec):
    """Residual sign with ``levels`` positive magnitudes ``means`` (see the module doc)."""

    format_name = "binary_residual"
    roundings = ("nearest_even",)

    width: int = 1
    levels: int = 2
    means: tuple[float, ...] | None = None

    def validate(self) -> None:
        check_int(self, "width", 1, 1)
        check_int(self, "levels", 1, 8)
        means = check_optional(self, "means")
        if means is None:
            total = self.levels * (self.levels + 1) / 2
            means = tuple((self.levels - i) / total for i in range(self.levels))
        object.__setattr__(self, "means", self._check_means(means))
        # The exact grid (float64 values), each value rounded to every compute dtype (two may coincide once
        # rounded: index i is still the i-th exact value), and the thresholds that decide: nearest to the
        # exact values, ties away from zero, a tie at 0 by the sign bit (formats/_nearest_table.py).
        exact = residual_values(self.means)
        grids = {dtype: tuple(torch.tensor(exact, dtype=dtype).tolist()) for dtype in (torch.float32, torch.float64)}
        object.__setattr__(self, "_grids", grids)
        object.__setattr__(self, "_thresholds", {dtype: thresholds(exact, dtype, "away") for dtype in grids})

    def _check_means(self, means) -> tuple[float, ...]:
        legal = f"must be {self.levels} finite positive numbers (one per level)"
        try:
            items = means.tolist() if isinstance(means, torch.Tensor) else means
            if not isinstance(items, (list, tuple)) or not all(is_number(m) for m in items):
                raise TypeError  # a string, bytes or bools are no list of magnitudes
            values = tuple(float(m) for m in items)
        except (TypeError, ValueError):
            raise FormatError(f"{self.format_name}: means={means!r} is invalid; {legal}") from None
        if len(values) != self.levels or not all(math.isfinite(m) and m > 0 for m in values):
            raise FormatError(f"{self.format_name}: means={means!r} is invalid; {legal}")
        return values

    @property
    def bits(self) -> int:
        return self.levels

    def value_set(self) -> torch.Tensor:
        return torch.tensor(residual_values(self.means), dtype=torch.float64)

    def _quantize(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        values = torch.tensor(self._grids[x.dtype], dtype=x.dtype, device=x.device)
        # In compiled kernels, counting (elementwise, fused) beats a binary search up to 16 values; eager
        # PyTorch is faster with bucketize. Both give the same index.
        counted = values.numel() <= _COUNTED_GRID_SIZE and torch.compiler.is_compiling()
        index = nearest_index(x, self._thresholds[x.dtype], counted)
        out = values.take(index)  # not values[index]: a 0-d index tensor would be read back as a Python int
        return torch.where(torch.isnan(x), x, out)

    def _native(self, x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor | None:
        return sign_log.residual(x, self._thresholds[torch.float32], self._grids[torch.float32])

    native_takes_halves = True
