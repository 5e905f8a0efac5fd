"""One quantized module per op, each format-agnostic: the formats come in a :class:`RoleFormats`.

Every class subclasses the torch module it replaces (so ``isinstance(m, nn.Linear)`` still holds and the
op classification does not change) and computes ``op(q_in(x), q_w(W), q_b(b))`` followed by ``q_out``
where those roles have formats. :meth:`QuantModule.from_float` copies a float module exactly: every
parameter, buffer and hyper-parameter (weights AND biases), on the same device and dtype.
"""

from __future__ import annotations

import copy
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from lowbit.errors import ConfigError
from lowbit.nn import accumulated_ops
from lowbit.nn import weight_cache
from lowbit.nn.roles import RoleFormats


class QuantModule:
    """Mixin of every quantized module: ``formats`` (a RoleFormats) and the float class it replaces."""

    mase_op: ClassVar[str] = ""
    float_class: ClassVar[type[nn.Module]] = nn.Module
    formats: RoleFormats

    def __init__(self, *args, formats: RoleFormats | None = None, **kwargs) -> None:
        # the torch module's own constructor (next in the MRO) takes the usual arguments
        super().__init__(*args, **kwargs)
        self.formats = RoleFormats() if formats is None else formats

    @classmethod
    def from_float(cls, module: nn.Module, formats: RoleFormats) -> QuantModule:
        """A quantized copy of ``module`` (which is left untouched)."""
        if not isinstance(module, cls.float_class):
            raise ConfigError(f"{cls.__name__} replaces {cls.float_class.__name__}, got {type(module).__name__}")
        new = copy.deepcopy(module)
        new.__class__ = cls
        new.formats = formats
        return new

    def to_float(self) -> nn.Module:
        """A float copy (the quantized module's current parameters, no formats)."""
        new = copy.deepcopy(self)
        del new.formats
        new.__class__ = self.float_class
        return new

    def extra_repr(self) -> str:
        return f"{self.float_class.extra_repr(self)}, formats=[{self.formats.describe()}]"

    def _q(self, role: str, value):
        # weights and biases are quantized once while they, the formats and the grad mode allow (weight_cache)
        return weight_cache.cached_role(self, role, value, self.formats.apply)

    def _apply(self, fn, *args, **kwargs):
        weight_cache.clear(self)  # .to() / .half() / .cuda(): the cached copies would be stale
        return super()._apply(fn, *args, **kwargs)


class QuantLinear(QuantModule, nn.Linear):
    mase_op = "linear"
    float_class = nn.Linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        operands = self._q("data_in", x), self._q("weight", self.weight), self._q("bias", self.bias)
        accumulator = None if self.formats.bypass else self.formats.accumulator
        if accumulator is not None:  # partial sums rounded into a simulated accumulator
            return self._q("data_out", accumulated_ops.linear(*operands, accumulator, self.formats.stream))
        return self._q("data_out", F.linear(*operands))


class _QuantConv(QuantModule):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        operands = self._q("data_in", x), self._q("weight", self.weight), self._q("bias", self.bias)
        accumulator = None if self.formats.bypass else self.formats.accumulator
        if accumulator is not None:  # partial sums rounded into a simulated accumulator
            if self.padding_mode != "zeros":
                raise ConfigError(f"accumulator simulation needs padding_mode='zeros', got {self.padding_mode!r}")
            conv = accumulated_ops.conv2d if isinstance(self, nn.Conv2d) else accumulated_ops.conv1d
            out = conv(*operands, accumulator, self.stride, self.padding, self.dilation, self.groups,
                       self.formats.stream)  # fmt: skip
            return self._q("data_out", out)
        return self._q("data_out", self._conv_forward(*operands))


class QuantConv1d(_QuantConv, nn.Conv1d):
    mase_op = "conv1d"
    float_class = nn.Conv1d


class QuantConv2d(_QuantConv, nn.Conv2d):
    mase_op = "conv2d"
    float_class = nn.Conv2d


class QuantReLU(QuantModule, nn.ReLU):
    mase_op = "relu"
    float_class = nn.ReLU

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # never in place: the quantized input is a new tensor, and the caller's x must not change
        return self._q("data_out", F.relu(self._q("data_in", x)))


class QuantGELU(QuantModule, nn.GELU):
    mase_op = "gelu"
    float_class = nn.GELU

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._q("data_out", F.gelu(self._q("data_in", x), approximate=self.approximate))


class QuantSoftmax(QuantModule, nn.Softmax):
    mase_op = "softmax"
    float_class = nn.Softmax

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._q("data_out", F.softmax(self._q("data_in", x), self.dim))


class QuantLayerNorm(QuantModule, nn.LayerNorm):
    mase_op = "layer_norm"
    float_class = nn.LayerNorm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.layer_norm(self._q("data_in", x), self.normalized_shape, self._q("weight", self.weight),
                           self._q("bias", self.bias), self.eps)  # fmt: skip
        return self._q("data_out", out)


class QuantBatchNorm2d(QuantModule, nn.BatchNorm2d):
    mase_op = "batch_norm2d"
    float_class = nn.BatchNorm2d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        # batch statistics in training mode (or without running stats); the running ones otherwise
        use_batch_stats = self.training or self.running_mean is None
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average
                momentum = 1.0 / float(self.num_batches_tracked)
        tracked = not self.training or self.track_running_stats
        out = F.batch_norm(
            self._q("data_in", x),
            self.running_mean if tracked else None,
            self.running_var if tracked else None,
            self._q("weight", self.weight), self._q("bias", self.bias),
            use_batch_stats, momentum, self.eps,
        )  # fmt: skip
        return self._q("data_out", out)


class QuantEmbedding(QuantModule, nn.Embedding):
    mase_op = "embedding"
    float_class = nn.Embedding

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        out = F.embedding(indices, self._q("weight", self.weight), self.padding_idx, self.max_norm,
                          self.norm_type, self.scale_grad_by_freq, self.sparse)  # fmt: skip
        return self._q("data_out", out)


QUANT_MODULES: tuple[type[QuantModule], ...] = (
    QuantLinear, QuantConv1d, QuantConv2d, QuantReLU, QuantGELU, QuantSoftmax, QuantLayerNorm,
    QuantBatchNorm2d, QuantEmbedding,
)  # fmt: skip
# mase_op -> the quantized module class for a module of that op
MODULE_FOR_OP: dict[str, type[QuantModule]] = {cls.mase_op: cls for cls in QUANT_MODULES}
