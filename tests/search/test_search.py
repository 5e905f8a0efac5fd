"""lowbit search: MASE-layout configs run, resuming adds trials, two processes share one study, the front's
files are valid (each front TOML reproduces its trial's accuracy through the quantize pass)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("optuna")

from lowbit.config.toml_config import load_run_config  # noqa: E402
from lowbit.errors import ConfigError  # noqa: E402
from lowbit.graph.module_swap import quantize_module_transform_pass  # noqa: E402
from lowbit.pipeline.catalog import get_split  # noqa: E402
from lowbit.pipeline.passes import PASSES  # noqa: E402
from lowbit.search import run_search  # noqa: E402
from lowbit.search.front import hypervolume_2d, pareto_front  # noqa: E402
from tests.search.configs import DIGITS_PRESETS, DIGITS_ROLES, TOY_MASE, TOY_MASE_STRINGS  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name: str = "search.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_mase_layout_runs_and_front_files_are_valid(tmp_path):
    result = run_search(write(tmp_path, TOY_MASE), tmp_path / "out")
    assert len(result["records"]) == 4
    document = json.loads((tmp_path / "out" / "front.json").read_text())
    numbers = {r["number"] for r in result["records"]}
    assert document["trials"] == 4 and document["front"]
    directions = {"accuracy": "maximize", "average_bitwidth": "minimize"}
    front_numbers = {m["trial"] for m in document["front"]}
    assert front_numbers == {r["number"] for r in pareto_front(result["records"], directions)} and front_numbers <= numbers
    for member in document["front"]:  # no trial dominates a front member
        for record in result["records"]:
            better = (record["metrics"]["accuracy"] >= member["metrics"]["accuracy"]
                      and record["metrics"]["average_bitwidth"] <= member["metrics"]["average_bitwidth"])  # fmt: skip
            assert not better or record["metrics"] == member["metrics"]
    assert sorted(p.name for p in (tmp_path / "out" / "front").iterdir()) == sorted(
        f"trial_{n:05d}.toml" for n in front_numbers)
    assert (tmp_path / "out" / "search.png").read_bytes()[:4] == b"\x89PNG"
    assert set(document["uniform"]) == {"int8", "int4_g32", "mxfp8", "mxfp4", "fp8", "ternary"}


def test_front_toml_reproduces_the_trial_through_the_quantize_pass(tmp_path):
    run_search(write(tmp_path, TOY_MASE), tmp_path / "out")
    member = json.loads((tmp_path / "out" / "front.json").read_text())["front"][0]
    config = load_run_config(tmp_path / "out" / member["config"], PASSES)
    assert config.style == "module" and config.options["model"] == "toy"
    [(_name, pass_args)] = config.passes
    model = _model_of_the_search()
    quantize_module_transform_pass(model, pass_args)
    dataset = get_split("toy_tiny", "validation")
    x = torch.stack([dataset[i][0] for i in range(256)])
    y = torch.stack([torch.as_tensor(dataset[i][1]) for i in range(256)])
    with torch.no_grad():
        accuracy = float((model.eval()(x).argmax(-1) == y).float().mean())
    assert accuracy == pytest.approx(member["metrics"]["accuracy"], abs=1e-9)


def _model_of_the_search(model: str = "toy", dataset: str = "toy_tiny", seed: int = 42) -> torch.nn.Module:
    """The model the search used: the config's seed builds the same (untrained) model."""
    from lowbit.config import merge_options
    from lowbit.pipeline.actions import load_model, prepare

    options = merge_options({"model": model, "dataset": dataset, "seed": seed}, {})
    prepare(options)
    return load_model(options)


def test_same_command_again_adds_n_trials(tmp_path):
    config = write(tmp_path, TOY_MASE_STRINGS)
    first = run_search(config, tmp_path / "out")
    second = run_search(config, tmp_path / "out")
    assert [r["number"] for r in first["records"]] == [0, 1, 2]
    assert [r["number"] for r in second["records"]] == [0, 1, 2, 3, 4, 5]
    assert (tmp_path / "out" / "study.journal").exists()
    assert len(second["front"]) == 1  # one scaled objective still gives a front over the declared metrics


