"""Codecs of the floating-point element formats: minifloats, OCP FP8 / FP6 / FP4 and ``log``.

- minifloat_ieee: sign | E-bit exponent field | M-bit mantissa, IEEE style (field 0 = subnormals), bias B;
  every code finite.
- minifloat_denorm: the same bit fields with MASE's meaning, 2^(field - B) * mantissa / 2^M (no hidden
  bit). Several codes can share a value; the encoder picks the one with the smallest exponent field.
- e5m2 / e4m3 / e3m2 / e2m3 / e2m1: the OCP bit patterns, identical to torch.float8_e5m2 /
  torch.float8_e4m3fn and ml_dtypes' float6_e3m2fn / float6_e2m3fn / float4_e2m1fn (low bits of a byte).
  e5m2 has +-inf (0x7C) and NaN (0x7F), e4m3 NaN (0x7F). Scaled (``axis`` / ``block_size``): one ``scale``
  per block in the format's ``scale_dtype``; value = element * scale. A given ``scale`` is stored per
  tensor, or per channel along ``axis``.
- log: sign | (W-1)-bit exponent code, code 0 = zero, code c = 2^(c - 1 + min_exponent).
"""

from __future__ import annotations

import torch

from lowbit.formats._base import FormatSpec
from lowbit.formats._float_grid import round_to_float_grid
from lowbit.formats.blocking import block_shape
from lowbit.qtensor.codecs._common import (
    Codec,
    Encoded,
    FloatLayout,
    block_stat,
    check_no_nan,
    expand_blocks,
    grid_shape,
    narrow_scale,
    power_of_two_code,
    power_of_two_value,
)

# (nan code, inf code) of the OCP element types, as positive 7-bit magnitude patterns.
_OCP_SPECIALS = {"e5m2": (0x7F, 0x7C), "e4m3": (0x7F, None)}


class MinifloatCodec(Codec):
    names = ("minifloat_ieee", "minifloat_denorm")

    def code_bits(self, spec: FormatSpec) -> int:
        return spec.width

    def _layout(self, spec: FormatSpec) -> FloatLayout:
        return FloatLayout(spec.exponent_width, spec.mantissa_bits, implicit=spec.format_name == "minifloat_ieee")

    def encode(self, spec: FormatSpec, work: torch.Tensor, values: torch.Tensor) -> Encoded:
        check_no_nan(spec, values)
        return Encoded(self._layout(spec).encode(values, 1 - spec.exponent_bias), {}, None)

    def decode(self, spec, codes, params, block, dtype) -> torch.Tensor:
        return self._layout(spec).decode(codes, 1 - spec.exponent_bias).to(dtype)


def ocp_layout(name: str, exponent_bits: int, mantissa_bits: int) -> FloatLayout:
    nan_code, inf_code = _OCP_SPECIALS.get(name, (None, None))
    return FloatLayout(exponent_bits, mantissa_bits, True, nan_code, inf_code)


class OcpFloatCodec(Codec):
    names = ("e5m2", "e4m3", "e3m2", "e2m3", "e2m1")

    def code_bits(self, spec: FormatSpec) -> int:
        return spec.element.bits

    def _layout(self, spec: FormatSpec) -> FloatLayout:
        return ocp_layout(spec.format_name, spec.element.exponent_width, spec.element.mantissa_bits)

    def encode(self, spec: FormatSpec, work: torch.Tensor, values: torch.Tensor) -> Encoded:
        layout, element = self._layout(spec), spec.element
        if layout.nan_code is None:
            check_no_nan(spec, values)
        if not spec.is_scaled:
            return Encoded(layout.encode(values, 1 - element.exponent_bias), {}, None)
        if spec.scale is not None:  # given: per tensor, or per channel along axis
            block = block_shape(work.shape, None, spec.axis)
            scale = spec.given_scale(work).expand(grid_shape(work.shape, block))
        else:
            block = block_shape(work.shape, spec.block_size, spec.axis, spec.skip_first_dim)
            scale = block_stat(work, block, spec._block_scale)
        # y = element * scale rounded once: y / scale is within an ulp of the element, whose grid is far
        # coarser, so rounding it to the element grid recovers the element (the final check confirms it).
        ratio = values.double() / expand_blocks(scale, work.shape, block).double()
        nearest = round_to_float_grid(ratio, element.mantissa_bits, 1 - element.exponent_bias, element.max_value)
        ratio = torch.where(torch.isinf(ratio), ratio, nearest)  # e5m2 without saturation keeps +-inf
        codes = layout.encode(ratio, 1 - element.exponent_bias)
        return Encoded(codes, {"scale": narrow_scale(scale.contiguous(), spec.scale_dtype)}, tuple(block))

    def decode(self, spec, codes, params, block, dtype) -> torch.Tensor:
        element_values = self._layout(spec).decode(codes, 1 - spec.element.exponent_bias).to(dtype)
        if "scale" not in params:
            return element_values
        return element_values * expand_blocks(params["scale"].to(dtype), codes.shape, block)


class LogCodec(Codec):
    names = ("log",)

    def code_bits(self, spec: FormatSpec) -> int:
        return spec.width

    def encode(self, spec: FormatSpec, work: torch.Tensor, values: torch.Tensor) -> Encoded:
        check_no_nan(spec, values)
        return Encoded(power_of_two_code(values, spec.min_exponent, spec.width), {}, None)

    def decode(self, spec, codes, params, block, dtype) -> torch.Tensor:
        return power_of_two_value(codes, spec.min_exponent, spec.width, dtype)
