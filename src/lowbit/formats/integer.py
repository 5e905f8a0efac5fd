"""Integer, fixed-point and affine (scale + zero point) formats.

``integer`` / ``fixed`` (MASE): y = clamp(round(x * 2^f), q_min, q_max) / 2^f with width w and frac_width f;
signed codes [-2^(w-1), 2^(w-1) - 1], unsigned [0, 2^w - 1]. Any f works, negative or larger than w.

``affine`` (seed 004's round(a*x + b) family): codes q = clamp(round(a*x) + b, q_min, q_max), value
y = (q - b) / a, with a = 1 / scale and b the zero point. The scale is either given or derived from the
data by min-max at a granularity (per tensor, per channel via ``axis``, ND blocks via ``block_size``);
``symmetric`` fixes b = 0; ``power_of_two`` rounds the scale up to a power of two (a block exponent);
``scale_dtype`` rounds the scale to the precision it is stored in; ``rounding="stochastic"`` is unbiased.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import torch

from lowbit.errors import FormatError
from lowbit.formats._base import (
    SCALE_DTYPES,
    FormatSpec,
    check_axis,
    check_block_size,
    check_bool,
    check_choice,
    check_int,
    check_optional,
)
from lowbit.formats._registry import register
from lowbit.formats.blocking import apply_blockwise, block_shape, finite_abs_max, finite_min_max, normalize_axis
from lowbit.formats.blocking import num_blocks
from lowbit.formats.rounding import round_to_integer
from lowbit.formats.scaling import SCALE_DTYPE_BITS, ceil_power_of_two, round_scale, safe_scale


def code_range(bits: int, signed: bool, narrow_range: bool = False) -> tuple[int, int]:
    """(q_min, q_max) of a ``bits``-wide integer code; narrow_range drops the most negative code."""
    if signed:
        return -(2 ** (bits - 1)) + int(narrow_range), 2 ** (bits - 1) - 1
    return 0, 2**bits - 1


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class Integer(FormatSpec):
    """Fixed point: ``width`` bits, ``frac_width`` of them after the binary point (default width // 2).

    Values: k / 2^frac_width for every code k. Saturates out-of-range values and +-inf to the extreme
    codes; NaN stays NaN; zero is the code 0.
    """

    format_name = "integer"

    width: int = 8
    frac_width: int | None = None
    signed: bool = True

    def validate(self) -> None:
        check_int(self, "width", 1, 32)
        if check_optional(self, "frac_width") is None:
            object.__setattr__(self, "frac_width", self.width // 2)
        check_int(self, "frac_width", -64, 64)
        check_bool(self, "signed")

    @property
    def bits(self) -> int:
        return self.width

    @property
    def code_range(self) -> tuple[int, int]:
        return code_range(self.width, self.signed)

    @property
    def step(self) -> float:
        return math.ldexp(1.0, -self.frac_width)

    def _quantize(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        q_min, q_max = self.code_range
        scaled = x * math.ldexp(1.0, self.frac_width)  # a power of two: exact
        codes = round_to_integer(scaled, self.rounding, generator).clamp(q_min, q_max)
        return codes * self.step

    def value_set(self) -> torch.Tensor:
        q_min, q_max = self.code_range
        return torch.arange(q_min, q_max + 1, dtype=torch.float64) * self.step


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class Fixed(Integer):
    """MASE's ``fixed``: the same format as ``integer``."""

    format_name = "fixed"


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class Affine(FormatSpec):
    """Uniform integer codes with a scale and a zero point: y = (clamp(round(x / scale) + zp) - zp) * scale.

    Given ``scale`` (and ``zero_point``) are used as they are: a number, or one entry per index of
    ``axis``. Otherwise they come from the data per block (min-max): symmetric scale = max|x| / q_max (so
    +-max|x| are exact; a signed format's most negative code then only takes clamped values); asymmetric scale = (max - min) / (q_max - q_min) over a range
    widened to include zero, zero point = q_min - round(min / scale). An all-zero block gets the smallest
    normal scale, so it stays zero and never produces NaN.
    """

    format_name = "affine"
    # Symmetric scale divisor: q_max (so +-max|x| are exact), or (q_max - q_min) / 2 to use every code.
    full_range_scale: ClassVar[bool] = False

    bits: int = 8
    signed: bool = True
    symmetric: bool = False
    narrow_range: bool = False
    power_of_two: bool = False
    scale: float | tuple[float, ...] | None = None
    zero_point: int | tuple[int, ...] | None = None
    axis: int | None = None
    block_size: tuple[int, ...] | None = None
    skip_first_dim: bool = False
    scale_dtype: str = "f32"

    def validate(self) -> None:
        check_int(self, "bits", 1, 16)
        for name in ("signed", "symmetric", "narrow_range", "power_of_two", "skip_first_dim"):
            check_bool(self, name)
        if self.narrow_range and (not self.signed or self.bits < 2):
            raise FormatError(f"{self.format_name}: narrow_range=True needs signed codes of at least 2 bits")
        check_axis(self)
        check_block_size(self)
        check_choice(self, "scale_dtype", SCALE_DTYPES)
        self._validate_given_parameters()

    def _validate_given_parameters(self) -> None:
        scale = _as_tuple(self, "scale", float)
        zero_point = _as_tuple(self, "zero_point", int)
        if scale is None and zero_point is not None:
            raise FormatError(f"{self.format_name}: zero_point={self.zero_point!r} needs scale= as well")
        if scale is not None and self.block_size is not None:
            raise FormatError(f"{self.format_name}: give scale= or block_size=, not both")
        if scale is not None and any(not (math.isfinite(s) and s > 0) for s in scale):
            raise FormatError(f"{self.format_name}: scale={self.scale!r} is invalid; every scale must be finite and > 0")
        if scale is not None and len(scale) > 1 and self.axis is None:
            raise FormatError(f"{self.format_name}: {len(scale)} scales need axis= to say which dimension they follow")
        q_min, q_max = self.code_range
        for zp in zero_point or ():
            if not q_min <= zp <= q_max:
                raise FormatError(f"{self.format_name}: zero_point={zp} is outside the code range [{q_min}, {q_max}]")
            if self.symmetric and zp != 0:
                raise FormatError(f"{self.format_name}: symmetric=True needs zero_point=0, got {zp}")

    # ---- description --------------------------------------------------------------------------------
    @property
    def code_range(self) -> tuple[int, int]:
        return code_range(self.bits, self.signed, self.narrow_range)

    def bits_per_element(self, shape: tuple[int, ...] | None = None) -> float:
        """Code bits plus the scale (and zero point) bits shared by each block, per element."""
        if shape is None or self.scale is not None:
            return float(self.bits)
        numel = math.prod(shape)
        if numel == 0:
            return float(self.bits)
        per_block = SCALE_DTYPE_BITS[self.scale_dtype] + (0 if self.symmetric else self.bits)
        block = block_shape(shape, self.block_size, self.axis, self.skip_first_dim)
        return self.bits + per_block * num_blocks(shape, block) / numel

    def value_set(self) -> torch.Tensor | None:
        if self.scale is None or len(self.scale) != 1:
            return None
        q_min, q_max = self.code_range
        zp = self.zero_point[0] if self.zero_point else 0
        scale = torch.tensor(self.scale[0], dtype=torch.float32)
        return ((torch.arange(q_min, q_max + 1, dtype=torch.float32) - zp) * scale).double()

    # ---- quantization -------------------------------------------------------------------------------
    def _quantize(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        if self.scale is not None:
            scale, zero_point = self._given_parameters(x)
            return self._fake_quantize(x, scale, zero_point, generator)
        block = block_shape(x.shape, self.block_size, self.axis, self.skip_first_dim)
        return apply_blockwise(x, block, lambda blocked, dims: self._quantize_block(blocked, dims, generator))

    def _quantize_block(self, blocked: torch.Tensor, dims: tuple[int, ...], generator) -> torch.Tensor:
        scale, zero_point = self.parameters_from_block(blocked, dims)
        return self._fake_quantize(blocked, scale, zero_point, generator)

    def parameters_from_block(self, blocked: torch.Tensor, dims: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """(scale, zero_point) per block from min-max statistics (broadcastable over ``blocked``)."""
        q_min, q_max = self.code_range
        if self.symmetric:
            amax = finite_abs_max(blocked, dims)
            scale = amax / ((q_max - q_min) / 2 if self.full_range_scale else q_max)
            return self._finish_scale(scale), torch.zeros_like(scale)
        low, high = finite_min_max(blocked, dims)
        scale = self._finish_scale((high - low) / (q_max - q_min))
        zero_point = (q_min - torch.round(low / scale)).clamp(q_min, q_max)
        return scale, zero_point

    def _finish_scale(self, scale: torch.Tensor) -> torch.Tensor:
        scale = safe_scale(scale)
        if self.power_of_two:
            scale = ceil_power_of_two(scale)
        return safe_scale(round_scale(scale, self.scale_dtype))

    def _given_parameters(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scale = torch.tensor(self.scale, dtype=x.dtype, device=x.device)
        if self.power_of_two:
            scale = ceil_power_of_two(scale)
        scale = round_scale(scale, self.scale_dtype)
        zero_point = torch.tensor(self.zero_point or (0,), dtype=x.dtype, device=x.device)
        if self.axis is None:
            return scale, zero_point
        axis = normalize_axis(self.axis, x.dim())
        for name, values in (("scale", scale), ("zero_point", zero_point)):
            if values.numel() not in (1, x.shape[axis] if x.dim() else 1):
                raise FormatError(
                    f"{self.format_name}: {values.numel()} {name} values do not match dimension {axis} "
                    f"of size {x.shape[axis]}"
                )
        view = [1] * x.dim()
        if x.dim():
            view[axis] = -1
        return scale.reshape(view), zero_point.reshape(view)

    def _fake_quantize(self, x, scale, zero_point, generator) -> torch.Tensor:
        q_min, q_max = self.code_range
        inverse = 1.0 / scale  # round(a*x + b) with a = 1/scale, as torch.fake_quantize_* computes it
        codes = round_to_integer(x * inverse, self.rounding, generator) + zero_point
        return (codes.clamp(q_min, q_max) - zero_point) * scale


def _as_tuple(spec: FormatSpec, name: str, kind: type) -> tuple | None:
    """Normalise a number / list / tensor parameter to a tuple of ``kind`` (None stays None)."""
    value = check_optional(spec, name)
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        value = value.detach().flatten().tolist()
    items = value if isinstance(value, (list, tuple)) else [value]
    try:
        converted = tuple(kind(v) for v in items)
    except (TypeError, ValueError):
        raise FormatError(f"{spec.format_name}: {name}={value!r} is invalid; expected numbers") from None
    if not converted:
        raise FormatError(f"{spec.format_name}: {name} is empty")
    if kind is int and any(float(v) != c for v, c in zip(items, converted)):
        raise FormatError(f"{spec.format_name}: {name}={value!r} must be integers")
    object.__setattr__(spec, name, converted)
    return converted
