"""The numbers of the quantization report, each a small pure function of tensors and format specs.

- SQNR: ``10 * log10(sum(f^2) / sum((q - f)^2))`` in dB, over the elements where both the float value ``f``
  and the quantized value ``q`` are finite; +inf when q equals f there.
- relative error: ``||q - f|| / ||f||`` (the L2 norm over the same elements); 10^(-SQNR / 20).
- bits per element of a stored tensor: what the format stores per element, shared scales and zero points
  included (:func:`storage_bits_per_element`); bytes round the tensor's total bits up to whole bytes.
- clamped share: the share of a tensor's elements that lie beyond the range the format can represent (by
  more than half a step), so that they saturate (:func:`clamped_count`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from lowbit.formats import FormatSpec
from lowbit.formats.affine import Affine
from lowbit.formats.scaling import SCALE_DTYPE_BITS


# ---- signal-to-quantization-noise ----------------------------------------------------------------------
@dataclass
class ErrorSums:
    """Running sums of a float signal and its quantization noise, in float64 (one per layer output)."""

    signal: float = 0.0  # sum of f^2
    noise: float = 0.0  # sum of (q - f)^2
    elements: int = 0  # elements where both are finite
    nonfinite: int = 0  # elements where f is finite and q is not (NaN / inf made by quantization)
    float_nonfinite: int = 0  # elements where f itself is NaN / inf (left out of the sums)

    def add(self, float_values: torch.Tensor, quantized_values: torch.Tensor) -> None:
        f = float_values.detach().double().reshape(-1)
        q = quantized_values.detach().double().reshape(-1)
        finite_float = torch.isfinite(f)
        both = finite_float & torch.isfinite(q)
        self.nonfinite += int((finite_float & ~both).sum())
        self.float_nonfinite += int((~finite_float).sum())
        self.signal += float(f[both].square().sum())
        self.noise += float((q[both] - f[both]).square().sum())
        self.elements += int(both.sum())

    @property
    def sqnr_db(self) -> float:
        return sqnr_from_sums(self.signal, self.noise)

    @property
    def relative_error(self) -> float:
        return relative_error_from_sums(self.signal, self.noise)


def sqnr_from_sums(signal: float, noise: float) -> float:
    """10 log10(signal / noise) in dB: +inf without noise, -inf for noise on a zero signal, NaN for nothing."""
    if noise == 0.0:
        return math.inf if signal > 0.0 else math.nan
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def relative_error_from_sums(signal: float, noise: float) -> float:
    if signal == 0.0:
        return 0.0 if noise == 0.0 else math.inf
    return math.sqrt(noise / signal)


def sqnr_db(float_values: torch.Tensor, quantized_values: torch.Tensor) -> float:
    """SQNR of one pair of tensors (see the module docstring)."""
    sums = ErrorSums()
    sums.add(float_values, quantized_values)
    return sums.sqnr_db


def relative_error(float_values: torch.Tensor, quantized_values: torch.Tensor) -> float:
    sums = ErrorSums()
    sums.add(float_values, quantized_values)
    return sums.relative_error


# ---- storage -------------------------------------------------------------------------------------------
def storage_bits_per_element(spec: FormatSpec | None, shape: tuple[int, ...], float_bits: int = 32) -> float:
    """Average stored bits per element of a tensor of ``shape`` in ``spec`` (None: ``float_bits``).

    The format's own ``bits_per_element`` counts the scales and zero points it derives per block from the
    data. An affine format with a *given* scale (static PTQ) stores those too: one scale (in its
    ``scale_dtype``) per given value, and one zero point of ``bits`` bits per given value when it is not
    symmetric.
    """
    if spec is None:
        return float(float_bits)
    numel = math.prod(shape)
    bits = float(spec.bits_per_element(tuple(shape)))
    if isinstance(spec, Affine) and spec.scale is not None and numel > 0:
        scales = len(spec.scale) if isinstance(spec.scale, tuple) else 1
        overhead = scales * SCALE_DTYPE_BITS[spec.scale_dtype]
        if spec.zero_point is not None and not spec.symmetric:
            points = len(spec.zero_point) if isinstance(spec.zero_point, tuple) else 1
            overhead += points * spec.bits
        bits += overhead / numel
    return bits


def storage_bytes(bits_per_element: float, numel: int) -> int:
    """Whole bytes holding ``numel`` elements of ``bits_per_element`` bits (total bits rounded up)."""
    total_bits = round(bits_per_element * numel, 6)  # per-block overheads make the product an integer
    return math.ceil(total_bits / 8)


def dtype_bits(tensor: torch.Tensor) -> int:
    return tensor.element_size() * 8


# ---- clamping ------------------------------------------------------------------------------------------
_SCALE_ROUNDING = 1e-6  # relative slack of a data-derived range (a few float32 ulps)
@dataclass
class ClampCounts:
    """Elements seen and elements outside the format's range, per role."""

    counts: dict[str, list[int]] = field(default_factory=dict)  # role -> [clamped, total]

    def add(self, role: str, clamped: int, total: int) -> None:
        entry = self.counts.setdefault(role, [0, 0])
        entry[0] += clamped
        entry[1] += total

    def share(self, role: str) -> float | None:
        clamped, total = self.counts.get(role, (0, 0))
        return clamped / total if total else None


