"""What ``lowbit train | test | transform`` do, as library functions (the CLI only parses and prints).

Outputs go under ``<project_dir>/<project>/software/``: ``training_ckpts/`` (best.ckpt, last.ckpt and,
when a transformed model was trained, ``transformed_ckpt/``), ``transform/`` (files the passes write,
then ``transformed_ckpt/``), ``test/metrics.json``.
"""

from __future__ import annotations

import copy
import io
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lowbit._io import atomic_write_text, read_regular_file
from lowbit.config.toml_config import RunConfig
from lowbit.errors import ConfigError, did_you_mean
from lowbit.pipeline.catalog import build_model, check_pair, dataset_info, make_loader, model_inputs
from lowbit.pipeline.checkpoints import infer_load_type, load_checkpoint, save_lowbit, saved_origin
from lowbit.pipeline.progress import warn
from lowbit.pipeline.passes import PASSES, TransformRun, check_pass_keys, check_quantize


def software_dir(options: Any) -> Path:
    return Path(options["project_dir"]) / options["project"] / "software"


def prepare(options: Any) -> None:
    """Check model / dataset; fill in the task from the dataset and the default project name (in place)."""
    if not 0 <= options["seed"] < 2**32:  # numpy's seeds (torch's too wide a range would overflow there)
        raise ConfigError(f"seed must be between 0 and 2**32 - 1 = {2**32 - 1}, got {options['seed']}")
    _check_project_name(options["project"])
    model, dataset = check_pair(options["model"], options["dataset"])
    task = dataset_info(dataset).task
    if options.source("task") != "default" and options["task"] != task:
        raise ConfigError(f"task {options['task']!r} ({options.source('task')}) does not fit dataset {dataset!r}, "
                          f"whose task is {task!r}; leave task out")  # fmt: skip
    options.values.update(model=model, dataset=dataset, task=task, project=options["project"] or f"{model}_{task}_{dataset}")
    if task == "language_modeling" and options.source("batch_size") == "default":
        options.values["batch_size"] = 1  # one window of 512 tokens: 128 of them would hold ~12 GB of logits


def _check_project_name(project: str | None) -> None:
    """A project is one folder under project_dir: a path ("../x", "a/b") would put outputs elsewhere."""
    if project and (project in (".", "..") or "/" in project or (os.sep != "/" and os.sep in project)):
        raise ConfigError(f"project {project!r} must be a folder name, not a path (set --project-dir for where "
                          f"outputs go)")  # fmt: skip


PRETRAINED_MODELS = ("minilm", "smollm2")  # built with their published weights


def warn_if_untrained(options: Any) -> None:
    """One warning line when a command evaluates a model that keeps its random initial weights."""
    if options["load"] is None and options["model"] not in PRETRAINED_MODELS:
        warn(f"no --load checkpoint: {options['model']} runs with random, untrained weights, so its accuracy "
             f"means nothing (train it with `lowbit train`, then pass --load <checkpoint>)")  # fmt: skip


def load_model(options: Any) -> nn.Module:
    """The built-in model, with the ``--load`` checkpoint applied (a lowbit folder replaces the model)."""
    torch.manual_seed(options["seed"])
    if options["load"] is not None and (options["load_type"] or infer_load_type(options["load"])) == "lowbit":
        saved_model, saved_dataset = saved_origin(options["load"])
        if saved_model not in (None, options["model"]):
            raise ConfigError(f"{options['load']} holds a {saved_model!r} model, not {options['model']!r}")
        return load_checkpoint(None, options["load"], "lowbit")
    model = build_model(options["model"], options["dataset"])
    if options["load"] is not None:
        model = load_checkpoint(model, options["load"], options["load_type"])
    return model


# ---- train --------------------------------------------------------------------------------------------------
def train(options: Any, low_precision_optimizer: dict[str, Any] | None = None) -> dict[str, Any]:
    from lowbit.pipeline.evaluate import evaluate
    from lowbit.train import fit

    check_training_options(options)
    model = load_model(options)
    _refuse_real_layers(model, options)
    root = software_dir(options)
    result = fit(model, options, root / "training_ckpts", root / "logs", low_precision_optimizer,
                 make_loader=make_loader)  # fmt: skip
    summary: dict[str, Any] = {"best": str(result.best), "last": str(result.last), "is_global_zero": result.is_global_zero}
    if not result.is_global_zero:
        return summary
    if result.best is not None:  # evaluate (and, for QAT, save) the best weights
        state = torch.load(io.BytesIO(read_regular_file(result.best)), map_location="cpu", weights_only=True)["state_dict"]
        result.module.load_state_dict(state)
    trained = result.module.model
    summary["metrics"] = {f"val_{k}": v for k, v in evaluate(trained, options, "validation").items()}
    _write_training_metrics(root / "training_ckpts" / "metrics.json", summary["metrics"], result.best)
    if _is_transformed(trained):
        directory = root / "training_ckpts" / "transformed_ckpt"
        save_lowbit(trained, directory, model_name=options["model"], dataset=options["dataset"])
        summary["transformed"] = str(directory)
    return summary


def _write_training_metrics(path: Path, metrics: dict[str, Any], best: Any) -> None:
    """metrics.json names the checkpoint it describes by path and SHA-256: best.ckpt is written by Lightning
    beside it, not in one swap with it, so a reader checks that the two still belong together."""
    from lowbit._checksum import digest_file

    digest = digest_file(best) if best is not None else None
    atomic_write_text(path, json.dumps({**metrics, "best": str(best), "best_sha256": digest}, indent=1) + "\n")


