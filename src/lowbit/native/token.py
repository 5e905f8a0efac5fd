"""Native per-token int8 quantization and rescaling (csrc/token.c) for the dynamic int8 Linear: the same
values as ``ops.quant.token_codes`` / ``token_float_codes`` and ``ops.kernels.token_rescale``, in one pass
each, with no compile. Each function returns None where it does not apply (no library, not float32 CPU)."""

from __future__ import annotations

import torch

from lowbit.native.kernels import function, threads

_TINY = float(torch.finfo(torch.float32).tiny)


def _usable(*tensors: torch.Tensor | None) -> bool:
    return all(t is None or (t.device.type == "cpu" and t.is_contiguous()) for t in tensors)


def quantize(x: torch.Tensor, symmetric: bool, q_max: int, float_codes: bool):
    """(codes [M, K] int8 or integer-valued float32, scale [M, 1], offset [M, 1] or None), or None."""
    entry = function("lb_token_quantize_f32")
    if entry is None or x.dtype != torch.float32 or x.dim() != 2 or not _usable(x):
        return None
    rows, columns = x.shape
    if rows == 0 or columns == 0:
        return None
    codes = torch.empty(rows, columns, dtype=torch.float32 if float_codes else torch.int8)
    scale = torch.empty(rows, 1)
    offset = None if symmetric else torch.empty(rows, 1)
    entry(x.data_ptr(), codes.data_ptr(), rows, columns, scale.data_ptr(), 0 if offset is None else offset.data_ptr(),
          float(q_max), 1.0 / q_max, 0.5 / q_max, _TINY, int(float_codes), threads())  # fmt: skip
    return codes, scale, offset


def rescale(sums: torch.Tensor, scale: torch.Tensor, weight_scale: torch.Tensor, offset: torch.Tensor | None,
            weight_sums: torch.Tensor | None, bias: torch.Tensor | None, owned: bool = False) -> torch.Tensor | None:  # fmt: skip
    """sums * scale * weight_scale (+ offset * weight_sums) (+ bias) as float32 [M, N]: in place for float32
    sums (the caller's own tensor) and for int32 sums the caller hands over (``owned``: the result is their
    buffer viewed as float32, one pass over one buffer), else a new tensor; None where it does not apply."""
    entry = function("lb_token_rescale_f32")
    vectors = (scale, weight_scale, offset, weight_sums, bias)
    if entry is None or sums.dtype not in (torch.int32, torch.float32) or sums.dim() != 2:
        return None
    if not _usable(sums, *vectors) or any(v is not None and v.dtype != torch.float32 for v in vectors):
        return None
    rows, columns = sums.shape
    lengths = (rows, columns, rows, columns, columns)  # what the kernel reads of each vector
    if any(v is not None and v.numel() != length for v, length in zip(vectors, lengths, strict=True)):
        return None
    in_place = sums.dtype == torch.float32 or owned
    out = sums if in_place else torch.empty(rows, columns)
    pointers = [0 if v is None else v.data_ptr() for v in vectors]
    entry(sums.data_ptr(), out.data_ptr(), rows, columns, *pointers, int(sums.dtype == torch.float32), threads())
    return out.view(torch.float32) if out.dtype == torch.int32 else out
