"""Exhaustive checks for formats of 8 bits or fewer: every code, every value of the grid.

For each format: decoding every code and encoding the result gives the same values back (and the same code
where the format has one code per value); the decoded values are exactly the format's value set; encoding
the whole value grid and decoding it is the identity. OCP element codes are checked against torch's float8
dtypes and ml_dtypes, independent implementations of the same bit layouts.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

import lowbit
from lowbit.formats import resolve
from lowbit.qtensor import QTensor, encode
from lowbit.qtensor.packing import code_range


def decode_codes(spec, codes: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    """Decode codes of a scalar format (a given affine scale comes from encoding zeros of that shape)."""
    template = encode(torch.zeros(codes.shape, dtype=dtype), spec)
    return QTensor(codes, template.params, spec, dtype, dtype, template.block).dequantize()


def all_codes(spec) -> torch.Tensor:
    """Every code of the format's width (ternary uses 3 of its 4 patterns, binary_residual one per value)."""
    if spec.format_name == "ternary":
        return torch.tensor([-1, 0, 1])
    if spec.format_name == "binary_residual":
        return torch.arange(spec.value_set().numel())
    q = encode(torch.zeros(1), spec)
    low, high = code_range(q.bits, q.signed)
    return torch.arange(low, high + 1)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.masked_fill(a.isnan(), 0), b.masked_fill(b.isnan(), 0)
    return torch.equal(a, b) and torch.equal(torch.signbit(a), torch.signbit(b))


SCALAR = (
    [("integer", {"width": w, "frac_width": f, "signed": s})
     for w in range(1, 9) for f in (-2, 0, 3) for s in (True, False)]
    + [("minifloat_ieee", {"width": w, "exponent_width": e}) for w in range(2, 9) for e in range(1, w)]
    + [("minifloat_denorm", {"width": w, "exponent_width": e}) for w in range(3, 9) for e in range(1, w - 1)]
    + [("minifloat_ieee", {"width": 8, "exponent_width": 4, "exponent_bias": b}) for b in (-3, 0, 12)]
    + [("log", {"width": w}) for w in range(2, 9)] + [("log", {"width": 6, "exponent_bias": 40})]
    + [(name, {}) for name in ("e4m3", "e3m2", "e2m3", "e2m1")] + [("e5m2", {"saturate": False})]
    + [("affine", {"bits": b, "scale": 0.3, "zero_point": z, "signed": s}) for b in (1, 3, 8) for s in (True, False)
       for z in ({True: -(2 ** (b - 1)), False: 0}[s],)]
    + [("binary", {}), ("binary", {"bipolar": False}), ("ternary", {}), ("binary_residual", {"levels": 3}),
       ("binary_residual", {"levels": 2, "means": [0.6, 0.3]})]
)  # fmt: skip
SCALAR_IDS = [f"{name}-{'-'.join(f'{k}{v}' for k, v in params.items())}" for name, params in SCALAR]


@pytest.mark.parametrize(("name", "params"), SCALAR, ids=SCALAR_IDS)
def test_every_code_and_every_value(name, params):
    spec = resolve(name, **params)
    codes = all_codes(spec)
    values = decode_codes(spec, codes)
    finite = values[~values.isnan()]
    # The decoded values are exactly the format's value set (zeros of both signs count once).
    grid = spec.value_set()
    assert torch.equal(torch.unique(finite[torch.isfinite(finite)] + 0.0), grid)
    # Encoding every decoded value gives it back bit for bit; one code per value: the same code.
    q = encode(values, spec)
    assert same_bits(q.dequantize(), values) and torch.equal(q.dequantize().isnan(), values.isnan())
    if name not in ("minifloat_denorm", "e5m2", "e4m3", "binary", "ternary", "binary_residual", "affine"):
        assert torch.equal(q.codes.to(torch.int64), codes)
    # The value grid itself, as float32 and float64, round trips.
    for dtype in (torch.float32, torch.float64):
        x = grid.to(dtype)
        assert same_bits(encode(x, spec).dequantize(), lowbit.quantize(x, spec))


