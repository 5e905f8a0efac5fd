"""The passes a TOML config can name (``[passes.<name>]``), each a thin adapter from the config's table to
a library function. Adapters fill in what a file cannot hold (the data, the float model, output paths) and
resolve relative paths against the run's transform folder.

Every adapter declares its keys, so a config is checked (unknown key -> nearest valid one) before any
pass runs; ``quantize``'s per-node configs are checked by a dry run on a copy of the graph.
"""

from __future__ import annotations

import copy
import itertools
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from lowbit._checks import check_flag, check_positive_int, check_text, check_texts
from lowbit.errors import ConfigError, did_you_mean


@dataclass
class TransformRun:
    """What the passes share: the model (a QGraph in graph style, an nn.Module in module style), a float copy
    made before any pass, the run options, the output folder and the data."""

    model: Any
    float_model: nn.Module
    options: Any
    out_dir: Path
    style: str
    quantize_args: Any = None  # module style: what rebuilds the model when it is loaded
    recipe: Any = None  # [passes.quantize_model]'s table (no data): what rebuilds its layers
    infos: dict[str, Any] = field(default_factory=dict)

    @property
    def module(self) -> nn.Module:
        return self.model.model if self.style == "graph" else self.model

    def path(self, value: Any, key: str, pass_name: str) -> Path:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"[passes.{pass_name}] {key} must be a non-empty path string, got {value!r}")
        path = Path(value)
        return path if path.is_absolute() else self.out_dir / path

    def loader(self, split: str, *, shuffle: bool = False):
        from lowbit.pipeline.catalog import make_loader

        o = self.options
        return make_loader(o["dataset"], split, o["batch_size"], shuffle=shuffle, seed=o["seed"], num_workers=o["num_workers"])

    def inputs(self, split: str, batches: int | None):
        from lowbit.pipeline.catalog import model_inputs

        return [model_inputs(batch) for batch in itertools.islice(self.loader(split), batches)]


@dataclass(frozen=True)
class PassSpec:
    run: Callable[[TransformRun, dict[str, Any]], Any]
    keys: tuple[str, ...] | None  # None: the pass checks its own table (dry run)
    graph_only: bool = True


def _graph_pass(function_name: str, keys: tuple[str, ...], paths: tuple[str, ...] = ()) -> PassSpec:
    def run(run: TransformRun, args: dict[str, Any]) -> Any:
        import lowbit.graph as graph_module

        args = {k: (str(run.path(v, k, function_name)) if k in paths and v is not None else v) for k, v in args.items()}
        run.model, info = getattr(graph_module, function_name)(run.model, args)
        return info

    return PassSpec(run, keys)


# ---- adapters -----------------------------------------------------------------------------------------------
def _profile(run: TransformRun, args: dict[str, Any]) -> Any:
    from lowbit.graph import profile_statistics_analysis_pass

    from lowbit.pipeline.progress import progress

    batches = run.inputs("train", None)
    args = {**args, "input_generator": progress(batches, "profiling", enabled=run.options["progress"])}
    run.model, info = profile_statistics_analysis_pass(run.model, args)
    return info


def _quantize(run: TransformRun, args: dict[str, Any]) -> Any:
    from lowbit.graph import quantize_module_transform_pass, quantize_transform_pass, summarize_quantization_analysis_pass

    if run.style == "module":
        run.model, info = quantize_module_transform_pass(run.model, args)
        run.quantize_args = copy.deepcopy(args)
        return info
    run.model, info = quantize_transform_pass(run.model, args)
    if args.get("report"):
        summary_dir = run.out_dir / "quantize"
        summarize_quantization_analysis_pass(run.model, {"save_dir": str(summary_dir), "print": run.options["progress"]})
    return info


def check_quantize(run: TransformRun, args: dict[str, Any]) -> None:
    """Dry run of the quantize pass on a copy: every node's config checked before any real work."""
    from lowbit.graph import QGraph, quantize_module_transform_pass, quantize_transform_pass
    from lowbit.nn.config import ConfigWarning

    with warnings.catch_warnings():  # the real run warns; the dry run would say it all a second time
        warnings.simplefilter("ignore", ConfigWarning)
        if run.style == "module":
            quantize_module_transform_pass(copy.deepcopy(run.model), args)
        else:
            quantize_transform_pass(QGraph(copy.deepcopy(run.model.model)), args)