def test_uniform_choice_trials_equal_the_reference_presets_and_cost(tmp_path):
    result = run_search(write(tmp_path, DIGITS_PRESETS), tmp_path / "out", storage=str(tmp_path / "study.db"))
    by_choice = {r["params"]["linear/choice"]: r["metrics"] for r in result["records"]}
    assert set(by_choice) == {"int8", "mxfp4"}  # the grid sampler visits both
    for preset in ("int8", "mxfp4"):
        assert by_choice[preset] == result["uniform"][preset]
    # weights 64x128 + 128x64 + 64x10; mxfp4: 4 bits + one 8-bit scale per 32 -> 4.25
    assert by_choice["mxfp4"]["weight_bits"] == pytest.approx(4.25)
    macs = 100 * (64 * 128 + 128 * 64 + 64 * 10)  # one batch of the 100 samples, cost 1 per MAC
    assert by_choice["int8"]["cost"] == macs
    assert (tmp_path / "study.db").exists()


def test_role_choices_over_format_families_with_regex_and_skip(tmp_path):
    result = run_search(write(tmp_path, DIGITS_ROLES), tmp_path / "out")
    assert len(result["records"]) == 5
    for record in result["records"]:
        assert set(record["plan"]) == {"fc1", "fc2"}  # fc3 skipped, ReLUs outside setup.ops: float
        for layer in ("fc1", "fc2"):
            assert record["plan"][layer]["weight"]["name"] in ("integer", "mxfp4_e2m1", "block_fp", "e4m3")
        assert record["metrics"]["weight_bits"] < 32
    # every front TOML (format families with block sizes, per-role names, float inputs) rebuilds its trial
    dataset = get_split("digits", "validation")
    x, y = dataset.tensors[0][:100], dataset.tensors[1][:100]
    for member in json.loads((tmp_path / "out" / "front.json").read_text())["front"]:
        [(_, pass_args)] = load_run_config(tmp_path / "out" / member["config"], PASSES).passes
        model = _model_of_the_search("digits_mlp", "digits", 0)
        quantize_module_transform_pass(model, pass_args)
        with torch.no_grad():
            logits = model.eval()(x)
        assert int((logits.argmax(-1) == y).sum()) / len(y) == member["metrics"]["accuracy"]
        loss = float(torch.nn.functional.cross_entropy(logits, y, reduction="sum")) / len(y)
        assert loss == pytest.approx(member["metrics"]["loss"], rel=1e-6)  # the same logits, not just the argmax


@pytest.mark.parametrize("storage", ["study.journal", "study.db"])
def test_two_processes_share_one_study_without_lost_or_duplicated_trials(tmp_path, storage):
    config = write(tmp_path, TOY_MASE_STRINGS)
    code = ("import sys; from lowbit.search import run_search; "
            "run_search(sys.argv[1], sys.argv[2], n_trials=3, storage=sys.argv[3], worker=int(sys.argv[4]))")  # fmt: skip
    processes = [subprocess.Popen([sys.executable, "-W", "ignore", "-c", code, str(config), str(tmp_path / "out"),
                                   str(tmp_path / storage), str(worker)], cwd=ROOT) for worker in (0, 1)]  # fmt: skip
    assert [p.wait(timeout=240) for p in processes] == [0, 0]
    result = run_search(config, tmp_path / "out", storage=str(tmp_path / storage), only_outputs=True)
    numbers = [r["number"] for r in result["records"]]
    assert sorted(numbers) == list(range(6))
    assert len(result["study"].trials) == 6


