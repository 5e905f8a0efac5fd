"""``run_search``: a config's ``[search]`` run end to end (model and data, space, study, outputs)."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from lowbit._io import atomic_write_text
from lowbit.errors import ConfigError
from lowbit.search.compare import compare_presets
from lowbit.search.config import SearchConfig, parse_search
from lowbit.search.evaluate import Evaluator, fixed_subset, tokenized
from lowbit.search.front import pareto_front, write_front
from lowbit.search.measure import CostModel, load_cost_table, record_geometry
from lowbit.search.space import PRESETS, REFERENCE_PRESETS, SearchSpace
from lowbit.search.study import completed_records, make_objective, make_sampler, make_storage, open_study

log = logging.getLogger("lowbit")
SPLITS = {"val_dataloader": "validation", "test_dataloader": "test", "train_dataloader": "train"}


def load_search_config(config: Any) -> tuple[dict[str, Any], SearchConfig, Path | None]:
    """(run options table, search config, config file) from a TOML path or a dict."""
    from lowbit.config.toml_config import read_toml

    path = None
    if isinstance(config, (str, Path)):
        path = Path(config)
        config = read_toml(path)
    if not isinstance(config, dict) or "search" not in config:
        raise ConfigError(f"{path or 'config'}: no [search] table (search_space and strategy)")
    rest = {key: value for key, value in config.items() if key != "search"}
    return rest, parse_search(config["search"], str(path or "config")), path


def run_search(config: Any, save_dir: str | Path | None = None, *, n_trials: int | None = None,
               storage: str | None = None, sampler: str | None = None, worker: int = 0, model: Any = None,
               sentences: list[str] | None = None, overrides: dict[str, Any] | None = None,
               progress: bool = False, only_outputs: bool = False) -> dict[str, Any]:  # fmt: skip
    """Run (or continue) the search of ``config`` (a TOML path or its dict) and write the outputs in
    ``save_dir`` (default: <project_dir>/<project>/search). Returns a summary (study, front, files).
    ``only_outputs`` adds no trial: it rewrites the outputs from the study as it is."""
    with _no_background_compiles():
        return _run(config, save_dir, n_trials, storage, sampler, worker, model, sentences, overrides or {}, progress,
                    only_outputs)  # fmt: skip


def _run(config: Any, save_dir: Any, n_trials: int | None, storage: str | None, sampler: str | None, worker: int,
         model: Any, sentences: list[str] | None, overrides: dict[str, Any], progress: bool,
         only_outputs: bool) -> dict[str, Any]:  # fmt: skip
    table, search, path = load_search_config(config)
    search.n_trials = n_trials or search.n_trials
    search.storage = storage or search.storage
    search.sampler = sampler or search.sampler
    options = _options(table, path, overrides)
    folder = Path(save_dir) if save_dir is not None else Path(options["project_dir"]) / options["project"] / "search"
    folder.mkdir(parents=True, exist_ok=True)
    root = model if model is not None else _load_model(options)
    evaluator = _evaluator(root, options, search, sentences)
    space = SearchSpace(root, search)
    geometry = record_geometry(evaluator.work, lambda: evaluator.evaluate({}))
    cost_table = load_cost_table(search.cost_table, path.parent if path else None)
    costs = CostModel(root, geometry, list(space.layers), search.compare_to, cost_table)

    latency = None
    if "latency_ms" in search.metrics:
        from lowbit.search.latency import LatencyModel

        latency = LatencyModel(evaluator, {name: geometry[name] for name in space.layers})

    def measure(plan: dict[str, Any]) -> dict[str, float]:
        metrics = {**evaluator.evaluate(plan), **costs.measure(plan)}
        return {**metrics, **latency.measure(plan)} if latency is not None else metrics

    study_storage = make_storage(search.storage, folder)
    study = open_study(search, study_storage, None)
    seed = search.seed + 7919 * worker + len(study.trials)
    study.sampler = make_sampler(search, space, seed)
    if search.sensitivity_start and not study.trials and not only_outputs:
        from lowbit.search.sensitivity import enqueue_sensitivity_start

        from lowbit.pipeline.progress import waiting

        with waiting(f"sensitivity of {len(space.decisions)} decisions for the first trials"):
            enqueue_sensitivity_start(study, space, evaluator)
    started = time.perf_counter()
    search.n_trials = 0 if only_outputs else search.n_trials
    if search.n_trials:
        study.optimize(make_objective(search, space, measure), n_trials=search.n_trials, timeout=search.timeout,
                       n_jobs=search.n_jobs, callbacks=[_progress_callback(search)] if progress else None)
    references = {name: measure(_uniform_plan(space, name)) for name in REFERENCE_PRESETS}
    seconds = time.perf_counter() - started
    return _write_outputs(folder, study, search, _transform_options(options), references, {
        "seconds": seconds, "added": search.n_trials, "cache_hits": evaluator.cache_hits,
        "cache_misses": evaluator.cache_misses, "layers": list(space.layers), "search_space_size": space.size()})


@contextlib.contextmanager
def _no_background_compiles() -> Any:
    """With background compiles turned on (``backend.set_background_compile(True)``), a compile (torch.fx
    tracing patches ``nn.Module.__call__`` process-wide) can break a forward pass running at the same
    moment; a search runs forward passes back to back, so it then evaluates eagerly (``compiled``, which
    compiles in the caller's thread, is kept)."""
    from lowbit import backend

    previous = backend.get_backend()
    if previous == "auto" and backend.background_compile():
        backend.wait_for_background()
        backend.set_backend("eager")
    try:
        yield
    finally:
        if previous == "auto" and backend.get_backend() == "eager":
            backend.set_backend("auto")


def _options(table: dict[str, Any], path: Path | None, overrides: dict[str, Any]) -> Any:
    from lowbit.config import merge_options
    from lowbit.config.toml_config import parse_run_config
    from lowbit.pipeline.actions import prepare
    from lowbit.pipeline.passes import PASSES

    run_config = parse_run_config(table, PASSES, str(path) if path else "config")
    options = merge_options(run_config.options, overrides)
    prepare(options)
    return options


def _load_model(options: Any) -> torch.nn.Module:
    from lowbit._model import root_module
    from lowbit.pipeline.actions import load_model

    return root_module(load_model(options), "search").eval()


def _evaluator(root: torch.nn.Module, options: Any, search: SearchConfig, sentences: list[str] | None) -> Evaluator:
    if options["task"] == "embedding":
        from lowbit.models.minilm import load_minilm_tokenizer
        from lowbit.models.sentences import SENTENCES

        chosen = list(sentences or SENTENCES)[: search.num_samples]
        return Evaluator(root, "embedding", tokenized(chosen, load_minilm_tokenizer()))
    from lowbit.pipeline.catalog import get_split

    inputs, labels = fixed_subset(get_split(options["dataset"], SPLITS[search.data_loader]), search.num_samples)
    return Evaluator(root, "classification", inputs, labels, batch_size=options["batch_size"])


def _uniform_plan(space: SearchSpace, preset: str) -> dict[str, Any]:
    from lowbit.search.space import named_decision

    plan = {}
    for layer, op in space.layers.items():
        decision = named_decision(layer, op, (layer,), [preset], PRESETS, f"preset {preset}")
        plan[layer] = decision.build({"choice": preset})
    return plan


def _progress_callback(search: SearchConfig) -> Any:
    """One line per trial (hidden by -q): trials done in this run, and the front so far in the first two
    metrics (e.g. accuracy at bits)."""
    from lowbit.pipeline.progress import note

    directions = {name: direction for name, (_, direction) in search.metrics.items()}
    shown = list(directions)[:2]
    done = [0]

    def callback(study: Any, trial: Any) -> None:
        done[0] += 1
        front = pareto_front(completed_records(study), directions)
        ordered = sorted(front, key=lambda r: r["metrics"][shown[-1]])
        points = "; ".join(" @ ".join(f"{r['metrics'][name]:.4g}" for name in shown) for r in ordered[:8])
        note(f"search: trial {trial.number} ({done[0]}/{search.n_trials} this run), front of {len(front)} "
             f"({' @ '.join(shown)}): {points}{' ...' if len(ordered) > 8 else ''}")  # fmt: skip

    return callback


def _transform_options(options: Any) -> dict[str, Any]:
    """The run options a front TOML needs to rebuild the searched model (checkpoint path made absolute)."""
    table = {"model": options["model"], "dataset": options["dataset"], "seed": options["seed"]}
    if options["load"] is not None:
        table["load_name"] = str(Path(options["load"]).resolve())
        if options["load_type"] is not None:
            table["load_type"] = options["load_type"]
    return table


def _write_outputs(folder: Path, study: Any, search: SearchConfig, options: dict[str, Any],
                   references: dict[str, dict[str, float]], run: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    from lowbit.search.chart import draw_chart
    from lowbit.search.page import write_page

    records = completed_records(study)
    directions = {name: direction for name, (_, direction) in search.metrics.items()}
    front = pareto_front(records, directions)
    task_metric = next((m for m in ("accuracy", "mean_cosine", "loss") if records and m in records[0]["metrics"]),
                       "accuracy")  # fmt: skip
    comparison = compare_presets(front, references, task_metric, directions)
    extra = {"study": search.study_name, "trials": len(records), "directions": directions, "uniform": references,
             "comparison": comparison, "run": run}  # fmt: skip
    front_file = write_front(folder, front, options, extra)
    atomic_write_text(folder / "trials.json", json.dumps(records, indent=1, sort_keys=True))
    chart = draw_chart(folder / "search.png", records, front, references, task_metric,
                       tuple(directions)) if records else None  # fmt: skip
    page = write_page(folder / "search.html", chart.read_bytes() if chart else None, front, references,
                      f"lowbit search: study {search.study_name}, {len(records)} trials", comparison)  # fmt: skip
    return {"study": study, "records": records, "front": front, "uniform": references, "comparison": comparison,
            "folder": folder,
            "files": [front_file, folder / "trials.json", *([chart] if chart else []), page], "run": run}


__all__ = ["load_search_config", "run_search"]
