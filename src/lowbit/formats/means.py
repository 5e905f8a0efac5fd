"""The mean behind the binary and ternary scales: the exact mean of a block's kept magnitudes, rounded once to
float32 (and from there to a bfloat16 / float16 tensor's dtype; float64 tensors keep their float64 sum's
mean). No summation order can change it, so the eager, compiled and native paths agree.

The float64 sum decides the rounding almost always: any order's float64 sum of n nonnegative terms is within
(n - 1) u of the exact sum (u = 2^-53), and where every quotient in that interval rounds to one float, that
float is the rounded exact mean. A quotient next to a float32 midpoint (about one tensor in 150 of 2112 x 384
normal values) is settled exactly: the block's mantissas summed per exponent in integers, the exact quotient
rounded in integer arithmetic. That step branches on the data, so a compiled kernel (which cannot) keeps the
float64 rounding there (native/csrc/sign_stats.c does the same steps in C).
"""

from __future__ import annotations

import torch

from lowbit.formats.blocking import can_branch_on_data

_SLACK = 16  # terms of slack in the error bound (the division's rounding and more)
_FLOAT32_MANTISSA_BITS = 24
_SMALLEST_EXPONENT = -149  # float32's smallest subnormal is 2^-149: the unit of the exact sums


def rounded_mean(kept: torch.Tensor, count: torch.Tensor | int, dims: tuple[int, ...]) -> torch.Tensor:
    """sum(kept) / count per block (keepdim over ``dims``), the exact quotient rounded once to float32, in
    kept's dtype. ``kept``: magnitudes, finite and >= 0, zero outside the selection; ``count``: the selected
    elements per block (a tensor broadcasting like the sum, or one number), at least 1."""
    total = kept.sum(dim=dims, keepdim=True, dtype=torch.float64)
    quotient = total / count
    if kept.dtype == torch.float64:
        return quotient
    mean = quotient.to(torch.float32)
    if can_branch_on_data(kept):
        counts = torch.as_tensor(count, dtype=torch.float64, device=total.device)
        spread = (counts + _SLACK) * 2.0**-52
        undecided = (quotient * (1 - spread)).to(torch.float32) != (quotient * (1 + spread)).to(torch.float32)
        if bool(undecided.any()):
            mean = mean.clone()
            counts = counts.expand_as(total)
            for index in undecided.nonzero().tolist():
                mean[tuple(index)] = _exact_block_mean(kept, dims, index, int(counts[tuple(index)]))
    return mean.to(kept.dtype)


def _exact_block_mean(kept: torch.Tensor, dims: tuple[int, ...], index: list[int], count: int) -> float:
    """The mean of one block (at ``index`` of the keepdim statistics) rounded to float32, exactly."""
    block = kept[tuple(slice(None) if d in dims else i for d, i in enumerate(index))]
    bits = block.reshape(-1).float().view(torch.int32).long()
    exponent = bits >> 23
    mantissa = (bits & 0x7FFFFF) | ((exponent > 0).long() << 23)
    per_exponent = torch.zeros(256, dtype=torch.int64, device=bits.device).index_add_(0, exponent, mantissa)
    units = sum(int(total) << max(e - 1, 0) for e, total in enumerate(per_exponent.tolist()) if total)
    return exact_float32(units, count)


def exact_float32(units: int, count: int) -> float:
    """units * 2^-149 / count rounded to float32, ties to even (a Python float holding that float32)."""
    quotient, remainder = divmod(units, count)
    shift = max(quotient.bit_length() - _FLOAT32_MANTISSA_BITS, 0)
    mantissa = quotient >> shift
    below = quotient - (mantissa << shift)  # the dropped bits: (below + remainder / count) / 2^shift of an ulp
    twice, whole = 2 * (below * count + remainder), count << shift
    if twice > whole or (twice == whole and mantissa & 1):
        mantissa += 1
    return float(mantissa) * 2.0 ** (shift + _SMALLEST_EXPONENT)
