"""``[passes.quantize_model]`` through the command line: every real recipe (GPTQ and w8a8_static calibrated
from the run's dataset) and a simulated format, saved by ``lowbit transform``, reloaded by ``--load`` with the
same modules and bit-identical outputs, and tested against the float model's accuracy."""

from __future__ import annotations

import json

import pytest
import torch

from lowbit.cli import main
from lowbit.models import DigitsMLP
from lowbit.pipeline.checkpoints import load_lowbit

HEAD = 'model = "digits_mlp"\ndataset = "digits"\nbatch_size = 64\n'
QUIET = ["--no-progress", "--print-config", "false"]
CASES = {  # recipe table -> (class of fc1 after the pass, largest accuracy drop vs fp32 in points)
    'recipe = "int8_dynamic"': ("Int8DynamicLinear", 1.5),
    'recipe = "int8_weight_only"': ("Int8WeightOnlyLinear", 1.5),
    'recipe = "int4_weight_only"\ngroup_size = 32': ("Int4WeightOnlyLinear", 6.0),
    'recipe = "int4_weight_only"\nmethod = "gptq"\nnum_batches = 4\ngroup_size = 32': ("Int4WeightOnlyLinear", 6.0),
    'recipe = "w8a8_static"\nnum_batches = 4': ("W8A8StaticLinear", 2.0),
    'recipe = "mxfp4_e2m1"': ("QuantLinear", 10.0),
    'recipe = "block_fp"\nparams = {width = 6}\nroles = ["data_in", "weight"]': ("QuantLinear", 10.0),
    # weights alone, GPTQ-rounded from the run's dataset: what Python's roles=["weight"] does (issue 44)
    'recipe = "mxfp4_e2m1"\nroles = ["weight"]\nmethod = "gptq"\nnum_batches = 4': ("QuantLinear", 6.0),
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A DigitsMLP trained for a few seconds with plain torch, its pt checkpoint and its fp32 test accuracy."""
    from lowbit.datasets import get_dataset

    torch.manual_seed(0)
    model = DigitsMLP()
    x, y = get_dataset("digits", "train").tensors
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    root = tmp_path_factory.mktemp("qm")
    torch.save(model.state_dict(), root / "digits.pt")
    tx, ty = get_dataset("digits", "test").tensors
    with torch.no_grad():
        accuracy = float((model(tx).argmax(1) == ty).float().mean())
    assert accuracy > 0.9
    return root, accuracy


def _transform_and_test(root, table: str, project: str) -> tuple[dict, dict]:
    config = root / f"{project}.toml"
    config.write_text(HEAD + "[passes.quantize_model]\n" + table + "\n")
    common = ["--project-dir", str(root), "--project", project, *QUIET]
    assert main(["transform", "--config", str(config), "--load", str(root / "digits.pt"), *common]) == 0
    folder = root / project / "software" / "transform" / "transformed_ckpt"
    assert main(["test", "digits_mlp", "digits", "--load", str(folder), *common]) == 0
    doc = json.loads((folder / "module.json").read_text())
    metrics = json.loads((root / project / "software" / "test" / "metrics.json").read_text())
    return doc, metrics


@pytest.mark.parametrize("table", list(CASES))
def test_recipe_transform_save_reload_test(trained, table):
    root, fp32 = trained
    project = "p" + str(list(CASES).index(table))
    doc, metrics = _transform_and_test(root, table, project)
    assert doc["version"] == 2 and doc["quantize_model"]["recipe"] in table
    assert "calibration_data" not in doc["quantize_model"]
    cls, allowed_drop = CASES[table]
    reloaded = load_lowbit(root / project / "software" / "transform" / "transformed_ckpt")
    assert type(reloaded.fc1).__name__ == cls and type(reloaded.fc3).__name__ == cls
    if "block_fp" in table:  # the format's parameters and roles came back with it
        assert reloaded.fc1.formats.weight.width == 6 and reloaded.fc1.formats.bias is None
    assert metrics["samples"] == 270
    assert metrics["accuracy"] >= fp32 - allowed_drop / 100


def test_reloaded_model_equals_the_transformed_one(trained, capsys):
    from lowbit.config import merge_options
    from lowbit.config.toml_config import parse_run_config
    from lowbit.pipeline.actions import prepare, transform
    from lowbit.pipeline.passes import PASSES

    root, _ = trained
    config = parse_run_config({"model": "digits_mlp", "dataset": "digits", "passes": {"quantize_model": {
        "recipe": "int4_weight_only", "method": "gptq", "num_batches": 2}}}, PASSES)  # fmt: skip
    options = merge_options(config.options, {"load": str(root / "digits.pt"), "project_dir": str(root),
                                              "project": "same", "progress": False})  # fmt: skip
    prepare(options)
    result = transform(options, config)
    reloaded = load_lowbit(root / "same" / "software" / "transform" / "transformed_ckpt")
    x = torch.randn(16, 1, 8, 8)
    with torch.no_grad():
        assert torch.equal(result["model"](x), reloaded(x))
    for name, value in result["model"].state_dict().items():
        assert torch.equal(value, reloaded.state_dict()[name]), name


def test_gptq_announces_its_wait(trained, capsys):
    root, _ = trained
    config = root / "g.toml"
    config.write_text(HEAD + '[passes.quantize_model]\nrecipe = "int4_weight_only"\nmethod = "gptq"\nnum_batches = 2\n')
    argv = ["transform", "--config", str(config), "--load", str(root / "digits.pt"), "--project-dir", str(root), *QUIET]
    capsys.readouterr()
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "lowbit: quantize_model: int4_weight_only (GPTQ) ..." in err
    assert "int4_weight_only (GPTQ): done in" in err
    assert main([*argv, "-q"]) == 0
    assert capsys.readouterr().err == ""  # -q: nothing but warnings and errors


@pytest.mark.parametrize("table, expected", [
    ("", "needs recipe"),
    ('recipe = "int9"', "unknown recipe 'int9'"),
    ('recipe = "int4_weight_only"\ngroup_sise = 32', "unknown option 'group_sise' (did you mean 'group_size'?)"),
    ('recipe = "int4_weight_only"\nscale_dtype = ["bf16"]', "scale_dtype=['bf16']"),
    ('recipe = "int4_weight_only"\nmethod = "gptx"', "method='gptx'"),
    ('recipe = "w8a8_static"\nnum_batches = -1', "num_batches=-1 must be a positive int"),
    ('recipe = "int8_dynamic"\ncalibration_data = 3', "cannot be given in a file"),
    ('recipe = "mxfp4_e2m1"\nroles = ["wieght"]', "roles='wieght'"),
    ('recipe = "int8_dynamic"\n[passes.profile_statistics]\nby = "type"', "needs a traced graph"),
])  # fmt: skip
def test_bad_quantize_model_tables(lowbit_cli, tmp_path, table, expected):
    config = tmp_path / "bad.toml"
    config.write_text(HEAD + "[passes.quantize_model]\n" + table + "\n")
    status, _, err = lowbit_cli("transform", "--config", str(config))
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith("lowbit: error: "), err
    assert expected in lines[0]
    assert not list(tmp_path.rglob("transformed_ckpt"))


def test_real_model_exports_to_onnx_and_safetensors(trained, tmp_path):
    """A w8a8_static folder from the pass: lowbit export writes an ONNX model that onnxruntime runs with the
    reloaded model's predictions, and a lowbit.save file that loads back into the float architecture."""
    onnxruntime = pytest.importorskip("onnxruntime", reason="the export extra is not installed")
    import lowbit
    from lowbit.datasets import get_dataset

    root, _ = trained
    _transform_and_test(root, 'recipe = "w8a8_static"\nnum_batches = 2', "export")
    folder = root / "export" / "software" / "transform" / "transformed_ckpt"
    onnx_path, file_path = tmp_path / "m.onnx", tmp_path / "m.safetensors"
    assert main(["export", "--load", str(folder), "--onnx", str(onnx_path), "--safetensors", str(file_path)]) == 0
    x = get_dataset("digits", "test").tensors[0]
    reloaded = load_lowbit(folder).eval()
    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    (theirs,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        ours = reloaded(x)
        again = lowbit.load(file_path, model=DigitsMLP()).eval()(x)
    assert torch.equal(ours, again)
    assert (theirs.argmax(1) == ours.argmax(1).numpy()).mean() >= 0.97


def test_training_a_real_quantized_model_is_refused(trained, lowbit_cli):
    root, _ = trained
    _transform_and_test(root, 'recipe = "int8_weight_only"', "refuse")
    folder = root / "refuse" / "software" / "transform" / "transformed_ckpt"
    status, _, err = lowbit_cli("train", "digits_mlp", "digits", "--load", str(folder), "--max-epochs", "1")
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert "holds real-quantized layers (fc1, ...), which cannot be trained" in err


@pytest.mark.parametrize("recipe, key, value", [
    ("int4_weight_only", "grup_size", 32), ("int4_weight_only", "group_size", -2), ("int8_dynamic", "act_bitz", 8),
    ("int8_dynamic", "smoothquant", 1.5), ("mxfp4_e2m1", "rolse", ["weight"]), ("mxfp4_e2m1", "method", "gptx"),
    ("w8a8_static", "include_conv", "maybe"),
])  # fmt: skip
def test_a_bad_option_is_the_same_error_from_python_and_from_toml(lowbit_cli, tmp_path, recipe, key, value):
    import lowbit
    from lowbit.errors import ConfigError

    with pytest.raises(ConfigError) as raised:
        lowbit.quantize_(torch.nn.Sequential(torch.nn.Linear(64, 8)), recipe, **{key: value})
    python = str(raised.value).split("; options:")[0]
    config = tmp_path / "bad.toml"
    config.write_text(HEAD + f"[passes.quantize_model]\nrecipe = {json.dumps(recipe)}\n{key} = {json.dumps(value)}\n")
    status, _, err = lowbit_cli("transform", "--config", str(config))
    assert status == 2 and err.strip().startswith(f"lowbit: error: [passes.quantize_model] {python}"), (python, err)