def test_config_errors_are_config_errors(tmp_path):
    bad_metric = TOY_MASE.replace("accuracy.scale", "acuracy.scale").replace("accuracy.direction", "acuracy.direction")
    with pytest.raises(ConfigError, match="did you mean 'accuracy'"):
        run_search(write(tmp_path, bad_metric), tmp_path / "out")
    with pytest.raises(ConfigError, match="optuna only"):  # MASE's rl strategy, with its own keys
        run_search(write(tmp_path, TOY_MASE.replace('name = "optuna"', 'name = "rl"\nalgorithm = "ppo"'), "r.toml"))
    bad_format = DIGITS_ROLES.replace('"e4m3"]', '"e4m4"]')
    with pytest.raises(ConfigError):
        run_search(write(tmp_path, bad_format, "b.toml"), tmp_path / "out")
    completed = subprocess.run([sys.executable, "-m", "lowbit", "search", "--config",
                                str(write(tmp_path, TOY_MASE.replace('"tpe"', '"cmaes"'), "c.toml"))],
                               check=False, capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert completed.returncode == 2 and "sampler" in completed.stderr


def test_hypervolume_2d():
    # maximize x, minimize y, reference (0, 10): boxes 1x(10-2) and (2-1)x(2-1)... union area
    assert hypervolume_2d([(1.0, 2.0), (2.0, 5.0)], (0.0, 10.0)) == pytest.approx(2 * 5 + 1 * 3)
    assert hypervolume_2d([(1.0, 11.0)], (0.0, 10.0)) == 0.0
    assert math.isclose(hypervolume_2d([(1.0, 2.0), (0.5, 3.0)], (0.0, 10.0)), 8.0)


def test_cli_search_with_two_workers(tmp_path):
    config = write(tmp_path, TOY_MASE_STRINGS)
    completed = subprocess.run([sys.executable, "-W", "ignore", "-m", "lowbit", "search", "--config", str(config),
                                "--save-dir", str(tmp_path / "out"), "--n-trials", "2", "--workers", "2"],
                               check=False, capture_output=True, text=True, cwd=ROOT, timeout=300)  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    assert "trials in study: 4 (this run added 4" in completed.stdout
    sentence = json.loads((tmp_path / "out" / "front.json").read_text())["comparison"]["sentence"]
    assert f"against the uniform presets: {sentence}\n" in completed.stdout
    trials = json.loads((tmp_path / "out" / "trials.json").read_text())
    assert sorted(t["number"] for t in trials) == [0, 1, 2, 3]
    page = (tmp_path / "out" / "search.html").read_text()
    assert "data:image/png;base64," in page and "Pareto front" in page and "int4_g32" in page


def test_latency_cost_uses_the_real_kernel_where_one_computes_the_formats(tmp_path):
    config = DIGITS_PRESETS.replace('choices = ["int8", "mxfp4"]', 'choices = ["int8", "int4_g32", "mxfp4"]')
    config = config.replace('cost.direction = "minimize"', 'latency_ms.direction = "minimize"')
    config = config.replace("n_trials = 2", "n_trials = 3")
    result = run_search(write(tmp_path, config), tmp_path / "out")
    by_choice = {r["params"]["linear/choice"]: r["metrics"] for r in result["records"]}
    # int8 (dynamic) and int4 g32 (weight-only) have real kernels for all three Linear layers; mxfp4 runs float
    assert {name: metrics["real_layers"] for name, metrics in by_choice.items()} == {"int8": 3, "int4_g32": 3, "mxfp4": 0}
    assert all(metrics["latency_ms"] > 0 for metrics in by_choice.values())


def test_shared_regex_decision_gives_its_layers_one_format(tmp_path):
    from tests.search.configs import DIGITS_SHARED

    result = run_search(write(tmp_path, DIGITS_SHARED), tmp_path / "out")
    for record in result["records"]:
        assert set(record["params"]) == {"fc[12]/weight", "fc[12]/data_in"}  # one decision, not one per layer
        assert record["plan"]["fc1"] == record["plan"]["fc2"] and set(record["plan"]) == {"fc1", "fc2"}


def test_cli_load_reaches_the_front_tomls(tmp_path):
    from lowbit.models import DigitsMLP

    torch.manual_seed(7)
    torch.save(DigitsMLP().state_dict(), tmp_path / "mlp.pt")
    config = write(tmp_path, DIGITS_PRESETS.replace("n_trials = 2", "n_trials = 1"))
    completed = subprocess.run([sys.executable, "-W", "ignore", "-m", "lowbit", "-q", "search", "--config", str(config),
                                "--save-dir", str(tmp_path / "out"), "--load", str(tmp_path / "mlp.pt"), "--load-type",
                                "pt"], check=False, capture_output=True, text=True, cwd=ROOT, timeout=300)  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    for path in (tmp_path / "out" / "front").iterdir():
        options = load_run_config(path, PASSES).options
        assert options["load"] == str((tmp_path / "mlp.pt").resolve()) and options["load_type"] == "pt"
