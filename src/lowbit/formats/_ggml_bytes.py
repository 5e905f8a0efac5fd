"""ggml's block bytes (the tensor data of a GGUF file) of every type lowbit holds, both ways, in numpy.

Fields (what :mod:`lowbit.formats.ggml` / :mod:`lowbit.formats.ggml_k` compute), for a [N, K] weight:
``codes`` int16 [N, K] (ggml's own code values: Q4_0 / Q4_1 / Q4_K 0..15, Q5_0 0..31, Q8_0 -127..127, Q6_K
-32..31), ``d`` float16 [N, blocks], ``m`` float16 [N, blocks] (Q4_1's minimum, Q4_K's dmin), ``sub_scale``
and ``sub_min`` int16 [N, sub-blocks] (K-quants). Byte layouts, per block (llama.cpp's ``block_*`` structs):

- Q4_0 d | 16 bytes: byte j holds element j (low nibble) and j + 16 (high); Q4_1 d | m | the same nibbles;
- Q5_0 d | 4 bytes, bit j = bit 4 of element j (little-endian) | the low nibbles as Q4_0; Q8_0 d | 32 int8;
- Q4_K (256) d | dmin | 12 bytes of 6-bit scales and minima | 128 bytes: for each 64 elements, 32 bytes,
  low nibbles the first 32, high nibbles the next 32;
- Q6_K (256) 128 bytes of low nibbles | 64 bytes of 2-bit high parts | 16 int8 scales | d.
"""

from __future__ import annotations

import numpy as np

from lowbit.errors import FormatError

# elements per block, bytes per block
LAYOUTS = {"q4_0": (32, 18), "q4_1": (32, 20), "q5_0": (32, 22), "q8_0": (32, 34), "q4_k": (256, 144),
           "q6_k": (256, 210)}  # fmt: skip


def _nibbles(codes: np.ndarray) -> np.ndarray:
    """[..., 32] codes -> [..., 16] bytes: element j low, j + 16 high."""
    return (codes[..., :16] & 15) | ((codes[..., 16:32] & 15) << 4)


def _from_nibbles(raw: np.ndarray) -> np.ndarray:
    return np.concatenate([raw & 15, raw >> 4], axis=-1)


