"""The plan (lowbit.graph.plan): each entry builds what it says, apply is all or nothing, and it is the one
place above nn/ and ops/ that builds or swaps a quantized module."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from lowbit.errors import ConfigError
from lowbit.formats import resolve
from lowbit.graph.plan import MakeReal, Ready, Real, Simulated, Transform, apply, build, place
from lowbit.nn.modules import QuantConv2d, QuantLinear
from lowbit.nn.roles import RoleFormats
from lowbit.ops import Int4WeightOnlyLinear, Int8Conv2d

SOURCE = Path(__file__).resolve().parents[2] / "src" / "lowbit"
INT8 = RoleFormats(data_in=resolve("affine", bits=8),
                   weight=resolve("affine", bits=8, symmetric=True, axis=0))  # fmt: skip


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Sequential(nn.Linear(32, 16)), nn.Conv2d(3, 4, 3))


def test_a_simulated_entry_is_the_op_module_from_float():
    model, formats = _model(), RoleFormats(weight=resolve("integer", width=6, frac_width=4))
    expected = QuantLinear.from_float(model[0], formats)
    applied = apply(model, {"0": Simulated(formats), "2.0": Simulated(formats, "linear"), "3": Simulated(formats)})
    assert applied.placed == {"0": "QuantLinear", "2.0": "QuantLinear", "3": "QuantConv2d"}
    assert isinstance(model[3], QuantConv2d) and model[0].formats == formats
    x = torch.randn(5, 64)
    assert torch.equal(model[0](x), expected(x))


def test_real_entries_by_formats_and_by_class():
    model = _model()
    x, image = torch.randn(7, 64), torch.randn(2, 3, 8, 8)
    twin = QuantLinear.from_float(model[0], INT8)
    conv_options = {"activation": "static", "channels_last": False, "input_qparams": (0.05, 0)}
    int4_options = {"group_size": 32, "scale_dtype": "f32"}
    applied = apply(model, {"0": Real(formats=INT8), "3": Real(module="Int8Conv2d", options=conv_options),
                            "2.0": Real(module="Int4WeightOnlyLinear", options=int4_options, record={"method": "t"})})
    assert applied.placed == {"0": "Int8DynamicLinear", "3": "Int8Conv2d", "2.0": "Int4WeightOnlyLinear"}
    assert torch.allclose(model[0](x), twin(x), atol=5e-4)  # the integer GEMM sums in another order
    assert isinstance(model[3], Int8Conv2d) and float(model[3].input_scale) == pytest.approx(0.05)
    assert isinstance(model[2][0], Int4WeightOnlyLinear) and model[2][0].algorithm == {"method": "t"}
    assert model[3](image).shape == (2, 4, 6, 6)


def test_make_real_converts_where_a_kernel_computes_and_keeps_the_rest_with_the_reason():
    model = _model()
    apply(model, {"0": Simulated(INT8), "2.0": Simulated(RoleFormats(weight=resolve("binary")))})
    applied = apply(model, {"0": MakeReal(), "2.0": MakeReal()})
    assert applied.placed == {"0": "Int8DynamicLinear"}
    assert list(applied.kept) == ["2.0"] and applied.kept["2.0"]
    assert isinstance(model[2][0], QuantLinear)


def test_apply_is_all_or_nothing():
    model = _model()
    before = {name: type(module) for name, module in model.named_modules()}
    with pytest.raises(ConfigError, match="no real kernel"):
        apply(model, {"0": Simulated(INT8), "2.0": Real(formats=RoleFormats(weight=resolve("binary")))})
    assert {name: type(module) for name, module in model.named_modules()} == before


def test_ready_entries_put_a_module_back_and_build_leaves_the_layer_alone():
    model = _model()
    original = model[0]
    built = build(original, Simulated(INT8))
    assert isinstance(built, QuantLinear) and model[0] is original
    apply(model, {"0": Ready(built)})
    assert model[0] is built
    apply(model, {"0": Ready(original)})
    assert model[0] is original


def test_transforms_run_first_and_say_what_they_did():
    model, formats = _model(), RoleFormats(weight=resolve("integer", width=8, frac_width=6))
    doubled = model[0].weight.detach() * 2

    def double_first_layer(root):
        with torch.no_grad():
            root[0].weight.mul_(2)
        return {"factor": 2}

    # the Simulated entry comes first in the plan, yet it is built from the transformed weight
    applied = apply(model, {"0": Simulated(formats), "": Transform(double_first_layer),
                            "2": Transform(lambda block: {"block": type(block).__name__})})  # fmt: skip
    assert applied.transformed == {"": {"factor": 2}, "2": {"block": "Sequential"}}
    assert isinstance(model[0], QuantLinear) and torch.equal(model[0].weight, doubled)
    with pytest.raises(ConfigError, match="builds none"):
        build(model[0], Transform(double_first_layer))


@pytest.mark.parametrize("entry, message", [
    (lambda: Real(), "either formats or a real module"),
    (lambda: Real(formats=INT8, module="Int8Conv2d"), "either formats or a real module"),
    (lambda: build(nn.Linear(4, 4), Real(module="NoSuchLinear")), "unknown real module"),
    (lambda: build(nn.Linear(4, 4), Simulated(INT8, "no_such_op")), "no quantized module for op"),
    (lambda: build(nn.LSTM(4, 4), Simulated(INT8)), "no quantized counterpart"),
    (lambda: place(nn.Sequential(nn.Linear(2, 2)), "", nn.Linear(2, 2)), "root itself"),
])  # fmt: skip
def test_bad_entries_are_one_clear_error(entry, message):
    with pytest.raises(ConfigError, match=message):
        entry()


def test_only_the_plan_builds_or_swaps_quantized_modules_above_nn_and_ops():
    """Issue 42's count: files outside nn/ and ops/ that build a module by ``from_float`` or swap one in."""
    pattern = re.compile(r"\.from_float\(|replace_module\(|\bsetattr\(parent, child")
    found = sorted(str(path.relative_to(SOURCE)) for path in SOURCE.rglob("*.py")
                   if path.parts[len(SOURCE.parts)] not in ("nn", "ops")
                   and any(pattern.search(line) for line in path.read_text().splitlines()
                           if not line.lstrip().startswith(("#", "``", "-", "*"))))  # fmt: skip
    assert found == ["graph/plan.py"]
