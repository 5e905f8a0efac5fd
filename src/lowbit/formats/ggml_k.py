"""llama.cpp's K-quants Q4_K and Q6_K (GGUF): ``gguf_q4_k``, ``gguf_q6_k``.

Super-blocks of 256 consecutive elements along the last dimension, cut into sub-blocks that each have a
small integer scale (and, for Q4_K, minimum) relative to the super-block's float16 fields:

========== ========== ============== ======================================================== ==========
format     sub-block  codes          value (float32, the order ggml's ``dequantize_row_*`` uses) bits/elem.
========== ========== ============== ======================================================== ==========
gguf_q4_k  8 x 32     q 0..15        (d * sc) * q - (dmin * m); sc, m 0..63 (6 bits each)       4.5
gguf_q6_k  16 x 16    q -32..31      (d * sc) * q; sc -128..127 (int8)                          6.5625
========== ========== ============== ======================================================== ==========

d and dmin are float16; ``d * sc`` and ``dmin * m`` are exact float32 products, so each weight is one float32
rounding of ``q * (d * sc)`` (then one subtraction for Q4_K): bit for bit what ``gguf.quants.dequantize``
gives for the same bytes (``tests/formats/test_ggml_k.py``).

**The rule that picks the fields is lowbit's** (ggml's ``quantize_row_q4_K_ref`` / ``q6_K_ref`` are not
shipped by any package to check against, so lowbit does not claim to reproduce them; what it does claim is
that every value it produces is exactly the value a GGUF file holding its fields decodes to). With
``search=True`` (the default) each sub-block's wanted scale (and minimum) come from a weighted least-squares
search over a fan of trial scales (:mod:`lowbit.formats._ggml_search`, the idea of ggml's
``make_qkx2_quants`` / ``make_qx_quants``; relative MSE on N(0, 1) rows 16 % (Q4_K) and 11 % (Q6_K) below
min-max); the super-block then rounds them as below, without the step-down. ``search=False``, min-max:

- Q4_K, per sub-block: ``low = min(min x, 0)``, ``high = max x``. ``dmin = max(-low) / 63`` (float16,
  saturated at 65504), ``m = round(-low / dmin)`` clamped to 0..63; then the wanted scale covers what the
  stored minimum holds, ``(high + dmin * m) / 15`` (at least 0); ``d = max wanted scale / 63``,
  ``sc = round(wanted scale / d)`` clamped to 0..63, then ``sc - 1`` where ``sc`` rounded up so far that
  ``high`` would not take code 15;
  ``q = round((x + dmin * m) / (d * sc))`` clamped to 0..15.
- Q6_K, per sub-block: ``p`` = the element of largest |x| (the first of ties), wanted scale ``p / -32`` (so
  the peak takes code -32, as ggml does); the super-block's wanted scale of largest magnitude ``t`` gives
  ``d = t / -128``; ``sc = round(wanted scale / d)`` clamped to -128..127, then one step toward 0 where the
  peak would not take code -32; ``q = round(x / (d * sc))`` clamped to -32..31.

Keeping each sub-block's extreme code in use makes the min-max rule settle: a sub-block's output re-derives
its own ``sc`` (the re-derived wanted scale is ``d * sc`` up to float32 noise, which the integer rounding
absorbs). The search re-fits its own output and claims no fixed point.

"round" is to nearest, ties to even, of ``v * (1 / divisor)`` (0 where the divisor is 0, as ggml's legacy
types). Statistics use finite elements only; NaN stays NaN; +-inf saturate to the extreme codes. A partial
last super-block is padded with copies of the last element. Min-max is not idempotent in every case: a Q4_K sub-block
whose range is small against the super-block's ``dmin`` step can leave code 0 unused (its minimum is
rounded to that step); tests/formats/test_properties.py lists the gap with an example.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, NamedTuple

import torch

from lowbit.formats._base import FormatSpec, check_bool
from lowbit.formats._ggml_search import q4_k_ranges, q6_k_scales
from lowbit.formats._registry import register
from lowbit.formats.ggml import _half, _inverse, from_blocks, to_blocks

SUPER_BLOCK = 256
K_TYPES = ("q4_k", "q6_k")
SUB_BLOCKS = {"q4_k": 32, "q6_k": 16}  # elements per sub-block
CODE_RANGES = {"q4_k": (0, 15), "q6_k": (-32, 31)}
SUB_SCALE_RANGES = {"q4_k": (0, 63), "q6_k": (-128, 127)}
CODE_BITS = {"q4_k": 4, "q6_k": 6}
FIELD_BITS = {"q4_k": 2 * 16 + 8 * 12, "q6_k": 16 + 16 * 8}  # per super-block: float16 fields + sub-block fields


class KFields(NamedTuple):
    """What a K-quant super-block stores: codes (float32, integer-valued) [..., n, 256], float16 ``d`` [..., n],
    ``dmin`` [..., n] (Q4_K, else None), sub-block scales (float32, integer-valued) [..., n, 8 | 16] and
    (Q4_K) sub-block minima [..., n, 8]."""

    codes: torch.Tensor
    d: torch.Tensor
    dmin: torch.Tensor | None
    sub_scale: torch.Tensor
    sub_min: torch.Tensor | None


def _sub_blocks(ggml_type: str, blocks: torch.Tensor) -> torch.Tensor:
    size = SUB_BLOCKS[ggml_type]
    return blocks.reshape(*blocks.shape[:-1], SUPER_BLOCK // size, size)


def _rounded(value: torch.Tensor, divisor: torch.Tensor, limits: tuple[int, int]) -> torch.Tensor:
    """round(value * (1 / divisor)) clamped to ``limits``; NaN passes, +-inf saturate, inf * (1 / 0) is 0."""
    inverse = _inverse(divisor)
    scaled = value * inverse
    codes = torch.where(torch.isinf(scaled), scaled, torch.round(scaled))
    codes = torch.where(torch.isinf(value) & (inverse == 0), torch.zeros_like(codes), codes)
    return codes.clamp(*limits) + 0.0  # + 0.0: a -0 code is the integer 0


def _q4_k(blocks: torch.Tensor, search: bool) -> KFields:
    sub = _sub_blocks("q4_k", blocks)
    finite = torch.isfinite(sub)
    high = torch.where(finite, sub, -math.inf).amax(-1)
    low = torch.where(finite, sub, math.inf).amin(-1)
    empty = torch.isinf(high) & (high < 0)  # no finite element
    high, low = high.masked_fill(empty, 0.0), low.masked_fill(empty, 0.0).clamp(max=0.0)
    wanted_scale, wanted_min = q4_k_ranges(sub, low, high) if search else (None, -low)
    dmin = _half(wanted_min.amax(-1, keepdim=True) / 63.0)
    sub_min = _rounded(wanted_min, dmin.float().unsqueeze(-1), SUB_SCALE_RANGES["q4_k"])
    minimum = _sub_fields(dmin, sub_min)  # the low end the stored fields hold
    if wanted_scale is None:  # min-max: the scale covers [-minimum, high]
        wanted_scale = (high + minimum) / 15.0
        wanted_scale = torch.where(torch.isinf(wanted_scale), high / 15.0 + minimum / 15.0, wanted_scale).clamp(min=0.0)
    d = _half(wanted_scale.amax(-1, keepdim=True) / 63.0)
    sub_scale = _rounded(wanted_scale, d.float().unsqueeze(-1), SUB_SCALE_RANGES["q4_k"])
    if not search:
        top = _rounded(high + minimum, _sub_fields(d, sub_scale), CODE_RANGES["q4_k"])
        sub_scale = torch.where((top < 15) & (sub_scale > 0), sub_scale - 1, sub_scale)  # keep the top code in use
    codes = _rounded(sub + minimum.unsqueeze(-1), _sub_fields(d, sub_scale).unsqueeze(-1), CODE_RANGES["q4_k"])
    return KFields(codes.reshape(blocks.shape), d, dmin, sub_scale, sub_min)


def _q6_k(blocks: torch.Tensor, search: bool) -> KFields:
    sub = _sub_blocks("q6_k", blocks)
    clean = torch.where(torch.isfinite(sub), sub, torch.zeros_like(sub))
    peak = clean.gather(-1, clean.abs().argmax(-1, keepdim=True)).squeeze(-1)  # the first of largest |x|
    wanted_scale = q6_k_scales(sub, peak) if search else peak / -32.0
    top = wanted_scale.gather(-1, wanted_scale.abs().argmax(-1, keepdim=True))
    d = _half(top / -128.0)
    sub_scale = _rounded(wanted_scale, d.float().unsqueeze(-1), SUB_SCALE_RANGES["q6_k"])
    if not search:
        peak_code = _rounded(peak, _sub_fields(d, sub_scale), CODE_RANGES["q6_k"])
        smaller = sub_scale - torch.sign(sub_scale)  # one step toward zero: the peak keeps code -32
        sub_scale = torch.where(peak_code > -32, smaller, sub_scale)
    codes = _rounded(sub, _sub_fields(d, sub_scale).unsqueeze(-1), CODE_RANGES["q6_k"])
    return KFields(codes.reshape(blocks.shape), d, None, sub_scale, None)


def _sub_fields(field: torch.Tensor, sub: torch.Tensor) -> torch.Tensor:
    """float32 ``field * sub`` per sub-block (exact: an 11-bit float16 significand times a 6-8 bit integer)."""
    return field.float().unsqueeze(-1) * sub.float()


def k_fields(ggml_type: str, blocks: torch.Tensor, search: bool = True) -> KFields:
    """lowbit's rule (module docstring) on float32 super-blocks [..., n, 256]; ``search`` (Q4_K): the
    least-squares search of :mod:`lowbit.formats._ggml_search` instead of min-max (Q6_K: instead of the
    peak's scale)."""
    return _q4_k(blocks, search) if ggml_type == "q4_k" else _q6_k(blocks, search)


def k_values(ggml_type: str, fields: KFields) -> torch.Tensor:
    """float32 values [..., n, 256] of a super-block's fields (ggml's dequantize order)."""
    sub = _sub_blocks(ggml_type, fields.codes.float())
    values = _sub_fields(fields.d, fields.sub_scale).unsqueeze(-1) * sub
    if ggml_type == "q4_k":
        values = values - _sub_fields(fields.dmin, fields.sub_min).unsqueeze(-1)
    return values.reshape(fields.codes.shape)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _KQuantFormat(FormatSpec):
    """One K-quant type (module docstring); no parameters: the type fixes everything."""

    ggml_type: ClassVar[str] = ""
    search: bool = True

    def validate(self) -> None:
        check_bool(self, "search")

    def _quantize(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        fields = k_fields(self.ggml_type, to_blocks(x, SUPER_BLOCK), self.search)
        return from_blocks(k_values(self.ggml_type, fields), x.shape)

    @property
    def bits(self) -> int:
        return CODE_BITS[self.ggml_type]

    def bits_per_element(self, shape: tuple[int, ...] | None = None) -> float:
        fields = FIELD_BITS[self.ggml_type]
        if shape is None or not shape:
            return self.bits + fields / SUPER_BLOCK
        numel = math.prod(shape)
        if numel == 0:
            return float(self.bits)
        blocks = numel // shape[-1] * -(-shape[-1] // SUPER_BLOCK)
        return self.bits + fields * blocks / numel


def _k_format(ggml_type: str) -> type[FormatSpec]:
    name = f"gguf_{ggml_type}"
    doc = f"llama.cpp's {ggml_type.upper()} (super-blocks of 256); see lowbit.formats.ggml_k."
    namespace = {"format_name": name, "ggml_type": ggml_type, "roundings": ("nearest_even",), "__doc__": doc,
                 "__module__": __name__, "__annotations__": {"rounding": "str", "search": "bool"},
                 "rounding": "nearest_even", "search": True}  # fmt: skip
    cls = dataclasses.dataclass(frozen=True, kw_only=True)(type(f"GGUF_{ggml_type.upper()}", (_KQuantFormat,), namespace))
    return register(cls)


GGUF_Q4_K = _k_format("q4_k")
GGUF_Q6_K = _k_format("q6_k")
