"""Block kernels (csrc/block_ocp.c, block_scaled.c, block_log.c) beyond the case table: parameter variants of the
OCP elements, MX, block_fp, block_minifloat and block_log, each bit for bit the eager path's result, and the
kernel really running where it should (None only where it is documented not to apply)."""

from __future__ import annotations

import pytest
import torch

import lowbit
from helpers import DETERMINISTIC, float32_patterns
from lowbit.formats.blocking import contiguous_runs, runs_of
from lowbit.native import build
from test_equal_to_eager import assert_bits_equal

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C compiler on this machine")


@pytest.fixture(scope="module", autouse=True)
def library():
    assert build.ensure() is not None, build.error()


def samples() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    spread = torch.randn(6, 75, generator=generator) * torch.logspace(-40, 38, 75)  # tails of 75 % 32, 75 % 16
    # rows of whole blocks of 16 and 32 (the kernels' loops across a group of blocks), one magnitude per row,
    # with a zero block, an inf and a NaN among them (the group's unusual blocks)
    whole = torch.randn(7, 96, generator=generator) * torch.logspace(-42, 36, 7)[:, None]
    whole[2, :32], whole[4, 40], whole[5, 70] = 0.0, float("inf"), float("nan")
    return [spread, float32_patterns((5, 45), 7), torch.randn(3, 4, 33, generator=generator) * 1e-39,
            torch.randint(-64, 64, (4, 48), generator=generator) / 16.0, whole]  # fmt: skip


def check(name: str, modes=DETERMINISTIC, out_dtype=torch.float32, **params) -> None:
    for mode in modes:
        spec = lowbit.get_format(name)(**params, rounding=mode)
        for x in samples():
            got = spec._native(x, out_dtype)
            assert got is not None, (name, params, mode)
            assert_bits_equal(got, spec._quantize_for(x, None, out_dtype))


@pytest.mark.parametrize("name", ["e5m2", "e4m3", "e3m2", "e2m3", "e2m1"])
@pytest.mark.parametrize("params", [
    {"saturate": False}, {"block_size": [1, 16], "saturate": False}, {"axis": 0}, {"axis": -1, "block_size": [8]},
    {"scale": 0.3, "saturate": False}, {"block_size": [-1]}, {"block_size": [1, 32], "skip_first_dim": True},
], ids=str)  # fmt: skip
def test_ocp_variants(name, params):
    check(name, **params)


NEAREST = ["nearest_even", "nearest_away", "nearest_toward_zero", "nearest_up", "nearest_down"]


@pytest.mark.parametrize("name", ["e5m2", "e4m3", "e2m1"])
@pytest.mark.parametrize("saturate", [True, False])
def test_ocp_per_channel_on_the_last_dimension_runs_per_column(name, saturate):
    """A scale per column (lb_ocp_columns_f32) under the nearest modes; the directed ones decline."""
    check(name, modes=NEAREST, axis=-1, saturate=saturate)
    x = samples()[0]
    for mode in ("up", "toward_zero"):
        spec = lowbit.get_format(name)(axis=-1, saturate=saturate, rounding=mode)
        assert spec._native(x, torch.float32) is None
    huge = torch.full((4, 3), torch.finfo(torch.float32).max)  # scales at the top of the float32 range
    huge[1, 1], huge[2, 0], huge[3, 2] = -float("inf"), 1.0, -3.0e38
    spec = lowbit.get_format(name)(axis=-1, saturate=saturate)
    assert_bits_equal(spec._native(huge, torch.float32), spec._quantize_for(huge, None, torch.float32))


def test_ocp_given_scale_per_first_dimension():
    spec = lowbit.get_format("e4m3")(scale=tuple(0.1 * (k + 1) for k in range(6)), axis=0)
    x = samples()[0]
    assert_bits_equal(spec._native(x, torch.float32), spec._quantize_for(x, None, torch.float32))


def test_ocp_parameters_without_a_kernel_return_none():
    x = samples()[0]
    assert lowbit.get_format("e4m3")(block_size=[2, 16])._native(x, torch.float32) is None  # ND blocks
    assert lowbit.get_format("e4m3")(block_size=[1, 16], scale_dtype="bf16")._native(x, torch.float32) is None
    assert lowbit.get_format("e4m3")(scale=(0.5,) * 75, axis=1)._native(x, torch.float32) is None
    assert lowbit.get_format("e4m3")(axis=1, rounding="up")._native(x, torch.float32) is None  # columns: nearest only
    assert lowbit.get_format("e4m3")(axis=1)._native(x.reshape(6, 3, 25), torch.float32) is None  # a middle axis


