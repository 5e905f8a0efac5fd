"""Native kernels of the sign and logarithmic formats (csrc/log.c, csrc/sign*.c, csrc/residual.c): ``log``, ``binary``,
``binary_residual`` and ``ternary``. Each takes a float32 contiguous CPU tensor and returns the float32 result
bit for bit as the eager ``_quantize`` gives it, or None where the kernel does not apply (no library, a
stochastic or unknown mode, a layout or parameter outside its range, memory short for its statistics): the
caller then runs the eager path."""

from __future__ import annotations

import ctypes
import functools

import torch

from lowbit.native import kernels

_FLOAT32_MAX_EXPONENT = 127
_RESIDUAL_MAX_POINTS = 32  # RESIDUAL_MAX_POINTS in residual.c
_TERNARY, _BIPOLAR, _UNIPOLAR = 0, 1, 2  # ELEMENT_* in sign.h


def group_layout(shape: torch.Size, axis: int | None) -> tuple[int, int, int] | None:
    """(outer, groups, inner): x viewed as [outer, groups, inner] with one statistic per middle index (per
    tensor: one group). None for an axis the tensor does not have (the eager path raises the error)."""
    numel = shape.numel()
    if axis is None:
        return 1, 1, numel
    if len(shape) == 0 or not -len(shape) <= axis < len(shape):
        return None
    dim = axis % len(shape)
    outer = shape[:dim].numel()
    return outer, shape[dim], shape[dim + 1 :].numel()


def _address(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def _per_group(values: tuple[float, ...] | None, groups: int) -> torch.Tensor | None:
    """Given per-tensor / per-channel values as one float32 per group, or None when their count fits neither."""
    if len(values) == 1:
        return torch.full((groups,), values[0], dtype=torch.float32)
    return torch.tensor(values, dtype=torch.float32) if len(values) == groups else None


def log(x: torch.Tensor, min_exponent: int, max_exponent: int, rounding: str, log_domain: bool,
        below_sqrt2: float) -> torch.Tensor | None:  # fmt: skip
    """formats/log.round_to_power_of_two on float32 (``below_sqrt2``: the largest float32 below sqrt(2))."""
    entry = kernels.function("lb_log_f32")
    mode, half = kernels.ROUNDING_CODES.get(rounding), kernels.HALF_CODES.get(x.dtype)
    if entry is None or mode is None or half is None or min_exponent > _FLOAT32_MAX_EXPONENT:
        return None
    top_code = min(max_exponent, _FLOAT32_MAX_EXPONENT) - min_exponent + 1
    out = torch.empty_like(x)
    entry(x.data_ptr(), out.data_ptr(), x.numel(), min_exponent, top_code, below_sqrt2,
          int(log_domain and rounding.startswith("nearest")), mode, half, kernels.threads())  # fmt: skip
    return out


def ternary(x: torch.Tensor, axis: int | None, threshold: float | None, scaled: bool,
            alpha: tuple[float, ...] | None) -> torch.Tensor | None:  # fmt: skip
    """formats/ternary.py: ``threshold`` fixed (already a magnitude) or None (TWN: 0.75 mean |x| per group);
    the values +-alpha (given), +-TWN scale (``scaled``) or +-1."""
    entry = kernels.function("lb_ternary_f32")
    prepared = _grouped(entry, x, axis, alpha)
    if prepared is None:
        return None
    layout, given, out = prepared
    done = entry(x.data_ptr(), out.data_ptr(), *layout, int(threshold is not None), threshold or 0.0, int(scaled),
                 _address(given), kernels.HALF_CODES[x.dtype], kernels.threads())  # fmt: skip
    return out if done else None


def binary(x: torch.Tensor, axis: int | None, bipolar: bool, scaled: bool,
           alpha: tuple[float, ...] | None) -> torch.Tensor | None:  # fmt: skip
    """formats/binary.py, deterministic: +-1 / {0, 1}, scaled by the given alpha or the per-group mean."""
    entry = kernels.function("lb_binary_f32")
    prepared = _grouped(entry, x, axis if scaled else None, alpha)
    if prepared is None:
        return None
    layout, given, out = prepared
    done = entry(x.data_ptr(), out.data_ptr(), *layout, int(bipolar), int(scaled), _address(given),
                 kernels.HALF_CODES[x.dtype], kernels.threads())  # fmt: skip
    return out if done else None


def _grouped(entry, x: torch.Tensor, axis: int | None, alpha: tuple[float, ...] | None):
    """(group layout, the given alphas as one float32 per group or None, output tensor) for ternary / binary, or
    None where the kernel does not apply (no library, an axis x lacks, an empty tensor, alphas matching no
    group count)."""
    layout = group_layout(x.shape, axis)
    if entry is None or layout is None or x.numel() == 0 or x.dtype not in kernels.HALF_CODES:
        return None
    given = None if alpha is None else _per_group(alpha, layout[1])
    if alpha is not None and given is None:
        return None
    return layout, given, torch.empty_like(x)


def residual(x: torch.Tensor, thresholds: tuple[float, ...], values: tuple[float, ...]) -> torch.Tensor | None:
    """formats/binary.BinaryResidual: values[the number of ``thresholds`` x reaches] (at most 32 thresholds,
    ascending; -0 does not reach a +0 threshold)."""
    entry = kernels.function("lb_residual_f32")
    half = kernels.HALF_CODES.get(x.dtype)
    if entry is None or half is None or len(thresholds) > _RESIDUAL_MAX_POINTS or len(values) != len(thresholds) + 1:
        return None
    arrays = _residual_arrays(thresholds, values)
    out = torch.empty_like(x)
    entry(x.data_ptr(), out.data_ptr(), x.numel(), len(thresholds), *arrays[1:], half, kernels.threads())
    return out


@functools.lru_cache(maxsize=64)
def _residual_arrays(thresholds: tuple[float, ...], values: tuple[float, ...]) -> tuple:
    """C arrays of the grid (kept alive here) and their addresses."""
    points = len(thresholds)
    arrays = ((ctypes.c_float * points)(*thresholds), (ctypes.c_float * (points + 1))(*values))
    return (arrays, *(ctypes.addressof(a) for a in arrays))
