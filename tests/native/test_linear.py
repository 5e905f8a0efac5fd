"""The native int8 weight-only Linear (lowbit.native.linear): float32 arithmetic within float32 rounding of the
dequantized reference, chosen automatically up to NATIVE_MAX_ROWS rows once loaded, refused clearly when it
cannot run."""

from __future__ import annotations

import pytest
import torch

from lowbit import backend
from lowbit.errors import ConfigError
from lowbit.native import build, kernels, linear
from lowbit.ops import Int8WeightOnlyLinear, capabilities, routes

needs_compiler = pytest.mark.skipif(build.compiler() is None, reason="no C compiler on this machine")


def module(inner: int, outer: int, bias: bool = True, seed: int = 0) -> Int8WeightOnlyLinear:
    torch.manual_seed(seed)
    return Int8WeightOnlyLinear.from_float(torch.nn.Linear(inner, outer, bias=bias))


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).abs().max() / want.double().abs().max())


@needs_compiler
@pytest.mark.parametrize("rows,inner,outer", [(1, 64, 48), (5, 37, 19), (16, 1024, 64), (64, 200, 130), (300, 96, 40)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("threaded", [False, True])
def test_native_kernel_is_within_float32_rounding_of_the_reference(rows, inner, outer, bias, threaded):
    assert build.ensure() is not None, build.error()
    layer = module(inner, outer, bias)
    x = torch.randn(rows, inner) * 3
    exact = x.double() @ layer.dequantized_weight().double().t() + (layer.bias.double() if bias else 0)
    with kernels.threads_from(1 << 8 if threaded else 0):  # threaded: column chunks of any parity
        got = linear.int8_linear(x, layer.weight_codes, layer.weight_scale, layer.bias)
    assert got is not None and got.dtype == torch.float32 and got.shape == (rows, outer)
    # float32 sums of `inner` products: a few ulps of the largest partial sum per step
    assert relative_error(got, exact) < 4 * inner * 2.0**-24
    assert relative_error(got, layer.forward_reference(x)) < 4 * inner * 2.0**-24


@needs_compiler
def test_auto_takes_the_native_kernel_for_up_to_native_max_rows_only_when_loaded(monkeypatch):
    assert build.ensure() is not None
    layer = module(96, 40)
    small, large = torch.randn(routes.NATIVE_MAX_ROWS, 96), torch.randn(routes.NATIVE_MAX_ROWS + 1, 96)
    few = small[: routes.NATIVE_FEW_ROWS]
    many_rows = "native" if capabilities.probe("native_linear_rows_fast") else "dequantize"  # measured here
    try:
        backend.set_backend("auto")
        assert layer.choose_path(few) == "native" and layer.choose_path(large) == "dequantize"
        assert layer.choose_path(small) == many_rows
        assert layer.choose_path(small.bfloat16()) != "native"  # bfloat16 models compute in bfloat16
        got = layer(small.reshape(8, -1, 96))  # any leading shape
        assert relative_error(got.reshape(-1, 40), layer.forward_reference(small)) < 1e-5
        backend.set_backend("eager")
        assert layer.choose_path(few) == "dequantize"
        backend.set_backend("auto")
        monkeypatch.setenv("LOWBIT_NATIVE", "0")
        assert layer.choose_path(few) == "dequantize"
    finally:
        backend.set_backend("eager")


def test_sizes_or_dtypes_the_kernel_does_not_take_are_refused_not_read():
    layer = module(32, 16)
    x = torch.randn(4, 32)
    assert linear.int8_linear(x, layer.weight_codes, layer.weight_scale[:8], layer.bias) is None
    assert linear.int8_linear(x, layer.weight_codes, layer.weight_scale, layer.bias[:8]) is None
    assert linear.int8_linear(x.double(), layer.weight_codes, layer.weight_scale, layer.bias) is None
    assert linear.int8_linear(torch.randn(32, 4).t(), layer.weight_codes, layer.weight_scale, None) is None
    assert linear.int8_linear(torch.randn(4, 31), layer.weight_codes, layer.weight_scale, None) is None


def test_a_forced_native_path_without_a_library_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.setenv("LOWBIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "/nonexistent/cc")
    build.reset()
    try:
        layer = module(32, 16)
        layer.path = "native"
        with pytest.raises(ConfigError, match="native kernels are not available .*no C compiler"):
            layer(torch.randn(4, 32))
    finally:
        build.reset()


@needs_compiler
@pytest.mark.parametrize("group,scale_dtype", [(32, "bf16"), (128, "f16"), (2, "f32")])
@pytest.mark.parametrize("bias", [True, False])
def test_native_int4_kernel_is_within_float32_rounding_of_the_reference(group, scale_dtype, bias):
    from lowbit.ops import Int4WeightOnlyLinear

    assert build.ensure() is not None
    torch.manual_seed(1)
    layer = Int4WeightOnlyLinear.from_float(torch.nn.Linear(256, 47, bias=bias), group_size=group, scale_dtype=scale_dtype)
    x = torch.randn(13, 256)  # a row tail after tiles of 4, an odd column after pairs
    exact = x.double() @ layer.dequantized_weight().double().t() + (layer.bias.double() if bias else 0)
    layer.path = "native"
    got = layer(x)
    with kernels.threads_from(1 << 8):
        assert torch.equal(layer(x), got)  # column chunks on several threads: the same sums
    assert relative_error(got, exact) < 4 * 256 * 2.0**-24
    try:
        backend.set_backend("auto")
        assert layer.choose_path(x[: routes.NATIVE_FEW_ROWS]) == "native"
    finally:
        backend.set_backend("eager")


@needs_compiler
@pytest.mark.parametrize("group", [32, 64, 128, 2, 6])  # 2 and 6: no whole vector per group, the widened path
@pytest.mark.parametrize("outer", [48, 47])  # an odd last weight row after pairs
@pytest.mark.parametrize("bias", [True, False])
def test_int4_few_rows_are_within_rounding_and_each_row_is_its_own(group, outer, bias):
    """One to four input rows run the register kernel (linear_few.c): every row within float32 rounding of the
    float64 product with the reference's dequantized weight, and the same bits whether it ran alone or in a tile
    of two or four (decoding a token never depends on what shares its batch)."""
    from lowbit.ops import Int4WeightOnlyLinear

    assert build.ensure() is not None
    torch.manual_seed(2)
    inner = 384
    layer = Int4WeightOnlyLinear.from_float(torch.nn.Linear(inner, outer, bias=bias), group_size=group,
                                            scale_dtype="f32", search=False)  # fmt: skip
    scale = layer.weight_scale.float().contiguous()
    x = torch.randn(4, inner) * 2
    exact = x.double() @ layer.dequantized_weight().double().t() + (layer.bias.double() if bias else 0)
    alone = torch.cat([linear.int4_linear(x[i : i + 1], layer.weight_codes, layer.weight_zero_point, scale,
                                          layer.bias, group) for i in range(4)])  # fmt: skip
    for rows in (2, 3, 4):
        got = linear.int4_linear(x[:rows], layer.weight_codes, layer.weight_zero_point, scale, layer.bias, group)
        assert torch.equal(got, alone[:rows])
    with kernels.threads_from(1 << 8):  # column chunks of any parity on several threads: the same sums
        threaded = linear.int4_linear(x, layer.weight_codes, layer.weight_zero_point, scale, layer.bias, group)
    assert torch.equal(threaded, alone)
    assert relative_error(alone, exact) < 4 * inner * 2.0**-24


@needs_compiler
@pytest.mark.parametrize("inner", [384, 391])  # 391: a scalar tail after whole vectors
def test_int8_few_rows_are_within_rounding_and_each_row_is_its_own(inner):
    assert build.ensure() is not None
    layer = module(inner, 33, seed=3)
    x = torch.randn(4, inner) * 3
    exact = x.double() @ layer.dequantized_weight().double().t() + layer.bias.double()
    alone = torch.cat([linear.int8_linear(x[i : i + 1], layer.weight_codes, layer.weight_scale, layer.bias)
                       for i in range(4)])  # fmt: skip
    for rows in (2, 3, 4):
        assert torch.equal(linear.int8_linear(x[:rows], layer.weight_codes, layer.weight_scale, layer.bias),
                           alone[:rows])  # fmt: skip
    assert relative_error(alone, exact) < 4 * inner * 2.0**-24


@needs_compiler
@pytest.mark.parametrize("ggml_type", ["q4_0", "q4_1", "q5_0", "q8_0", "q4_k", "q6_k"])
@pytest.mark.parametrize("outer", [48, 47])
def test_ggml_native_weights_are_ggmls_bit_for_bit_and_sums_within_rounding(ggml_type, outer):
    """Rows of the identity pick single weights out (every other product is an exact zero), so the kernels'
    weights must be the reference's bits (Q4_1 / Q4_K: d * q + m rounded twice, never fused) on both the register
    path (up to four rows) and the widening one; random rows: within float32 rounding of the float64 sum, the
    same bits alone as in a tile."""
    from lowbit.ops import GGMLLinear

    assert build.ensure() is not None
    torch.manual_seed(4)
    inner = 256
    layer = GGMLLinear.from_float(torch.nn.Linear(inner, outer, bias=False), ggml_type)
    layer.path = "native"
    weight = layer.dequantize_weight()
    assert layer.run_native(torch.randn(1, inner)) is not None and layer.run_native(torch.randn(5, inner)) is not None
    identity = torch.eye(inner)
    for start in range(0, inner, 37):
        for rows in (1, 4, 37):
            picked = identity[start : start + rows]
            assert torch.equal(layer(picked), weight.t()[start : start + rows]), (start, rows)
    x = torch.randn(6, inner) * 2
    exact = x.double() @ weight.double().t()
    alone = torch.cat([layer(x[i : i + 1]) for i in range(6)])
    assert torch.equal(layer(x[:4]), alone[:4])
    assert relative_error(alone, exact) < 4 * inner * 2.0**-24
    assert relative_error(layer(x), exact) < 4 * inner * 2.0**-24  # six rows: the widening kernel


def _weight_only_modules():
    from lowbit.ops import GGMLLinear, Int4WeightOnlyLinear

    torch.manual_seed(5)
    linear_layer = torch.nn.Linear(256, 37)
    yield "int8", Int8WeightOnlyLinear.from_float(linear_layer)
    for group, scale_dtype in ((32, "bf16"), (64, "f16"), (2, "f32"), (256, "f32")):
        yield f"int4 g{group}", Int4WeightOnlyLinear.from_float(linear_layer, group_size=group, scale_dtype=scale_dtype)
    for ggml_type in ("q4_0", "q4_1", "q5_0", "q8_0", "q4_k", "q6_k"):
        yield ggml_type, GGMLLinear.from_float(linear_layer, ggml_type)


@needs_compiler
def test_native_weight_rows_are_the_reference_weight_bit_for_bit():
    """The dequantize route's rebuilt rows (csrc/weight_rows.c) are dequantized_weight's bits, whole and in row
    blocks, threaded or not; the route then gives the same result as with torch's rebuild."""
    assert build.ensure() is not None
    x = torch.randn(40, 256)
    for label, layer in _weight_only_modules():
        reference = layer.dequantized_weight()
        whole = layer.native_weight_rows(0, layer.out_features)
        assert whole is not None and torch.equal(whole, reference), label
        assert torch.equal(layer.native_weight_rows(5, 23), reference[5:23]), label
        with kernels.threads_from(1 << 8):
            assert torch.equal(layer.native_weight_rows(0, layer.out_features), reference), label
        layer.path = "dequantize"
        try:
            backend.set_backend("auto")
            native_route = layer(x)
        finally:
            backend.set_backend("eager")
        assert torch.equal(native_route, layer(x)), label  # eager: torch's rebuild, the same weight


def test_native_weight_rows_refuse_what_they_do_not_take():
    codes = torch.zeros(4, 16, dtype=torch.uint8)
    scale = torch.ones(4, 1)
    assert linear.weight_rows("int4_zero", codes, scale, group=32) is None  # no zero points
    zero_point = torch.zeros(4, 1, dtype=torch.uint8)
    assert linear.weight_rows("int4_zero", codes, scale[:2], zero_point=zero_point, group=32) is None
    assert linear.weight_rows("int4_zero", codes, scale, zero_point=zero_point, group=31) is None
    assert linear.weight_rows("int8_channel", codes, scale.squeeze(1)) is None  # uint8 codes: not int8
    assert linear.weight_rows("bogus", codes, scale) is None
