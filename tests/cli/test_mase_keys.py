"""MASE's command-line keys in configs and on the command line: mapped to lowbit options or refused with the
reason; a MASE config's [search] tables are skipped with a warning."""

from __future__ import annotations

from pathlib import Path

import pytest

from lowbit import ConfigError
from lowbit.cli.parser import build_parser
from lowbit.config.options import merge_options
from lowbit.config.toml_config import load_run_config, parse_run_config
from lowbit.nn.config import ConfigWarning
from lowbit.pipeline.passes import PASSES

FIXTURE = Path(__file__).parents[1] / "mase" / "fixtures" / "trainer_keys.toml"


def test_mase_trainer_keys_in_a_config_map_to_options():
    with pytest.warns(ConfigWarning, match=r"\[search\] ignored"):
        config = load_run_config(FIXTURE, PASSES)
    assert config.options == {"model": "toy", "dataset": "toy_tiny", "devices": "1", "log_every_n_steps": 5,
                              "accumulate_grad_batches": 2, "trainer_precision": "32", "t_max": 7, "eta_min": 1e-6,
                              "accelerator": "cpu"}  # fmt: skip
    assert [name for name, _ in config.passes] == ["quantize"]


def test_defaults_keep_lowbit_training_unchanged():
    values = merge_options({}, {}).values
    assert (values["log_every_n_steps"], values["accumulate_grad_batches"], values["trainer_precision"]) == (1, 1, "32")
    assert values["t_max"] is None and values["eta_min"] == 0.0


def test_num_devices_flag_and_precedence():
    args = build_parser().parse_args(["train", "toy", "toy_tiny", "--num-devices", "2", "--log-every-n-steps", "3",
                                      "--trainer-precision", "bf16-mixed", "--t-max", "4", "--eta-min", "0.01"])  # fmt: skip
    assert (args.devices, args.log_every_n_steps, args.trainer_precision, args.t_max, args.eta_min) == (
        "2", 3, "bf16-mixed", 4, 0.01)
    merged = merge_options({"devices": "1", "t_max": 9}, {"devices": "2"})
    assert merged["devices"] == "2" and merged.source("devices") == "command line" and merged["t_max"] == 9


@pytest.mark.parametrize("key, value, words", [
    ("max_token_len", 512, ["max_token_len", "not supported", "128 tokens"]),
    ("is_pretrained", True, ["is_pretrained", "not supported"]),
    ("report_to", "wandb", ["report_to", "CSV"]),
    ("trainer_precision", "16", ["trainer_precision", "not one of"]),
    ("log_every_n_steps", 0, ["log_every_n_steps", "at least 1"]),
    ("num_devices", 0, ["devices must be a positive count"]),
    ("log_evry_n_steps", 5, ["did you mean 'log_every_n_steps'"]),
])  # fmt: skip
def test_mase_keys_without_a_meaning_are_refused_with_the_reason(key, value, words):
    with pytest.raises(ConfigError) as error:
        parse_run_config({"model": "toy", key: value}, PASSES)
    for word in words:
        assert word in str(error.value)


def test_schedule_and_trainer_arguments_reach_lightning():
    pytest.importorskip("lightning")
    import torch

    from lowbit.train.lightning_module import ClassifierModule

    module = ClassifierModule(torch.nn.Linear(2, 2), learning_rate=0.1, max_epochs=5, t_max=3, eta_min=0.01)
    schedule = module.configure_optimizers()["lr_scheduler"]
    assert (schedule.T_max, schedule.eta_min) == (3, 0.01)
    default = ClassifierModule(torch.nn.Linear(2, 2), max_epochs=5).configure_optimizers()["lr_scheduler"]
    assert (default.T_max, default.eta_min) == (5, 0.0)
