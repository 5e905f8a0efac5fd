"""gguf_q4_k / gguf_q6_k: every value lowbit produces is what the gguf package's own dequantizer (the numpy
copy of ggml-quants.c) reads from the bytes lowbit writes, bit for bit; the byte layout round-trips; the rule
of lowbit.formats.ggml_k holds (peak codes, clamps, zero / NaN / inf blocks)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import lowbit
from lowbit.formats import _ggml_bytes
from lowbit.formats.ggml import to_blocks
from lowbit.formats.ggml_k import SUPER_BLOCK, KFields, k_fields, k_values
from lowbit.qtensor import encode

gguf = pytest.importorskip("gguf", reason="the gguf package (llama.cpp's Python side) is not installed")
from gguf.quants import dequantize  # noqa: E402

TYPES = {"q4_k": gguf.GGMLQuantizationType.Q4_K, "q6_k": gguf.GGMLQuantizationType.Q6_K}


def _awkward(rows: int = 12, seed: int = 0) -> torch.Tensor:
    """Sub-blocks of very different ranges, all-positive / all-negative sub-blocks, zeros, ties of |x|."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 512, generator=gen) * torch.exp2(torch.randint(-12, 8, (rows, 16), generator=gen).float()
                                                            ).repeat_interleave(32, dim=1)  # fmt: skip
    x[0, :256] = 0.0
    x[1, :64] = x[1, :64].abs() + 1.0  # a positive sub-block: Q4_K's minimum clamps to 0
    x[2, :64] = -x[2, :64].abs() - 1.0
    x[3, 5], x[3, 9] = 7.0, -7.0  # equal |x| of both signs: the first is the peak
    x[4, 256:] = 1e-3 * torch.arange(256.0)
    return x


def _fields_dict(ggml_type: str, fields: KFields, rows: int) -> dict[str, np.ndarray]:
    out = {"codes": fields.codes.reshape(rows, -1).numpy(), "d": fields.d.numpy(),
           "sub_scale": fields.sub_scale.reshape(rows, -1).numpy()}  # fmt: skip
    if ggml_type == "q4_k":
        out["m"], out["sub_min"] = fields.dmin.numpy(), fields.sub_min.reshape(rows, -1).numpy()
    return out


@pytest.mark.parametrize("ggml_type", list(TYPES))
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("search", [True, False])
def test_values_are_what_gguf_reads_from_the_bytes(ggml_type, seed, search):
    x = _awkward(seed=seed)
    fields = k_fields(ggml_type, to_blocks(x, SUPER_BLOCK), search)
    data = _ggml_bytes.pack(ggml_type, _fields_dict(ggml_type, fields, x.shape[0]))
    assert data.shape == (x.shape[0], 2 * _ggml_bytes.LAYOUTS[ggml_type][1])
    expected = dequantize(data, TYPES[ggml_type])
    got = lowbit.quantize(x, f"gguf_{ggml_type}", search=search).numpy()
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))  # signs of zero included


@pytest.mark.parametrize("ggml_type", list(TYPES))
def test_byte_layout_round_trips_every_code_and_field(ggml_type):
    gen = torch.Generator().manual_seed(4)
    low, high = (0, 15) if ggml_type == "q4_k" else (-32, 31)
    codes = torch.randint(low, high + 1, (3, 512), generator=gen)
    codes[0, : high - low + 1] = torch.arange(low, high + 1)
    subs = 8 if ggml_type == "q4_k" else 16
    scale_low, scale_high = (0, 63) if ggml_type == "q4_k" else (-128, 127)
    fields = {"codes": codes.numpy(), "d": np.float16(np.random.default_rng(0).normal(size=(3, 2))),
              "sub_scale": torch.randint(scale_low, scale_high + 1, (3, 2 * subs), generator=gen).numpy()}  # fmt: skip
    fields["sub_scale"][0, :2] = (scale_low, scale_high)
    if ggml_type == "q4_k":
        fields["m"] = np.float16(np.random.default_rng(1).normal(size=(3, 2)))
        fields["sub_min"] = torch.randint(0, 64, (3, 16), generator=gen).numpy()
        fields["sub_min"][0, :2] = (0, 63)
    back = _ggml_bytes.unpack(ggml_type, _ggml_bytes.pack(ggml_type, fields), (3, 512))
    assert set(back) == set(fields)
    for name, value in fields.items():
        assert np.array_equal(back[name].astype(np.float64), np.asarray(value).astype(np.float64)), name


