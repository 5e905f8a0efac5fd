"""Real-quantized Linear modules: integer codes in buffers, integer kernels in forward.

Each module keeps its codes, scales and zero points as buffers (so ``state_dict`` holds everything),
describes itself with ``config()`` (JSON-able) and is rebuilt empty by ``from_config(config)`` before
``load_state_dict`` fills it: that is the whole contract with ``lowbit.save`` / ``lowbit.load``. Every
module has a plain reference path (``forward_reference``: integer codes, exact int64 sums, float64
rescaling) and ``path="auto"`` picks the fastest exact kernel for the input's device from the machine's
probes (``lowbit.ops.routes``, docs/real-execution.md); any path can be forced with ``module.path = "..."``
(an inexact one raises, a slow one warns). Kernel state (fbgemm packed weights, int4 tiles) is derived from
the buffers on first use, per device, and dropped whenever the buffers move or a state dict is loaded.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from lowbit import backend
from lowbit.errors import ConfigError, FormatError
from lowbit.native import ensure as native_ensure
from lowbit.native import error as native_error
from lowbit.native import gemm as native_gemm
from lowbit.native import linear as native_linear
from lowbit.ops import kernels, routes
from lowbit.ops._state import DerivedStateMixin
from lowbit.ops.integer import accumulate_int_mm, accumulate_reference, dense
from lowbit.ops.quant import broadcast_qparams, quantize, symmetric_scale

REAL_MODULES: dict[str, type[nn.Module]] = {}


def register(cls):
    REAL_MODULES[cls.__name__] = cls
    return cls


class RealQuantLinear(DerivedStateMixin, nn.Module):
    """Base: y = x W^T + b with W held as integer codes. Subclasses define buffers, kernels and paths."""

    paths: ClassVar[tuple[str, ...]] = ("auto", "reference")

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        for name, value in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{type(self).__name__}: {name}={value!r} must be a positive int")
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)
        self.path = "auto"
        self._kernel_state: dict[str, Any] = {}
        # What chose the codes (the recipe's method, its options and what it measured: flows/real.py), for
        # reports; saved with the module; None for modules built by hand.
        self.algorithm: dict[str, Any] | None = None

    # ---- (de)serialization contract -------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        config = {"in_features": self.in_features, "out_features": self.out_features, "bias": self.bias is not None}
        return config if not self.algorithm else {**config, "algorithm": dict(self.algorithm)}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> RealQuantLinear:
        """An empty module (zero buffers of the right shapes and dtypes) for ``load_state_dict``."""
        config = dict(config)
        algorithm = config.pop("algorithm", None)
        if algorithm is not None and not isinstance(algorithm, dict):
            raise ConfigError(f"bad {cls.__name__} config: algorithm={algorithm!r} must be a table")
        try:
            module = cls(**config)
        except TypeError as error:
            raise ConfigError(f"bad {cls.__name__} config {config!r}: {error}") from None
        module.algorithm = algorithm
        return module

    # ---- forward ---------------------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise FormatError(f"{type(self).__name__}: input has {x.shape[-1]} features, expected {self.in_features}")
        if self.path not in self.paths:
            raise ConfigError(f"{type(self).__name__}.path={self.path!r}; legal: {', '.join(self.paths)}")
        rows = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        if self.path == "auto":
            path = self.choose_path(rows)
        else:
            path = self.path
            if path != "reference":
                routes.check_forced(type(self).__name__, path, rows.device, getattr(self, "act_bits", 8))
        rows = rows if rows.dtype == torch.float32 else rows.float()  # exact; bfloat16 paths round back exactly
        out = self.forward_reference(rows) if path == "reference" else self.run_path(path, rows)
        if x.dtype != torch.float32 and x.is_floating_point():
            out = out.to(x.dtype)
        return out if x.dim() == 2 else out.reshape(*x.shape[:-1], self.out_features)

    def choose_path(self, rows: torch.Tensor) -> str:
        return "reference"

    def run_path(self, path: str, rows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward_reference(self, rows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _add_bias(self, out: torch.Tensor) -> torch.Tensor:
        return out if self.bias is None else out.add_(self.bias)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.config().items())

    def weight_bytes(self) -> int:
        """Bytes of the stored weight state (codes, scales, zero points; bias included)."""
        return sum(b.numel() * b.element_size() for b in self.buffers())


BLOCKED_DEQUANTIZE_ELEMENTS = 1 << 20  # weights this large are dequantized in row blocks (measured faster)


def dequantized_linear(rows: torch.Tensor, weight_rows, out_features: int, in_features: int, bias,
                       compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:  # fmt: skip
    """rows @ W^T + bias with W rebuilt by ``weight_rows(start, end)`` (float32 rows [end - start, K]).

    Small weights are rebuilt whole; large ones in blocks of about 2 MB, each used while it is in cache
    (one float32 copy of a 16M-element weight costs more than the matmul at 256 rows). ``compute_dtype``
    bfloat16 multiplies in bfloat16 (rows and weight rounded to it) with a float32 result.
    """
    work = rows.to(compute_dtype)
    if out_features * in_features < BLOCKED_DEQUANTIZE_ELEMENTS:
        weight = weight_rows(0, out_features)
        if compute_dtype == torch.float32:
            return F.linear(rows, weight, bias)
        out = F.linear(work, weight.to(compute_dtype)).float()
        return out if bias is None else out.add_(bias)
    step = max(16, (1 << 19) // in_features)
    out = torch.empty(rows.shape[0], out_features, dtype=rows.dtype, device=rows.device)
    for start in range(0, out_features, step):
        end = min(out_features, start + step)
        out[:, start:end] = F.linear(work, weight_rows(start, end).to(compute_dtype))
    return out if bias is None else out.add_(bias)


COMPUTE_DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}


def check_compute_dtype(owner: str, compute_dtype) -> str | None:
    """None (follow the input: bfloat16 input computes in bfloat16, anything else in float32), "f32" or "bf16"
    (also given as torch dtypes)."""
    names = {torch.bfloat16: "bf16", torch.float32: "f32"}
    compute_dtype = names.get(compute_dtype, compute_dtype)
    if compute_dtype is not None and compute_dtype not in COMPUTE_DTYPES:
        raise ConfigError(f"{owner}: compute_dtype={compute_dtype!r}; legal: None (the input's), 'f32', 'bf16'")
    return compute_dtype


class WeightOnlyLinear(RealQuantLinear):
    """Paths shared by the weight-only modules: ``packed_path`` (a bfloat16 kernel on packed codes),
    "dequantize" (float32 weight rebuilt per call, in row blocks for large weights, then float32 matmul; the
    reference rebuilds it whole) and "dequantize_bf16" (the same in bfloat16). The compute dtype is the
    input's unless ``compute_dtype`` says otherwise: a float32 model is never computed in bfloat16 behind the
    user's back; with bfloat16 compute ``auto`` takes the packed kernel for at most ``SMALL_BATCH`` rows when
    ``packed_fits()``. Subclasses give ``dequantized_weight``, ``packed_fits`` and ``run_packed``."""

    packed_path: ClassVar[str]
    has_native: ClassVar[bool] = False  # a float32 kernel in lowbit.native (the "native" path)
    SMALL_BATCH = 32
    compute_dtype: str | None = None

    def packed_fits(self) -> bool:
        raise NotImplementedError

    def run_packed(self, rows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        config = super().config()
        return config if self.compute_dtype is None else {**config, "compute_dtype": self.compute_dtype}

    def choose_path(self, rows: torch.Tensor) -> str:
        dtype = COMPUTE_DTYPES[self.compute_dtype] if self.compute_dtype else rows.dtype
        native = self.has_native and backend.native_ready()
        return routes.weight_only(rows.device, rows.shape[0], dtype, self.packed_path, self.packed_fits(),
                                  self.SMALL_BATCH, native)  # fmt: skip

    def forward_reference(self, rows: torch.Tensor) -> torch.Tensor:
        return F.linear(rows, self.dequantized_weight(), self.bias)

    def run_native(self, rows: torch.Tensor) -> torch.Tensor | None:
        """The float32 native kernel's result (contiguous float32 rows), None where it does not apply."""
        raise NotImplementedError

    def native_weight_rows(self, start: int, end: int) -> torch.Tensor | None:
        """Weight rows [start, end) rebuilt in one native pass (``native.linear.weight_rows``: the values of
        ``dequantized_weight`` bit for bit), None where no kernel takes this module's buffers."""
        return None

    def rebuilt_weight(self, start: int = 0, end: int | None = None) -> torch.Tensor:
        """The "dequantize" route's float32 weight rows: native where the backend may run native kernels and
        they take the buffers, else ``dequantized_weight`` (the same bits either way)."""
        end = self.out_features if end is None else end
        rows = self.native_weight_rows(start, end) if backend.native_ready() else None
        return self.dequantized_weight(start, end) if rows is None else rows

    def run_path(self, path: str, rows: torch.Tensor) -> torch.Tensor:
        if path == self.packed_path:
            return self.run_packed(rows)
        if path == "native":
            if native_ensure() is None:  # a forced path builds the library if need be, whatever the backend
                raise ConfigError(f"{type(self).__name__}.path='native': the native kernels are not available "
                                  f"({native_error() or 'LOWBIT_NATIVE=0'})")  # fmt: skip
            out = self.run_native(rows.contiguous())
            if out is not None:
                return out
            path = "dequantize"  # buffers the kernel does not take (moved off the CPU)
        dtype = torch.bfloat16 if path == "dequantize_bf16" else torch.float32
        return dequantized_linear(rows, self.rebuilt_weight, self.out_features, self.in_features, self.bias, dtype)


