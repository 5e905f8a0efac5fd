"""Binary formats: ``binary`` (one bit per element) and ``binary_residual`` (L residual sign levels).

``binary``: bipolar values {-1, +1} (x >= 0 -> +1, so +-0 -> +1) or unipolar {0, 1} (x > 0 -> 1), optionally
times alpha = mean |x| (per tensor, or per index of ``axis``). Stochastic rounding draws +1 with probability
clamp((x / alpha + 1) / 2, 0, 1) (bipolar) or clamp(x / alpha, 0, 1) (unipolar), so E[y] = x inside the
range: unbiased. NaN stays NaN; +-inf take the sign's value.

``binary_residual`` (ReActNet / LUTNet residual sign): r = x; for each level l: s_l = sign(r) * m_l
(sign(0) = +1), r -= s_l; y = sum_l s_l. With L levels there are 2^L values (every signed sum of the m_l).
The default magnitudes are MASE's (L, L-1, ..., 1) / sum, e.g. (2/3, 1/3) for L = 2.
"""

from __future__ import annotations

import dataclasses
import itertools

import torch

from lowbit.errors import FormatError
from lowbit.formats._base import FormatSpec, check_axis, check_bool, check_int, check_optional
from lowbit.formats._registry import register
from lowbit.formats.blocking import apply_blockwise, block_shape


def mean_abs(blocked: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """mean |x| per block over finite elements."""
    finite = torch.isfinite(blocked)
    magnitude = torch.where(finite, blocked.abs(), torch.zeros_like(blocked))
    count = finite.sum(dim=dims, keepdim=True).clamp(min=1)
    return magnitude.sum(dim=dims, keepdim=True) / count


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class Binary(FormatSpec):
    """Sign binarisation, bipolar {-1, +1} or unipolar {0, 1}, optionally scaled by mean |x|."""

    format_name = "binary"
    roundings = ("nearest_even", "stochastic")

    width: int = 1
    bipolar: bool = True
    stochastic: bool = False
    scaling_factor: bool = False
    axis: int | None = None

    def validate(self) -> None:
        check_int(self, "width", 1, 1)
        for name in ("bipolar", "stochastic", "scaling_factor"):
            check_bool(self, name)
        check_axis(self)
        # One truth for stochastic: the flag (MASE's key) and rounding="stochastic" mean the same.
        if self.stochastic or self.rounding == "stochastic":
            object.__setattr__(self, "stochastic", True)
            object.__setattr__(self, "rounding", "stochastic")

    @property
    def bits(self) -> int:
        return 1

    def value_set(self) -> torch.Tensor | None:
        if self.scaling_factor:
            return None
        return torch.tensor([-1.0, 1.0] if self.bipolar else [0.0, 1.0], dtype=torch.float64)

    def _quantize(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        if not self.scaling_factor:
            return self._binarize(x, torch.ones((), dtype=x.dtype, device=x.device), generator)
        block = block_shape(x.shape, None, self.axis)
        return apply_blockwise(x, block, lambda b, dims: self._binarize(b, mean_abs(b, dims), generator))

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


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class BinaryResidual(FormatSpec):
    """Residual sign with ``levels`` magnitudes ``means`` (positive, non-increasing)."""

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
        means = tuple(float(m) for m in (means.tolist() if isinstance(means, torch.Tensor) else means))
        if len(means) != self.levels:
            raise FormatError(f"{self.format_name}: means has {len(means)} entries but levels={self.levels}")
        if any(m <= 0 for m in means) or any(a < b for a, b in zip(means, means[1:])):
            raise FormatError(f"{self.format_name}: means={means} must be positive and non-increasing")
        object.__setattr__(self, "means", means)

    @property
    def bits(self) -> int:
        return self.levels

    def value_set(self) -> torch.Tensor:
        sums = {sum(s * m for s, m in zip(signs, self.means)) for signs in itertools.product((-1, 1), repeat=self.levels)}
        return torch.tensor(sorted(sums), dtype=torch.float64)

    def _quantize(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        residual = x
        out = torch.zeros_like(x)
        for magnitude in self.means:
            level = torch.where(residual >= 0, magnitude, -magnitude)
            out = out + level
            residual = residual - level
        return torch.where(torch.isnan(x), x, out)
