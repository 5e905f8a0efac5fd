"""gguf_q4_0 / gguf_q4_1 / gguf_q5_0 / gguf_q8_0 against ggml's reference quantizer (the gguf package's numpy copy of
ggml-quants.c), bit for bit, plus every code of a block mapping to itself."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import lowbit
from lowbit.formats.ggml import block_fields, block_values, to_blocks
from lowbit.qtensor import encode

gguf = pytest.importorskip("gguf", reason="the gguf package (llama.cpp's Python side) is not installed")
from gguf.quants import dequantize, quantize  # noqa: E402

TYPES = {"q4_0": gguf.GGMLQuantizationType.Q4_0, "q4_1": gguf.GGMLQuantizationType.Q4_1,
         "q5_0": gguf.GGMLQuantizationType.Q5_0, "q8_0": gguf.GGMLQuantizationType.Q8_0}  # fmt: skip


def _awkward(rows: int = 48, seed: int = 0) -> torch.Tensor:
    """Magnitudes from 2^-20 to 2^12, blocks of zeros, constants, ties for the largest |x|, fp16-subnormal d."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 128, generator=gen) * torch.exp2(torch.randint(-20, 12, (rows, 1), generator=gen).float())
    x[0, :32] = 0.0
    x[1, :32] = 3.0
    x[2, :32] = -1.5
    x[3, 7], x[3, 9] = 5.0, -5.0  # equal |x| of both signs: ggml takes the first
    x[4, :32] = torch.linspace(-8, 7, 32)
    x[5, 32:64] *= 1e-6
    x[6, :32] = torch.arange(32.0) * 0.125 - 2.0  # exact halves on the code grid
    return x


@pytest.mark.parametrize("ggml_type", list(TYPES))
def test_equal_to_ggml_reference_quantizer(ggml_type):
    x = _awkward()
    expected = dequantize(quantize(x.numpy(), TYPES[ggml_type]), TYPES[ggml_type])
    got = lowbit.quantize(x, f"gguf_{ggml_type}").numpy()
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))  # signs of zero included


@pytest.mark.parametrize("ggml_type", list(TYPES))
def test_stored_fields_are_ggml_bytes(ggml_type):
    x = _awkward(seed=3)
    fields = block_fields(ggml_type, to_blocks(x))
    raw = quantize(x.numpy(), TYPES[ggml_type]).reshape(x.shape[0], 4, -1)
    assert np.array_equal(fields.scale.numpy().view(np.uint8).reshape(x.shape[0], 4, 2), raw[..., :2])
    if ggml_type == "q4_1":
        assert np.array_equal(fields.minimum.numpy().view(np.uint8).reshape(x.shape[0], 4, 2), raw[..., 2:4])


@pytest.mark.parametrize("ggml_type", list(TYPES))
def test_every_code_maps_to_itself(ggml_type):
    """A block holding every code of the type (with its extreme codes present) quantizes to itself."""
    low, high = {"q8_0": (-127, 127), "q5_0": (0, 31)}.get(ggml_type, (0, 15))
    every = torch.arange(low, high + 1, dtype=torch.float32)
    every = torch.cat([every, torch.full((-len(every) % 30,), float(low))]).reshape(-1, 30)
    extreme = torch.tensor([low, high], dtype=torch.float32).expand(len(every), 2)  # both ends in each block
    codes = torch.cat([extreme, every], dim=1)  # [blocks, 32]
    for d in (0.25, 3.0e-3, 1.5):
        scale = torch.full(codes.shape[:1], d, dtype=torch.float16)
        minimum = torch.full(codes.shape[:1], -0.75, dtype=torch.float16) if ggml_type == "q4_1" else None
        values = block_values(ggml_type, codes, scale, minimum)
        assert torch.equal(lowbit.quantize(values, f"gguf_{ggml_type}"), values)
        again = block_fields(ggml_type, values)
        assert torch.equal(again.codes, codes)


@pytest.mark.parametrize("ggml_type", list(TYPES))
def test_codec_stores_ggml_fields(ggml_type):
    x = _awkward(rows=8, seed=5)
    q = encode(x, f"gguf_{ggml_type}")
    assert q.params["scale"].dtype == torch.float16 and tuple(q.params["scale"].shape) == (8, 4)
    assert ("min" in q.params) == (ggml_type == "q4_1")
    assert torch.equal(q.dequantize(), lowbit.quantize(x, f"gguf_{ggml_type}"))


def test_bits_per_element():
    assert lowbit.get_format("gguf_q4_0")().bits_per_element() == 4.5
    assert lowbit.get_format("gguf_q4_1")().bits_per_element() == 5.0
    assert lowbit.get_format("gguf_q5_0")().bits_per_element() == 5.5
    assert lowbit.get_format("gguf_q8_0")().bits_per_element() == 8.5


def test_only_ggml_rounding_is_accepted():
    with pytest.raises(lowbit.FormatError, match="rounding"):
        lowbit.quantize(torch.ones(32), "gguf_q4_0", rounding="nearest_even")


def test_float16_overflow_saturates_where_ggml_writes_inf():
    x = torch.zeros(32)
    x[0] = 6.0e5  # d = -75000: past float16
    out = lowbit.quantize(x, "gguf_q4_0")
    assert torch.isfinite(out).all() and out[0] == 65504.0 * 8
