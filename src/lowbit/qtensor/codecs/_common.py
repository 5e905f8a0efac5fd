"""What every codec shares: the codec interface, block-grid helpers and the floating-point bit layouts.

A *codec* turns the fake-quantized values of one format family into integer codes plus per-block
parameters (scales, zero points, shared exponents), and back. It encodes from the values the format itself
produced (``spec._quantize_for`` on the work tensor), so rounding is never re-implemented here; the only
statistics it recomputes are per-block scales, with the format's own functions on the same blocked layout.

Per-block parameters are stored on the *block grid*: a tensor shaped ``[n0, n1, ...]`` with
``n_i = ceil(dim_i / block_i)`` for the concrete block shape (see ``lowbit.formats.blocking``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, NamedTuple

import torch

from lowbit.errors import FormatError
from lowbit.formats._base import FormatSpec
from lowbit.formats._float_grid import exact_pow2, floor_log2
from lowbit.formats.blocking import apply_blockwise


class Encoded(NamedTuple):
    """A codec's output: integer codes (shaped like the tensor), per-block parameters, the block shape."""

    codes: torch.Tensor
    params: dict[str, torch.Tensor]
    block: tuple[int, ...] | None


@dataclasses.dataclass(frozen=True)
class Codec:
    """Base class: ``names`` are the format names it handles; subclasses implement the four methods."""

    names: ClassVar[tuple[str, ...]] = ()

    def code_bits(self, spec: FormatSpec) -> int:
        """Width of one code."""
        raise NotImplementedError

    def code_signed(self, spec: FormatSpec) -> bool:
        """Whether codes are two's-complement signed integers (else unsigned bit patterns)."""
        return False

    def encode(self, spec: FormatSpec, work: torch.Tensor, values: torch.Tensor) -> Encoded:
        """Codes for ``values`` (the format's output on ``work``, in the compute dtype)."""
        raise NotImplementedError

    def decode(self, spec: FormatSpec, codes: torch.Tensor, params: dict[str, torch.Tensor],
               block: tuple[int, ...] | None, dtype: torch.dtype) -> torch.Tensor:  # fmt: skip
        """The values of ``codes`` in the compute ``dtype`` (bit for bit the format's output)."""
        raise NotImplementedError


