"""The K-quants' per-sub-block search (``search=True`` of ``gguf_q4_k`` / ``gguf_q6_k``): lowbit's own
implementation of the idea behind llama.cpp's ``make_qkx2_quants`` / ``make_qx_quants`` (try a fan of scales
around the min-max one, fit each trial's codes by weighted least squares, keep the trial with the lowest
weighted squared error). The fitted scale (and minimum) are the sub-block's *wanted* values; the super-block
then rounds them to its float16 d (dmin) and 6- / 8-bit integers as the min-max rule does.

Weights: Q4_K ``rms(sub-block) + |x|`` (large elements matter more), Q6_K ``x^2``; NaN and +-inf elements
are read as zeros here (their codes still saturate / stay NaN).
"""

from __future__ import annotations

import torch

TRIALS = tuple(0.1 * step for step in range(-10, 11))  # scale multipliers' offsets around the min-max one


def _finite(sub: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(``sub`` with NaN and +-inf read as 0 (so a NaN element weighs exactly what a zero does), divided by
    its sub-block's largest |x| so squares cannot overflow; that divisor [..., 1]). Least squares and the
    weights scale along, so the fit of the divided values times the divisor is the fit of the values."""
    clean = torch.where(torch.isfinite(sub), sub, torch.zeros_like(sub))
    peak = clean.abs().amax(-1, keepdim=True)
    peak = torch.where(peak > 0, peak, torch.ones_like(peak))
    return clean / peak, peak


def q4_k_ranges(sub: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Wanted (scale >= 0, minimum >= 0: value = scale * q - minimum) per sub-block of ``sub`` [..., 32], starting
    from its min-max range [low <= 0, high] ([...] each)."""
    x, divisor = _finite(sub)
    weight = x.square().mean(-1, keepdim=True).sqrt() + x.abs()
    low, high = low.unsqueeze(-1) / divisor, high.unsqueeze(-1) / divisor
    width = high - low
    best_scale, best_low = width / 15.0, low
    best_error = _error(x, weight, best_scale, best_low, 15)
    for offset in TRIALS:
        inverse = torch.where(width > 0, (15.0 + offset) / width, torch.zeros_like(width))
        codes = torch.round((x - low) * inverse).clamp(0, 15)
        scale, fitted_low = _fit_affine(x, weight, codes)
        error = _error(x, weight, scale, fitted_low, 15)
        better = error < best_error  # a degenerate fit (NaN) never wins
        best_scale = torch.where(better, scale, best_scale)
        best_low = torch.where(better, fitted_low, best_low)
        best_error = torch.where(better, error, best_error)
    largest = torch.finfo(x.dtype).max  # a fit past the extreme elements of a block near float32's max
    return ((best_scale * divisor).squeeze(-1).clamp(0.0, largest),
            (-best_low * divisor).squeeze(-1).clamp(0.0, largest))  # fmt: skip


def _fit_affine(x: torch.Tensor, weight: torch.Tensor, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted least-squares (scale, low) of x ~ scale * codes + low with low <= 0 (NaN where singular)."""
    sum_w, sum_c = weight.sum(-1, keepdim=True), (weight * codes).sum(-1, keepdim=True)
    sum_cc, sum_x = (weight * codes * codes).sum(-1, keepdim=True), (weight * x).sum(-1, keepdim=True)
    sum_cx = (weight * codes * x).sum(-1, keepdim=True)
    determinant = sum_w * sum_cc - sum_c * sum_c
    singular = determinant <= 0
    determinant = torch.where(singular, torch.full_like(determinant, torch.nan), determinant)
    scale = (sum_w * sum_cx - sum_x * sum_c) / determinant
    low = (sum_cc * sum_x - sum_c * sum_cx) / determinant
    positive = low > 0  # the stored minimum is unsigned: refit the scale alone with low = 0
    scale = torch.where(positive, sum_cx / sum_cc.clamp_min(torch.finfo(x.dtype).tiny), scale)
    return scale, torch.where(positive, torch.zeros_like(low), low)


def _error(x, weight, scale, low, top: int) -> torch.Tensor:
    inverse = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    codes = torch.round((x - low) * inverse).clamp(0, top)
    return (weight * (scale * codes + low - x).square()).sum(-1, keepdim=True)


def q6_k_scales(sub: torch.Tensor, peak: torch.Tensor) -> torch.Tensor:
    """Wanted signed scale per sub-block of ``sub`` [..., 16] (value = scale * q, q in -32..31), starting from
    ``peak / -32`` ([...], the element of largest |x|): trials around it, each fitted by least squares."""
    x, divisor = _finite(sub)
    weight = x.square()
    peak = peak.unsqueeze(-1) / divisor
    best_scale = peak / -32.0
    best_error = _signed_error(x, weight, best_scale)
    for offset in TRIALS[1:-1]:
        inverse = torch.where(peak != 0, -(32.0 + offset) / peak, torch.zeros_like(peak))
        codes = torch.round(x * inverse).clamp(-32, 31)
        scale = (weight * codes * x).sum(-1, keepdim=True) / (weight * codes * codes).sum(-1, keepdim=True)
        error = _signed_error(x, weight, scale)  # NaN (no codes) never wins
        better = error < best_error
        best_scale = torch.where(better, scale, best_scale)
        best_error = torch.where(better, error, best_error)
    largest = torch.finfo(x.dtype).max
    return (best_scale * divisor).squeeze(-1).clamp(-largest, largest)


def _signed_error(x, weight, scale) -> torch.Tensor:
    inverse = torch.where(scale != 0, 1.0 / scale, torch.zeros_like(scale))
    codes = torch.round(x * inverse).clamp(-32, 31)
    return (weight * (scale * codes - x).square()).sum(-1, keepdim=True)
