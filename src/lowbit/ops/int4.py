"""4-bit weight-only Linear: asymmetric codes 0..15 per group of ``group_size`` inputs, packed two per byte.

Stored (the state dict): ``weight_codes`` uint8 [N, K / 2] (element 2j in the low nibble), ``weight_scale``
[N, K / g] in ``scale_dtype`` (bfloat16 by default: the int4pack kernel's own precision, so every path
uses the same scales), ``weight_zero_point`` uint8 [N, K / g] (0..15). Value: (q - zero_point) * scale.
At group 32 that is 0.5 + 3 / 32 bytes per weight, 0.148x float32.

Scales: min-max per group over a range widened to include 0; with ``search=True`` (default) each group
also tries its range shrunk at either end by 5 % steps down to 70 % and keeps the pair with the lowest
squared error, weighted per input channel by ``importance`` (mean x^2 from calibration) when given.

``zero_point_domain="float"`` (torchao's name; its and HQQ's default, ggml's Q4_1 at group 32): the group's
offset is a float, ``weight_min`` [N, K / g] in ``scale_dtype`` instead of ``weight_zero_point``; value
q * scale + minimum in float32 (the product rounded, then the sum). The range is the group's own min-max (no
widening to 0), scale (max - min) / 15, minimum min, both rounded to ``scale_dtype``; codes
round((x - minimum) * (1 / scale)); the same shrink search. No int4pack path (its kernel works in bfloat16);
the native kernels' ``int4_min`` kind computes these weights exactly.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lowbit import backend
from lowbit.errors import ConfigError, FormatError
from lowbit.native import gptq as native_gptq
from lowbit.native import linear as native_linear
from lowbit.ops import kernels
from lowbit.ops.modules import WeightOnlyLinear, _check_linear, check_compute_dtype, register

SCALE_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
SHRINK_STEPS = tuple(1.0 - 0.05 * step for step in range(7))  # 1.0 .. 0.7
ZERO_POINT_DOMAINS = ("int", "float")


def _group_codes(groups: torch.Tensor, low: torch.Tensor, high: torch.Tensor, scale_dtype: torch.dtype):
    """(codes, scale, zero_point) of groups [N, G, g] for the ranges [low, high] [N, G, 1]."""
    scale = (high - low).mul_(1.0 / 15).clamp_min_(torch.finfo(torch.float32).tiny)
    scale = scale.to(scale_dtype).float()
    scale = scale.masked_fill_(scale <= 0, 1.0)  # a bf16 / f16 underflow
    inverse = 1.0 / scale  # x * (1 / scale): the rounding rule of the affine format (lowbit.formats.affine)
    zero_point = torch.round(low * inverse).neg_().clamp_(0, 15)
    codes = torch.round(groups * inverse).add_(zero_point).clamp_(0, 15)
    return codes, scale, zero_point


def _float_group_codes(groups: torch.Tensor, low: torch.Tensor, high: torch.Tensor, scale_dtype: torch.dtype):
    """(codes, scale, minimum) of groups [N, G, g] for the ranges [low, high] with a float offset."""
    scale = (high - low).mul_(1.0 / 15).clamp_min_(torch.finfo(torch.float32).tiny)
    scale = scale.to(scale_dtype).float()
    scale = scale.masked_fill_(scale <= 0, 1.0)  # a bf16 / f16 underflow
    minimum = low.to(scale_dtype).float()
    codes = torch.round((groups - minimum) * (1.0 / scale)).clamp_(0, 15)
    return codes, scale, minimum


def weight_groups(weight: torch.Tensor, group_size: int, widen: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``weight`` [N, K] as float32 groups [N, K / g, g] with each group's min-max range ([N, K / g, 1]),
    widened to hold 0 (low <= 0 <= high) unless ``widen`` is False; FormatError on NaN / inf."""
    n, k = weight.shape
    groups = weight.detach().float().reshape(n, k // group_size, group_size)
    if not bool(torch.isfinite(groups).all()):
        raise FormatError("the weight has NaN or inf values; it cannot be quantized")
    low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    return (groups, low.clamp_(max=0.0), high.clamp_(min=0.0)) if widen else (groups, low, high)


def quantize_groups(weight: torch.Tensor, group_size: int, scale_dtype: torch.dtype = torch.bfloat16,
                    search: bool = True, importance: torch.Tensor | None = None, float_zero: bool = False):  # fmt: skip
    """uint8 codes [N, K], scales [N, K / g] (scale_dtype), uint8 zero points [N, K / g] of ``weight``; with
    ``float_zero`` the third is the float minimum [N, K / g] (scale_dtype) of the float zero-point domain.

    A CPU weight runs the native kernel (csrc/gptq.c) once the library is loaded: the same element arithmetic,
    each trial's squared errors summed in input order (torch.sum's order is its own), so a group whose trial
    ranges tie to float32 rounding may keep another of them (1 group in 98,304 measured)."""
    native = _native_fit(weight, group_size, scale_dtype, search, importance, float_zero)
    if native is not None:
        return native
    n, k = weight.shape
    groups, low0, high0 = weight_groups(weight, group_size, widen=not float_zero)  # float offsets: the own range
    trial_codes = _float_group_codes if float_zero else _group_codes
    weights = None if importance is None else importance.float().reshape(1, k // group_size, group_size)
    best, best_error = None, None
    for low_factor in SHRINK_STEPS if search else (1.0,):
        for high_factor in SHRINK_STEPS if search else (1.0,):
            trial = trial_codes(groups, *_shrunk(low0, high0, low_factor, high_factor, float_zero), scale_dtype)
            values = trial[0] * trial[1] + trial[2] if float_zero else (trial[0] - trial[2]).mul_(trial[1])
            error = values.sub_(groups).square_()
            error = (error if weights is None else error.mul_(weights)).sum(-1, keepdim=True)
            if best is None:
                best, best_error = list(trial), error
                continue
            better = error < best_error
            best = [torch.where(better, new, old) for new, old in zip(trial, best, strict=True)]
            best_error = torch.where(better, error, best_error)
    codes, scale, zero_point = best
    offset = zero_point.squeeze(-1).to(scale_dtype if float_zero else torch.uint8)
    return codes.reshape(n, k).to(torch.uint8), scale.squeeze(-1).to(scale_dtype), offset


def _native_fit(weight, group_size, scale_dtype, search, importance, float_zero):
    if weight.device.type != "cpu" or not backend.native_ready():
        return None
    columns = weight.detach().float().t().contiguous()  # [K, N]; NaN / inf: not taken, the torch code says so
    weights = None if importance is None else importance.detach().float().cpu().contiguous()
    result = native_gptq.int4_fit(columns, group_size, scale_dtype, search, weights, float_zero)
    if result is None:
        return None
    codes, scale, offset = result
    offset = offset.t().to(scale_dtype if float_zero else torch.uint8)
    return codes, scale.t().to(scale_dtype), offset


def _shrunk(low: torch.Tensor, high: torch.Tensor, low_factor: float, high_factor: float, float_zero: bool):
    """The trial range: each end moved toward 0 (integer zero points: the range holds 0) or toward the
    group's middle (float offsets: the range is the group's own) by its factor."""
    if not float_zero:
        return low * low_factor, high * high_factor
    width = high - low
    return (low if low_factor == 1.0 else high - width * low_factor,
            high if high_factor == 1.0 else low + width * high_factor)  # fmt: skip


@register
class Int4WeightOnlyLinear(WeightOnlyLinear):
    """Paths of :class:`WeightOnlyLinear` with "int4pack" (bfloat16 activations; N a multiple of 16, groups of
    32 to 256) as the packed one."""

    paths = ("auto", "reference", "int4pack", "dequantize", "dequantize_bf16", "native")
    packed_path = "int4pack"
    has_native = True

    def __init__(self, in_features: int, out_features: int, bias: bool = True, group_size: int = 32,
                 scale_dtype: str = "bf16", compute_dtype: str | None = None, zero_point_domain: str = "int") -> None:  # fmt: skip
        super().__init__(in_features, out_features, bias)
        self.compute_dtype = check_compute_dtype(type(self).__name__, compute_dtype)
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2 or group_size % 2:
            raise ConfigError(f"group_size={group_size!r} must be an even int >= 2 (32 or 128 for the int4pack kernel)")
        if in_features % group_size:
            raise FormatError(f"in_features={in_features} is not divisible by group_size={group_size}")
        if scale_dtype not in SCALE_DTYPES:
            raise ConfigError(f"scale_dtype={scale_dtype!r}; legal: {', '.join(SCALE_DTYPES)}")
        if zero_point_domain not in ZERO_POINT_DOMAINS:
            raise ConfigError(f"zero_point_domain={zero_point_domain!r}; legal: {', '.join(ZERO_POINT_DOMAINS)}")
        self.group_size, self.scale_dtype, self.zero_point_domain = group_size, scale_dtype, zero_point_domain
        groups = in_features // group_size
        self.register_buffer("weight_codes", torch.zeros(out_features, in_features // 2, dtype=torch.uint8))
        self.register_buffer("weight_scale", torch.ones(out_features, groups, dtype=SCALE_DTYPES[scale_dtype]))
        if zero_point_domain == "float":
            self.register_buffer("weight_min", torch.zeros(out_features, groups, dtype=SCALE_DTYPES[scale_dtype]))
        else:
            self.register_buffer("weight_zero_point", torch.zeros(out_features, groups, dtype=torch.uint8))

    @property
    def float_zero(self) -> bool:
        return self.zero_point_domain == "float"

    def config(self) -> dict[str, Any]:
        domain = {"zero_point_domain": "float"} if self.float_zero else {}  # older files: the integer domain
        return {**super().config(), "group_size": self.group_size, "scale_dtype": self.scale_dtype, **domain}

    @classmethod
    def from_float(cls, module: nn.Linear, *, group_size: int = 32, scale_dtype: str = "bf16", search: bool = True,
                   importance: torch.Tensor | None = None, codes=None, scale=None, zero_point=None,
                   compute_dtype: str | None = None, zero_point_domain: str = "int") -> Int4WeightOnlyLinear:  # fmt: skip
        """Quantize ``module``'s weight (or take given uint8 codes [N, K], scales and zero points [N, K / g];
        in the float domain ``zero_point`` is the float minimum)."""
        _check_linear(module)
        new = cls(module.in_features, module.out_features, module.bias is not None, group_size, scale_dtype, compute_dtype,
                  zero_point_domain)  # fmt: skip
        if codes is None:
            codes, scale, zero_point = quantize_groups(module.weight, group_size, SCALE_DTYPES[scale_dtype], search,
                                                       importance, new.float_zero)  # fmt: skip
        new.weight_codes.copy_(kernels.pack_nibbles(codes.to(torch.uint8)))
        new.weight_scale.copy_(scale)
        (new.weight_min if new.float_zero else new.weight_zero_point).copy_(zero_point)
        if module.bias is not None:
            new.bias.copy_(module.bias.detach())
        return new.to(module.weight.device)

    def codes(self) -> torch.Tensor:
        """Unpacked uint8 codes [N, K]."""
        return kernels.unpack_nibbles(self.weight_codes)

    def signed_codes(self) -> torch.Tensor | None:
        """int8 codes - zero_point [N, K] when every one lies in -8..7 (a symmetric int4 grid: what
        compressed-tensors' symmetric scheme and GGUF's Q4_0 store), else None (always in the float domain)."""
        if self.float_zero:
            return None
        zero_point = self.weight_zero_point.to(torch.int16).repeat_interleave(self.group_size, dim=1)
        signed = self.codes().to(torch.int16) - zero_point
        return signed.to(torch.int8) if bool(((signed >= -8) & (signed <= 7)).all()) else None

    def dequantized_weight(self, start: int = 0, end: int | None = None) -> torch.Tensor:
        """float32 weight rows [start, end): (codes - zero_point) * scale per group."""
        k, g = self.in_features, self.group_size
        codes = kernels.unpack_nibbles(self.weight_codes[start:end])
        groups = codes.reshape(codes.shape[0], k // g, g).float()
        scale = self.weight_scale[start:end].unsqueeze(-1).float()
        if self.float_zero:  # the product rounded, then the sum (the native int4_min kind's order)
            return groups.mul_(scale).add_(self.weight_min[start:end].unsqueeze(-1).float()).reshape(codes.shape[0], k)
        groups = groups.sub_(self.weight_zero_point[start:end].unsqueeze(-1).float())
        return groups.mul_(scale).reshape(codes.shape[0], k)

    def packed_fits(self) -> bool:
        """The int4pack kernel's shape rules (N a multiple of 16, groups of 32 to 256) and availability."""
        fits = self.group_size in (32, 64, 128, 256) and self.out_features % 16 == 0 and not self.float_zero
        return fits and kernels.int4pack_available()

    def _float_minimum(self) -> torch.Tensor:
        return self.derived("float_minimum", lambda: self.weight_min.float().contiguous())

    def run_native(self, rows: torch.Tensor) -> torch.Tensor | None:
        scale = self.derived("float_scale", lambda: self.weight_scale.float().contiguous())
        if self.float_zero:
            return native_linear.ggml_linear(rows, self.weight_codes, scale, self._float_minimum(), self.bias,
                                             "int4_min", self.group_size)  # fmt: skip
        return native_linear.int4_linear(rows, self.weight_codes, self.weight_zero_point, scale, self.bias,
                                         self.group_size)  # fmt: skip

    def native_weight_rows(self, start: int, end: int) -> torch.Tensor | None:
        scale = self.derived("float_scale", lambda: self.weight_scale.float().contiguous())
        if self.float_zero:
            return native_linear.weight_rows("int4_min", self.weight_codes[start:end], scale[start:end],
                                             minimum=self._float_minimum()[start:end], group=self.group_size)  # fmt: skip
        return native_linear.weight_rows("int4_zero", self.weight_codes[start:end], scale[start:end],
                                         zero_point=self.weight_zero_point[start:end], group=self.group_size)  # fmt: skip

    def run_packed(self, rows: torch.Tensor) -> torch.Tensor:
        if not self.packed_fits():
            raise ConfigError(f"path 'int4pack' needs out_features % 16 == 0 and group_size in 32..256 and the "
                              f"kernel; this module has {self.out_features} outputs, group {self.group_size}")  # fmt: skip
        build = lambda: kernels.int4pack_weight(self.codes(), self.weight_scale, self.weight_zero_point)
        packed, pairs = self.derived("int4pack", build)
        return self._add_bias(kernels.int4pack_linear(rows, packed, self.group_size, pairs))
