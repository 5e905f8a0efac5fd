"""`lowbit train` with a [low_precision_optimizer] table: the optimizer keeps its weights (and state) in the
given formats, so every trained weight in the checkpoints lies on the format's grid; bad tables are
ConfigErrors before training."""

from __future__ import annotations

import pytest
import torch

from lowbit.config.toml_config import parse_run_config
from lowbit.errors import ConfigError
from lowbit.train.optimizer_state import check_low_precision, wrap_optimizer

FRAC_WIDTH, WIDTH = 6, 8  # weights on 2^-6, codes -128..127

CONFIG = f"""
model = "toy"
dataset = "toy_tiny"
max_epochs = 1
accelerator = "cpu"
training_optimizer = "sgd"
learning_rate = 0.05

[low_precision_optimizer]
weight = {{name = "integer", width = {WIDTH}, frac_width = {FRAC_WIDTH}}}
grad = "e5m2"
momentum = {{name = "block_fp", width = 8, exponent_width = 8}}
stochastic = true
seed = 3
"""


def _on_grid(tensor: torch.Tensor) -> bool:
    codes = tensor.double() * 2**FRAC_WIDTH
    return bool((codes == codes.round()).all() and codes.min() >= -(2 ** (WIDTH - 1)) and codes.max() <= 2 ** (WIDTH - 1) - 1)


def test_train_keeps_weights_on_the_format_grid(lowbit_cli, tmp_path):
    config = tmp_path / "train.toml"
    config.write_text(CONFIG)
    status, out, err = lowbit_cli("train", "--config", str(config), "--project", "lp")
    assert status == 0, err
    checkpoints = lowbit_cli.software("lp") / "training_ckpts"
    for name in ("best.ckpt", "last.ckpt"):
        checkpoint = torch.load(checkpoints / name, map_location="cpu", weights_only=False)
        weights = {k: v for k, v in checkpoint["state_dict"].items() if v.is_floating_point()}
        assert weights and all(_on_grid(v) for v in weights.values()), name
        # the run trained: SGD momentum buffers exist and the state dict round-trips through the wrapper
        momentum = [s["momentum_buffer"] for s in checkpoint["optimizer_states"][0]["state"].values()]
        assert momentum and any(m.abs().sum() > 0 for m in momentum)


def test_float_training_is_off_the_grid(lowbit_cli, tmp_path):
    """The oracle's control: without the table, trained weights leave the 2^-6 grid."""
    config = tmp_path / "float.toml"
    config.write_text(CONFIG.split("[low_precision_optimizer]")[0])
    status, _, err = lowbit_cli("train", "--config", str(config), "--project", "float")
    assert status == 0, err
    checkpoint = torch.load(lowbit_cli.software("float") / "training_ckpts" / "last.ckpt", weights_only=False)
    assert not all(_on_grid(v) for v in checkpoint["state_dict"].values() if v.is_floating_point())


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"weight": "e5m2", "wieght": "e5m2"}, "did you mean"),
        ({"stochastic": True}, "names no format"),
        ({"weight": 8}, "format name or a table"),
        ({"weight": "e5m2", "stochastic": "yes"}, "true or false"),
        ({"weight": "e5m2", "seed": 1.5}, "integer"),
    ],
)
def test_bad_tables_are_config_errors(table, message):
    with pytest.raises(ConfigError, match=message):
        parse_run_config({"low_precision_optimizer": table}, [])


def test_bad_formats_fail_before_training():
    with pytest.raises(ConfigError, match="momentum"):
        check_low_precision({"momentum": "no_such_format"})
    with pytest.raises(ConfigError, match="weight"):
        check_low_precision({"weight": {"name": "integer", "width": 0}})


def test_wrap_optimizer_rounds_the_weights_and_leaves_none_alone():
    parameter = torch.nn.Parameter(torch.tensor([0.3, -0.71]))
    inner = torch.optim.SGD([parameter], lr=0.1)
    assert wrap_optimizer(inner, None) is inner
    wrapped = wrap_optimizer(inner, {"weight": {"name": "integer", "width": 8, "frac_width": 2}})
    assert parameter.detach().tolist() == [0.25, -0.75]  # rounded once when wrapped
    parameter.grad = torch.tensor([-1.0, 1.0])
    wrapped.step()  # a step of 0.1 is under half the 0.25 grid step: lost under nearest rounding
    assert parameter.detach().tolist() == [0.25, -0.75]
    parameter.grad = torch.tensor([-3.0, 3.0])
    wrapped.step()  # 0.55 -> 0.5, -1.05 -> -1.0
    assert parameter.detach().tolist() == [0.5, -1.0]