def _check_linear(module: nn.Module) -> None:
    if not isinstance(module, nn.Linear):
        raise ConfigError(f"expected an nn.Linear, got {type(module).__name__}")


def per_channel_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8 codes [N, K] in [-127, 127] and scales [N] (max|w| / 127)."""
    weight = weight.detach().float()
    if not bool(torch.isfinite(weight).all()):
        raise FormatError("the weight has NaN or inf values; it cannot be quantized")
    scale = symmetric_scale(weight).reshape(-1)
    codes = torch.round(weight * (1.0 / scale.reshape(-1, 1))).clamp(-127, 127).to(torch.int8)
    return codes, scale


class _Int8WeightLinear(RealQuantLinear):
    """Shared buffers: int8 weight codes [N, K] and float32 per-channel scales [N]."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__(in_features, out_features, bias)
        self.register_buffer("weight_codes", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("weight_scale", torch.ones(out_features))

    @classmethod
    def from_float(cls, module: nn.Linear, codes=None, scale=None, **options) -> _Int8WeightLinear:
        """Quantize ``module``'s weight per channel (or take given codes / scales)."""
        _check_linear(module)
        new = cls(module.in_features, module.out_features, module.bias is not None, **options)
        if codes is None:
            codes, scale = per_channel_int8(module.weight)
        new.weight_codes.copy_(codes)
        new.weight_scale.copy_(scale.reshape(-1))
        if module.bias is not None:
            new.bias.copy_(module.bias.detach())
        return new.to(module.weight.device)

    def dequantized_weight(self, start: int = 0, end: int | None = None) -> torch.Tensor:
        """float32 weight rows [start, end): codes * scale."""
        return self.weight_codes[start:end].float().mul_(self.weight_scale[start:end].reshape(-1, 1))

    def _packed(self):
        return self.derived("fbgemm", lambda: kernels.pack_int8_weight(self.weight_codes, self.weight_scale))

    def _packed_with_bias(self):
        return self.derived("fbgemm_bias", lambda: kernels.pack_int8_weight(self.weight_codes, self.weight_scale, self.bias))

    def _packed_unit(self):
        """fbgemm weight with unit scales: its float32 outputs are the integer sums themselves."""
        return self.derived("fbgemm_unit", lambda: kernels.pack_int8_weight(self.weight_codes, torch.ones_like(self.weight_scale)))

    def _weight_t(self) -> torch.Tensor:
        return self.derived("weight_t", lambda: dense(self.weight_codes.t()))

    def _float_weight_t(self) -> torch.Tensor:
        """Weight codes as float32 [K, N] for the exact float route (float64 off the CPU: no TF32 surprise)."""
        dtype = torch.float32 if self.weight_codes.device.type == "cpu" else torch.float64
        return self.derived("float_weight_t", lambda: self.weight_codes.t().to(dtype).contiguous())

    def _native_sums(self, codes: torch.Tensor, zero_point: torch.Tensor | None = None) -> torch.Tensor:
        """Exact int32 sums of 8-bit codes [M, K] (minus ``zero_point``) times the weight codes by lowbit's own
        kernel (``lowbit.native.gemm``: int16 pairs into int32, no saturation on any CPU), on a weight packed
        once; the same integers as every other route. A forced "native" path builds the library if need be."""
        if codes.device.type != "cpu":
            return self._float_sums(codes, zero_point, 255 if codes.dtype == torch.uint8 else 128)
        if native_ensure() is None:
            raise ConfigError(f"{type(self).__name__}.path='native': the native kernels are not available "
                              f"({native_error() or 'LOWBIT_NATIVE=0'})")  # fmt: skip
        packed = self.derived("native_int8", lambda: native_gemm.pack(self.weight_codes))
        acc = None if packed is None else native_gemm.sums(codes.contiguous(), packed)
        if acc is None:
            return self._float_sums(codes, zero_point, 255 if codes.dtype == torch.uint8 else 128)
        if zero_point is not None:
            code_sums = self.derived("code_sums", lambda: self.weight_codes.sum(1, dtype=torch.int32))
            acc.sub_(code_sums * zero_point.to(torch.int32))
        return acc

    def _float_sums(self, codes: torch.Tensor, zero_point: torch.Tensor | None = None, max_code: int = 127) -> torch.Tensor:
        """Exact int32 sums of integer codes [M, K] (minus ``zero_point``) times the weight codes, through float
        matmuls (:func:`kernels.float_codes_mm`): the route for machines without fast integer kernels."""
        weight_t = self._float_weight_t()
        centred = codes.to(weight_t.dtype)
        centred = centred if zero_point is None else centred.sub_(zero_point.to(centred.dtype))
        if weight_t.dtype == torch.float64:
            return (centred @ weight_t).to(torch.int32)
        return kernels.float_codes_mm(centred, weight_t, max_code * 127)


@register
class W8A8StaticLinear(_Int8WeightLinear):
    """int8 weights (symmetric, per channel) x activations quantized with a calibrated per-tensor scale and
    zero point (uint8 codes, or int8 with ``act_signed=True``). Paths: "int_mm" and "float_codes" (exact codes
    and sums; the second for machines without fast integer kernels) and "fbgemm" (bias fused, one call, where
    its 8-bit sums are exact; the kernel quantizes x as round(fma(x, 1 / s, zero_point)), so about one code in
    10^5 differs by one step from the reference's round(x * (1 / s)) + zero_point)."""

    paths = ("auto", "reference", "fbgemm", "int_mm", "float_codes", "native")

    def __init__(self, in_features: int, out_features: int, bias: bool = True, act_signed: bool = False) -> None:
        super().__init__(in_features, out_features, bias)
        self.act_signed = bool(act_signed)
        self.register_buffer("input_scale", torch.ones(()))
        self.register_buffer("input_zero_point", torch.zeros((), dtype=torch.int32))

    def config(self) -> dict[str, Any]:
        return {**super().config(), "act_signed": self.act_signed}

    def set_input_qparams(self, scale: float, zero_point: int) -> W8A8StaticLinear:
        qrange = (-128, 127) if self.act_signed else (0, 255)
        params = broadcast_qparams(torch.zeros((), device=self.input_scale.device), scale, zero_point, qrange=qrange)
        self.input_scale.copy_(params.scale)
        self.input_zero_point.copy_(params.zero_point)
        self._kernel_state.clear()
        return self

    def _codes(self, rows: torch.Tensor) -> torch.Tensor:
        """Activation codes (uint8, or int8 with act_signed) with the calibrated scale and zero point."""
        dtype = torch.int8 if self.act_signed else torch.uint8
        return quantize(rows, self.input_scale, self.input_zero_point, dtype=dtype)

    def forward_reference(self, rows: torch.Tensor) -> torch.Tensor:
        codes = self._codes(rows)
        zero = torch.zeros((), dtype=torch.int32, device=rows.device)
        acc = accumulate_reference(codes, self.input_zero_point, self.weight_codes, zero)
        real = acc.double() * (self.input_scale.double() * self.weight_scale.double())
        return real.float() if self.bias is None else (real + self.bias.double()).float()

    def choose_path(self, rows: torch.Tensor) -> str:
        return routes.w8a8_static(rows.device, rows.shape[0], self.in_features, self.out_features,
                                  native=backend.native_ready())

    def run_path(self, path: str, rows: torch.Tensor) -> torch.Tensor:
        if path in ("int_mm", "float_codes", "native"):
            codes = self._codes(rows)
            if path == "native":
                acc = self._native_sums(codes, self.input_zero_point)
            elif path == "int_mm":
                zero = torch.zeros((), dtype=torch.int32, device=rows.device)
                acc = accumulate_int_mm(codes, self.input_zero_point, self.weight_codes, zero)
            else:
                acc = self._float_sums(codes, self.input_zero_point, 255)
            return self._add_bias(acc.float().mul_(self.input_scale * self.weight_scale))
        zero_point = int(self.input_zero_point) + (128 if self.act_signed else 0)  # fbgemm takes uint8 codes
        return kernels.fbgemm_linear(rows, float(self.input_scale), zero_point, self._packed_with_bias())


@register
class Int8WeightOnlyLinear(_Int8WeightLinear, WeightOnlyLinear):
    """int8 weights (symmetric, per channel), float activations; paths of :class:`WeightOnlyLinear` with
    "int8pack" (bfloat16 activations, several times faster than float32 for few rows) as the packed one."""

    paths = ("auto", "reference", "int8pack", "dequantize", "dequantize_bf16", "native")
    packed_path = "int8pack"
    has_native = True

    def __init__(self, in_features: int, out_features: int, bias: bool = True, compute_dtype: str | None = None) -> None:
        super().__init__(in_features, out_features, bias)
        self.compute_dtype = check_compute_dtype(type(self).__name__, compute_dtype)

    def packed_fits(self) -> bool:
        return kernels.int8pack_available()

    def run_packed(self, rows: torch.Tensor) -> torch.Tensor:
        return self._add_bias(kernels.int8pack_linear(rows, self.weight_codes, self.weight_scale))

    def run_native(self, rows: torch.Tensor) -> torch.Tensor | None:
        return native_linear.int8_linear(rows, self.weight_codes, self.weight_scale, self.bias)

    def native_weight_rows(self, start: int, end: int) -> torch.Tensor | None:
        return native_linear.weight_rows("int8_channel", self.weight_codes[start:end], self.weight_scale[start:end])
