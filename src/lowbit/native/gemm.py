"""Native exact int8 GEMM (csrc/int8_gemm.c): int32 sums of 8-bit activation codes times int8 weight codes,
both widened to int16 and multiplied in pairs into int32 (vpmaddwd on AVX2), so no partial sum saturates on
CPUs without VNNI. The weight is packed once (:func:`pack`); each function returns None where the kernel does
not apply (no library, not a contiguous CPU tensor of the right dtype and size)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lowbit.native.kernels import function, threads

PANEL = 16  # output columns per packed panel (csrc/int8_gemm.c)


def packed_size(columns: int, inner: int) -> int:
    """int16 elements of the packed form of an [N, K] weight: N rounded up to 16, K to even."""
    return -(-columns // PANEL) * PANEL * (inner + (inner & 1))


@dataclass(frozen=True)
class Packed:
    """A weight packed for :func:`sums`: the int16 panels (1-D) and the [N, K] shape they hold."""

    panels: torch.Tensor
    columns: int
    inner: int


def pack(codes: torch.Tensor) -> Packed | None:
    """int8 weight codes [N, K] -> the kernel's packed int16 panels, or None."""
    entry = function("lb_int8_pack")
    if entry is None or codes.dtype != torch.int8 or codes.dim() != 2 or codes.device.type != "cpu":
        return None
    codes = codes.contiguous()
    columns, inner = codes.shape
    packed = torch.empty(packed_size(columns, inner), dtype=torch.int16)
    entry(codes.data_ptr(), packed.data_ptr(), columns, inner)
    return Packed(packed, columns, inner)


def sums(codes: torch.Tensor, packed: Packed) -> torch.Tensor | None:
    """Exact int32 sums [M, N] of activation codes [M, K] (int8, or uint8 without their zero point) times the
    packed weight [N, K]; None where the kernel does not apply (another K among them)."""
    entry = function("lb_int8_gemm_s32")
    if entry is None or codes.dim() != 2 or codes.dtype not in (torch.int8, torch.uint8):
        return None
    rows, inner = codes.shape
    if codes.device.type != "cpu" or not codes.is_contiguous() or inner != packed.inner:
        return None
    columns = packed.columns
    out = torch.empty(rows, columns, dtype=torch.int32)
    status = entry(codes.data_ptr(), int(codes.dtype == torch.uint8), packed.panels.data_ptr(), out.data_ptr(), rows,
                   inner, columns, threads())  # fmt: skip
    return out if status == 0 else None
