"""HQQ: data-free half-quadratic optimisation of int4 group scales and zero points (Badri and Shaji 2023,
"Half-Quadratic Quantization of Large Machine Learning Models"), written from the paper's description.

The paper fits each group's parameters to the weight under a sparsity-promoting loss ``|W - dequant(quant(W))|_p``
with ``p < 1``: a few large errors (the weights the range cannot hold well) cost little more than many
small ones, so the fit is not dragged towards the outliers the way a squared error is. Half-quadratic
splitting adds an auxiliary error variable ``E`` and alternates two easy sub-problems:

    E  <- shrink_p(W - dequant(q), beta)        generalised soft threshold: the outlying part of the error
    params <- closed-form least squares of dequant(q) against W - E      (q: the codes for the current params)

with ``beta`` growing by ``kappa`` per step, so ``E`` is forced towards the true error by the end. The paper
updates a real zero point only; this layout stores integer zero points (uint8, 0..15, see
:mod:`lowbit.ops.int4`: the native and int4pack kernels take them so), so a real zero point rounded at the end
loses most of the gain (measured: 0.6 % lower squared error on SmolLM2 against 14 % with the zero point kept
an integer throughout). Each step therefore fits the scale in closed form for the current integer zero point,
then moves the zero point to the rounded least-squares centre. Errors are measured in code units (divided by
the group's scale), so ``beta`` does not depend on the weights' magnitude. ``p`` is 0.5 by default (the paper
suggests 0.7; the same squared error within 0.3 % on SmolLM2, and ``|r|^(p-1)`` is then a reciprocal square
root, many times cheaper than a general power on the CPU).

The result is what :class:`~lowbit.ops.int4.Int4WeightOnlyLinear` computes with: of the parameters met on the
way, each group keeps those of lowest squared error; the scale is rounded to the stored scale dtype and the
final codes are chosen with the stored values by the format's own rounding rule; a group keeps min-max
rounding's parameters where they give the lower squared error, so the result is never worse than plain rounding
in squared error. Every step is a tensor operation over all the groups of a block of rows; the blocks (about
64 K weights) only keep each block's temporaries in the caches over all its steps.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from lowbit import backend
from lowbit.native import gptq as native_gptq
from lowbit.ops.int4 import _float_group_codes, _group_codes, weight_groups

CODE_MAX = 15.0
DEFAULT_ITERATIONS, DEFAULT_P, BETA_START, KAPPA = 20, 0.5, 10.0, 1.01
FLOAT_P = 0.7  # the paper's p for its own (float zero point) form
BLOCK_ELEMENTS = 1 << 16  # weights per block of rows: the block's temporaries stay in the caches


class HqqResult(NamedTuple):
    """uint8 codes [N, K] (0..15), scales [N, K / g] (scale dtype), uint8 zero points [N, K / g]."""

    codes: torch.Tensor
    scale: torch.Tensor
    zero_point: torch.Tensor


def shrink(error: torch.Tensor, beta: float, p: float) -> torch.Tensor:
    """The proximal step of ``|x|_p`` (p < 1) at weight ``beta``: ``sign(x) * max(|x| - |x|^(p-1) / beta, 0)``
    (zero stays zero)."""
    magnitude = error.abs()
    threshold = magnitude.clamp_min(1e-12).pow(p - 1.0).div_(beta)
    return error.sign().mul_((magnitude - threshold).clamp_min_(0.0))


def kept_residual(residual: torch.Tensor, beta: float, p: float) -> torch.Tensor:
    """``residual - shrink(residual, beta, p)`` in three cheap passes: ``sign(r) * min(|r|, |r|^(p-1) / beta)``."""
    magnitude = residual.abs()
    cap = magnitude * beta ** (1.0 / (1.0 - p))  # (beta^(1/(1-p)) |r|)^(p-1) = |r|^(p-1) / beta; 0 -> inf
    cap = cap.rsqrt_() if p == 0.5 else cap.pow_(p - 1.0)  # rsqrt: many times faster than pow on the CPU
    return torch.minimum(cap, magnitude, out=cap).copysign_(residual)


def _step(groups: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, beta: float, p: float,
          low: torch.Tensor, high: torch.Tensor):  # fmt: skip
    """One round of the two sub-problems for every group; returns (squared error of the current parameters,
    next scale, next zero point). In code units (the weight over the scale), with codes q and residual r:

    - the outlying part of the error is ``shrink(r)``, so the fit sees the residual ``c = r - shrink(r)``
      (``sign(r) * min(|r|, |r|^(p-1) / beta)``: each element's pull capped) and the target ``q - z + c``;
    - the least-squares scale for the codes against that target, at the current zero point ``z``, is
      ``scale * (1 + sum((q - z) c) / sum((q - z)^2))``;
    - the zero point that centres the codes on the target over the new scale is the rounded mean of
      ``q - target / new_scale``.

    Only four sums per group are needed (q, q^2, c, q c), so each step makes a handful of passes."""
    count = groups.shape[-1]
    shifted = groups * (1.0 / scale)
    shifted += zero_point
    codes = shifted.round().clamp_(0.0, CODE_MAX)
    residual = shifted.sub_(codes)  # the error in code units
    error = torch.linalg.vector_norm(residual, dim=-1, keepdim=True).mul_(scale).square_()
    kept = kept_residual(residual, beta, p)
    code_sum, kept_sum = codes.sum(-1, keepdim=True), kept.sum(-1, keepdim=True)
    code_squares = torch.linalg.vector_norm(codes, dim=-1, keepdim=True).square_()
    cross = torch.linalg.vecdot(codes, kept).unsqueeze(-1)
    spread = code_squares - 2 * zero_point * code_sum + count * zero_point.square()
    lift = (cross - zero_point * kept_sum) / spread.clamp_min(1e-30)
    new_scale = torch.where((spread > 0) & (lift > -1), scale * (1 + lift), scale)
    centre = (code_sum + kept_sum) / count - zero_point  # mean of the target in old code units
    new_zero = (code_sum / count - centre * scale / new_scale).round_().clamp_(0.0, CODE_MAX)
    return error, torch.maximum(new_scale, _unclipped(low, high, new_zero)), new_zero


def _unclipped(low: torch.Tensor, high: torch.Tensor, zero_point: torch.Tensor) -> torch.Tensor:
    """The smallest scale whose grid reaches the group's extremes within half a step at ``zero_point``: the
    largest weights are the ones a model is most sensitive to, so they are never clipped (measured on SmolLM2:
    a free least-squares scale lowers the mean squared error but clips them, and perplexity gets worse)."""
    return torch.maximum(high / (CODE_MAX - zero_point + 0.5), -low / (zero_point + 0.5))


def optimise(groups: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, iterations: int, p: float):
    """Half-quadratic steps from (scale, integer zero point) [N, G, 1], ``beta`` growing by ``KAPPA`` per step,
    the scale never below :func:`_unclipped`'s; returns the pair of lowest squared error met on the way."""
    low = groups.amin(-1, keepdim=True).clamp_(max=0.0)
    high = groups.amax(-1, keepdim=True).clamp_(min=0.0)
    beta = BETA_START
    best_scale, best_zero, best_error = scale, zero_point, None
    for _ in range(iterations + 1):
        error, next_scale, next_zero = _step(groups, scale, zero_point, beta, p, low, high)
        if best_error is None:
            best_error = error
        better = error < best_error
        best_scale = torch.where(better, scale, best_scale)
        best_zero = torch.where(better, zero_point, best_zero)
        best_error = torch.minimum(error, best_error)
        scale, zero_point = next_scale, next_zero
        beta *= KAPPA
    return best_scale, best_zero


def _stored(groups: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, scale_dtype: torch.dtype):
    """(codes, scale, zero point) with the scale rounded to ``scale_dtype``, codes by the format's rule."""
    scale = scale.to(scale_dtype).float().clamp_min_(torch.finfo(torch.float32).tiny)
    inverse = 1.0 / scale  # the format's rounding rule, as _group_codes applies it
    codes = torch.round(groups * inverse).add_(zero_point).clamp_(0.0, CODE_MAX)
    return codes, scale, zero_point


def hqq_quantize(weight: torch.Tensor, group_size: int, scale_dtype: torch.dtype = torch.bfloat16,
                 iterations: int = DEFAULT_ITERATIONS, p: float = DEFAULT_P) -> HqqResult:  # fmt: skip
    """uint8 codes [N, K], scales [N, K / g] (scale_dtype), uint8 zero points [N, K / g] of ``weight``.

    A CPU weight at p = 0.5 runs the native kernel (csrc/hqq.c) once the library is loaded: the same steps, each
    group's sums in input order (torch picks its own), so a step whose error ties another's may be kept instead."""
    native = _native_hqq(weight, group_size, scale_dtype, iterations, p)
    if native is not None:
        return native
    n, k = weight.shape
    groups, low, high = weight_groups(weight, group_size)
    plain = _group_codes(groups, low, high, scale_dtype)  # min-max rounding: the start and the fallback
    start_scale = (high - low).div_(CODE_MAX).clamp_min_(1e-30)
    start_zero = torch.round(-low / start_scale).clamp_(0.0, CODE_MAX)
    rows = max(1, BLOCK_ELEMENTS // k)
    fitted = [optimise(groups[i : i + rows], start_scale[i : i + rows], start_zero[i : i + rows], iterations, p)
              for i in range(0, n, rows)]  # fmt: skip
    scale, zero_point = torch.cat([pair[0] for pair in fitted]), torch.cat([pair[1] for pair in fitted])
    tuned = _stored(groups, scale, zero_point, scale_dtype)
    errors = [(codes - zero_point).mul_(step).sub_(groups).square_().sum(-1, keepdim=True)
              for codes, step, zero_point in (plain, tuned)]  # fmt: skip
    keep = errors[1] <= errors[0]
    codes, scale, zero_point = (torch.where(keep, new, old) for new, old in zip(tuned, plain, strict=True))
    return HqqResult(codes.reshape(n, k).to(torch.uint8), scale.squeeze(-1).to(scale_dtype),
                     zero_point.squeeze(-1).to(torch.uint8))  # fmt: skip


def hqq_float_quantize(weight: torch.Tensor, group_size: int, scale_dtype: torch.dtype = torch.bfloat16,
                       iterations: int = DEFAULT_ITERATIONS, p: float = FLOAT_P) -> HqqResult:  # fmt: skip
    """The paper's own form, for the float zero-point domain: each group's scale stays min-max's, its zero point
    starts at min-max's and is a float moved by the half-quadratic steps (the mean of ``q - (w - shrink(e)) /
    scale``); of the zero points met, each group keeps the one of lowest mean |error|. Returns codes [N, K],
    scales [N, K / g] and the minima -zero * scale [N, K / g] (both in ``scale_dtype``), codes by the float
    domain's rule for the stored values.

    Measured (int4 g64, perplexity): a start rounded to an integer (0 on the grid, as AutoAWQ and torchao's HQQ
    start) gives SmolLM2 151.5 against 161.9 from this start, but Gemma-3-270M 183.5 against 156.9; keeping per
    group the start whose steps end with the lower mean |error| gives SmolLM2 161.0. This start is kept."""
    n, k = weight.shape
    groups, low, high = weight_groups(weight, group_size, widen=False)
    _, scale, _ = _float_group_codes(groups, low, high, scale_dtype)  # min-max's stored scale, kept
    spread = high > low  # a group of one value keeps min-max's minimum (itself)
    inverse = torch.where(spread, 1.0 / scale, torch.ones_like(scale))  # code units per weight unit
    rows = max(1, BLOCK_ELEMENTS // k)
    start = -low * inverse  # min-max's own zero point
    zeros = [_float_zero(groups[i:i + rows], inverse[i:i + rows], start[i:i + rows], iterations, p)
             for i in range(0, n, rows)]  # fmt: skip
    minimum = torch.where(spread, -torch.cat(zeros) * scale, low).to(scale_dtype).float()
    codes = torch.round((groups - minimum) * (1.0 / scale)).clamp_(0.0, CODE_MAX)
    return HqqResult(codes.reshape(n, k).to(torch.uint8), scale.squeeze(-1).to(scale_dtype),
                     minimum.squeeze(-1).to(scale_dtype))  # fmt: skip


def _float_zero(groups: torch.Tensor, inverse: torch.Tensor, zero: torch.Tensor, iterations: int, p: float):
    """The steps for one block of rows: groups [R, G, g], code units per weight unit and float zero points
    [R, G, 1]; returns the zero points of lowest mean |error| met."""
    beta, best_zero, best_error = BETA_START, zero, None
    for _ in range(iterations):
        codes = torch.round(groups * inverse + zero).clamp_(0.0, CODE_MAX)
        error = groups - (codes - zero) / inverse
        mean_error = error.abs().mean(-1, keepdim=True)
        if best_error is None:
            best_zero, best_error = zero, mean_error
        better = mean_error < best_error
        best_zero, best_error = torch.where(better, zero, best_zero), torch.minimum(mean_error, best_error)
        zero = (codes - (groups - shrink(error, beta, p)) * inverse).mean(-1, keepdim=True)
        beta *= KAPPA
    return best_zero


def _native_hqq(weight: torch.Tensor, group_size: int, scale_dtype: torch.dtype, iterations: int, p: float):
    if p != 0.5 or weight.device.type != "cpu" or not backend.native_ready():
        return None
    columns = weight.detach().float().t().contiguous()  # [K, N]; NaN / inf: not taken, the torch code says so
    result = native_gptq.hqq_fit(columns, group_size, scale_dtype, iterations, BETA_START, KAPPA)
    if result is None:
        return None
    codes, scale, zero_point = result
    return HqqResult(codes, scale.t().to(scale_dtype), zero_point.t().to(torch.uint8))


__all__ = ["HqqResult", "hqq_float_quantize", "hqq_quantize", "kept_residual", "shrink"]
