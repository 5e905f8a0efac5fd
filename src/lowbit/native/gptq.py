"""Native int4 group fitting, GPTQ's column loop (csrc/gptq.c) and HQQ's fit (csrc/hqq.c): the weight
transposed, [inputs, rows], with a tile of rows in the vector lanes. Each function returns None where the kernel does not apply (no library,
tensors not float32 / contiguous / on the CPU, sizes it does not take, values whose scale would leave the storage
dtype's range), and the caller runs its torch code instead."""

from __future__ import annotations

import torch

from lowbit.native.interface import INT4_SCALE_TYPES
from lowbit.native.kernels import function, threads

SCALE_TYPES = {getattr(torch, name): code for name, code in INT4_SCALE_TYPES.items()}  # csrc/int4_groups.h
# |weight| beyond which a scale or minimum might not fit its storage dtype (torch's cast would give inf there, the
# kernel's rounding does not): such weights take the torch code.
_LARGEST = {torch.float32: 1e37, torch.bfloat16: 1e37, torch.float16: 3e4}


def _cpu_float32(*tensors: torch.Tensor | None) -> bool:
    return all(t is None or (t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous())
               for t in tensors)  # fmt: skip


def fits_range(weight: torch.Tensor, scale_dtype: torch.dtype) -> bool:
    """Whether the kernels take a weight of this magnitude with scales stored in ``scale_dtype`` (never one with
    NaN or inf: the torch code then raises the error)."""
    return scale_dtype in SCALE_TYPES and float(weight.abs().max()) <= _LARGEST[scale_dtype]


def int4_fit(columns: torch.Tensor, group_size: int, scale_dtype: torch.dtype, search: bool,
             importance: torch.Tensor | None = None, float_zero: bool = False):  # fmt: skip
    """(codes uint8 [N, K], scale [K / g, N], offset [K / g, N] float32) of the transposed weight ``columns``
    [K, N]: int4.quantize_groups' rule (offset: the zero point, or the minimum with ``float_zero``)."""
    entry = function("lb_int4_fit_f32")
    if entry is None or columns.dim() != 2 or not _cpu_float32(columns, importance):
        return None
    k, n = columns.shape
    if n == 0 or group_size < 2 or k % group_size or not fits_range(columns, scale_dtype):
        return None
    if importance is not None and importance.numel() != k:
        return None
    codes = torch.empty(n, k, dtype=torch.uint8)
    scale, offset = torch.empty(k // group_size, n), torch.empty(k // group_size, n)
    status = entry(columns.data_ptr(), 0 if importance is None else importance.data_ptr(), codes.data_ptr(),
                   scale.data_ptr(), offset.data_ptr(), n, k, group_size, SCALE_TYPES[scale_dtype], int(search),
                   int(float_zero), threads())  # fmt: skip
    return None if status else (codes, scale, offset)


def gptq_block(block: torch.Tensor, upper: torch.Tensor, start: int, columns: torch.Tensor, importance: torch.Tensor,
               codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, group_size: int,
               scale_dtype: torch.dtype, *, search: bool, float_zero: bool, fixed: bool) -> torch.Tensor | None:  # fmt: skip
    """Round ``block`` [B, N] (the transposed weight's inputs ``columns`` [B] int64, in place) column by column
    into ``codes`` [N, K]; ``upper`` [K, K] is U in rounding order and the block starts at its row ``start``.
    ``scale`` / ``offset`` [K / g, N] are filled as groups start, or read (``fixed``). Returns the errors
    [B, N] divided by U's diagonal, or None (nothing written) where the kernel does not apply."""
    entry = function("lb_gptq_block_f32")
    tensors_fit = _cpu_float32(block, upper, importance, scale, offset) and columns.dtype == torch.int64
    if entry is None or not tensors_fit or codes.dtype != torch.uint8 or not codes.is_contiguous():
        return None
    width, n = block.shape
    k = codes.shape[1]
    if upper.shape != (k, k) or columns.numel() != width or importance.numel() != k or start + width > k:
        return None
    errors, columns = torch.empty(width, n), columns.contiguous()  # held until the call returns
    status = entry(block.data_ptr(), errors.data_ptr(), upper.data_ptr() + 4 * (start * k + start), k,
                   columns.data_ptr(), importance.data_ptr(), codes.data_ptr(), scale.data_ptr(),
                   offset.data_ptr(), n, k, width, group_size, SCALE_TYPES[scale_dtype], int(search), int(float_zero),
                   int(fixed), threads())  # fmt: skip
    return None if status else errors




def hqq_fit(columns: torch.Tensor, group_size: int, scale_dtype: torch.dtype, iterations: int, beta: float,
            kappa: float):  # fmt: skip
    """(codes uint8 [N, K], scale [K / g, N] already rounded to ``scale_dtype``, zero point [K / g, N], float32)
    of the transposed weight ``columns`` [K, N] by ops.hqq's steps at p = 0.5, or None."""
    entry = function("lb_hqq_fit_f32")
    if entry is None or columns.dim() != 2 or not _cpu_float32(columns):
        return None
    k, n = columns.shape
    if n == 0 or group_size < 2 or k % group_size or not fits_range(columns, scale_dtype):
        return None
    codes = torch.empty(n, k, dtype=torch.uint8)
    scale, zero = torch.empty(k // group_size, n), torch.empty(k // group_size, n)
    status = entry(columns.data_ptr(), codes.data_ptr(), scale.data_ptr(), zero.data_ptr(), n, k, group_size,
                   iterations, SCALE_TYPES[scale_dtype], beta, kappa, threads())  # fmt: skip
    return None if status else (codes, scale, zero)