@pytest.mark.parametrize("ggml_type", list(TYPES))
def test_codec_stores_the_super_block_fields(ggml_type):
    x = _awkward(rows=5, seed=5)
    q = encode(x, f"gguf_{ggml_type}")
    assert q.params["d"].dtype == torch.float16 and tuple(q.params["d"].shape) == (5, 2)
    assert ("dmin" in q.params) == ("sub_min" in q.params) == (ggml_type == "q4_k")
    assert tuple(q.params["sub_scale"].shape) == (5, 2, 8 if ggml_type == "q4_k" else 16)
    assert torch.equal(q.dequantize(), lowbit.quantize(x, f"gguf_{ggml_type}"))


def test_q6_k_peak_takes_code_minus_32_and_the_top_scale_minus_128():
    x = torch.zeros(256)
    x[:16] = torch.linspace(-1.0, 2.0, 16)  # the peak is +2: scale 2 / -32, code -32
    x[16:32] = 0.5
    fields = k_fields("q6_k", to_blocks(x, SUPER_BLOCK), search=False)
    assert fields.codes[0, 15] == -32 and fields.sub_scale[0, 0] == -128
    assert fields.d.item() == pytest.approx((2.0 / -32) / -128, rel=1e-3)
    values = k_values("q6_k", fields)[0]
    assert values[15] == 2.0 * (float(fields.d) * -128 * -32) / 2.0  # the peak, from the stored fields
    assert torch.all(fields.codes[0, 32:] == 0) and torch.all(values[32:] == 0)


def test_q4_k_positive_sub_block_has_no_minimum_and_the_widest_takes_63():
    x = torch.zeros(256)
    x[:32] = torch.linspace(1.0, 4.0, 32)  # positive: low clamps to 0, minimum code 0
    x[32:64] = torch.linspace(-8.0, 7.0, 32)  # the widest range: scale code 63, minimum code 63
    fields = k_fields("q4_k", to_blocks(x, SUPER_BLOCK), search=False)
    assert fields.sub_min[0, 0] == 0 and fields.sub_scale[0, 1] == 63 and fields.sub_min[0, 1] == 63
    values = k_values("q4_k", fields)[0]
    assert values[32] == pytest.approx(-8.0, rel=1e-3) and values[63] == pytest.approx(7.0, rel=1e-3)
    assert torch.all(values[64:] == 0)


@pytest.mark.parametrize("ggml_type", list(TYPES))
def test_zero_nan_and_infinite_elements(ggml_type):
    x = torch.randn(2, 256)
    x[0] = 0.0
    x[1, 3], x[1, 40], x[1, 41] = math.nan, math.inf, -math.inf
    y = lowbit.quantize(x, f"gguf_{ggml_type}")
    assert torch.all(y[0] == 0)
    assert torch.isnan(y[1, 3]) and torch.isnan(y[1]).sum() == 1
    sub = y[1, 32:48]  # +-inf saturate to their sub-block's extreme values
    assert y[1, 40] == sub.max() and y[1, 41] == sub.min() and torch.isfinite(sub).all()


def test_partial_super_block_and_bits_per_element():
    x = torch.randn(3, 300)
    padded = torch.cat([x, x[:, -1:].expand(3, 212)], dim=1)
    for ggml_type in TYPES:
        name = f"gguf_{ggml_type}"
        assert torch.equal(lowbit.quantize(x, name), lowbit.quantize(padded, name)[:, :300])
    assert lowbit.get_format("gguf_q4_k")().bits_per_element() == 4.5
    assert lowbit.get_format("gguf_q6_k")().bits_per_element() == 6.5625
    assert lowbit.get_format("gguf_q4_k")().bits_per_element((4, 512)) == 4.5


@pytest.mark.parametrize("ggml_type", list(TYPES))
def test_search_lowers_the_error_of_min_max(ggml_type):
    """The least-squares search (the default) against the min-max rule on Gaussian and heavy-tailed rows."""
    gen = torch.Generator().manual_seed(0)
    for x in (torch.randn(16, 1024, generator=gen), torch.randn(16, 1024, generator=gen) ** 3):
        error = {search: float((lowbit.quantize(x, f"gguf_{ggml_type}", search=search) - x).square().sum())
                 for search in (True, False)}  # fmt: skip
        assert error[True] < 0.97 * error[False], error


def test_only_nearest_even_is_accepted():
    with pytest.raises(lowbit.FormatError, match="rounding"):
        lowbit.quantize(torch.ones(256), "gguf_q4_k", rounding="nearest_up")