@pytest.mark.parametrize("name", ["mxint8", "mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4_e2m1"])
@pytest.mark.parametrize("params", [{"scale_rule": "ceil"}, {"scale_rule": "even"}, {"block_size": 16},
                                    {"block_size": -1}], ids=str)  # fmt: skip
def test_mx_variants(name, params):
    check(name, **params)


@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rule", ["floor", "ceil", "even"])
def test_mx_saturates_at_the_output_dtype(out_dtype, rule):
    check("mxfp4_e2m1", modes=["nearest_even", "up"], out_dtype=out_dtype, scale_rule=rule)
    x = torch.tensor([[65504.0, 3.0e38] + [1.0] * 30])
    spec = lowbit.get_format("mxfp4_e2m1")(scale_rule=rule)
    assert_bits_equal(spec._native(x, out_dtype), spec._quantize_for(x, None, out_dtype))
    assert spec._native(x, torch.float64) is None


def test_mx_other_axes_return_none():
    x = samples()[0]
    assert lowbit.get_format("mxfp8_e4m3")(axis=0)._native(x, torch.float32) is None


@pytest.mark.parametrize("params", [
    {}, {"width": 4, "exponent_width": 4}, {"width": 30, "exponent_width": 9, "exponent_bias": 200},
    {"width": 25}, {"block_size": None}, {"axis": 0, "block_size": None}, {"block_size": [1, 7]},
    {"width": 6, "exponent_width": 3, "exponent_bias": 0},
], ids=str)  # fmt: skip
def test_block_fp_variants(params):
    check("block_fp", **params)


@pytest.mark.parametrize("params", [
    {}, {"width": 6, "exponent_width": 5}, {"width": 12, "exponent_width": 3, "exponent_bias_width": 10},
    {"width": 27, "exponent_width": 3}, {"width": 5, "exponent_width": 4}, {"block_size": None},
    {"block_size": [1, 9], "exponent_bias_width": 2},
], ids=str)  # fmt: skip
def test_block_minifloat_variants(params):
    check("block_minifloat", **params)


@pytest.mark.parametrize("params", [
    {}, {"log_domain": True}, {"width": 3, "exponent_bias_width": 10}, {"width": 11, "exponent_bias_width": 0},
    {"block_size": None}, {"axis": 0, "block_size": None}, {"block_size": [1, 5]},
], ids=str)  # fmt: skip
def test_block_log_variants(params):
    check("block_log", **params)


def test_block_kernels_run_on_several_threads(several_threads):
    x = torch.randn(1024, 1100, generator=torch.Generator().manual_seed(9)) * 8
    x[3, 5], x[700, 1] = float("nan"), float("inf")
    for name, params in [("mxfp4_e2m1", {}), ("block_fp", {}), ("block_minifloat", {}), ("block_log", {}),
                         ("e2m1", {"block_size": [1, 32]}), ("e4m3", {"scale": 0.25})]:  # fmt: skip
        spec = lowbit.get_format(name)(**params)
        assert_bits_equal(spec._native(x, torch.float32), spec._quantize_for(x, None, torch.float32))


def test_contiguous_runs():
    assert contiguous_runs((4, 100), (1, 32)) == (4, 100, 32)
    assert contiguous_runs((4, 100), (4, 100)) == (1, 400, 400)
    assert contiguous_runs((3, 4, 5), (1, 4, 5)) == (1, 60, 20)  # three blocks of 20
    assert contiguous_runs((3, 4, 5), (1, 2, 5)) == (3, 20, 10)
    assert contiguous_runs((3, 4, 5), (3, 1, 5)) is None
    assert contiguous_runs((4, 100), (2, 32)) is None
    assert contiguous_runs((), ()) is None
    assert runs_of((4, 100), (32,)) == runs_of((4, 100), (32,)) == (4, 100, 32)  # remembered: the same answer
    assert runs_of((4, 100), [1, 32]) == (4, 100, 32)  # an unhashable block_size is computed each time
    assert runs_of((6, 8), None, 0) == (1, 48, 8)  # per channel on the first dimension: a block per row


