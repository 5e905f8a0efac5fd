"""Native int8 weight-only Linear in float32 (csrc/linear.c): x @ (codes * scale)^T + bias without
rebuilding the float weight, each weight row widened once and dotted with every input row (16-lane float32
partial sums). Not bit-identical to a float32 matmul of the dequantized weight (another summation order, and
the scale applied to the sum), but float32 arithmetic throughout: relative error ~1e-7 to the float64 sum."""

from __future__ import annotations

import torch

from lowbit.native.kernels import I64, INT, POINTER, function, threads

_ARGUMENTS = [POINTER, POINTER, POINTER, POINTER, POINTER, I64, I64, I64, INT]


def int8_linear(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """x [M, K] float32, codes [N, K] int8, scale [N] float32, bias [N] float32 or None -> [M, N]; None where the
    kernel does not apply (no library, other dtypes or devices, non-contiguous, mismatched sizes)."""
    entry = function("lb_int8_linear_f32", _ARGUMENTS, INT)
    if entry is None or x.dim() != 2 or codes.dim() != 2 or x.shape[1] != codes.shape[1]:
        return None
    rows, inner = x.shape
    columns = codes.shape[0]
    tensors = [(x, torch.float32, rows * inner), (codes, torch.int8, columns * inner), (scale, torch.float32, columns)]
    if bias is not None:
        tensors.append((bias, torch.float32, columns))
    if any(t.dtype != dtype or t.numel() != size or t.device.type != "cpu" or not t.is_contiguous() for t, dtype, size in tensors):
        return None
    if rows == 0 or inner == 0 or columns == 0:
        return None  # nothing to sum: the eager path says what that gives
    out = torch.empty(rows, columns)
    status = entry(x.data_ptr(), codes.data_ptr(), scale.data_ptr(), 0 if bias is None else bias.data_ptr(),
                   out.data_ptr(), rows, inner, columns, threads())  # fmt: skip
    return out if status == 0 else None
