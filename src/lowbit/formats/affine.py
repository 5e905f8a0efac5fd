"""Affine (scale + zero point) formats: seed 004's round(a*x + b) family.

``affine``: codes q = clamp(round(a*x) + b, q_min, q_max), value y = (q - b) / a, with a = 1 / scale and b the
zero point. The scale is either given or derived from the data by min-max at a granularity (per tensor, per
channel via ``axis``, ND blocks via ``block_size``); ``symmetric`` fixes b = 0; ``power_of_two`` rounds the
scale up to a power of two (a block exponent); ``scale_dtype`` rounds the scale to the precision it is stored
in; ``rounding="stochastic"`` is unbiased. See docs/formats/integer.md.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, NamedTuple

import torch

from lowbit.casting import narrow_toward
from lowbit.errors import FormatError
from lowbit.formats._base import (
    SCALE_DTYPES,
    FormatSpec,
    check_axis,
    check_block_size,
    check_bool,
    check_choice,
    check_given_scales,
    check_int,
    check_optional,
    check_tensor,
    is_number,
)
from lowbit.formats._registry import register
from lowbit.formats.blocking import (
    apply_blockwise,
    block_shape,
    finite_abs_max,
    finite_min_max,
    normalize_axis,
    scaled_bits_per_element,
)
from lowbit.formats.integer import code_range
from lowbit.formats.rounding import DIRECTED_MODES, correct_directed, round_to_integer
from lowbit.formats.scaling import (
    SCALE_DTYPE_BITS,
    ceil_power_of_two,
    round_scale,
    round_scale_down,
    round_scale_up,
    safe_scale,
    shorten_scale,
)
from lowbit.native import integer as native_integer


_SETTLE_ROUNDS = 4  # re-derivations of settled parameters (parameters_from_block)


class AffineParameters(NamedTuple):
    """The scale and zero point of every element (both shaped like the quantized tensor)."""

    scale: torch.Tensor
    zero_point: torch.Tensor


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class Affine(FormatSpec):
    """Uniform integer codes with a scale and a zero point: y = (clamp(round(x / scale) + zp) - zp) * scale.

    Codes q in [q_min, q_max]: [-2^(bits-1), 2^(bits-1) - 1] signed (narrow_range drops -2^(bits-1)),
    [0, 2^bits - 1] unsigned. Values: (q - zp) * scale, so max = (q_max - zp) * scale, min =
    (q_min - zp) * scale; an evenly spaced grid, no subnormals. Zero is always exact (the code zp).

    Given ``scale`` (and ``zero_point``, default 0) are used as they are: a number, or one entry per index
    of ``axis`` (``power_of_two`` rounds a given scale up to a power of two, ``scale_dtype`` to the
    nearest f16 / bf16 value). x / scale is computed as x * (1 / scale), bit for bit as
    torch.fake_quantize_* does; the directed modes then compare against the grid values themselves, so a
    value on the grid never moves.

    Otherwise scale and zero point come from the data per block (min-max over finite elements):
    symmetric scale = max|x| / q_max, so +-max|x| land on the end codes (exact up to float rounding of
    q_max * scale) and the format is sign symmetric (-inf saturates at -q_max; the most negative signed
    code stays unused); asymmetric scale = (max - min) /
    (q_max - q_min) over a range widened to include zero, zero point = q_min - R(min / scale) with R the
    format's rounding mode (nearest for stochastic), so min lands on the first code and re-quantizing a
    quantized tensor re-derives the same grid under every deterministic mode.
    ``power_of_two`` then rounds the scale up to a power of two and ``scale_dtype`` to the nearest f16 /
    bf16 value, or up to the next one where nearest would push a block extreme more than half a step past
    the codes: a block's maximum never saturates. A block whose scale would be zero or below the
    smallest normal float (all zeros, or magnitudes below about q_max * 1.2e-38) gets the smallest normal
    float as its scale, so it stays (nearly) zero and never produces NaN.

    Out-of-range values and +-inf saturate to the extreme codes; NaN stays NaN and does not affect the
    scale.
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
        # A given scale must keep 1 / scale and the codes finite in float32: [smallest normal, largest
        # finite] float32 (2^127 with power_of_two, which rounds it up to a power of two).
        scale = check_given_scales(self, "scale", "f32", largest=2.0**127 if self.power_of_two else None)
        zero_point = _as_tuple(self, "zero_point", int)
        if scale is None and zero_point is not None:
            raise FormatError(f"{self.format_name}: zero_point={self.zero_point!r} needs scale= as well")
        if scale is not None and self.block_size is not None:
            raise FormatError(f"{self.format_name}: give scale= or block_size=, not both")
        if zero_point is not None and len(zero_point) > 1 and self.axis is None:
            raise FormatError(
                f"{self.format_name}: {len(zero_point)} zero_point values need axis= to say which dimension they follow"
            )
        q_min, q_max = self.code_range
        if self.symmetric and q_max < 1:
            raise FormatError(
                f"{self.format_name}: symmetric=True needs a positive largest code; bits={self.bits} signed "
                f"codes are [{q_min}, {q_max}] (use bits >= 2 or signed=False)"
            )
        for zp in zero_point or ():
            if not q_min <= zp <= q_max:
                raise FormatError(f"{self.format_name}: zero_point={zp} is outside the code range [{q_min}, {q_max}]")
            if self.symmetric and zp != 0:
                raise FormatError(f"{self.format_name}: symmetric=True needs zero_point=0, got {zp}")

    # ---- description --------------------------------------------------------------------------------
    @property
    def code_range(self) -> tuple[int, int]:
        return code_range(self.bits, self.signed, self.narrow_range)

    @property
    def clamp_range(self) -> tuple[int, int]:
        """The codes quantized values can take: the code range, except that a data-derived symmetric scale
        (max|x| = q_max steps) also saturates -inf at -q_max, keeping the format sign symmetric and its own
        output's scale equal to the scale it was quantized with (idempotence)."""
        q_min, q_max = self.code_range
        if self.scale is None and self.symmetric and not self.full_range_scale:
            return max(q_min, -q_max), q_max
        return q_min, q_max

    def bits_per_element(self, shape: tuple[int, ...] | None = None) -> float:
        """Code bits plus the scale (and zero point) bits shared by each block, per element."""
        if self.scale is not None:
            return float(self.bits)
        per_block = SCALE_DTYPE_BITS[self.scale_dtype] + (0 if self.symmetric else self.bits)
        return scaled_bits_per_element(self.bits, per_block, shape, self.block_size, self.axis, self.skip_first_dim)

    def value_set(self) -> torch.Tensor | None:
        if self.scale is None or len(self.scale) != 1 or len(self.zero_point or (0,)) != 1:
            return None  # data-derived, or one grid per channel
        q_min, q_max = self.clamp_range
        # The scale as quantization rounds it; float64 products are the grid of a float64 input (a float32
        # input gets these values rounded to float32, which is what its own arithmetic gives).
        scale, zero_point = self._given_parameters(torch.zeros((), dtype=torch.float64))
        return (torch.arange(q_min, q_max + 1, dtype=torch.float64) - zero_point) * scale

    # ---- quantization -------------------------------------------------------------------------------
    def _native(self, x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor | None:
        if self.settle_dtype(x.dtype, out_dtype) is not None:
            return None  # parameters settled for a narrower dtype: the eager path (parameters_from_block)
        return native_integer.affine(x, self, block_shape)

    native_takes_halves = True  # the kernel declines halves per channel of an inner dimension and in rows past a tile

    def _quantize(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        if self.scale is not None:
            scale, zero_point = self._given_parameters(x)
            return self._fake_quantize(x, scale, zero_point, generator)
        block = block_shape(x.shape, self.block_size, self.axis, self.skip_first_dim)
        return apply_blockwise(x, block, lambda blocked, dims: self._quantize_block(blocked, dims, generator))

    def _quantize_for(self, x: torch.Tensor, generator: torch.Generator | None, out_dtype: torch.dtype) -> torch.Tensor:
        """``_quantize``, with parameters settled for ``out_dtype`` where ``settle_dtype`` says so."""
        settle = self.settle_dtype(x.dtype, out_dtype)
        if settle is None:
            return self._quantize(x, generator)
        block = block_shape(x.shape, self.block_size, self.axis, self.skip_first_dim)
        return apply_blockwise(x, block, lambda blocked, dims: self._quantize_block(blocked, dims, generator, settle))

    def settle_dtype(self, work_dtype: torch.dtype, out_dtype: torch.dtype) -> torch.dtype | None:
        """The dtype min-max parameters are settled for (``parameters_from_block``): a narrower ``out_dtype``
        of a directed mode (toward_zero's pinned scale is settled already) on float32 work; else None."""
        settled = self.rounding in DIRECTED_MODES and not self._pins_scale and self.scale is None
        narrow = work_dtype == torch.float32 and out_dtype not in (torch.float32, torch.float64)
        return out_dtype if settled and narrow else None

    def _quantize_block(self, blocked: torch.Tensor, dims: tuple[int, ...], generator, settle=None) -> torch.Tensor:
        scale, zero_point = self.parameters_from_block(blocked, dims, settle)
        out = self._fake_quantize(blocked, scale, zero_point, generator)
        return out if settle is None else self._settled_output(out, blocked, dims, settle)

    def _settled_output(self, out: torch.Tensor, blocked: torch.Tensor, dims: tuple[int, ...],
                        settle: torch.dtype) -> torch.Tensor:  # fmt: skip
        """``out`` narrowed to ``settle`` (toward ``blocked``) and, where a second pass would still move it (the
        settled parameters of a longer cycle), passed again until a pass leaves it: the result a second call
        gives back unchanged. Each pass keeps the mode's direction from its own input, so the last keeps it
        from ``blocked``; a block needs at most one extra pass in practice (tests/formats/test_affine_settle.py).
        """
        out = narrow_toward(out, blocked, settle).float()
        for _ in range(_SETTLE_ROUNDS):
            scale, zero_point = self._min_max_parameters(out, dims)
            again = narrow_toward(self._fake_quantize(out, scale, zero_point, None), out, settle).float()
            if bool(((again == out) | (again.isnan() & out.isnan())).all()):
                return out
            out = again
        raise FormatError(f"{self.format_name}: rounding={self.rounding!r} found no result that a second pass "
                          f"leaves in {settle} after {_SETTLE_ROUNDS} passes; quantize in float32 instead")

    def parameters_from_block(self, blocked: torch.Tensor, dims: tuple[int, ...],
                              settle: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """(scale, zero_point) per block from min-max statistics (broadcastable over ``blocked``).

        ``settle``: the narrower dtype a directed result is narrowed to (``casting.narrow_toward``). The narrowed
        extremes must re-derive the same parameters, or a second pass moves values a step (in float32 they land
        on the end codes; narrowed they need not), so the parameters are re-derived from the narrowed result
        until they reproduce themselves (at most ``_SETTLE_ROUNDS`` times). A two-cycle takes the larger scale
        whichever set it started from, so a second pass chooses the same; longer cycles are not resolved.
        """
        scale, zero_point = self._min_max_parameters(blocked, dims)
        if settle is None:
            return scale, zero_point
        before = (scale, zero_point)
        for _ in range(_SETTLE_ROUNDS):
            narrowed = narrow_toward(self._fake_quantize(blocked, scale, zero_point, None), blocked, settle).float()
            again = self._min_max_parameters(narrowed, dims)
            if torch.equal(again[0], scale) and torch.equal(again[1], zero_point):
                return scale, zero_point  # every block settled
            before, (scale, zero_point) = (scale, zero_point), again
        later = (scale > before[0]) | ((scale == before[0]) & (zero_point >= before[1]))
        return torch.where(later, scale, before[0]), torch.where(later, zero_point, before[1])

    def _min_max_parameters(self, blocked: torch.Tensor, dims: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        q_min, q_max = self.code_range
        if self.symmetric and self.full_range_scale:
            # Every code in use: the negative side may reach q_min, the positive side q_max.
            low, high = finite_min_max(blocked, dims)
            return self._fit_scale(torch.maximum(low / q_min, high / q_max), low, high)
        if self.symmetric:
            amax = finite_abs_max(blocked, dims)
            return self._fit_scale(amax / q_max, -amax, amax)
        low, high = finite_min_max(blocked, dims)
        levels = q_max - q_min
        if self._covers_range:
            levels -= 1  # one step of headroom, so that both ends of the range lie inside the codes
        span = high - low  # overflows to inf only for a range wider than the float range: split it then
        raw = torch.where(torch.isinf(span), high / levels - low / levels, span / levels)
        if self._covers_range:
            return self._covering_scale(raw, low, high)
        scale, zero_point = self._fit_scale(raw, low, high)
        if self._pins_scale:
            return self._pinned_scale(scale, zero_point, low, high), zero_point
        return scale, zero_point

    @property
    def _pins_scale(self) -> bool:
        """toward_zero with derived asymmetric parameters (not power_of_two: a scale rounded down to a power
        of two could halve the grid's range); see ``_pinned_scale``."""
        return self.rounding == "toward_zero" and not self.power_of_two

    def _pinned_scale(self, scale: torch.Tensor, zero_point: torch.Tensor, low: torch.Tensor,
                      high: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """The largest scale (rounded down at every step) that puts low and high on or past the end codes
        around ``zero_point`` (see ``_pins_scale``).

        Rounding toward zero pulls both extremes of a block inward, so with the min-max scale the output's
        range is a step narrower than the codes and re-deriving from it gives a smaller scale (the grid moves
        on every pass). Pinned, the extremes round onto the end codes (a value at or past an integer never
        rounds back across it; outputs stay inside [low, high], as toward_zero requires), and a quantized
        block re-derives the same zero point and this same scale exactly.
        """
        q_min, q_max = self.code_range
        above, below = q_max - zero_point, zero_point - q_min  # codes on each side of zero
        inf = torch.full_like(scale, math.inf)
        from_high = torch.where(above > 0, high / above.clamp(min=1), inf)
        from_low = torch.where(below > 0, -low / below.clamp(min=1), inf)
        pinned = torch.minimum(torch.minimum(from_high, from_low), scale)
        pinned = round_scale_down(safe_scale(pinned), self.scale_dtype)
        return shorten_scale(safe_scale(pinned), self.bits)

    @property
    def _covers_range(self) -> bool:
        """Stochastic rounding of derived asymmetric parameters: the grid must cover [low, high].

        The zero point is an integer (zero stays exact), so low and high cannot both be codes in general; a
        grid that rounds low's code to nearest leaves the other end up to half a step past the last code,
        where draws are clamped and E[y] != x. With one step of headroom and low's code rounded down,
        every element of the range lies between two codes and is rounded without bias.
        """
        q_min, q_max = self.code_range
        return self.is_stochastic and not self.symmetric and q_max - q_min > 1

    def _covering_scale(self, raw: torch.Tensor, low: torch.Tensor, high: torch.Tensor):
        """(scale, zero point) whose grid covers [low, high]: the scale never rounds below ``raw`` (its
        stored and shortened forms are rounded up), the zero point puts low on or above the first code."""
        raw = safe_scale(raw) * (1 + 2.0 ** (self.bits - 22))  # room for shorten_scale's rounding down
        if self.power_of_two:
            raw = ceil_power_of_two(raw)
        scale = shorten_scale(safe_scale(round_scale_up(raw, self.scale_dtype)), self.bits)
        zero_point = self._floor_zero_point(low, scale)
        # float rounding of high / scale can still land a hair past the last code (rarely): widen there
        q_min, q_max = self.clamp_range
        inverse = 1.0 / scale
        past = (high * inverse + zero_point > q_max) | (low * inverse + zero_point < q_min)
        scale = torch.where(past, scale * 2, scale)
        return scale, self._floor_zero_point(low, scale)

    def _floor_zero_point(self, low: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        q_min, q_max = self.code_range
        return (q_min - torch.floor(low * (1.0 / scale))).clamp(q_min, q_max)

    def _fit_scale(self, raw: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Scale and zero point from the raw min-max scale of blocks spanning [low, high].

        The scale goes to a power of two (up) if asked, then to its stored precision: to nearest, as a
        plain cast stores it, except where that would put the block's low or high more than half a step
        past the codes; there it is rounded up instead, so a block's extremes never saturate. Directed modes
        round it down instead: a stored scale above the min-max one would leave an end code unused under
        "up" / "down" (the extremes move inward and the next pass derives a smaller scale); rounded down,
        the extremes land on or just past the end codes (saturating by less than 2^-7 of the range for
        bf16) and the output re-derives the same scale.
        """
        raw = safe_scale(raw)
        if self.power_of_two:
            raw = ceil_power_of_two(raw)
        if self.rounding in DIRECTED_MODES:
            scale = shorten_scale(safe_scale(round_scale_down(raw, self.scale_dtype)), self.bits)
            return scale, self._derived_zero_point(low, scale)
        scale = safe_scale(round_scale(raw, self.scale_dtype))
        zero_point = self._derived_zero_point(low, scale)
        if self.scale_dtype != "f32":
            q_min, q_max = self.clamp_range
            inverse = 1.0 / scale
            past = (high * inverse + zero_point > q_max + 0.5) | (low * inverse + zero_point < q_min - 0.5)
            scale = torch.where(past, safe_scale(round_scale_up(raw, self.scale_dtype)), scale)
        scale = shorten_scale(scale, self.bits)
        return scale, self._derived_zero_point(low, scale)

    def _derived_zero_point(self, low: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """0 for a symmetric format; else the code of zero, so that ``low`` lands on the first code."""
        if self.symmetric:
            return torch.zeros_like(scale)
        q_min, q_max = self.code_range
        if self.is_stochastic or self._pins_scale:  # pinned scales: see _pinned_scale
            low_steps = torch.round(low * (1.0 / scale))
        else:
            # low's steps under the format's own rounding, exactly as its code is computed: low lands on the
            # first code, so a quantized tensor's minimum re-derives the same zero point and scale (with
            # round-to-nearest here, "up" would lift low off the first code and move the grid next pass).
            low_steps = self._round_steps(low, scale, None)
        return (q_min - low_steps).clamp(q_min, q_max)

    def _given_parameters(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The given scale and zero point, shaped to broadcast over ``x`` (per channel along ``axis``)."""
        scale = torch.tensor(self.scale, dtype=x.dtype, device=x.device)
        if self.power_of_two:
            scale = ceil_power_of_two(scale)
        scale = round_scale(scale, self.scale_dtype)
        zero_point = torch.tensor(self.zero_point or (0,), dtype=x.dtype, device=x.device)
        view = [1] * x.dim()  # a 0-d x keeps its 0-d shape
        if self.axis is not None:
            axis = normalize_axis(self.axis, x.dim())
            length = x.shape[axis] if x.dim() else 1
            for name, count in (("scale", len(self.scale)), ("zero_point", len(self.zero_point or (0,)))):
                if count != 1 and count != length:  # plain ints: torch.compile traces the check as a guard
                    raise FormatError(
                        f"{self.format_name}: {count} {name} values do not match dimension {axis} "
                        f"of size {length} (axis={self.axis}, tensor shape {tuple(x.shape)})"
                    )
            if x.dim():
                view[axis] = -1
        return scale.reshape(view), zero_point.reshape(view)

    def scale_and_zero_point(self, x: torch.Tensor) -> AffineParameters:
        """The scale and zero point each element of ``x`` is quantized with, both shaped like ``x``.

        Given parameters are broadcast; derived ones are computed from ``x`` exactly as quantization does
        (float32 math for float16 / bfloat16 input, float64 for float64). A directed mode's result narrowed to
        a half / float8 dtype is not on this grid: it is narrowed toward x, and where a second pass would have
        moved it, passed again (``_settled_output``).
        """
        check_tensor(x)
        work = x.detach() if x.dtype in (torch.float32, torch.float64) else x.detach().float()
        if self.scale is not None:
            scale, zero_point = self._given_parameters(work)
        elif work.numel() == 0:
            scale, zero_point = torch.ones_like(work), torch.zeros_like(work)
        else:
            block = block_shape(work.shape, self.block_size, self.axis, self.skip_first_dim)
            settle = self.settle_dtype(work.dtype, x.dtype)
            scale, zero_point = (apply_blockwise(work, block, lambda b, dims, i=i: self.parameters_from_block(
                b, dims, settle)[i].expand_as(b)) for i in (0, 1))  # fmt: skip
        return AffineParameters(scale.expand_as(work).clone(), zero_point.expand_as(work).clone())

    def _fake_quantize(self, x, scale, zero_point, generator) -> torch.Tensor:
        q_min, q_max = self.clamp_range
        steps = self._round_steps(x, scale, generator)
        out = ((steps + zero_point).clamp(q_min, q_max) - zero_point) * scale
        # A scale rounded up (power of two) for data near the top of the float range can put the extreme
        # grid values beyond it; saturate there rather than return inf for finite input.
        limit = torch.finfo(out.dtype).max
        return out.clamp(-limit, limit)

    def _round_steps(self, x: torch.Tensor, scale: torch.Tensor, generator) -> torch.Tensor:
        """round(x / scale) by the rounding mode: the signed number of steps of the value from zero."""
        scaled = x * (1.0 / scale)  # round(a*x + b) with a = 1/scale, as torch.fake_quantize_* computes it
        steps = round_to_integer(scaled, self.rounding, generator)
        if self.rounding in DIRECTED_MODES:
            return correct_directed(x, scale, steps, self.rounding)
        if self.is_stochastic:
            nearest = torch.round(scaled)
            return torch.where(nearest * scale == x, nearest, steps)  # values on the grid stay put
        return steps


def _as_tuple(spec: FormatSpec, name: str, kind: type) -> tuple | None:
    """Normalise a number / list / tensor parameter to a tuple of ``kind`` (None stays None)."""
    value = check_optional(spec, name)
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        value = value.detach().flatten().tolist()
    items = value if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise FormatError(f"{spec.format_name}: {name} is empty")
    if not all(is_number(v) and math.isfinite(v) for v in items):  # no bools, strings or bytes
        raise FormatError(f"{spec.format_name}: {name}={value!r} is invalid; expected finite numbers")
    converted = tuple(kind(v) for v in items)
    if kind is int and any(float(v) != c for v, c in zip(items, converted, strict=True)):
        raise FormatError(f"{spec.format_name}: {name}={value!r} must be integers")
    object.__setattr__(spec, name, converted)
    return converted