def layer_like(columns: int) -> torch.Tensor:
    """7 rows of ``columns`` values, block after block of 16 one binade apart from 2^-150 to 2^127 (tiny,
    subnormal and huge blocks), with blocks of ties (multiples of 1/16), an all-zero and a -0.0 block, and
    NaN, +-inf and an all-inf block: whole blocks of 16 and 32 back to back, groups of blocks across rows."""
    generator = torch.Generator().manual_seed(12)
    x = torch.randn(7, columns, generator=generator)
    blocks = x.view(-1)[: x.numel() // 16 * 16].view(-1, 16)
    blocks.mul_(torch.pow(2.0, torch.arange(len(blocks), dtype=torch.float64) * 277 / len(blocks) - 150)
                .clamp(max=2.0**126).to(torch.float32)[:, None])  # fmt: skip
    blocks[3] = torch.randint(-64, 64, (16,), generator=generator) / 16.0
    blocks[4], blocks[5], blocks[6] = 0.0, -0.0, float("inf")
    blocks[7, 3], blocks[8, 0], blocks[9, 15], blocks[40, 7] = float("nan"), float("inf"), -float("inf"), float("nan")
    blocks[41] = torch.randint(-64, 64, (16,), generator=generator) * 2.0**-140  # subnormal ties
    # maxima on the ties of the shared exponent's rounding (|max| halfway between two codes at some width)
    # and maxima one step above a power of two (block_log's ceil_log2), large (a bias inside its range) and small
    ties = [1.5, 3.0, -6.0, 1.25, 2.5, 1.75, 1.125, 1.0625 * 8, 1 + 3 * 2.0**-8, 1 + 2.0**-7, 1 + 2.0**-23, 2.0**24 - 1,
            2.0**115 * (1 + 2.0**-23), 1.5, 1 + 2.0**-23, 1.25]  # fmt: skip
    for offset, tie in enumerate(ties):
        blocks[42 + offset] = blocks[42 + offset] / blocks[42 + offset].abs().max() * (abs(tie) / 2)
        blocks[42 + offset, offset % 16] = tie
    blocks[54, 0], blocks[56, 0] = 1.5 * 2.0**-12, 1.5 * 2.0**-15  # by the smallest power each bias keeps
    return x


LAYER_FORMATS = [
    ("block_fp", {"width": 8, "exponent_width": 8, "exponent_bias": 127, "block_size": [1, 16]}),
    ("block_fp", {"width": 2, "block_size": [1, 32]}), ("block_fp", {"width": 24, "block_size": [1, 16]}),
    ("block_fp", {"width": 25, "exponent_width": 9, "exponent_bias": 200, "block_size": [1, 32]}),
    ("block_minifloat", {"width": 8, "exponent_width": 4, "exponent_bias_width": 4, "block_size": [1, 16]}),
    ("block_minifloat", {"width": 6, "exponent_width": 3, "exponent_bias_width": 8, "block_size": [1, 32]}),
    ("block_minifloat", {"width": 5, "exponent_width": 4, "block_size": [1, 16]}),  # no mantissa bit
    ("block_log", {"width": 8, "exponent_bias_width": 4, "block_size": [1, 16]}),
    ("block_log", {"width": 5, "exponent_bias_width": 8, "block_size": [1, 32], "log_domain": True}),
    ("mxint8", {}), ("mxfp8_e4m3", {}), ("mxfp4_e2m1", {}), ("mxfp6_e3m2", {"block_size": 16}),
    ("e2m1", {"block_size": [1, 32]}), ("e4m3", {"block_size": [1, 16], "saturate": False}),
]  # fmt: skip


@pytest.mark.parametrize("columns", [320, 336, 330], ids=["whole-blocks", "a-half-block-of-32", "row-tails"])
@pytest.mark.parametrize(("name", "params"), LAYER_FORMATS, ids=str)
def test_blocks_of_16_and_32_in_every_mode(name, params, columns):
    x = layer_like(columns)
    for mode in DETERMINISTIC:
        spec = lowbit.get_format(name)(**params, rounding=mode)
        got = spec._native(x, torch.float32)
        assert got is not None, (name, params, mode)
        assert_bits_equal(got, spec._quantize_for(x, None, torch.float32))
