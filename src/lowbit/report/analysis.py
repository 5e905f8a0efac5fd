"""``quantization_report_analysis_pass``: compare a quantized model with its float original on real data.

pass_args:

- ``float_model`` (required): the float model, an ``nn.Module`` or a QGraph (for a model quantized in
  place, a copy taken before quantizing).
- ``inputs`` (required): input batches (tensors, dicts of keyword tensors, or (x, y) pairs whose x is used).
- ``labels``: label batches aligned with ``inputs``; with them the task metric is top-1 accuracy.
- ``metric``: "accuracy", "cosine" (mean per-sample cosine of the outputs to the float outputs) or "auto"
  (accuracy when labels are given, else cosine).
- ``sensitivity`` (True): rank the layers by the metric when only that layer is quantized.
- ``histogram_layers`` (4): "all", a list of layer names, or N (the N layers with the lowest SQNR).
- ``latency_runs`` (5): timed calls of each real-quantized layer and of its float original on the layer's
  first captured input (the median is reported); 0 skips the timing.
- ``header``: what the report is about, shown at the top of the page: a dict of strings, such as
  ``{"model": ..., "dataset": ..., "config": ..., "checkpoint": ...}`` (lowbit's and torch's versions and
  whether the layers are simulated, real or mixed are added).
- ``save_dir``: write report.json and report.html there.
- ``print_table`` (False): print the rich table.
- ``gradients`` (False): one backward pass through each model (lowbit.report.gradients); every layer row
  gets ``grad_weight_sqnr_db``, the SQNR of its weight gradient against the float model's (None without
  a float weight).

Returns ``(graph, {"report": report})``; the report is a plain dict (docs/report.md has its schema).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import fx, nn

from lowbit._checks import check_flag
from lowbit.errors import LowbitError, ReportError
from lowbit.graph.metadata import REQUIRED, read_pass_args
from lowbit.graph.qgraph import QGraph
from lowbit.report import build, gradients, histograms, real
from lowbit.report.collect import evaluation_mode, main_tensor, make_runner
from lowbit.report.layers import check_float_counterparts, find_layers
from lowbit.report.metrics import METRICS, TaskMetric
from lowbit.report.sensitivity import sensitivity_ranking
from lowbit.report.stats import LayerStats, update_all

PASS_NAME = "quantization_report_analysis_pass"
DEFAULTS: dict[str, Any] = {
    "float_model": REQUIRED, "inputs": REQUIRED, "labels": None, "metric": "auto", "sensitivity": True,
    "histogram_layers": 4, "save_dir": None, "print_table": False, "latency_runs": 5, "header": None,
    "gradients": False,
}  # fmt: skip


def quantization_report_analysis_pass(graph: QGraph | nn.Module, pass_args: dict[str, Any]):
    """The quantization report of ``graph`` against ``pass_args["float_model"]``: (graph, {"report": ...})."""
    args = read_pass_args(PASS_NAME, pass_args, DEFAULTS)
    quantized = _as_module(graph, "the quantized model")
    by_node = isinstance(quantized, fx.GraphModule)
    original = _float_model(args["float_model"], by_node)
    batches = _batches(args["inputs"], "inputs")
    labels = None if args["labels"] is None else _batches(args["labels"], "labels")
    kind = _metric_kind(args["metric"], labels, len(batches))
    layers = find_layers(quantized)
    check_float_counterparts(layers, original, by_node)
    histograms.check_choice(args["histogram_layers"], [layer.name for layer in layers])  # before the work
    header = _header_fields(args["header"])
    runs = _latency_runs(args["latency_runs"])
    gradients_wanted = _flag(args["gradients"], "gradients")
    with torch.no_grad(), evaluation_mode(original, quantized):
        report = _measure(quantized, original, layers, batches, labels, kind, args)
        _time_real_layers(report["layers"], layers, report.pop("_stats"), runs)
    if gradients_wanted:
        with evaluation_mode(original, quantized):
            _attach_gradients(report["layers"], gradients.gradient_sqnr(quantized, original, layers, batches, labels))
    report["header"] = build.header({**_rotation_field(quantized), **header}, report["layers"])
    if args["save_dir"] is not None:
        from lowbit.report.files import write_report

        write_report(report, args["save_dir"])
    if args["print_table"]:
        from lowbit.report.table import print_report

        print_report(report)
    return graph, {"report": report}


def _measure(quantized, original, layers, batches, labels, kind, args) -> dict[str, Any]:
    quantized_runner = make_runner(quantized, layers)
    stats, float_outputs, quantized_outputs = _collect(make_runner(original), quantized_runner, layers, batches)
    metric = TaskMetric(kind, float_outputs, labels)
    _check_labels(metric)
    float_score, quantized_score = metric.score(float_outputs), metric.score(quantized_outputs)
    rows = [build.layer_row(layer_stats) for layer_stats in stats.values()]
    ranking = None
    if args["sensitivity"]:
        ranking = sensitivity_ranking(quantized_runner, layers, batches, metric, float_score)
    _attach_sensitivity(rows, ranking)
    chosen = histograms.select_layers(args["histogram_layers"], rows)
    summary = build.model_summary(quantized, list(stats.values()))
    summary.update(
        layers=len(rows), batches=len(batches), samples=sum(_batch_size(output) for output in float_outputs),
        metric=kind, float_metric=float_score, quantized_metric=quantized_score,
        metric_delta=quantized_score - float_score,
    )  # fmt: skip
    return {"schema": build.SCHEMA, "summary": summary, "layers": rows, "sensitivity": ranking,
            "histogram_layers": chosen, "histograms": _histograms(stats, chosen), "_stats": stats}  # fmt: skip


def _time_real_layers(rows: list[dict[str, Any]], layers, stats: dict[str, LayerStats], runs: int) -> None:
    """Each real layer against its float original on the input it first saw in the quantized model."""
    if runs == 0:
        return
    by_name = {layer.name: layer for layer in layers}
    for row in rows:
        layer, first = by_name[row["name"]], stats[row["name"]].first_call
        if layer.kind == "real" and first is not None:
            row["latency"] = real.latency(layer.module, layer.float_module, first.args, first.kwargs, runs)


def _collect(float_runner, quantized_runner, layers, batches):
    """Both models on every batch: per-layer statistics and each model's outputs."""
    stats = {layer.name: LayerStats(layer) for layer in layers}
    float_outputs, quantized_outputs = [], []
    for index, batch in enumerate(batches):
        float_out, float_calls = float_runner.run(batch, stats)
        quantized_out, quantized_calls = quantized_runner.run(batch, stats)
        update_all(stats, float_calls, quantized_calls, index)
        float_outputs.append(main_tensor(float_out, "the float model's output"))
        quantized_outputs.append(main_tensor(quantized_out, "the quantized model's output"))
    return stats, float_outputs, quantized_outputs