# ---- block grids ------------------------------------------------------------------------------------------
def grid_shape(shape: Sequence[int], block: Sequence[int]) -> tuple[int, ...]:
    return tuple(-(-dim // b) for dim, b in zip(shape, block, strict=True))


def block_stat(x: torch.Tensor, block: Sequence[int], statistic: Callable[[torch.Tensor, tuple], Any]) -> Any:
    """``statistic(blocked, dims)`` over the blocked layout a format sees for ``block`` (the same reduction
    order), reshaped to the block grid; a statistic returning a tuple gives a tuple of grids."""
    found: list[Any] = []

    def record(blocked: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
        found.append(statistic(blocked, dims))
        return blocked

    apply_blockwise(x, block, record)
    shape = grid_shape(x.shape, block)
    result = found[0]
    if isinstance(result, tuple):
        return tuple(t.reshape(shape) for t in result)
    return result.reshape(shape)


def expand_blocks(grid: torch.Tensor, shape: Sequence[int], block: Sequence[int]) -> torch.Tensor:
    """A block-grid tensor repeated over every element of its block, shaped ``shape``."""
    shape = tuple(shape)
    if not shape:
        return grid.reshape(())
    if len(block) != len(shape):  # a stored block read back from a file
        raise FormatError(f"a block of shape {tuple(block)} does not fit codes of shape {shape}")
    counts = grid_shape(shape, block)
    if tuple(grid.shape) != counts:
        raise FormatError(f"block parameters of shape {tuple(grid.shape)} do not match the block grid {counts}")
    interleaved = [v for n, b in zip(counts, block, strict=True) for v in (n, b)]
    view = grid.reshape([v for n in counts for v in (n, 1)]).expand(interleaved)
    padded = view.reshape([n * b for n, b in zip(counts, block, strict=True)])
    return padded[tuple(slice(0, dim) for dim in shape)]


def smallest_int_dtype(low: int, high: int) -> torch.dtype:
    for dtype in (torch.int8, torch.int16, torch.int32):
        info = torch.iinfo(dtype)
        if info.min <= low and high <= info.max:
            return dtype
    return torch.int64


def as_int(values: torch.Tensor, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """Integer-valued floats as integers; FormatError if some value is not an integer (meta: unchecked)."""
    if values.device.type != "meta" and not torch.equal(values, torch.round(values)):
        raise FormatError("internal: expected integer-valued codes")
    return values.to(dtype)


def check_no_nan(spec: FormatSpec, values: torch.Tensor) -> None:
    if values.device.type == "meta":  # shapes only: no values to check
        return
    count = int(torch.isnan(values).sum())
    if count:
        raise FormatError(
            f"{spec.format_name}: cannot encode NaN: its codes have no NaN pattern ({count} NaN element(s)); "
            "the fake-quantized tensor keeps NaN, but integer storage cannot"
        )


def signbit_code(values: torch.Tensor) -> torch.Tensor:
    return torch.signbit(values).to(torch.int64)


# ---- floating-point bit layouts ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class FloatLayout:
    """Sign | exponent field | mantissa field bits of a small binary float (the code, unsigned).

    ``implicit`` (IEEE style): field 0 holds the subnormals mant * 2^(min_exponent - M), field f >= 1 the
    normals (2^M + mant) * 2^(min_exponent + f - 1 - M). Explicit (MASE's minifloat_denorm): every field f
    means mant * 2^(min_exponent + f - 1 - M) with no hidden bit. ``min_exponent`` may be a tensor (a bias
    per element, e.g. from a block). ``nan_code`` / ``inf_code`` are the positive patterns of NaN / +inf
    where the type has them (None: NaN cannot be encoded).
    """

    exponent_bits: int
    mantissa_bits: int
    implicit: bool = True
    nan_code: int | None = None
    inf_code: int | None = None

    @property
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    def encode(self, values: torch.Tensor, min_exponent: int | torch.Tensor) -> torch.Tensor:
        """Codes (int64) of grid values (any float dtype; computed in float64, exact)."""
        v = values.double()
        magnitude = v.abs()
        finite = torch.isfinite(magnitude)
        magnitude = torch.where(finite, magnitude, torch.zeros_like(magnitude))
        m_bits = self.mantissa_bits
        min_exp = torch.as_tensor(min_exponent, dtype=torch.int64, device=v.device)
        exponent = torch.maximum(floor_log2(magnitude).to(torch.int64), min_exp)
        if self.implicit:
            mant = magnitude / exact_pow2(exponent - m_bits, torch.float64)  # in [0, 2^(M+1))
            normal = mant >= 2**m_bits
            field = torch.where(normal, exponent - min_exp + 1, 0)
            mant = torch.where(normal, mant - 2**m_bits, mant)
        else:  # the smallest field whose range 2^(min_exponent + field - 1) lies above the magnitude
            field = torch.clamp(floor_log2(magnitude).to(torch.int64) - min_exp + 2, min=0)
            mant = magnitude / exact_pow2(min_exp + field - 1 - m_bits, torch.float64)
        code = (field << m_bits) | as_int(mant)
        code = self._specials(code, v, finite)
        return code | (signbit_code(v) << (self.bits - 1))

    def _specials(self, code: torch.Tensor, v: torch.Tensor, finite: torch.Tensor) -> torch.Tensor:
        checked = v.device.type != "meta"  # meta: shapes only, nothing to check
        if checked and self.nan_code is None and bool(torch.isnan(v).any()):
            raise FormatError("cannot encode NaN: this element type has no NaN code")
        if checked and self.inf_code is None and bool(torch.isinf(v).any()):
            raise FormatError("cannot encode inf: this element type has no inf code")
        code = torch.where(torch.isnan(v), self.nan_code or 0, code)
        return torch.where(torch.isinf(v), self.inf_code or 0, code)

    def decode(self, codes: torch.Tensor, min_exponent: int | torch.Tensor) -> torch.Tensor:
        """float64 values of ``codes``."""
        codes = codes.to(torch.int64)
        m_bits = self.mantissa_bits
        magnitude_code = codes & ((1 << (self.bits - 1)) - 1)
        field, mant = magnitude_code >> m_bits, (magnitude_code & ((1 << m_bits) - 1)).double()
        min_exp = torch.as_tensor(min_exponent, dtype=torch.int64, device=codes.device)
        if self.implicit:
            mant = torch.where(field > 0, mant + 2**m_bits, mant)
            field = torch.clamp(field, min=1)  # field 0 has the exponent of field 1
        value = mant * exact_pow2(min_exp + field - 1 - m_bits, torch.float64)
        if self.inf_code is not None:
            value = torch.where(magnitude_code == self.inf_code, math.inf, value)
        if self.nan_code is not None:
            special = self._nan_patterns(magnitude_code)
            value = torch.where(special, math.nan, value)
        return torch.where((codes >> (self.bits - 1)) == 1, -value, value)

    def _nan_patterns(self, magnitude_code: torch.Tensor) -> torch.Tensor:
        """Every NaN pattern: above the inf code (IEEE style) or the single NaN code."""
        if self.inf_code is not None:
            return magnitude_code > self.inf_code
        return magnitude_code == self.nan_code


def power_of_two_code(values: torch.Tensor, min_exponent: int | torch.Tensor, bits: int) -> torch.Tensor:
    """Sign | exponent code of the log formats: 0 for zero, e - min_exponent + 1 for 2^e."""
    magnitude = values.abs()
    min_exp = torch.as_tensor(min_exponent, dtype=torch.int64, device=values.device)
    exponent = floor_log2(magnitude).to(torch.int64)
    code = torch.where(magnitude > 0, exponent - min_exp + 1, 0)
    return code | (signbit_code(values) << (bits - 1))


def power_of_two_value(codes: torch.Tensor, min_exponent: int | torch.Tensor, bits: int,
                       dtype: torch.dtype) -> torch.Tensor:  # fmt: skip
    """Inverse of ``power_of_two_code``, with the log formats' own arithmetic (exact_pow2, copysign)."""
    codes = codes.to(torch.int64)
    code = codes & ((1 << (bits - 1)) - 1)
    min_exp = torch.as_tensor(min_exponent, dtype=torch.int64, device=codes.device)
    power = exact_pow2(min_exp + code - 1, dtype)
    sign = torch.where((codes >> (bits - 1)) == 1, -1.0, 1.0).to(dtype)
    return torch.copysign(torch.where(code == 0, torch.zeros_like(power), power), sign)


# ---- scale storage ------------------------------------------------------------------------------------
SCALE_TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def narrow_scale(scale: torch.Tensor, scale_dtype: str = "f32") -> torch.Tensor:
    """``scale`` in the dtype the format declares for it when that holds every value exactly (it does for
    scales the format rounded to that precision), else in its own compute dtype: nothing is ever lost."""
    target = SCALE_TORCH_DTYPES[scale_dtype]
    narrowed = scale.to(target)
    if scale.device.type == "meta":  # no values to compare: the declared dtype, what rounded scales give
        return narrowed
    return narrowed if torch.equal(narrowed.to(scale.dtype), scale) else scale
