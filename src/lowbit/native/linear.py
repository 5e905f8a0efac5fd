"""Native int8 / int4 weight-only Linear in float32: x @ weight^T + bias without rebuilding the float weight.
One to four input rows (csrc/linear_few.c) decode the codes in registers; more rows (csrc/linear.c) widen each
weight row once into a float buffer and dot it with every input row (float32 vector sums with fused
multiply-adds, four input rows by two weight rows at a time). Not bit-identical to a
float32 matmul of the dequantized weight (another summation order, and the scale applied to the sum), but
float32 arithmetic throughout: relative error ~1e-7 to the float64 sum."""

from __future__ import annotations

import torch

from lowbit.native.interface import WEIGHT_KINDS
from lowbit.native.kernels import function, threads

KINDS = WEIGHT_KINDS  # csrc/linear.h's enum lb_weight_kind, by name


def _fits(tensors: list[tuple[torch.Tensor, torch.dtype, int]]) -> bool:
    return all(t.dtype == dtype and t.numel() == size and t.device.type == "cpu" and t.is_contiguous()
               for t, dtype, size in tensors)  # fmt: skip


def int8_linear(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """x [M, K] float32, codes [N, K] int8, scale [N] float32, bias [N] float32 or None -> [M, N]; None where the
    kernel does not apply (no library, other dtypes or devices, non-contiguous, mismatched sizes)."""
    entry = function("lb_int8_linear_f32")
    if entry is None or x.dim() != 2 or codes.dim() != 2 or x.shape[1] != codes.shape[1]:
        return None
    rows, inner = x.shape
    columns = codes.shape[0]
    tensors = [(x, torch.float32, rows * inner), (codes, torch.int8, columns * inner), (scale, torch.float32, columns)]
    if bias is not None:
        tensors.append((bias, torch.float32, columns))
    if not _fits(tensors):
        return None
    if rows == 0 or inner == 0 or columns == 0:
        return None  # nothing to sum: the eager path says what that gives
    out = torch.empty(rows, columns)
    status = entry(x.data_ptr(), codes.data_ptr(), scale.data_ptr(), 0 if bias is None else bias.data_ptr(),
                   out.data_ptr(), rows, inner, columns, threads())  # fmt: skip
    return out if status == 0 else None


def int4_linear(x: torch.Tensor, packed: torch.Tensor, zero_point: torch.Tensor, scale: torch.Tensor,
                bias: torch.Tensor | None, group: int) -> torch.Tensor | None:  # fmt: skip
    """x [M, K] float32, packed nibbles [N, K / 2] uint8 (low first), zero_point [N, K / group] uint8, scale
    [N, K / group] float32, bias [N] or None -> [M, N] float32; None where the kernel does not apply."""
    entry = function("lb_int4_linear_f32")
    if entry is None or x.dim() != 2 or packed.dim() != 2 or group < 2 or group % 2:
        return None
    rows, inner = x.shape
    columns = packed.shape[0]
    if rows == 0 or columns == 0 or inner == 0 or inner % group:
        return None
    groups = columns * (inner // group)
    tensors = [(x, torch.float32, rows * inner), (packed, torch.uint8, columns * inner // 2),
               (zero_point, torch.uint8, groups), (scale, torch.float32, groups)]  # fmt: skip
    if bias is not None:
        tensors.append((bias, torch.float32, columns))
    if not _fits(tensors):
        return None
    out = torch.empty(rows, columns)
    status = entry(x.data_ptr(), packed.data_ptr(), zero_point.data_ptr(), scale.data_ptr(),
                   0 if bias is None else bias.data_ptr(), out.data_ptr(), rows, inner, columns, group, threads())  # fmt: skip
    return out if status == 0 else None


def ggml_linear(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor | None,
                bias: torch.Tensor | None, kind: str, group: int = 32) -> torch.Tensor | None:  # fmt: skip
    """x [M, K] float32 against per-group weight codes (the ggml types' kernels): ``kind`` "int4_min" (packed
    nibbles [N, K / 2] uint8, lowbit's order, low first; weight code * scale + minimum, the product rounded
    first: Q4_1, Q4_K) or "int8_group" (int8 codes [N, K]; weight code * scale: Q8_0, Q5_0, Q6_K); ``scale``
    and (int4_min) ``minimum`` float32 [N, K / group]. None where the kernel does not apply."""
    entry = function("lb_weight_linear_f32")
    if entry is None or kind not in ("int4_min", "int8_group") or x.dim() != 2 or codes.dim() != 2:
        return None
    rows, inner = x.shape
    columns = codes.shape[0]
    packed = kind == "int4_min"
    if rows == 0 or columns == 0 or inner == 0 or group < 2 or inner % group or packed != (minimum is not None):
        return None
    groups = columns * (inner // group)
    tensors = [(x, torch.float32, rows * inner), (scale, torch.float32, groups),
               (codes, torch.uint8 if packed else torch.int8, columns * inner // (2 if packed else 1))]  # fmt: skip
    if minimum is not None:
        tensors.append((minimum, torch.float32, groups))
    if bias is not None:
        tensors.append((bias, torch.float32, columns))
    if not _fits(tensors):
        return None
    out = torch.empty(rows, columns)
    pointer = lambda t: 0 if t is None else t.data_ptr()  # noqa: E731
    status = entry(x.data_ptr(), codes.data_ptr(), 0, scale.data_ptr(), pointer(minimum), pointer(bias),
                   out.data_ptr(), rows, inner, columns, group, KINDS[kind], threads())  # fmt: skip
    return out if status == 0 else None




def weight_rows(kind: str, codes: torch.Tensor, scale: torch.Tensor, *, zero_point: torch.Tensor | None = None,
                minimum: torch.Tensor | None = None, group: int = 0) -> torch.Tensor | None:  # fmt: skip
    """float32 weight rows [N, K] rebuilt from a weight-only module's buffers, each value the reference's bit for
    bit (csrc/weight_rows.c): ``kind`` "int8_channel" (int8 codes [N, K] x scale [N]), "int8_group" (x scale
    [N, K / group]), "int4_zero" (packed nibbles [N, K / 2], (code - zero_point) * scale per group) or
    "int4_min" (code * scale + minimum per group); float32 scales and minima. None where the kernel does not
    apply (no library, other dtypes or devices, non-contiguous buffers, mismatched sizes)."""
    entry = function("lb_weight_rows_f32")
    if entry is None or kind not in KINDS or codes.dim() != 2:
        return None
    packed = kind.startswith("int4")
    rows, inner = codes.shape[0], codes.shape[1] * (2 if packed else 1)
    if rows == 0 or inner == 0 or (kind != "int8_channel" and (group < 2 or inner % group)):
        return None
    groups = rows if kind == "int8_channel" else rows * (inner // group)
    tensors = [(codes, torch.uint8 if packed else torch.int8, codes.numel()), (scale, torch.float32, groups)]
    extra = {"int4_zero": (zero_point, torch.uint8), "int4_min": (minimum, torch.float32)}.get(kind)
    if extra is not None:
        if extra[0] is None:
            return None
        tensors.append((extra[0], extra[1], groups))
    if not _fits(tensors):
        return None
    out = torch.empty(rows, inner)
    pointer = lambda t: 0 if t is None else t.data_ptr()  # noqa: E731
    status = entry(codes.data_ptr(), pointer(zero_point), scale.data_ptr(), pointer(minimum), out.data_ptr(), rows,
                   inner, group, KINDS[kind], threads())  # fmt: skip
    return out if status == 0 else None