def _batch_size(output: torch.Tensor) -> int:
    return int(output.shape[0]) if output.dim() else 1


def _histograms(stats: dict[str, LayerStats], chosen: list[str]) -> list[dict[str, Any]]:
    entries = []
    for name in chosen:
        layer_stats = stats[name]
        for role in histograms.HISTOGRAM_ROLES:
            values = layer_stats.sample(role)
            if values is None:
                continue
            if layer_stats.layer.kind == "real":
                entry = histograms.real_histogram_entry(name, role, layer_stats.layer.module, values,
                                                        layer_stats.grids.get(role))  # fmt: skip
                if entry is not None:
                    entries.append(entry)
                continue
            spec = getattr(layer_stats.layer.formats, role)
            entry = histograms.histogram_entry(name, role, spec, values, layer_stats.grids.get(role))
            if entry is not None:
                entries.append(entry)
    return entries


def _attach_gradients(rows: list[dict[str, Any]], sqnr: dict[str, float | None]) -> None:
    for row in rows:
        row["grad_weight_sqnr_db"] = sqnr.get(row["name"])


def _attach_sensitivity(rows: list[dict[str, Any]], ranking: list[dict[str, Any]] | None) -> None:
    by_layer = {entry["layer"]: (entry["rank"], entry) for entry in ranking or ()}
    for row in rows:
        rank, entry = by_layer.get(row["name"], (None, None))
        row["sensitivity_rank"] = rank
        row["sensitivity_metric"] = entry["metric"] if entry else None


