"""OCP Microscaling (MX v1.0): blocks of elements sharing one power-of-two scale.

A block of ``block_size`` (default 32) consecutive elements along ``axis`` (default -1) shares a scale
2^s stored as E8M0: s is an integer in [-127, 127] (E8M0's 0xFF NaN code is never produced). Each element
is a small number format; the value of an element code p is 2^s * p.

========== ======= ================ ==== ========= ============== ============ ======================
format     element element values   emax max       min normal     min subnorm. bits / elem. (k = 32)
========== ======= ================ ==== ========= ============== ============ ======================
mxint8     INT8    k / 64, |k|<=127  0   127/64    (uniform)      1/64         8.25
mxfp8_e4m3 E4M3    OCP FP8 E4M3      8   448       2^-6           2^-9         8.25
mxfp8_e5m2 E5M2    OCP FP8 E5M2     15   57344     2^-14          2^-16        8.25
mxfp6_e3m2 E3M2    OCP FP6 E3M2      4   28        2^-2           2^-4         6.25
mxfp6_e2m3 E2M3    OCP FP6 E2M3      2   7.5       1              2^-3         6.25
mxfp4_e2m1 E2M1    OCP FP4 E2M1      2   6         1              0.5          4.25
========== ======= ================ ==== ========= ============== ============ ======================

MXINT8 uses the symmetric codes [-127, 127] (the spec allows dropping -128, i.e. the element -2), so every
MX format here is sign-symmetric. The block values are the element values times 2^s.

Shared exponent (``scale_rule``), from amax = max |x| over the block's finite elements:

- ``floor`` (the spec): s = floor(log2 amax) - emax; elements beyond the element max are clamped to it.
- ``ceil``: the smallest s with amax <= 2^s * element max, so nothing in the block is clamped.
- ``even``: the floor rule applied to amax rounded to the element's precision (round half to even); it
  moves to the next s exactly when amax would round up to the next power of two on an unbounded grid.

Then s is clamped to [-127, 127]. Elements are rounded onto the element grid scaled by 2^s with
``rounding`` (default nearest_even; all modes, stochastic included), directly in the input's binary
floating point (no division by 2^s, so no scaled value can underflow or overflow).

NaN elements stay NaN and do not affect the rest of their block (the spec would make the whole block NaN).
+-inf and out-of-range elements saturate to +-(2^s * element max) and never set the scale. A block with no
finite non-zero element gets s = -127 and stays zero; zero is the element code 0. In the rare case where
2^s * element max exceeds the input dtype's largest finite value (only for amax within a factor of two of
it, with the ceil / even rules), the block saturates at the largest block value that dtype can hold.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import ClassVar

import torch

from lowbit.errors import FormatError
from lowbit.formats._base import (
    FormatSpec,
    check_axis,
    check_block_size,
    check_bool,
    check_choice,
    check_tensor,
)
from lowbit.formats._float_grid import float_grid_values, round_to_float_grid
from lowbit.formats._registry import register
from lowbit.formats.blocking import (
    apply_blockwise,
    block_shape,
    block_statistics,
    finite_abs_max,
    normalize_axis,
    num_blocks,
    runs_of,
)
from lowbit.native import block as native_block

_NATIVE_OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

SCALE_BITS = 8
SCALE_EXPONENT_MIN = -127
SCALE_EXPONENT_MAX = 127
SCALE_RULES = ("floor", "ceil", "even")


@dataclasses.dataclass(frozen=True)
class MXElement:
    """An element type: the float grid with ``mantissa_bits`` and smallest normal exponent ``min_exponent``.

    Its values are 0, the subnormals k * 2^(min_exponent - mantissa_bits) and the normals
    2^e * (1 + f / 2^mantissa_bits) up to ``max_value``. INT8 with its implicit 2^-6 is the same grid with
    6 mantissa bits and min_exponent 0: every value is a multiple of 1/64.
    """

    name: str
    bits: int
    mantissa_bits: int
    min_exponent: int
    emax: int  # exponent of the largest normal binade: the spec's shared exponent is floor(log2 amax) - emax
    max_value: float

    def values(self) -> torch.Tensor:
        """Every element value, both signs, ascending (float64)."""
        return float_grid_values(self.mantissa_bits, self.min_exponent, self.max_value)


ELEMENTS: dict[str, MXElement] = {
    "int8": MXElement("int8", 8, 6, 0, 0, 127 / 64),
    "fp8_e4m3": MXElement("fp8_e4m3", 8, 3, -6, 8, 448.0),
    "fp8_e5m2": MXElement("fp8_e5m2", 8, 2, -14, 15, 57344.0),
    "fp6_e3m2": MXElement("fp6_e3m2", 6, 2, -2, 4, 28.0),
    "fp6_e2m3": MXElement("fp6_e2m3", 6, 3, 0, 2, 7.5),
    "fp4_e2m1": MXElement("fp4_e2m1", 4, 1, 0, 2, 6.0),
}


# ---- shared exponent rules: how much to add to the spec's floor(log2 amax) - emax --------------------------
# Each gets the frexp mantissa m of amax (amax = m * 2^e, m in [0.5, 1); exact for subnormals too).
def _floor_increment(mantissa: torch.Tensor, element: MXElement) -> torch.Tensor:
    return torch.zeros_like(mantissa, dtype=torch.int32)


def _ceil_increment(mantissa: torch.Tensor, element: MXElement) -> torch.Tensor:
    # Under the floor exponent amax becomes 2m * 2^emax, in [2^emax, 2^(emax+1)): one more if it overflows.
    return (mantissa * 2.0 ** (element.emax + 1) > element.max_value).to(torch.int32)


def _even_increment(mantissa: torch.Tensor, element: MXElement) -> torch.Tensor:
    # 2m rounded to mantissa_bits fraction bits reaches 2 exactly when amax rounds to the next power of two.
    top = 2.0 ** (element.mantissa_bits + 1)
    return (torch.round(mantissa * top) == top).to(torch.int32)


_SCALE_RULE_INCREMENT: dict[str, Callable[[torch.Tensor, MXElement], torch.Tensor]] = {
    "floor": _floor_increment,
    "ceil": _ceil_increment,
    "even": _even_increment,
}


def shared_exponent(amax: torch.Tensor, element: MXElement, scale_rule: str = "floor") -> torch.Tensor:
    """The E8M0 exponent s (int32, in [-127, 127]) for blocks with maximum magnitude ``amax`` (finite, >= 0)."""
    mantissa, exponent = torch.frexp(amax)  # amax = mantissa * 2^exponent: floor(log2 amax) = exponent - 1
    shared = exponent - 1 - element.emax + _SCALE_RULE_INCREMENT[scale_rule](mantissa, element)
    shared = torch.where(amax > 0, shared, torch.full_like(shared, SCALE_EXPONENT_MIN))
    return shared.clamp(SCALE_EXPONENT_MIN, SCALE_EXPONENT_MAX)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _MXFormat(FormatSpec):
    """Shared machinery of the six MX formats; each subclass fixes ``element``."""


    element: ClassVar[MXElement]

    block_size: int = 32
    axis: int = -1
    scale_rule: str = "floor"
    skip_first_dim: bool = False

    def validate(self) -> None:
        block = check_block_size(self)
        if block is None or len(block) != 1:
            raise FormatError(
                f"{self.format_name}: block_size={self.block_size!r} is invalid; must be one int >= 1 "
                "(or -1 for the whole axis): MX blocks run along one axis"
            )
        object.__setattr__(self, "block_size", block[0])
        if check_axis(self) is None:
            raise FormatError(f"{self.format_name}: axis={self.axis!r} is invalid; must be an int (a tensor dimension)")
        check_choice(self, "scale_rule", SCALE_RULES)
        check_bool(self, "skip_first_dim")
        if self.skip_first_dim and self.axis == 0:
            raise FormatError(
                f"{self.format_name}: skip_first_dim=True with axis=0 is invalid; it would leave blocks of one "
                "element (skip_first_dim keeps dimension 0 out of every block)"
            )

    # ---- description --------------------------------------------------------------------------------
    @property
    def bits(self) -> int:
        return self.element.bits

    @property
    def element_max(self) -> float:
        return self.element.max_value

    def element_values(self) -> torch.Tensor:
        """The element grid (the values of a block whose scale is 2^0), ascending, float64."""
        return self.element.values()

    def bits_per_element(self, shape: tuple[int, ...] | None = None) -> float:
        """Element bits plus one 8-bit E8M0 scale per block (per padded block when ``shape`` is given)."""
        if shape is None:
            return self.bits + (SCALE_BITS / self.block_size if self.block_size > 0 else 0.0)
        numel = math.prod(shape)
        if numel == 0:
            return float(self.bits)
        block = self._block(tuple(shape)) if shape else (1,)
        return self.bits + SCALE_BITS * num_blocks(shape or (1,), block) / numel

    # ---- quantization -------------------------------------------------------------------------------
    def _quantize(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        return self._quantize_within(x, generator, torch.finfo(x.dtype).max)

    def _quantize_for(self, x: torch.Tensor, generator, out_dtype: torch.dtype) -> torch.Tensor:
        """A block never rounds past the largest finite value of the output dtype."""
        return self._quantize_within(x, generator, torch.finfo(out_dtype).max)

    def _native(self, x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor | None:
        """Blocks along the last dimension (or whole trailing dimensions) run natively, saturating at
        out_dtype's largest value as ``_quantize_for`` does."""
        if out_dtype not in _NATIVE_OUT_DTYPES or x.dim() == 0 or not -x.dim() <= self.axis < x.dim():
            return None
        runs = runs_of(x.shape, (self.block_size,), self.axis, self.skip_first_dim)
        if runs is None:
            return None
        element = self.element
        dtype_max = torch.finfo(out_dtype).max
        return native_block.mx(x, runs, element.mantissa_bits, element.min_exponent, element.emax,
                               element.max_value, self.scale_rule, dtype_max, self.rounding)  # fmt: skip

    native_takes_halves = True

    def _quantize_within(self, x: torch.Tensor, generator, dtype_max: float) -> torch.Tensor:
        if x.dim() == 0:
            return self._quantize_within(x.reshape(1), generator, dtype_max).reshape(())

        def quantize_block(blocked: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
            return self._quantize_block(blocked, dims, generator, dtype_max)

        return apply_blockwise(x, self._block(tuple(x.shape)), quantize_block)

    def _block(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        normalize_axis(self.axis, len(shape))  # FormatError for an axis the tensor does not have
        return block_shape(shape, (self.block_size,), self.axis, self.skip_first_dim)

    def _quantize_block(self, blocked, dims, generator, dtype_max: float) -> torch.Tensor:
        exponent = self._block_exponent(blocked, dims)  # [n0, 1, n1, 1, ...]
        min_exponent = exponent + self.element.min_exponent
        limit = self._block_limit(exponent, min_exponent, blocked.dtype, dtype_max)
        mantissa_bits = self.element.mantissa_bits
        return round_to_float_grid(blocked, mantissa_bits, min_exponent, limit, self.rounding, generator)

    def _block_exponent(self, blocked: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
        return shared_exponent(finite_abs_max(blocked, dims), self.element, self.scale_rule)

    def _block_limit(self, exponent, min_exponent, dtype: torch.dtype, dtype_max: float) -> torch.Tensor:
        """2^s * element max, or the largest block value <= dtype_max when that one is not finite there."""
        device = exponent.device  # the block's device: no CPU constants next to CUDA / meta data
        element_max = torch.full(exponent.shape, self.element.max_value, dtype=dtype, device=device)
        element_max = torch.ldexp(element_max, exponent)
        largest = torch.full(exponent.shape, dtype_max, dtype=dtype, device=device)  # inf above stays capped by "down"
        return round_to_float_grid(largest, self.element.mantissa_bits, min_exponent, element_max, "down")

    def block_exponents(self, x: torch.Tensor) -> torch.Tensor:
        """The shared exponent s of every block of ``x`` (int32, one entry per block, blocks' layout)."""
        check_tensor(x)
        x = x.detach().reshape(1) if x.dim() == 0 else x.detach()
        work = x if x.dtype in (torch.float32, torch.float64) else x.float()
        return block_statistics(work, self._block(tuple(work.shape)), self._block_exponent)


def _mx_format(class_name: str, name: str, element: str) -> type[_MXFormat]:
    spec = ELEMENTS[element]
    doc = (
        f"OCP MX {name}: blocks of ``block_size`` {spec.name.upper()} elements (max {spec.max_value:g}, "
        f"emax {spec.emax}) sharing an E8M0 scale 2^s, s in [-127, 127]. See the module docstring for the "
        "scale rules and the NaN / inf / zero handling."
    )
    namespace = {"format_name": name, "element": spec, "__doc__": doc, "__module__": __name__}
    cls = dataclasses.dataclass(frozen=True, kw_only=True)(type(class_name, (_MXFormat,), namespace))
    cls.__qualname__ = class_name
    return register(cls)


MXInt8 = _mx_format("MXInt8", "mxint8", "int8")
MXFP8E4M3 = _mx_format("MXFP8E4M3", "mxfp8_e4m3", "fp8_e4m3")
MXFP8E5M2 = _mx_format("MXFP8E5M2", "mxfp8_e5m2", "fp8_e5m2")
MXFP6E3M2 = _mx_format("MXFP6E3M2", "mxfp6_e3m2", "fp6_e3m2")
MXFP6E2M3 = _mx_format("MXFP6E2M3", "mxfp6_e2m3", "fp6_e2m3")
MXFP4E2M1 = _mx_format("MXFP4E2M1", "mxfp4_e2m1", "fp4_e2m1")
