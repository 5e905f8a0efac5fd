"""Codecs of the block formats: ``block_fp``, ``block_minifloat``, ``block_log`` and the six OCP MX formats.

Each block stores one small integer (the per-block parameter, on the block grid); each element one code:

- block_fp: ``exponent`` e (int16) per block; element = sign | (W-1)-bit magnitude m, value
  +-m * 2^(e - W + 2).
- block_minifloat: ``exponent`` t (int16, the top element binade) per block; element = the W-bit IEEE-style
  minifloat bits (sign | E | M) with bias 2^E - 1 - t.
- block_log: ``bias`` beta (int16) per block; element = sign | (W-1)-bit exponent code, code 0 = zero,
  code c = 2^(c - beta).
- mxint8 / mxfp8_e4m3 / mxfp8_e5m2 / mxfp6_e3m2 / mxfp6_e2m3 / mxfp4_e2m1: ``scale`` = the E8M0 byte
  s + 127 (uint8) per block; element = the OCP element bits (INT8: two's complement k, value k / 64),
  value element * 2^s.
"""

from __future__ import annotations

import torch

from lowbit.formats._base import FormatSpec
from lowbit.formats._float_grid import exact_pow2
from lowbit.formats.block_fp import dtype_max_exponent, shared_exponent
from lowbit.formats.blocking import block_shape, finite_abs_max
from lowbit.qtensor.codecs._common import (
    Codec,
    Encoded,
    FloatLayout,
    as_int,
    block_stat,
    check_no_nan,
    expand_blocks,
    power_of_two_code,
    power_of_two_value,
    signbit_code,
)
from lowbit.qtensor.codecs.float_codes import ocp_layout

_E8M0_BIAS = 127


class BlockFPCodec(Codec):
    names = ("block_fp",)

    def code_bits(self, spec: FormatSpec) -> int:
        return spec.width

    def encode(self, spec: FormatSpec, work: torch.Tensor, values: torch.Tensor) -> Encoded:
        check_no_nan(spec, values)
        block = block_shape(work.shape, spec.block_size, spec.axis, spec.skip_first_dim)
        top = min(spec.max_exponent, dtype_max_exponent(work.dtype))
        bits = spec.mantissa_bits
        exponent = block_stat(work.double(), block, lambda b, dims: shared_exponent(
            b, dims, bits, spec.rounding, spec.min_exponent, top))  # fmt: skip
        step = exact_pow2(expand_blocks(exponent, work.shape, block) - bits + 1, torch.float64)
        magnitude = as_int(values.double().abs() / step)
        codes = magnitude | (signbit_code(values) << bits)
        return Encoded(codes, {"exponent": exponent.to(torch.int16).contiguous()}, tuple(block))

    def decode(self, spec, codes, params, block, dtype) -> torch.Tensor:
        bits = spec.mantissa_bits
        codes = codes.to(torch.int64)
        step = exact_pow2(expand_blocks(params["exponent"].to(torch.int64), codes.shape, block) - bits + 1,
                          torch.float64)  # fmt: skip
        magnitude = (codes & ((1 << bits) - 1)).double() * step
        return torch.where((codes >> bits) == 1, -magnitude, magnitude).to(dtype)