_CALIBRATE_KEYS = ("num_batches", "observer", "observer_args", "bits", "signed", "symmetric", "weight_bits",
                   "weight_group_size", "ops", "save_path", "activation_format")  # fmt: skip


def _calibrate(run: TransformRun, args: dict[str, Any]) -> Any:
    from lowbit import ptq

    options = {"num_batches": 8, "observer": "min_max", "observer_args": None, "bits": 8, "signed": False,
               "symmetric": False, "weight_bits": 8, "weight_group_size": None, "ops": list(ptq.DEFAULT_OPS),
               "save_path": "calibration.json", "activation_format": "affine", **args}  # fmt: skip
    from lowbit.pipeline.progress import progress

    batches = progress(run.inputs("train", options["num_batches"]), "calibrating", enabled=run.options["progress"])
    state = ptq.calibrate(run.module, batches, ops=options["ops"], observer=options["observer"],
                          observer_args=options["observer_args"], bits=options["bits"], signed=options["signed"],
                          symmetric=options["symmetric"], activation_format=options["activation_format"])  # fmt: skip
    state.save(run.path(options["save_path"], "save_path", "calibrate"))
    _, info = ptq.quantize_static(run.module, state, weight_bits=options["weight_bits"],
                                  weight_group_size=options["weight_group_size"])  # fmt: skip
    return info


def _dynamic(run: TransformRun, args: dict[str, Any]) -> Any:
    from lowbit import ptq

    _, info = ptq.quantize_dynamic(run.module, **args)
    return info


def _weight_only(run: TransformRun, args: dict[str, Any]) -> Any:
    from lowbit import ptq

    _, info = ptq.quantize_weight_only(run.module, **args)
    return info


def _quantize_model(run: TransformRun, args: dict[str, Any]) -> Any:
    from lowbit.flows import quantize_model
    from lowbit.pipeline.progress import note, waiting
    from lowbit.pipeline.quantizing import DEFAULT_BATCHES, needs_data, recipe_call, saved_recipe

    recipe, options = recipe_call(args)
    method = args.get("method", "round")
    what = args["recipe"] + (f" ({method.upper()})" if isinstance(method, str) and method != "round" else "")
    if needs_data(args):
        count = args.get("num_batches") or DEFAULT_BATCHES
        with waiting(f"reading {count} calibration batches of {run.options['dataset']}", slow=False):
            options["calibration_data"] = run.inputs("train", count)
    large = sum(p.numel() for p in run.module.parameters()) > 5_000_000  # MiniLM: seconds even without data
    with waiting(f"quantize_model: {what}", slow=needs_data(args) or large):
        _, info = quantize_model(run.module, recipe, **options)
    for reason, count in Counter((info.get("kept") or {}).values()).items():  # one line per reason (-q hides them)
        note(f"quantize_model: {count} layer{'s' if count > 1 else ''} {reason}")
    if info.get("note"):
        note(f"quantize_model: {info['note']}")
    run.recipe = saved_recipe(args)
    return info


def _save_statistics(run: TransformRun, args: dict[str, Any]) -> Any:
    from lowbit.graph import save_statistics

    path = run.path(args.get("save_path"), "save_path", "save_statistics")
    save_statistics(run.model, path)
    return {"files": [str(path)]}


_REPORT_KEYS = ("num_batches", "sensitivity", "histogram_layers", "save_dir", "print_table", "metric", "gradients")