def clamped_count(spec: FormatSpec, values: torch.Tensor) -> int:
    """How many finite elements of ``values`` saturate in ``spec``: they lie more than half an edge step
    beyond the format's smallest or largest value, so the clamp, not rounding, decides where they go.

    The range and edge steps are exact where the format fixes them: formats with a value set (integer /
    fixed, minifloats, log, unscaled OCP floats, ...) and affine formats with given scales (per channel
    when there is one scale per channel); wide floats use their largest value. Where the scale follows the
    data (min-max affine, block and MX formats, scaled binary / ternary) the distinct values of the whole
    quantized tensor give them (plus a relative 1e-6 for the float rounding of scales): exact for
    per-tensor scales, a lower bound for per-block ones.
    """
    x = values.detach()
    if x.numel() == 0 or not x.is_floating_point():
        return 0
    lower, upper = _clamp_limits(spec, x)
    outside = (x < lower) | (x > upper)
    return int((outside & torch.isfinite(x)).sum())


def _clamp_limits(spec: FormatSpec, x: torch.Tensor):
    values = spec.value_set()
    if values is not None and values.numel() > 0:
        return _grid_limits(values)
    if isinstance(spec, Affine) and spec.scale is not None:
        return _given_affine_limits(spec, x)
    largest = getattr(spec, "max_value", None)
    if isinstance(largest, float) and not getattr(spec, "is_scaled", False):
        return -largest, largest
    quantized = spec.quantize(x.float())
    grid = torch.unique(quantized[torch.isfinite(quantized)]).double()
    if grid.numel() == 0:
        return math.inf, -math.inf  # every finite input became NaN / inf: all of them are out of range
    lower, upper = _grid_limits(grid)
    slack = _SCALE_ROUNDING * float(grid.abs().max())
    return lower - slack, upper + slack


def _grid_limits(grid: torch.Tensor) -> tuple[float, float]:
    """Half a step below the smallest and above the largest value of a sorted grid."""
    low, high = float(grid[0]), float(grid[-1])
    if grid.numel() < 2:
        return low, high
    return low - float(grid[1] - grid[0]) / 2, high + float(grid[-1] - grid[-2]) / 2


def _given_affine_limits(spec: Affine, x: torch.Tensor):
    """(q_min - zp - 1/2) * scale and (q_max - zp + 1/2) * scale, per channel along ``axis``."""
    q_min, q_max = spec.clamp_range
    scale = torch.tensor(spec.scale, dtype=torch.float64)  # [channels] or [1]
    zero = torch.tensor(spec.zero_point if spec.zero_point is not None else (0,), dtype=torch.float64)
    lower, upper = (q_min - zero - 0.5) * scale, (q_max - zero + 0.5) * scale
    if lower.numel() > 1 and spec.axis is not None and x.dim() > 0:
        shape = [1] * x.dim()
        shape[spec.axis % x.dim()] = -1
        lower, upper = lower.reshape(shape), upper.reshape(shape)
    else:
        lower, upper = lower.reshape(-1)[0], upper.reshape(-1)[0]
    return lower.to(x.dtype), upper.to(x.dtype)


# ---- task metrics --------------------------------------------------------------------------------------
METRICS = ("accuracy", "cosine")


@dataclass
class TaskMetric:
    """Scores a model's outputs on the report's batches: ``accuracy`` (share of top-1 hits, 0..1, needs
    labels) or ``cosine`` (mean per-sample cosine similarity to the float model's outputs)."""

    kind: str
    float_outputs: list[torch.Tensor]
    labels: list[torch.Tensor] | None = None

    def score(self, outputs: list[torch.Tensor]) -> float:
        if self.kind == "accuracy":
            hits = sum(correct_predictions(o, y) for o, y in zip(outputs, self.labels, strict=True))
            return hits / sum(int(y.numel()) for y in self.labels)
        cosines = [cosine_similarities(f, o) for f, o in zip(self.float_outputs, outputs, strict=True)]
        return float(torch.cat(cosines).mean())


def correct_predictions(outputs: torch.Tensor, labels: torch.Tensor) -> int:
    """Top-1 hits: argmax over the last dimension equals the label."""
    return int((outputs.detach().argmax(dim=-1) == labels.to(outputs.device)).sum())


def cosine_similarities(float_outputs: torch.Tensor, quantized_outputs: torch.Tensor) -> torch.Tensor:
    """Per-sample cosine similarity of the flattened outputs (dimension 0 is the batch), float64."""
    f = float_outputs.detach().double().reshape(float_outputs.shape[0], -1) if float_outputs.dim() else \
        float_outputs.detach().double().reshape(1, 1)  # fmt: skip
    q = quantized_outputs.detach().double().reshape(f.shape)
    return torch.nn.functional.cosine_similarity(f, q, dim=1)