class BlockMinifloatCodec(Codec):
    names = ("block_minifloat",)

    def code_bits(self, spec: FormatSpec) -> int:
        return spec.width

    def _min_exponent(self, spec: FormatSpec, shared: torch.Tensor, shape, block) -> torch.Tensor:
        return spec.element_min_exponent(expand_blocks(shared.to(torch.int64), shape, block))

    def encode(self, spec: FormatSpec, work: torch.Tensor, values: torch.Tensor) -> Encoded:
        check_no_nan(spec, values)
        block = block_shape(work.shape, spec.block_size, None, spec.skip_first_dim)
        top = min(spec.max_shared_exponent, dtype_max_exponent(work.dtype))
        shared = block_stat(work.double(), block, lambda b, dims: shared_exponent(
            b, dims, spec.mantissa_bits + 1, spec.rounding, spec.min_shared_exponent, top))  # fmt: skip
        layout = FloatLayout(spec.exponent_width, spec.mantissa_bits)
        codes = layout.encode(values, self._min_exponent(spec, shared, work.shape, block))
        return Encoded(codes, {"exponent": shared.to(torch.int16).contiguous()}, tuple(block))

    def decode(self, spec, codes, params, block, dtype) -> torch.Tensor:
        layout = FloatLayout(spec.exponent_width, spec.mantissa_bits)
        return layout.decode(codes, self._min_exponent(spec, params["exponent"], codes.shape, block)).to(dtype)


class BlockLogCodec(Codec):
    names = ("block_log",)

    def code_bits(self, spec: FormatSpec) -> int:
        return spec.width

    def encode(self, spec: FormatSpec, work: torch.Tensor, values: torch.Tensor) -> Encoded:
        check_no_nan(spec, values)
        block = block_shape(work.shape, spec.block_size, spec.axis, spec.skip_first_dim)
        bias = block_stat(work, block, lambda b, dims: spec.block_bias(finite_abs_max(b, dims)))
        min_exponent = 1 - expand_blocks(bias.to(torch.int64), work.shape, block)
        codes = power_of_two_code(values, min_exponent, spec.width)
        return Encoded(codes, {"bias": bias.to(torch.int16).contiguous()}, tuple(block))

    def decode(self, spec, codes, params, block, dtype) -> torch.Tensor:
        min_exponent = 1 - expand_blocks(params["bias"].to(torch.int64), codes.shape, block)
        return power_of_two_value(codes, min_exponent, spec.width, dtype)


class MXCodec(Codec):
    names = ("mxint8", "mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4_e2m1")

    def code_bits(self, spec: FormatSpec) -> int:
        return spec.element.bits

    def code_signed(self, spec: FormatSpec) -> bool:
        return spec.element.name == "int8"

    def _layout(self, spec: FormatSpec) -> FloatLayout:
        element = spec.element
        name = {"fp8_e4m3": "e4m3", "fp8_e5m2": "e5m2"}.get(element.name, element.name)
        return ocp_layout(name, element.bits - 1 - element.mantissa_bits, element.mantissa_bits)

    def encode(self, spec: FormatSpec, work: torch.Tensor, values: torch.Tensor) -> Encoded:
        flat_work = work.reshape(1) if work.dim() == 0 else work  # as the format treats a 0-d tensor
        block = spec._block(tuple(flat_work.shape))
        shared = block_stat(flat_work, block, spec._block_exponent).to(torch.int64)
        power = exact_pow2(expand_blocks(shared, flat_work.shape, block), torch.float64).reshape(work.shape)
        elements = values.double() / power  # exact: a power of two in float64
        if spec.element.name == "int8":
            check_no_nan(spec, values)
            codes = as_int(elements * 64.0)
        else:
            if self._layout(spec).nan_code is None:
                check_no_nan(spec, values)
            codes = self._layout(spec).encode(elements, spec.element.min_exponent)
        scale = (shared + _E8M0_BIAS).to(torch.uint8).contiguous()
        return Encoded(codes, {"scale": scale}, tuple(block))

    def decode(self, spec, codes, params, block, dtype) -> torch.Tensor:
        shape = codes.shape
        flat = codes.reshape(1) if codes.dim() == 0 else codes
        shared = params["scale"].to(torch.int64) - _E8M0_BIAS
        power = exact_pow2(expand_blocks(shared, flat.shape, block), torch.float64)
        if spec.element.name == "int8":
            elements = flat.double() / 64.0
        else:
            elements = self._layout(spec).decode(flat, spec.element.min_exponent)
        return (elements * power).to(dtype).reshape(shape)
