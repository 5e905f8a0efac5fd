"""Real-quantized 2-D convolution: :class:`Int8Conv2d` (int8 weight codes, uint8 / int8 activation codes).

Stored (the state dict): ``weight_codes`` int8 [O, C / groups, kh, kw] (symmetric per output channel,
max|w| / 127, codes in [-127, 127]), ``weight_scale`` float32 [O], ``bias`` float32 [O] (if any) and, for
``activation="static"``, ``input_scale`` / ``input_zero_point`` (a calibrated per-tensor scale and zero
point). ``activation="dynamic"`` quantizes each input at run time per tensor, uint8 asymmetric over its
min-max range widened to include 0 (the rule of ``Int8DynamicLinear(act_granularity="tensor")``).

Paths (``module.path``):

- ``"reference"``: the input's codes, exact int64 sums (im2col, padding with the input's zero point: the
  real value 0), float64 rescaling ``acc * x_scale * w_scale[o] + bias[o]``.
- ``"int_mm"``: the same codes and sums through ``torch._int_mm`` (identical integers, identical output).
- ``"onednn"``: oneDNN's quantized convolution (``torch.ops.onednn.qconv2d_pointwise``) on the same codes,
  with a weight prepacked once, int32 accumulation and a float32 output (``acc * x_scale * w_scale + bias``
  in float32: the integer sums are exact, the output differs from the reference by float rounding only).
  A probe at first use checks that its sums are exact; otherwise ``"auto"`` takes ``"int_mm"``.

fbgemm's ``quantized::conv2d`` (prepacked by ``conv2d_prepack``) is not a path: it returns uint8 codes
requantized to one output scale, so its sums cannot be read back exactly; im2col + ``torch._int_mm`` was
13-50x slower than float32 convolution here (the unfold dominates), oneDNN 0.8-2x (docs/real-execution.md).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from lowbit.errors import ConfigError, FormatError
from lowbit.ops import capabilities, routes
from lowbit.ops._state import DerivedStateMixin
from lowbit.ops.conv import _grouped_accumulate, _output_size
from lowbit.ops.modules import register
from lowbit.ops.quant import broadcast_qparams, quantize, symmetric_scale

ACTIVATIONS = ("dynamic", "static")
FLOAT32_EPS = float(torch.finfo(torch.float32).eps)  # the smallest dynamic scale (builders.scale_zero_point's floor)


def _pair(value, name: str) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) and not isinstance(value, bool) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair):
        raise ConfigError(f"Int8Conv2d: {name}={value!r} must be an int or a pair of ints")
    return pair


def _positive(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"Int8Conv2d: {name}={value!r} must be a positive int")
    return value


def conv_problem(module: nn.Module) -> str | None:
    """Why an ``nn.Conv2d`` cannot become an :class:`Int8Conv2d` (None when it can)."""
    if module.padding_mode != "zeros":
        return f"padding_mode={module.padding_mode!r} (only 'zeros' pads with the zero point)"
    if isinstance(module.padding, str) and module.padding != "valid":
        return f"padding={module.padding!r} (give the padding as numbers)"
    return None


@register
class Int8Conv2d(DerivedStateMixin, nn.Module):
    """y = conv2d(x, W) + b with W held as int8 codes; see the module docstring for storage and paths."""

    paths: ClassVar[tuple[str, ...]] = ("auto", "reference", "onednn", "int_mm")

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, activation: str = "dynamic", act_signed: bool = False,
                 channels_last: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.in_channels, self.out_channels = _positive(in_channels, "in_channels"), _positive(out_channels, "out_channels")
        self.groups = _positive(groups, "groups")
        if in_channels % groups or out_channels % groups:
            raise ConfigError(f"Int8Conv2d: groups={groups} must divide in_channels={in_channels} and "
                              f"out_channels={out_channels}")  # fmt: skip
        self.kernel_size = tuple(_positive(k, "kernel_size") for k in _pair(kernel_size, "kernel_size"))
        self.stride = tuple(_positive(s, "stride") for s in _pair(stride, "stride"))
        self.dilation = tuple(_positive(d, "dilation") for d in _pair(dilation, "dilation"))
        self.padding = _pair(padding, "padding")
        if min(self.padding) < 0:
            raise ConfigError(f"Int8Conv2d: padding={padding!r} must not be negative")
        if activation not in ACTIVATIONS:
            raise ConfigError(f"Int8Conv2d: activation={activation!r}; legal: {', '.join(ACTIVATIONS)}")
        if not isinstance(act_signed, bool) or (act_signed and activation == "dynamic"):
            raise ConfigError(f"Int8Conv2d: act_signed={act_signed!r} must be a bool, and True only with activation='static'")
        if not isinstance(channels_last, bool):
            raise ConfigError(f"Int8Conv2d: channels_last={channels_last!r} must be True or False")
        self.activation, self.act_signed, self.channels_last = activation, act_signed, channels_last
        shape = (out_channels, in_channels // groups, *self.kernel_size)
        self.register_buffer("weight_codes", torch.zeros(shape, dtype=torch.int8))
        self.register_buffer("weight_scale", torch.ones(out_channels))
        self.register_buffer("bias", torch.zeros(out_channels) if bias else None)
        if activation == "static":
            self.register_buffer("input_scale", torch.ones(()))
            self.register_buffer("input_zero_point", torch.zeros((), dtype=torch.int32))
        self.path = "auto"
        self._kernel_state: dict[str, Any] = {}

    # ---- (de)serialization contract -------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        return {"in_channels": self.in_channels, "out_channels": self.out_channels,
                "kernel_size": list(self.kernel_size), "stride": list(self.stride), "padding": list(self.padding),
                "dilation": list(self.dilation), "groups": self.groups, "bias": self.bias is not None,
                "activation": self.activation, "act_signed": self.act_signed, "channels_last": self.channels_last}  # fmt: skip

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Int8Conv2d:
        """An empty module (zero buffers of the right shapes and dtypes) for ``load_state_dict``."""
        try:
            return cls(**config)
        except TypeError as error:
            raise ConfigError(f"bad Int8Conv2d config {config!r}: {error}") from None

    @classmethod
    def from_float(cls, module: nn.Conv2d, activation: str = "dynamic", act_signed: bool = False,
                   channels_last: bool = False, input_qparams: tuple[float, int] | None = None) -> Int8Conv2d:  # fmt: skip
        """Quantize ``module``'s weight per output channel (symmetric int8, max|w| / 127); ``input_qparams``:
        a static module's calibrated (scale, zero point), as :meth:`set_input_qparams` takes them."""
        if not isinstance(module, nn.Conv2d):
            raise ConfigError(f"Int8Conv2d.from_float expects an nn.Conv2d, got {type(module).__name__}")
        problem = conv_problem(module)
        if problem:
            raise ConfigError(f"Int8Conv2d cannot hold this convolution: {problem}")
        padding = (0, 0) if module.padding == "valid" else module.padding
        new = cls(module.in_channels, module.out_channels, module.kernel_size, module.stride, padding,
                  module.dilation, module.groups, module.bias is not None, activation, act_signed, channels_last)  # fmt: skip
        weight = module.weight.detach().float()
        if not bool(torch.isfinite(weight).all()):
            raise FormatError("the weight has NaN or inf values; it cannot be quantized")
        scale = symmetric_scale(weight.reshape(weight.shape[0], -1)).reshape(-1)  # [O]
        new.weight_codes.copy_(torch.round(weight * (1.0 / scale.reshape(-1, 1, 1, 1))).clamp(-127, 127))
        new.weight_scale.copy_(scale)
        if module.bias is not None:
            new.bias.copy_(module.bias.detach())
        return new if input_qparams is None else new.set_input_qparams(*input_qparams)

    def set_input_qparams(self, scale: float, zero_point: int) -> Int8Conv2d:
        """The calibrated per-tensor input scale and zero point (``activation="static"`` only)."""
        if self.activation != "static":
            raise ConfigError("set_input_qparams needs activation='static'; dynamic modules measure each input")
        qrange = (-128, 127) if self.act_signed else (0, 255)
        params = broadcast_qparams(torch.zeros(()), scale, zero_point, qrange=qrange)
        self.input_scale.copy_(params.scale)
        self.input_zero_point.copy_(params.zero_point)
        return self

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.config().items())

    def weight_bytes(self) -> int:
        """Bytes of the stored state (codes, scales, bias, input parameters)."""
        return sum(b.numel() * b.element_size() for b in self.buffers())

    # ---- forward ---------------------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise FormatError(f"Int8Conv2d: input of shape {tuple(x.shape)}; expected [B, {self.in_channels}, H, W]")
        if self.path not in self.paths:
            raise ConfigError(f"Int8Conv2d.path={self.path!r}; legal: {', '.join(self.paths)}")
        if self.path == "auto":
            path = routes.int8_conv(x.device)
        else:
            path = self.path
            if path != "reference":
                routes.check_forced("Int8Conv2d", path, x.device, probe="onednn_conv_exact" if path == "onednn" else None)
        out = self._run(x if x.dtype == torch.float32 else x.float(), path)  # channels-last strides
        out = out.contiguous(memory_format=self._memory_format(x))
        return out.to(x.dtype) if x.is_floating_point() and x.dtype != torch.float32 else out

    def forward_reference(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x.float(), "reference").contiguous(memory_format=self._memory_format(x))

    def _memory_format(self, x: torch.Tensor) -> torch.memory_format:
        """channels-last with ``channels_last=True``; else F.conv2d's rule (channels-last only for an input
        in that layout). Every path computes channels-last; the copy to NCHW measured up to half the time."""
        channels_last = self.channels_last or (x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous())
        return torch.channels_last if channels_last else torch.contiguous_format

    def _run(self, x: torch.Tensor, path: str) -> torch.Tensor:
        codes, scale, zero_point = self.input_codes(x, fast=path != "reference")
        if path == "onednn":
            return self._onednn(codes, scale, zero_point)
        out_h, out_w = (_output_size(x.shape[2 + i], self.kernel_size[i], self.stride[i], self.padding[i],
                                     self.dilation[i]) for i in range(2))  # fmt: skip
        if out_h < 1 or out_w < 1:
            raise FormatError(f"Int8Conv2d: the kernel {self.kernel_size} does not fit the padded input {tuple(x.shape[2:])}")
        geometry = (self.kernel_size, self.stride, self.padding, self.dilation)
        w_zero = torch.zeros(self.out_channels, dtype=torch.int64, device=x.device)
        acc = _grouped_accumulate(codes, int(zero_point), self.weight_codes, w_zero, self.groups, geometry, path)
        real = acc.double() * (scale.double() * self.weight_scale.double())  # [B * H' * W', O]
        real = real if self.bias is None else real + self.bias.double()
        return real.float().reshape(x.shape[0], out_h, out_w, self.out_channels).permute(0, 3, 1, 2)

    def input_codes(self, x: torch.Tensor, fast: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(codes, scale, zero point) of the input: calibrated (static) or from its min-max (dynamic). ``fast``
        does the float operations of :func:`lowbit.ops.quantize` in place, without its checks (same codes)."""
        if self.activation == "static":
            scale, zero_point = self.input_scale, self.input_zero_point
        else:
            scale, zero_point = dynamic_qparams(x)
        signed = self.activation == "static" and self.act_signed
        if not fast:
            return quantize(x, scale, zero_point, dtype=torch.int8 if signed else torch.uint8), scale, zero_point
        low, high = (-128, 127) if signed else (0, 255)
        scaled = torch.nan_to_num_(x * (1.0 / scale), nan=0.0)
        codes = scaled.round_().add_(zero_point).clamp_(low, high).to(torch.int8 if signed else torch.uint8)
        return codes, scale, zero_point

    def _onednn(self, codes: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor) -> torch.Tensor:
        packed = self.derived("onednn", lambda: _onednn_pack(self.weight_codes, self.weight_scale, self.stride,
                                                             self.padding, self.dilation, self.groups))  # fmt: skip
        if codes.dtype == torch.int8:  # oneDNN takes uint8 codes: shift codes and zero point alike
            codes, zero_point = (codes.to(torch.int16) + 128).to(torch.uint8), zero_point + 128
        return _onednn_conv(codes, float(scale), int(zero_point), packed, self.weight_scale,
                            self.bias, self.stride, self.padding, self.dilation, self.groups)  # fmt: skip


def dynamic_qparams(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor uint8 scale and zero point over x's range widened to include 0: the values of
    ``lowbit.calibrate.builders.scale_zero_point(min, max, 8, signed=False)``, computed without its checks."""
    low, high = torch.aminmax(x)
    scale = ((high.clamp(min=0.0) - low.clamp(max=0.0)) / 255.0).clamp(min=FLOAT32_EPS)
    if not bool(torch.isfinite(scale)):
        raise FormatError("Int8Conv2d: the input has NaN or inf values; its dynamic range is not finite")
    zero_point = (-torch.round(low.clamp(max=0.0) / scale)).clamp(0, 255).to(torch.int32)
    return scale, zero_point


# ---- oneDNN ----------------------------------------------------------------------------------------------------
def _onednn_pack(codes: torch.Tensor, scale: torch.Tensor, stride, padding, dilation, groups: int):
    """oneDNN's packed weight (packed once; measured independent of the input's scale, zero point, shape)."""
    return torch.ops.onednn.qconv_prepack(codes, scale, 1.0, 0, list(stride), list(padding), list(dilation), groups, None)


def _onednn_conv(codes, scale: float, zero_point: int, packed, weight_scale, bias, stride, padding, dilation, groups):
    """uint8 codes [B, C, H, W] conv the packed int8 weight: int32 sums, float32 acc * scale * w_scale + bias."""
    zeros = torch.zeros(weight_scale.shape[0], dtype=torch.int64)
    return torch.ops.onednn.qconv2d_pointwise(codes, scale, zero_point, packed, weight_scale, zeros, bias, list(stride),
                                              list(padding), list(dilation), groups, 1.0, 0, torch.float32, "none",
                                              [], "")  # fmt: skip


def onednn_exact() -> bool:
    """True when oneDNN's quantized convolution runs here and gives exact integer sums (cached probe)."""
    return capabilities.probe("onednn_conv_exact", "cpu")


@capabilities.register_probe("onednn_conv_exact")
def _onednn_conv_exact(device: torch.device) -> bool:
    if device.type != "cpu":
        return False
    generator = torch.Generator().manual_seed(0)
    weight = torch.randint(-127, 128, (16, 4, 3, 3), generator=generator, dtype=torch.int16).to(torch.int8)
    codes = torch.randint(0, 256, (2, 8, 6, 7), generator=generator, dtype=torch.int16).to(torch.uint8)
    codes[0, :4] = 255  # large sums of one sign
    packed = _onednn_pack(weight, torch.ones(16), (2, 1), (1, 2), (1, 2), 2)
    got = _onednn_conv(codes, 1.0, 3, packed, torch.ones(16), None, (2, 1), (1, 2), (1, 2), 2)
    expected = F.conv2d(codes.double() - 3, weight.double(), stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)
    return bool(torch.equal(got.double(), expected))