# ---- argument checks -----------------------------------------------------------------------------------
def _as_module(model: Any, what: str) -> nn.Module:
    if isinstance(model, QGraph):
        return model.model
    if isinstance(model, nn.Module):
        return model
    raise ReportError(f"{PASS_NAME}: {what} must be a QGraph or a torch.nn.Module, got {type(model).__name__}")


def _float_model(model: Any, by_node: bool) -> nn.Module:
    """The float model as the quantized one is seen: a GraphModule (traced if needed) for graphs."""
    module = _as_module(model, "float_model")
    if not by_node or isinstance(module, fx.GraphModule):
        return module
    try:
        return QGraph(module).model
    except LowbitError as error:
        raise ReportError(f"{PASS_NAME}: float_model cannot be traced to match the quantized graph ({error}); "
                          "pass the float model as a QGraph") from error  # fmt: skip


def _batches(values: Any, what: str) -> list[Any]:
    if isinstance(values, (torch.Tensor, dict)) or not isinstance(values, Iterable):
        raise ReportError(f"{PASS_NAME}: {what} must be an iterable of batches (a list, a DataLoader, ...), "
                          f"got {type(values).__name__}; wrap a single batch in a list")  # fmt: skip
    batches = list(values)
    if not batches:
        raise ReportError(f"{PASS_NAME}: {what} is empty; the report needs at least one batch")
    return batches


def _metric_kind(metric: Any, labels: list[Any] | None, batch_count: int) -> str:
    kind = ("accuracy" if labels is not None else "cosine") if metric == "auto" else metric
    if kind not in METRICS:
        raise ReportError(f"{PASS_NAME}: metric={metric!r} is invalid; use 'accuracy', 'cosine' or 'auto'")
    if kind == "accuracy" and labels is None:
        raise ReportError(f"{PASS_NAME}: metric='accuracy' needs labels (pass_args['labels'])")
    if labels is not None and len(labels) != batch_count:
        raise ReportError(f"{PASS_NAME}: {len(labels)} label batches for {batch_count} input batches")
    return kind


def _rotation_field(model: nn.Module) -> dict[str, str]:
    """{"rotation": ...} for a model that ``lowbit.quantize_(model, "rotate")`` rotated (its config says so)."""
    record = getattr(getattr(model, "config", None), "lowbit_rotation", None)
    if not isinstance(record, dict):
        return {}
    factors = " x ".join(str(factor) for factor in record.get("hadamard_factors", []))
    parts = [f"Hadamard {record.get('hidden_size')} ({factors}) on the residual stream"]
    if record.get("random_signs"):
        parts.append(f"random signs (seed {record.get('seed')})")
    if record.get("rotate_heads"):
        parts.append(f"per-head {record.get('head_dim')} on v / o")
    if record.get("online_down"):
        parts.append("online before down_proj")
    return {"rotation": ", ".join(parts)}


def _header_fields(header: Any) -> dict[str, str]:
    if header is None:
        return {}
    if not isinstance(header, dict) or not all(isinstance(key, str) for key in header):
        raise ReportError(f"{PASS_NAME}: header must be a dict of str -> str (model, dataset, config, checkpoint, "
                          f"...), got {type(header).__name__}")  # fmt: skip
    return {key: str(value) for key, value in header.items() if value is not None}


def _flag(value: Any, name: str) -> bool:
    return check_flag(PASS_NAME, name, value, ReportError)


def _latency_runs(runs: Any) -> int:
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 0:
        raise ReportError(f"{PASS_NAME}: latency_runs={runs!r} must be an int >= 0 (0: no timing)")
    return runs


def _check_labels(metric: TaskMetric) -> None:
    if metric.kind != "accuracy":
        return
    for index, (outputs, labels) in enumerate(zip(metric.float_outputs, metric.labels, strict=True)):
        if not isinstance(labels, torch.Tensor) or labels.shape != outputs.shape[:-1]:
            shape = tuple(labels.shape) if isinstance(labels, torch.Tensor) else type(labels).__name__
            raise ReportError(f"{PASS_NAME}: label batch {index} is {shape}; expected a tensor of shape "
                              f"{tuple(outputs.shape[:-1])} (one class index per output row)")  # fmt: skip
