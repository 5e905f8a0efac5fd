"""Real low-bit storage: ``encode(x, fmt) -> QTensor`` (integer codes + per-block parameters), bit-exact
``QTensor.dequantize()``, and packing of b-bit codes into uint8 / uint32 words (see docs/storage.md)."""

from lowbit.qtensor.codecs import codec_for, encodable_formats
from lowbit.qtensor.encode import encode
from lowbit.qtensor.packing import LAYOUTS, PackedCodes, code_dtype, code_range, pack_codes, unpack_codes
from lowbit.qtensor.tensor import QTensor

__all__ = ["LAYOUTS", "PackedCodes", "QTensor", "code_dtype", "code_range", "codec_for", "encodable_formats",
           "encode", "pack_codes", "unpack_codes"]  # fmt: skip