def _halves(field: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(field, dtype=np.float16).view(np.uint8).reshape(*field.shape, 2)


def _half_field(raw: np.ndarray) -> np.ndarray:
    return raw.copy().view(np.float16).reshape(raw.shape[:-1])


def _k4_scales(scale: np.ndarray, minimum: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and minima [..., 8] -> ggml's 12 bytes."""
    out = np.zeros((*scale.shape[:-1], 12), dtype=np.uint8)
    out[..., 0:4] = scale[..., :4] | ((scale[..., 4:] >> 4) << 6)
    out[..., 4:8] = minimum[..., :4] | ((minimum[..., 4:] >> 4) << 6)
    out[..., 8:12] = (scale[..., 4:] & 15) | ((minimum[..., 4:] & 15) << 4)
    return out


def _k4_fields(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    low, high, mixed = raw[..., 0:4], raw[..., 4:8], raw[..., 8:12]
    scale = np.concatenate([low & 63, (mixed & 15) | ((low >> 6) << 4)], axis=-1)
    minimum = np.concatenate([high & 63, (mixed >> 4) | ((high >> 6) << 4)], axis=-1)
    return scale, minimum


def pack(ggml_type: str, fields: dict[str, np.ndarray]) -> np.ndarray:
    """uint8 [N, K / block * bytes] of ``fields`` (module docstring)."""
    size, width = LAYOUTS[ggml_type]
    codes = np.asarray(fields["codes"]).astype(np.int16)
    n, k = codes.shape
    blocks = codes.reshape(n, k // size, size)
    out = np.zeros((n, k // size, width), dtype=np.uint8)
    if ggml_type in ("q4_0", "q4_1", "q5_0", "q8_0"):
        out[..., 0:2] = _halves(fields["d"])
        at = 4 if ggml_type == "q4_1" else 2
        if ggml_type == "q4_1":
            out[..., 2:4] = _halves(fields["m"])
        if ggml_type == "q8_0":
            out[..., 2:] = blocks.astype(np.int8).view(np.uint8)
        elif ggml_type == "q5_0":
            high = ((blocks >> 4) & 1).astype(np.uint8)
            out[..., 2:6] = np.packbits(high, axis=-1, bitorder="little")
            out[..., 6:] = _nibbles(blocks.astype(np.uint8))
        else:
            out[..., at:] = _nibbles(blocks.astype(np.uint8))
    elif ggml_type == "q4_k":
        out[..., 0:2], out[..., 2:4] = _halves(fields["d"]), _halves(fields["m"])
        scale = np.asarray(fields["sub_scale"]).astype(np.uint8).reshape(n, k // size, 8)
        minimum = np.asarray(fields["sub_min"]).astype(np.uint8).reshape(n, k // size, 8)
        out[..., 4:16] = _k4_scales(scale, minimum)
        pairs = blocks.astype(np.uint8).reshape(n, k // size, 4, 2, 32)
        out[..., 16:] = (pairs[..., 0, :] | (pairs[..., 1, :] << 4)).reshape(n, k // size, 128)
    else:  # q6_k
        unsigned = (blocks + 32).astype(np.uint8).reshape(n, k // size, 2, 128)
        low = (unsigned & 15).reshape(n, k // size, 2, 2, 64)
        out[..., 0:128] = (low[..., 0, :] | (low[..., 1, :] << 4)).reshape(n, k // size, 128)
        high = (unsigned >> 4).reshape(n, k // size, 2, 4, 32)
        packed = high[..., 0, :] | (high[..., 1, :] << 2) | (high[..., 2, :] << 4) | (high[..., 3, :] << 6)
        out[..., 128:192] = packed.reshape(n, k // size, 64)
        out[..., 192:208] = np.asarray(fields["sub_scale"]).astype(np.int8).reshape(n, k // size, 16).view(np.uint8)
        out[..., 208:210] = _halves(fields["d"])
    return out.reshape(n, -1)


def unpack(ggml_type: str, data: np.ndarray, shape: tuple[int, int]) -> dict[str, np.ndarray]:
    """The fields (module docstring) of ggml's block bytes for a [N, K] weight; FormatError on a size mismatch."""
    size, width = LAYOUTS[ggml_type]
    n, k = shape
    if k % size or data.size != n * (k // size) * width:
        raise FormatError(f"{ggml_type.upper()} data of {data.size} bytes does not hold a [{n}, {k}] weight "
                          f"({n * (k // size) * width} bytes in blocks of {size})")  # fmt: skip
    raw = np.ascontiguousarray(data, dtype=np.uint8).reshape(n, k // size, width)
    fields: dict[str, np.ndarray] = {}
    if ggml_type in ("q4_0", "q4_1", "q5_0", "q8_0"):
        fields["d"] = _half_field(raw[..., 0:2])
        if ggml_type == "q4_1":
            fields["m"] = _half_field(raw[..., 2:4])
        if ggml_type == "q8_0":
            codes = raw[..., 2:].view(np.int8).astype(np.int16)
        elif ggml_type == "q5_0":
            high = np.unpackbits(raw[..., 2:6], axis=-1, bitorder="little").astype(np.int16)
            codes = _from_nibbles(raw[..., 6:]).astype(np.int16) | (high << 4)
        else:
            codes = _from_nibbles(raw[..., 4 if ggml_type == "q4_1" else 2:]).astype(np.int16)
    elif ggml_type == "q4_k":
        fields["d"], fields["m"] = _half_field(raw[..., 0:2]), _half_field(raw[..., 2:4])
        scale, minimum = _k4_fields(raw[..., 4:16])
        fields["sub_scale"], fields["sub_min"] = scale.reshape(n, -1).astype(np.int16), minimum.reshape(n, -1).astype(np.int16)
        pairs = raw[..., 16:].reshape(n, k // size, 4, 1, 32)
        codes = np.concatenate([pairs & 15, pairs >> 4], axis=-2).astype(np.int16)
    else:  # q6_k
        low = raw[..., 0:128].reshape(n, k // size, 2, 1, 64)
        low = np.concatenate([low & 15, low >> 4], axis=-2).reshape(n, k // size, 2, 128)
        high = raw[..., 128:192].reshape(n, k // size, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(4, 1)
        high = (high & 3).reshape(n, k // size, 2, 128)
        codes = (low | (high << 4)).astype(np.int16) - 32
        fields["sub_scale"] = raw[..., 192:208].copy().view(np.int8).reshape(n, -1).astype(np.int16)
        fields["d"] = _half_field(raw[..., 208:210])
    fields["codes"] = codes.reshape(n, k)
    if "d" in fields and fields["d"].ndim == 3:
        fields["d"] = fields["d"].reshape(n, -1)
    return fields
