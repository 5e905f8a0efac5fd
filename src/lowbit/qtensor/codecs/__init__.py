"""The codec registry: format name -> the codec that stores that format as integer codes.

One module per format family (``affine``, ``float_codes``, ``signs``, ``block``, ``nvfp4``, ``tables``, ``ggml``); every registered format of
``lowbit.formats`` has a codec. A format added later without one makes ``encode`` raise a FormatError
naming it.
"""

from __future__ import annotations

from lowbit.errors import FormatError
from lowbit.formats._base import FormatSpec
from lowbit.qtensor.codecs._common import Codec, Encoded, FloatLayout
from lowbit.qtensor.codecs.affine import AffineCodec, IntegerCodec
from lowbit.qtensor.codecs.block import BlockFPCodec, BlockLogCodec, BlockMinifloatCodec, MXCodec
from lowbit.qtensor.codecs.ggml import GGMLCodec, KQuantCodec
from lowbit.qtensor.codecs.float_codes import LogCodec, MinifloatCodec, OcpFloatCodec
from lowbit.qtensor.codecs.nvfp4 import NVFP4Codec
from lowbit.qtensor.codecs.signs import BinaryCodec, BinaryResidualCodec, TernaryCodec
from lowbit.qtensor.codecs.tables import TableCodec

_CODECS: dict[str, Codec] = {}


def register_codec(codec: Codec) -> Codec:
    for name in codec.names:
        _CODECS[name] = codec
    return codec


for _cls in (IntegerCodec, AffineCodec, MinifloatCodec, OcpFloatCodec, LogCodec, BinaryCodec, TernaryCodec,
             BinaryResidualCodec, BlockFPCodec, BlockMinifloatCodec, BlockLogCodec, MXCodec, NVFP4Codec,
             TableCodec, GGMLCodec, KQuantCodec):  # fmt: skip
    register_codec(_cls())


def codec_for(spec: FormatSpec) -> Codec:
    """The codec of ``spec``'s format; FormatError if that format has no integer encoding."""
    codec = _CODECS.get(spec.format_name)
    if codec is None:
        raise FormatError(
            f"{spec.format_name}: no integer encoding is known for this format, so it cannot be stored as a "
            f"QTensor; encodable formats: {', '.join(sorted(_CODECS))}"
        )
    return codec


def encodable_formats() -> list[str]:
    return sorted(_CODECS)


__all__ = ["Codec", "Encoded", "FloatLayout", "codec_for", "encodable_formats", "register_codec"]