def _quantization_report(run: TransformRun, args: dict[str, Any]) -> Any:
    from lowbit.pipeline.catalog import model_inputs
    from lowbit.report import quantization_report_analysis_pass

    options = {"num_batches": 4, "save_dir": "report", "print_table": True, **args}
    batches = list(itertools.islice(run.loader("test"), options.pop("num_batches")))
    save_dir = run.path(options.pop("save_dir"), "save_dir", "quantization_report")
    pass_args = {"float_model": run.float_model, "inputs": [model_inputs(b) for b in batches], "save_dir": str(save_dir),
                 **options}  # fmt: skip
    if run.options["task"] == "classification":
        pass_args["labels"] = [batch[1] for batch in batches]
    from lowbit.pipeline.progress import waiting

    what = "with per-layer sensitivity" if pass_args.get("sensitivity", True) else "without sensitivity"
    count = f"{len(batches)} test batch{'' if len(batches) == 1 else 'es'}"
    with waiting(f"quantization report on {count}, {what}"):
        _, info = quantization_report_analysis_pass(run.model, pass_args)
    return {**info, "files": [str(save_dir / "report.json"), str(save_dir / "report.html")]}


PASSES: dict[str, PassSpec] = {
    "profile_statistics": PassSpec(_profile, ("by", "target_weight_nodes", "target_activation_nodes", "weight_statistics",
                                              "activation_statistics", "num_samples", "profile_output_activation")),
    "quantize": PassSpec(_quantize, None, graph_only=False),
    "calibrate": PassSpec(_calibrate, _CALIBRATE_KEYS, graph_only=False),
    "quantize_model": PassSpec(_quantize_model, None, graph_only=False),
    "quantize_dynamic": PassSpec(_dynamic, ("bits", "granularity", "per", "weight_bits", "ops"), graph_only=False),
    "quantize_weight_only": PassSpec(_weight_only, ("bits", "group_size", "granularity", "ops"), graph_only=False),
    "summarize_quantization": _graph_pass("summarize_quantization_analysis_pass", ("save_dir", "print"), ("save_dir",)),
    "report_node_type": _graph_pass("report_node_type_analysis_pass", ("print",)),
    "report_node_shape": _graph_pass("report_node_shape_analysis_pass", ("print",)),
    "report_node_meta_param": _graph_pass("report_node_meta_param_analysis_pass", ("which", "save_path", "print"), ("save_path",)),
    "verify_common_metadata": _graph_pass("verify_common_metadata_analysis_pass", ()),
    "save_node_meta_param": _graph_pass("save_node_meta_param_interface_pass", ("save_path",), ("save_path",)),
    "save_mase_graph": _graph_pass("save_mase_graph_interface_pass", ("save_dir",), ("save_dir",)),
    "save_statistics": PassSpec(_save_statistics, ("save_path",)),
    "quantization_report": PassSpec(_quantization_report, _REPORT_KEYS, graph_only=False),
}


def check_pass_keys(name: str, args: dict[str, Any], style: str) -> None:
    spec = PASSES[name]
    if spec.graph_only and style == "module":
        raise ConfigError(f"[passes.{name}] needs a traced graph; it cannot run with transform.style = 'module'")
    if name == "quantize_model":
        from lowbit.pipeline.quantizing import check_quantize_model

        check_quantize_model(args)
    if spec.keys is None:
        return
    for key, value in args.items():
        if key not in spec.keys:
            valid = ", ".join(spec.keys) or "none"
            raise ConfigError(f"[passes.{name}]: unknown key {key!r}{did_you_mean(key, spec.keys)}; valid keys: {valid}")
        _check_value(name, key, value)


# The check of each common adapter key's value (None is always allowed: MASE's "NA"), in lowbit._checks' wording.
_VALUE_RULES: dict[str, Callable[[str, str, Any], Any]] = {
    **dict.fromkeys(("num_batches", "num_samples", "bits", "weight_bits", "group_size", "weight_group_size"),
                    check_positive_int),
    **dict.fromkeys(("signed", "symmetric", "sensitivity", "print_table", "print", "profile_output_activation",
                     "gradients"), check_flag),
    **dict.fromkeys(("save_path", "save_dir", "observer", "metric", "per", "granularity", "activation_format", "by"),
                    check_text),
    "ops": check_texts,
}  # fmt: skip


def _check_value(name: str, key: str, value: Any) -> None:
    check = _VALUE_RULES.get(key)
    if value is not None and check is not None:
        check(f"[passes.{name}]", key, value)


__all__ = ["PASSES", "PassSpec", "TransformRun", "check_pass_keys", "check_quantize"]