def check_training_options(options: Any) -> None:
    """Lightning's strategy and accelerator, checked before any work: a clear error instead of its traceback."""
    from lightning.pytorch.strategies import StrategyRegistry

    strategies = ["auto", *StrategyRegistry.available_strategies()]
    if options["strategy"] not in strategies:
        raise ConfigError(f"strategy {options['strategy']!r}{did_you_mean(options['strategy'], strategies)}; "
                          f"strategies: {', '.join(strategies[:6])}, ... (Lightning's StrategyRegistry)")  # fmt: skip
    accelerator = options["accelerator"]
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ConfigError(f"accelerator {accelerator!r}: no CUDA GPU is available here (use --accelerator cpu or auto)")
    if accelerator == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("accelerator 'mps': Apple's MPS is not available here (use --accelerator cpu or auto)")


def _refuse_real_layers(model: nn.Module, options: Any) -> None:
    """Real int8 / int4 layers hold integer codes, not trainable weights: QAT needs simulated layers."""
    from lowbit.ops import REAL_MODULES

    real = [name for name, module in model.named_modules() if isinstance(module, tuple(REAL_MODULES.values()))]
    if real:
        raise ConfigError(f"{options['load']} holds real-quantized layers ({real[0]}{', ...' if len(real) > 1 else ''}), "
                          "which cannot be trained; train the float model, or a simulated one (quantization-aware "
                          "training), and convert after")  # fmt: skip


def _is_transformed(model: nn.Module) -> bool:
    from lowbit.nn.modules import QuantModule

    return isinstance(model, torch.fx.GraphModule) or any(isinstance(m, QuantModule) for m in model.modules())


# ---- test ---------------------------------------------------------------------------------------------------
def test(options: Any) -> dict[str, Any]:
    from lowbit.pipeline.evaluate import evaluate

    if options["load"] is None and options["model"] not in PRETRAINED_MODELS:
        raise ConfigError("lowbit test needs --load: a checkpoint to evaluate (a fresh model would be untrained)")
    model = load_model(options)
    if options["warmup"]:
        _warm_up(model, options)
    metrics = evaluate(model, options)
    path = software_dir(options) / "test" / "metrics.json"
    atomic_write_text(path, json.dumps(metrics, indent=1) + "\n")
    return {"metrics": metrics, "files": [str(path)]}


# ---- transform ----------------------------------------------------------------------------------------------
def transform(options: Any, config: RunConfig) -> dict[str, Any]:
    if not config.passes:
        raise ConfigError(f"{config.path or 'the config'} has no [passes.*] tables: nothing to transform")
    style = _style(config)
    for name, args in config.passes:
        check_pass_keys(name, args, style)
    model = load_model(options)
    run = TransformRun(_captured(model, options, style), copy.deepcopy(model).eval(), options,
                       software_dir(options) / "transform", style)  # fmt: skip
    for name, args in config.passes:  # check every quantize table before any pass does real work
        if name == "quantize":
            check_quantize(run, args)
    warn_if_untrained(options)
    for name, args in config.passes:
        if name == "quantization_report" and options["warmup"]:
            _warm_up(run.module, options)
        run.infos[name] = PASSES[name].run(run, args)
    directory = run.out_dir / "transformed_ckpt"
    save_lowbit(run.model if style == "graph" else run.module, directory, model_name=options["model"],
                dataset=options["dataset"], quantize_args=run.quantize_args, recipe=run.recipe)  # fmt: skip
    return {"passes": run.infos, "transformed": str(directory), "model": run.module}


def _style(config: RunConfig) -> str:
    """The config's style; ``[passes.quantize_model]`` works on the module (real layers do not trace), so a
    config using it runs in module style unless a pass needs the graph."""
    names = [name for name, _ in config.passes]
    if "quantize_model" not in names:
        return config.style
    graph_passes = [name for name in names if PASSES[name].graph_only]
    if graph_passes:
        raise ConfigError(f"[passes.quantize_model] runs on the module, but [passes.{graph_passes[0]}] needs a "
                          "traced graph; use them in separate configs")  # fmt: skip
    return "module"


def _warm_up(model: nn.Module, options: Any) -> None:
    from lowbit.pipeline.warming import warm_up

    warm_up(model, next(iter(make_loader(options["dataset"], "test", options["batch_size"]))))


def _captured(model: nn.Module, options: Any, style: str) -> Any:
    """Graph style: the traced QGraph with common and software metadata from the first training batch."""
    if style == "module":
        return model
    from lowbit.graph import QGraph, add_common_metadata_analysis_pass, add_software_metadata_analysis_pass
    from lowbit.graph import init_metadata_analysis_pass

    graph = QGraph(model)
    graph, _ = init_metadata_analysis_pass(graph)
    batch = model_inputs(next(iter(make_loader(options["dataset"], "train", options["batch_size"]))))
    placeholders = [node.name for node in graph.model.graph.nodes if node.op == "placeholder"]
    dummy = dict(batch) if isinstance(batch, dict) else {placeholders[0]: batch}
    graph, _ = add_common_metadata_analysis_pass(graph, {"dummy_in": dummy, "add_value": False})
    graph, _ = add_software_metadata_analysis_pass(graph)
    return graph


__all__ = ["check_training_options", "load_model", "prepare", "software_dir", "test", "train", "transform",
           "warn_if_untrained"]
