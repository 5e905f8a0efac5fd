"""codebook (any table) and nf4 (bitsandbytes' NormalFloat4): the NF4 table from its definition, an
independent numpy oracle on over a million NF4 values (zero blocks, saturation, NaN / inf, midpoints and
their neighbours), exact Fraction oracles for every tie rule, and their storage."""

from __future__ import annotations

import math
import statistics
from fractions import Fraction

import numpy as np
import pytest
import torch

import lowbit
from lowbit import FormatError
from lowbit.formats.codebook import NF4_VALUES
from helpers import assert_same

F32 = np.float32
TIE_RULES = ("nearest_toward_zero", "nearest_away", "nearest_up", "nearest_down")


def test_nf4_table_follows_from_its_definition():
    """Normal quantiles of 8 (positive) and 7 (negative) float32 points from 0.9677083 to 0.5, and 0,
    normalised by the largest: bitsandbytes' construction, in float32 as it does."""
    quantile = statistics.NormalDist().inv_cdf
    positive = [quantile(p) for p in torch.linspace(0.9677083, 0.5, 9)[:-1].tolist()]
    negative = [-quantile(p) for p in torch.linspace(0.9677083, 0.5, 8)[:-1].tolist()]
    values = torch.tensor([*positive, 0.0, *negative]).sort().values
    assert_same(values / values.max(), torch.tensor(NF4_VALUES, dtype=torch.float32))
    assert torch.tensor(NF4_VALUES).double().tolist() == list(NF4_VALUES)  # float32 values, exactly


# ---- NF4 against a numpy oracle --------------------------------------------------------------------------------
def nf4_oracle(x: np.ndarray, block: int = 64) -> np.ndarray:
    """absmax per block of the last dimension; nearest table value of t = x / absmax (float32), ties toward
    the smaller magnitude (float64 distances are exact here: t and the table are float32 in [-1, 1])."""
    table = np.array(NF4_VALUES, dtype=np.float64)
    length = x.shape[-1]
    pad = (-length) % block
    blocks = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)]).reshape(-1, block)
    absmax = np.where(np.isfinite(blocks), np.abs(blocks), F32(0)).max(axis=1, keepdims=True).astype(F32)
    with np.errstate(invalid="ignore"):
        t = (blocks / np.where(absmax > 0, absmax, F32(1))).astype(F32).reshape(-1)
    out = np.empty_like(t)
    for start in range(0, t.size, 1 << 18):
        part = t[start : start + (1 << 18)].astype(np.float64)
        distance = np.abs(np.nan_to_num(part, posinf=2, neginf=-2)[:, None] - table[None, :])
        nearest = distance == distance.min(axis=1, keepdims=True)
        choice = np.argmin(np.where(nearest, np.abs(table)[None, :], np.inf), axis=1)
        out[start : start + part.size] = table.astype(F32)[choice]
    y = (out.reshape(blocks.shape) * absmax).reshape(*x.shape[:-1], -1)[..., :length]
    return np.where(np.isnan(x), x, y)


def nf4_cases() -> np.ndarray:
    """1024 x 1056 float32 (1,081,344 values; the last block of each row is 32 long)."""
    rng = np.random.default_rng(45)
    x = rng.standard_normal((1024, 1056)).astype(F32) * F32(10.0) ** rng.integers(-20, 20, (1024, 1)).astype(F32)
    x[rng.random((1024, 1056)) < 0.01] *= 100  # outliers
    x[:32, :64] = 0  # zero blocks
    x[40, 3], x[41, 70], x[42, 1000] = np.inf, -np.inf, np.nan
    table = np.array(NF4_VALUES, dtype=F32)
    middles = ((table[1:].astype(np.float64) + table[:-1]) / 2).astype(F32)
    probes = np.concatenate([middles, np.nextafter(middles, F32(2)), np.nextafter(middles, F32(-2)), table])
    tie_rows = rng.choice(probes, (128, 1056)).astype(F32)
    tie_rows[:, ::64] = 1.0  # absmax 1: t = x exactly
    x[64:192] = tie_rows
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nf4_matches_the_oracle_on_a_million_values(dtype):
    x = torch.from_numpy(nf4_cases()).to(dtype)
    expected = torch.from_numpy(nf4_oracle(x.float().numpy())).to(dtype)
    assert_same(lowbit.quantize(x, "nf4", block_size=64), expected)
    assert x.numel() >= 1_000_000


# ---- codebook: exact oracles for every tie rule ------------------------------------------------------------
def exact_nearest(value: float, table: list[float], rule: str) -> float:
    if math.isnan(value):
        return value
    if math.isinf(value):
        return table[-1] if value > 0 else table[0]
    exact = Fraction(value)
    best = min(abs(Fraction(v) - exact) for v in table)
    candidates = [v for v in table if abs(Fraction(v) - exact) == best]
    if len(candidates) == 1:
        return candidates[0]
    low, high = candidates
    if rule in ("nearest_up", "nearest_down"):
        return high if rule == "nearest_up" else low
    if value == 0:  # -a / +a: by the sign bit
        return low if math.copysign(1.0, value) < 0 else high
    nearer_zero = low if abs(low) < abs(high) else high
    return nearer_zero if rule == "nearest_toward_zero" else (high if nearer_zero == low else low)


