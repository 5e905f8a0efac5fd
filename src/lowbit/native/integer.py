"""Native kernels of the integer family (csrc/fixed.c, csrc/affine.c with affine_params.h): fixed point (``integer`` / ``fixed``) and affine
(given or min-max scales per tensor, per channel or per block of the last dimension; the Burn presets).

Each function takes a float32 contiguous CPU tensor and a format spec (read by attribute: this layer does not
import the formats) and returns the float32 result, bit for bit the eager one, or None where no kernel
applies (library not loaded, stochastic rounding, a block shape other than per tensor / per channel / blocks
along the last dimension, memory exhausted); the caller then runs the eager path.

A spec's constants are packed once into a C structure (``_prepared``, keyed by the spec object), so that a
call passes a handful of arguments: Python overhead dominates at a few hundred thousand elements.
"""

from __future__ import annotations

import ctypes
import math
import weakref

import torch

from lowbit.native import kernels
from lowbit.native.interface import AFFINE_KINDS, AFFINE_LAYOUTS, AFFINE_SCALE_DTYPES, AffineSpec, FixedSpec

_SHORTEN_MAX_CODE_BITS = 11  # formats/scaling.py: wider codes keep their scale unchanged
_TENSOR, _ROWS, _CHANNELS, _GIVEN = (AFFINE_LAYOUTS[name] for name in ("tensor", "rows", "channels", "given"))
_MAX_PREPARED = 512  # specs (and shapes per spec) remembered before the memo starts over


class _Prepared:
    """One spec's C structure (its address), the tensors it points into, and its layout per input shape."""

    def __init__(self, spec, structure: ctypes.Structure | None, keep: tuple = ()):
        self.spec_ref = weakref.ref(spec)
        self.structure, self.keep, self.layouts = structure, keep, {}
        self.address = ctypes.addressof(structure) if structure is not None else None


_prepared: dict[int, _Prepared] = {}


def fixed_point(x: torch.Tensor, spec) -> torch.Tensor | None:
    """Integer.quantize: clamp(round(x * 2^f), q_min, q_max) * 2^-f (spec: width, frac_width, signed)."""
    entry = kernels.function("lb_fixed_f32")
    prepared = _prepared_for(spec, _fixed_structure)
    half = kernels.HALF_CODES.get(x.dtype)
    if entry is None or prepared.address is None or half is None:
        return None
    out = torch.empty_like(x)
    entry(x.data_ptr(), out.data_ptr(), x.numel(), prepared.address, half, kernels.threads())
    return out


def affine(x: torch.Tensor, spec, block_shape) -> torch.Tensor | None:
    """Affine.quantize: given parameters, or min-max ones over the blocks ``block_shape(shape, block_size,
    axis, skip_first_dim)`` gives (formats.blocking.block_shape, passed in: it lives a layer above)."""
    entry = kernels.function("lb_affine_f32")  # 0: it could not allocate (nothing written)
    prepared = _prepared_for(spec, _affine_structure)
    half = kernels.HALF_CODES.get(x.dtype)
    if entry is None or prepared.address is None or half is None:
        return None
    shape = x.shape
    layout = prepared.layouts.get(shape)
    if layout is None:
        layout = _given_layout(spec, shape) if spec.scale is not None else _derived_layout(spec, shape, block_shape)
        if len(prepared.layouts) > _MAX_PREPARED:
            prepared.layouts.clear()
        prepared.layouts[shape] = layout
    if not layout:
        return None
    out = torch.empty_like(x)
    done = entry(x.data_ptr(), out.data_ptr(), *layout, prepared.address, half, kernels.threads())
    return out if done else None


def _prepared_for(spec, make) -> _Prepared:
    prepared = _prepared.get(id(spec))
    if prepared is None or prepared.spec_ref() is not spec:
        if len(_prepared) > _MAX_PREPARED:
            _prepared.clear()
        prepared = _prepared[id(spec)] = make(spec)
    return prepared


def _fixed_structure(spec) -> _Prepared:
    mode = kernels.ROUNDING_CODES.get(spec.rounding)
    if mode is None:
        return _Prepared(spec, None)
    width, frac_width = spec.width, spec.frac_width
    q_min, q_max = (-(2 ** (width - 1)), 2 ** (width - 1) - 1) if spec.signed else (0, 2**width - 1)
    keep_sign = frac_width < 0 and not spec.rounding.startswith("nearest")  # see Integer._quantize
    structure = FixedSpec(math.ldexp(1.0, frac_width), math.ldexp(1.0, -frac_width), q_min, q_max,
                           int(keep_sign), mode)  # fmt: skip
    return _Prepared(spec, structure)


def _affine_structure(spec) -> _Prepared:
    mode = kernels.ROUNDING_CODES.get(spec.rounding)
    if mode is None:
        return _Prepared(spec, None)
    q_min, q_max = spec.code_range
    clamp_low, clamp_high = spec.clamp_range
    kind = AFFINE_KINDS[("full_range" if spec.full_range_scale else "symmetric") if spec.symmetric else "asymmetric"]
    shorten = spec.bits if spec.bits <= _SHORTEN_MAX_CODE_BITS else 0
    scales = torch.tensor(spec.scale if spec.scale is not None else (1.0,), dtype=torch.float32)
    zero_points = torch.tensor(spec.zero_point or (0,), dtype=torch.float32)
    structure = AffineSpec(q_min, q_max, clamp_low, clamp_high, kind, int(spec.power_of_two),
                            AFFINE_SCALE_DTYPES[spec.scale_dtype], shorten, mode, 0, scales.data_ptr(),
                            zero_points.data_ptr(), scales.numel(), zero_points.numel())  # fmt: skip
    return _Prepared(spec, structure, (scales, zero_points))


def _given_layout(spec, shape: torch.Size) -> tuple | None:
    """(GIVEN, outer, channels, inner) with channels along ``axis``; None where the number of given values
    matches neither 1 nor the axis (the eager path raises the error)."""
    numel, outer, channels, inner = math.prod(shape), math.prod(shape), 1, 1
    if spec.axis is not None and len(shape):
        if not -len(shape) <= spec.axis < len(shape):
            return None
        axis = spec.axis % len(shape)
        channels, inner = shape[axis], math.prod(shape[axis + 1 :])
        outer = numel // max(channels * inner, 1)
    counts = (len(spec.scale), len(spec.zero_point or (0,)))
    if numel == 0 or any(count not in (1, channels) for count in counts):
        return None
    return _GIVEN, outer, channels, inner


def _derived_layout(spec, shape: torch.Size, block_shape) -> tuple | None:
    """(layout, d0, d1, d2): the whole tensor, rows cut into blocks along the last dimension, or one block
    per index of one dimension; None for any other block shape."""
    numel = math.prod(shape)
    if numel == 0:
        return None
    block = block_shape(shape, spec.block_size, spec.axis, spec.skip_first_dim)
    shape = tuple(shape)
    if not shape or block == shape:
        return _TENSOR, numel, 1, 1
    if all(b == 1 for b in block[:-1]):
        return _ROWS, numel // shape[-1], shape[-1], block[-1]
    split = [index for index, (b, dim) in enumerate(zip(block, shape, strict=True)) if b != dim]
    if len(split) != 1 or block[split[0]] != 1:
        return None
    axis = split[0]
    outer, channels, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :])
    if outer == 1:
        return _ROWS, channels, inner, inner
    return _CHANNELS, outer, channels, inner
