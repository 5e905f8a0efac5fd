"""MASE-style per-node configs -> RoleFormats: keys, required operands, lowbit additions, clear errors."""

from __future__ import annotations

import pytest

import lowbit
from lowbit import ConfigError
from lowbit.nn import OP_ROLES, RoleFormats, parse_node_config

INTEGER_LINEAR = {
    "name": "integer",
    "data_in_width": 8, "data_in_frac_width": 4,
    "weight_width": 8, "weight_frac_width": 4,
    "bias_width": 8, "bias_frac_width": 4,
}  # fmt: skip


def test_mase_integer_config_builds_one_spec_per_role():
    formats = parse_node_config("linear", INTEGER_LINEAR)
    expected = lowbit.get_format("integer")(width=8, frac_width=4)
    assert formats.data_in == formats.weight == formats.bias == expected
    assert formats.data_out is None and not formats.bypass
    assert formats.precision("weight") == [8, 4] and formats.precision("data_out") == [32]


def test_na_name_leaves_node_in_float_and_role_names_override():
    assert parse_node_config("linear", {"name": "NA"}) is None
    assert parse_node_config("linear", {"name": None}) is None
    mixed = parse_node_config("linear", {"name": "integer", "data_in_width": 8, "weight_name": "ternary",
                                         "weight_scaling_factor": True, "bias_name": "NA", "bias_width": 4})  # fmt: skip
    assert mixed.weight.format_name == "ternary" and mixed.weight.scaling_factor
    assert mixed.bias is None and mixed.data_in.width == 8


def test_relu_input_is_unsigned_for_integer_like_mase_unless_said_otherwise():
    assert parse_node_config("relu", {"name": "integer", "data_in_width": 4}).data_in.signed is False
    assert parse_node_config("relu", {"name": "integer", "data_in_width": 4, "data_in_signed": True}).data_in.signed


def test_floor_maps_to_round_down_and_compat_keys_are_accepted():
    formats = parse_node_config("linear", {**INTEGER_LINEAR, "floor": True})
    assert formats.data_in.rounding == formats.weight.rounding == "down"
    residual = parse_node_config("linear", {"name": "binary_residual", "data_in_levels": 2,
                                            "data_in_residual_sign": True, "weight_binary_training": True})  # fmt: skip
    assert residual.data_in.levels == 2 and residual.weight is not None


def test_bypass_and_plain_dict_round_trip():
    formats = parse_node_config("conv2d", {**INTEGER_LINEAR, "bypass": True, "data_out_width": 6})
    assert formats.bypass and formats.data_out.width == 6
    assert RoleFormats.from_dict(formats.to_dict()) == formats


@pytest.mark.parametrize(
    "op,config,words",
    [
        ("lienar", INTEGER_LINEAR, ["lienar", "linear"]),
        ("linear", {"name": "integer", "data_in_width": 8}, ["missing", "weight", "weight_width"]),
        ("linear", {**INTEGER_LINEAR, "data_in_widht": 8}, ["data_in_widht", "data_in_width"]),
        ("linear", {**INTEGER_LINEAR, "data_in_width": 0}, ["data_in", "width=0"]),
        ("linear", {**INTEGER_LINEAR, "weight_width": 99}, ["weight", "width=99", "[1, 32]"]),
        ("linear", {"name": "intger", "data_in_width": 8}, ["intger", "integer"]),
        ("linear", {"data_in_width": 8}, ["'name'"]),
        ("relu", {"name": "integer", "data_in_width": 8, "weight_width": 8}, ["weight_width", "no 'weight' operand"]),
        ("linear", {**INTEGER_LINEAR, "bypass": "yes"}, ["bypass"]),
        ("linear", {**INTEGER_LINEAR, "weight_name": 3}, ["weight_name"]),
        ("embedding", {"name": "integer", "data_in_width": 8}, ["data_in_width", "embedding"]),
        ("linear", ["name", "integer"], ["table"]),
    ],
)  # fmt: skip
def test_bad_configs_name_the_key(op, config, words):
    with pytest.raises(ConfigError) as error:
        parse_node_config(op, config, "node 'fc1'")
    for word in words:
        assert word in str(error.value)


def test_every_op_has_roles_and_required_roles_are_enforced():
    for op, (required, optional) in OP_ROLES.items():
        config = {"name": "integer", **{f"{role}_width": 8 for role in required}}
        formats = parse_node_config(op, config)
        assert set(formats.active()) == set(required)
        for missing in required:
            partial = {k: v for k, v in config.items() if not k.startswith(missing)}
            with pytest.raises(ConfigError, match=missing):
                parse_node_config(op, partial)