def probes(table: list[float], dtype: torch.dtype) -> torch.Tensor:
    """Each value, each exact midpoint rounded to dtype and 4 dtype steps either side, +-0, +-inf, NaN."""
    found = [torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 1e30, -1e30], dtype=dtype)]
    for low, high in zip(table[:-1], table[1:]):
        y = torch.tensor([float((Fraction(low) + Fraction(high)) / 2)], dtype=dtype)
        for direction in (math.inf, -math.inf):
            step = y
            for _ in range(4):
                step = torch.nextafter(step, torch.tensor([direction], dtype=dtype))
                found.append(step)
        found.append(y)
    return torch.cat(found + [torch.tensor(table, dtype=dtype)])


TABLES = [[-1.0, -0.25, 0.0, 0.5, 1.0], [-0.75, 0.75], [-3.0, -1.0, 1.0, 3.0], [0.1, 0.2, 0.30000001, 7.0],
          list(NF4_VALUES), [-2.0, 2 / 3, 1e-30, 5e-324 * 7]]  # fmt: skip


@pytest.mark.parametrize("table", TABLES, ids=lambda t: f"{len(t)}-values")
@pytest.mark.parametrize("rule", TIE_RULES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_codebook_is_nearest_with_its_tie_rule(table, rule, dtype):
    spec = lowbit.get_format("codebook")(values=table, rounding=rule)
    table = sorted(table)
    x = probes(table, dtype)
    expected = [exact_nearest(v, table, rule) for v in x.tolist()]
    assert_same(spec(x), torch.tensor(expected, dtype=torch.float64).to(dtype))


def test_codebook_symmetric_table_is_sign_symmetric():
    spec = lowbit.get_format("codebook")(values=[-3.0, -1.0, 1.0, 3.0])
    x = probes([-3.0, -1.0, 1.0, 3.0], torch.float32)
    x = x[~x.isnan()]
    assert_same(spec(-x), -spec(x))


def test_scaled_codebook_and_zero_blocks():
    spec = lowbit.get_format("codebook")(values=[-1.0, -0.5, 0.0, 0.5, 1.0], block_size=[2, 2])
    x = torch.tensor([[4.0, 1.1, 0.0, 0.0], [-0.9, 0.0, 0.0, -0.0]])
    assert_same(spec(x), torch.tensor([[4.0, 2.0, 0.0, 0.0], [0.0, 0.0, 0.0, -0.0]]))
    assert_same(spec.absmax(x), torch.tensor([[4.0, 0.0]]))


def test_bits():
    assert lowbit.get_format("nf4")().bits_per_element() == 4.5
    assert lowbit.get_format("nf4")().bits_per_element((3, 100)) == 4 + 32 * 6 / 300
    assert lowbit.get_format("codebook")(values=list(range(9))).bits == 4
    assert lowbit.get_format("codebook")(values=[0, 1]).bits_per_element() == 1.0


@pytest.mark.parametrize(
    "params,name",
    [({"values": [1.0]}, "values"), ({"values": [1.0, 1.0]}, "values"), ({"values": [0.0, math.inf]}, "values"),
     ({"values": "ab"}, "values"), ({"values": list(range(257))}, "values"),
     ({"values": [-2.0, 0.0, 2.0], "block_size": 4}, "normalised"), ({"values": [-1.0, 1.0], "block_size": 4}, "0"),
     ({"rounding": "nearest_even"}, "rounding"), ({"block_size": 0}, "block_size")],
)  # fmt: skip
def test_bad_parameters(params, name):
    with pytest.raises(FormatError, match=name):
        lowbit.get_format("codebook")(**params)
    with pytest.raises(FormatError, match="block_size"):
        lowbit.get_format("nf4")(block_size=None)


@pytest.mark.parametrize("fmt,params", [("nf4", {}), ("nf4", {"block_size": [-1]}), ("codebook", {"values": [-2, 0.1, 7]}),
                                        ("codebook", {"values": [-1, 0, 0.5, 1], "block_size": [4, 4]})])  # fmt: skip
def test_stored_codes_decode_bit_for_bit(fmt, params):
    for x in (torch.randn(5, 70), torch.randn(3, 5, 9).double(), torch.tensor(0.7), torch.randn(4, 130).bfloat16()):
        stored = lowbit.qtensor.encode(x, fmt, **params)
        assert_same(stored.dequantize(), lowbit.quantize(x, fmt, **params))
    stored = lowbit.qtensor.encode(torch.randn(64, 256), "nf4")
    assert stored.bits == 4 and stored.nbytes == 64 * 256 // 2 + 64 * 4 * 4  # codes + float32 absmax per 64
