"""encode(x, fmt) -> QTensor: real low-bit storage whose dequantize() equals lowbit.quantize bit for bit.

The format quantizes ``x`` itself (the same eager function ``lowbit.quantize`` runs, with the same
generator for stochastic rounding); the codec then turns those values into codes and per-block parameters,
and ``encode`` decodes them again and checks the result bit for bit. Anything that cannot be stored exactly
(NaN in a format without a NaN code, a value off the format's grid) raises a FormatError instead of
returning a QTensor that would dequantize to something else.
"""

from __future__ import annotations

from typing import Any

import torch

from lowbit.errors import FormatError
from lowbit.formats._base import FormatSpec, check_tensor
from lowbit.formats._registry import resolve
from lowbit.formats.rounding import make_generator
from lowbit.qtensor.codecs import codec_for
from lowbit.qtensor.packing import code_range
from lowbit.qtensor.tensor import QTensor, dtype_name


def encode(
    x: torch.Tensor,
    fmt: str | FormatSpec,
    *,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    signed_zero: bool = True,
    storage: str = "auto",
    **params: Any,
) -> QTensor:
    """Quantize ``x`` to ``fmt`` (a name or spec, ``params`` as for ``lowbit.quantize``) as a QTensor.

    ``signed_zero=False`` lets a -0.0 of the fake-quantized tensor decode as +0.0 in formats whose codes
    have no negative zero (two's complement: integer, fixed, mxint8) instead of recording a 1-bit mask.
    ``storage`` picks the packing used when the QTensor is saved ("auto", "native", "uint8", "uint32").
    """
    spec = resolve(fmt, **params)
    check_tensor(x)
    codec = codec_for(spec)
    x = x.detach()
    gen = make_generator(seed, generator, x.device)
    gen = gen if spec.is_stochastic else None
    work = x if x.dtype in (torch.float32, torch.float64) else x.float()
    if x.numel() == 0:
        codes = torch.zeros(x.shape, dtype=torch.int64, device=x.device)
        return QTensor(codes, {}, spec, x.dtype, work.dtype, None, None, storage)
    with torch.no_grad():
        values = spec._quantize_for(work, gen, x.dtype)  # what spec.quantize computes, before the final cast
        dtype = {"out_dtype": x.dtype} if getattr(codec, "takes_out_dtype", False) else {}
        encoded = codec.encode(spec, work, values, **dtype)
        result = QTensor(encoded.codes, encoded.params, spec, x.dtype, values.dtype, encoded.block, None, storage)
        if x.device.type != "meta":  # meta tensors carry shapes only: no values to check or signs to record
            _check_code_range(spec, codec.code_bits(spec), codec.code_signed(spec), encoded.codes)
            _record_zero_signs_and_check(spec, result, values, signed_zero)
    return result


def _record_zero_signs_and_check(spec: FormatSpec, result: QTensor, values: torch.Tensor, signed_zero: bool) -> None:
    """Keep the sign of zeros the codes lose (or drop it, ``signed_zero=False``), then check the decode."""
    decoded = result.decode_compute()
    flipped = (values == 0) & (torch.signbit(values) != torch.signbit(decoded))
    if bool(flipped.any()):
        if signed_zero:
            result.zero_sign = flipped
            decoded = torch.where(flipped, -decoded, decoded)
        else:
            values = torch.where(flipped, -values, values)
    _check_exact(spec, values, decoded)


def _check_code_range(spec: FormatSpec, bits: int, signed: bool, codes: torch.Tensor) -> None:
    low, high = code_range(bits, signed)
    if codes.numel() and (int(codes.min()) < low or int(codes.max()) > high):
        raise FormatError(
            f"{spec.describe()}: the quantized values need codes in [{int(codes.min())}, {int(codes.max())}], outside "
            f"the {bits}-bit range [{low}, {high}] (a float32 input cannot hold every code of a format wider than "
            "24 bits; use float64)"
        )


def _check_exact(spec: FormatSpec, expected: torch.Tensor, decoded: torch.Tensor) -> None:
    """decoded == expected bit for bit (every NaN pattern counts as NaN)."""
    nan = torch.isnan(expected)
    same = torch.equal(nan, torch.isnan(decoded)) and decoded.dtype == expected.dtype
    if same:
        a, b = expected.masked_fill(nan, 0), decoded.masked_fill(nan, 0)
        same = torch.equal(a, b) and torch.equal(torch.signbit(a), torch.signbit(b))
    if not same:
        wrong = (expected != decoded) & ~(nan & torch.isnan(decoded))
        where = wrong.nonzero()[:1].tolist()
        first = f" (first at {where[0]}: {expected[tuple(where[0])].item()!r} decodes as " \
                f"{decoded[tuple(where[0])].item()!r})" if where else ""  # fmt: skip
        raise FormatError(
            f"{spec.describe()}: these values cannot be stored exactly as integer codes "
            f"({int(wrong.sum())} element(s) differ in {dtype_name(expected.dtype)}){first}"
        )