@pytest.mark.parametrize(("name", "dtype"), [("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)])
def test_fp8_codes_match_torch_float8(name, dtype):
    codes = torch.arange(256)
    ours = decode_codes(resolve(name), codes, dtype=torch.float32)
    theirs = codes.to(torch.uint8).view(dtype).float()
    assert same_bits(ours, theirs) and torch.equal(ours.isnan(), theirs.isnan())
    finite = theirs[~theirs.isnan()]
    assert torch.equal(encode(finite, name, saturate=False).codes, finite.to(dtype).view(torch.uint8))


@pytest.mark.parametrize(("name", "np_dtype", "bits"), [("e3m2", ml_dtypes.float6_e3m2fn, 6),
                                                        ("e2m3", ml_dtypes.float6_e2m3fn, 6),
                                                        ("e2m1", ml_dtypes.float4_e2m1fn, 4)])  # fmt: skip
def test_fp6_fp4_codes_match_ml_dtypes(name, np_dtype, bits):
    codes = np.arange(2**bits, dtype=np.uint8)
    theirs = torch.from_numpy(codes.view(np_dtype).astype(np.float32))
    ours = decode_codes(resolve(name), torch.from_numpy(codes.astype(np.int64)), dtype=torch.float32)
    assert same_bits(ours, theirs)
    assert encode(theirs, name).codes.tolist() == codes.tolist()


@pytest.mark.parametrize("exponent", [-9, 0, 5])
@pytest.mark.parametrize(("name", "params"), [
    ("block_fp", {"width": 6, "exponent_width": 5}), ("block_fp", {"width": 8, "exponent_width": 8}),
    ("block_minifloat", {"width": 6, "exponent_width": 3, "exponent_bias_width": 5}),
    ("block_minifloat", {"width": 8, "exponent_width": 4, "exponent_bias_width": 8})])  # fmt: skip
def test_every_value_of_a_block(name, params, exponent):
    spec = resolve(name, block_size=[-1], **params)
    values = spec.block_values(exponent).float()  # one block: its maximum fixes the shared exponent
    q = encode(values, spec)
    assert same_bits(q.dequantize(), values)
    assert int(q.params["exponent"]) == exponent
    magnitudes = q.codes.to(torch.int64) & ((1 << (spec.width - 1)) - 1)
    assert len(set(q.codes.tolist())) == values.numel()  # one code per value
    if name == "block_fp":
        assert sorted(set(magnitudes.tolist())) == list(range(2 ** (spec.width - 1)))


@pytest.mark.parametrize("bias", [0, 3, 7])
def test_every_value_of_a_block_log_block(bias):
    spec = resolve("block_log", width=5, exponent_bias_width=3, block_size=[-1])
    top = 2**spec.exponent_width - 1 - bias
    powers = [2.0**e for e in range(1 - bias, top + 1)]
    values = torch.tensor([-p for p in reversed(powers)] + [0.0] + powers)
    q = encode(values, spec)
    assert same_bits(q.dequantize(), values) and int(q.params["bias"]) == bias
    assert len(set(q.codes.tolist())) == values.numel()


@pytest.mark.parametrize("shared", [-20, 0, 9])
@pytest.mark.parametrize("name", ["mxint8", "mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4_e2m1"])
def test_every_element_of_an_mx_block(name, shared):
    spec = resolve(name, block_size=-1)
    values = (spec.element_values() * 2.0**shared).float()
    q = encode(values, spec)
    assert same_bits(q.dequantize(), values)
    assert q.params["scale"].tolist() == [shared + 127]
    assert len(set(q.codes.tolist())) == values.numel()


@pytest.mark.parametrize("name", ["q8s", "q4s", "q2s", "q8f", "q4f", "q2f"])
def test_presets_use_every_code_of_their_range(name):
    spec = resolve(name)
    low, high = spec.clamp_range
    y = lowbit.quantize(torch.linspace(low, high, 4001) * 0.37, spec)
    q = encode(y, spec)
    assert same_bits(q.dequantize(), lowbit.quantize(y, spec))
    assert sorted(set(q.codes.tolist())) == list(range(low, high + 1))
    assert int(q.codes.min()) >= -(2 ** (spec.bits - 1)) and q.bits == spec.bits


def test_unscaled_grid_sizes():
    # 2^W - 1 values for IEEE minifloats and log (two zeros), 2^W for integers.
    assert len(decode_codes(resolve("minifloat_ieee", width=5, exponent_width=2), all_codes(
        resolve("minifloat_ieee", width=5, exponent_width=2))).unique()) == 31
    assert math.isclose(float(decode_codes(resolve("e2m1"), torch.tensor([7]))), 6.0)
