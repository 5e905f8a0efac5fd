"""llama.cpp's legacy block types (GGML / GGUF): ``gguf_q4_0``, ``gguf_q4_1``, ``gguf_q5_0``, ``gguf_q8_0``.

Blocks of 32 consecutive elements along the last dimension. Each block stores a float16 scale d (and, for
Q4_1, a float16 minimum m) and one code per element:

========== =============== ============================= ======================================= ==========
format     codes           value                         rule (float32, as ggml's reference code)   bits/elem.
========== =============== ============================= ======================================= ==========
gguf_q4_0  0..15           d * (q - 8)                   p = the element of largest |x| (first),   4.5
                                                         d = p / -8, q = trunc(x / d + 8.5)
gguf_q4_1  0..15           d * q + m                     d = (max - min) / 15, m = min,            5.0
                                                         q = trunc((x - min) / d + 0.5)
gguf_q5_0  0..31           d * (q - 16)                  p = the element of largest |x| (first),   5.5
                                                         d = p / -16, q = trunc(x / d + 16.5)
gguf_q8_0  -127..127       d * q                         d = max|x| / 127, q = round(x / d)        8.5
                                                         (ties away from zero)
========== =============== ============================= ======================================= ==========

"x / d" is x * (1 / d) with 1 / d taken from the float32 d (0 when d is 0), the float16 rounding applied
only to what is stored: exactly ggml's ``quantize_row_*_ref`` and the ``gguf`` package's numpy copy of it,
which ``tests/formats/test_ggml.py`` compares bit for bit. Codes are clamped to their range. Values are
computed from the stored float16 fields in float32, the order ``dequantize_row_*`` uses.

Beyond ggml (which never sees them in a model): a trailing partial block is read as if padded with copies
of its last element (so its statistics are those of its own elements); NaN elements stay NaN and, like
+-inf, never set a block's statistics; +-inf saturate to the block's extreme codes. A block of zeros is
d = 0 and decodes to zeros. Float16 fields saturate at +-65504 where ggml's would overflow to inf (a
block past 65504 * 8 for Q4_0 or 65504 * 16 for Q5_0, far beyond any model weight); everywhere else the bits are ggml's.
Idempotent: a block's extreme element keeps its extreme code, so the re-derived d (and m) are the same.
The K-quants (super-blocks of 256) are :mod:`lowbit.formats.ggml_k`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, NamedTuple

import torch

from lowbit.casting import saturating_cast
from lowbit.formats._base import FormatSpec
from lowbit.formats._registry import register

BLOCK_SIZE = 32
GGML_TYPES = ("q4_0", "q4_1", "q5_0", "q8_0")
CODE_RANGES = {"q4_0": (0, 15), "q4_1": (0, 15), "q5_0": (0, 31), "q8_0": (-127, 127)}
ZERO_CODES = {"q4_0": 8, "q4_1": 0, "q5_0": 16, "q8_0": 0}  # the code of a block whose d is 0
CODE_BITS = {"q4_0": 4, "q4_1": 4, "q5_0": 5, "q8_0": 8}


class GGMLFields(NamedTuple):
    """What a ggml block stores: codes (float32, integer-valued) [..., n, 32], float16 scales and minima
    [..., n] (minimum None except for Q4_1)."""

    codes: torch.Tensor
    scale: torch.Tensor
    minimum: torch.Tensor | None


def _half(field: torch.Tensor) -> torch.Tensor:
    """A block field [..., 1] as stored: float16, finite values past 65504 saturated (ggml's would be inf)."""
    return saturating_cast(field.squeeze(-1), torch.float16)


def _inverse(d: torch.Tensor) -> torch.Tensor:
    """1 / d, and 0 where d is 0 or so small (subnormal) that 1 / d overflows float32: there the float16 d
    stored is 0 too, and the block decodes to zeros (ggml's x * inf would make NaN codes of finite zeros)."""
    inverse = 1.0 / d
    return torch.where((d == 0) | torch.isinf(inverse), torch.zeros_like(d), inverse)


def _codes(ggml_type: str, scaled: torch.Tensor, blocks: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """Clamped integer codes of ``scaled`` (the pre-rounding value); NaN stays NaN, inf saturates."""
    low, high = CODE_RANGES[ggml_type]
    if ggml_type == "q8_0":
        magnitude = scaled.abs()
        whole = torch.floor(magnitude)
        codes = torch.sign(scaled) * (whole + torch.floor(2 * (magnitude - whole)))  # C roundf
    else:
        codes = torch.trunc(scaled)
    codes = torch.where(torch.isinf(scaled), scaled, codes)  # +-inf saturate (roundf made them NaN)
    zero_code = float(ZERO_CODES[ggml_type])
    codes = torch.where(torch.isinf(blocks) & (inverse == 0), zero_code, codes)  # inf * (1 / 0 := 0) is NaN
    return codes.clamp(low, high) + 0.0  # NaN passes; + 0.0 makes a -0 code the integer 0


def block_fields(ggml_type: str, blocks: torch.Tensor) -> GGMLFields:
    """ggml's reference quantizer on float32 ``blocks`` [..., 32] (statistics over finite elements)."""
    finite = torch.isfinite(blocks)
    if ggml_type in ("q4_0", "q5_0"):
        middle = float(ZERO_CODES[ggml_type])
        clean = torch.where(finite, blocks, torch.zeros_like(blocks))
        peak = clean.gather(-1, clean.abs().argmax(-1, keepdim=True))  # the first element of largest |x|
        d = peak / -middle
        inverse = _inverse(d)
        codes = _codes(ggml_type, blocks * inverse + (middle + 0.5), blocks, inverse)
        return GGMLFields(codes, _half(d), None)
    if ggml_type == "q4_1":
        high = torch.where(finite, blocks, -math.inf).amax(-1, keepdim=True)
        low = torch.where(finite, blocks, math.inf).amin(-1, keepdim=True)
        empty = torch.isinf(high)  # no finite element
        high, low = high.masked_fill(empty, 0.0), low.masked_fill(empty, 0.0)
        d = (high - low) / 15.0
        d = torch.where(torch.isinf(d), high / 15.0 - low / 15.0, d)  # a range past the float32 maximum
        inverse = _inverse(d)
        codes = _codes(ggml_type, (blocks - low) * inverse + 0.5, blocks, inverse)
        return GGMLFields(codes, _half(d), _half(low))
    peak = torch.where(finite, blocks, torch.zeros_like(blocks)).abs().amax(-1, keepdim=True)
    d = peak / 127.0
    inverse = _inverse(d)
    codes = _codes(ggml_type, blocks * inverse, blocks, inverse)
    return GGMLFields(codes, _half(d), None)


def block_values(ggml_type: str, codes: torch.Tensor, scale: torch.Tensor,
                 minimum: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """float32 values [..., 32] of codes [..., 32] with float16 fields [...] (ggml's dequantize order)."""
    d = scale.float().unsqueeze(-1)
    codes = codes.float()
    if ggml_type in ("q4_0", "q5_0"):
        return d * (codes - float(ZERO_CODES[ggml_type]))
    if ggml_type == "q4_1":
        return d * codes + minimum.float().unsqueeze(-1)
    return codes * d


def to_blocks(x: torch.Tensor, size: int = BLOCK_SIZE) -> torch.Tensor:
    """float32 [..., n, size] of ``x`` along its last dimension (0-d as one element; a partial last block
    padded with copies of the last element, which changes none of its statistics)."""
    rows = x.reshape(1) if x.dim() == 0 else x
    rows = rows.float()
    missing = -rows.shape[-1] % size
    if missing:
        rows = torch.cat([rows, rows[..., -1:].expand(*rows.shape[:-1], missing)], dim=-1)
    return rows.reshape(*rows.shape[:-1], rows.shape[-1] // size, size)


def from_blocks(values: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """The inverse of :func:`to_blocks`: values [..., n, 32] cut back to ``shape``."""
    flat = values.reshape(*values.shape[:-2], -1)
    length = shape[-1] if len(shape) else 1
    return flat[..., :length].reshape(shape)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _GGMLBlockFormat(FormatSpec):
    """One ggml block type (see the module docstring); no parameters: the type fixes everything."""

    ggml_type: ClassVar[str] = ""
    field_bits: ClassVar[int] = 16  # float16 d (+ 16 for Q4_1's m)

    def _quantize(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        fields = block_fields(self.ggml_type, to_blocks(x))
        values = block_values(self.ggml_type, *fields)
        return from_blocks(values, x.shape)

    @property
    def bits(self) -> int:
        return CODE_BITS[self.ggml_type]

    def bits_per_element(self, shape: tuple[int, ...] | None = None) -> float:
        fields = self.field_bits * (2 if self.ggml_type == "q4_1" else 1)
        if shape is None or not shape:
            return self.bits + fields / BLOCK_SIZE
        numel = math.prod(shape)
        if numel == 0:
            return float(self.bits)
        blocks = numel // shape[-1] * -(-shape[-1] // BLOCK_SIZE)
        return self.bits + fields * blocks / numel


def _ggml_format(ggml_type: str, rounding: str) -> type[FormatSpec]:
    name = f"gguf_{ggml_type}"
    doc = f"llama.cpp's {ggml_type.upper()} block type (blocks of 32, float16 fields); see lowbit.formats.ggml."
    namespace = {"format_name": name, "ggml_type": ggml_type, "roundings": (rounding,), "__doc__": doc,
                 "__module__": __name__, "__annotations__": {"rounding": "str"}, "rounding": rounding}  # fmt: skip
    cls = dataclasses.dataclass(frozen=True, kw_only=True)(type(f"GGUF_{ggml_type.upper()}", (_GGMLBlockFormat,), namespace))
    return register(cls)


# Q4_0 / Q4_1 / Q5_0 round trunc(v + 0.5) of a non-negative v (ties up); Q8_0 is C's roundf (ties away from zero).
GGUF_Q4_0 = _ggml_format("q4_0", "nearest_up")
GGUF_Q4_1 = _ggml_format("q4_1", "nearest_up")
GGUF_Q5_0 = _ggml_format("q5_0", "nearest_up")
GGUF_Q8_0 = _ggml_format("q8_0", "nearest_away")
