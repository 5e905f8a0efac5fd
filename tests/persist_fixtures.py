"""Files of every on-disk format lowbit writes, kept in tests/fixtures/persist/ so that later lowbits are checked
against files an earlier one wrote ("files written today still load").

``python tests/persist_fixtures.py`` (with lowbit importable) writes them with the lowbit at hand, then loads
each with that same lowbit and records what it read in ``expected.json`` (digests of tensors, a model's output on
a fixed input, the plain values of a document). The committed files were written by lowbit at commit 24a9477,
before the formats moved onto ``lowbit._persist``; tests/test_persistence.py loads them with today's code and
compares against expected.json. Regenerate only to add a format: the point is that old files stay old.

Besides what lowbit writes today, three files are written by hand the way earlier lowbits (or MASE) wrote them:
an unsealed calibration state (version 1), an unsealed module.json (version 1) and a statistics TOML without the
lowbit header line (MASE's). Each loads with a warning that it was not verified.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
from pathlib import Path
from typing import Any

import torch

FOLDER = Path(__file__).parent / "fixtures" / "persist"
STATISTICS = {"fc1": {"common": {"mase_type": "module_related_func", "mase_op": "linear"},
                      "software": {"args": {"data_in_0": {"stat": {"range_min_max": {
                          "min": -1.5, "max": 2.25, "range": 3.75, "count": 8}}}}}}}  # fmt: skip


def _toy(fill_seed: int = 0):
    from lowbit.pipeline.catalog import build_model

    torch.manual_seed(fill_seed)
    model = build_model("toy", "toy_tiny")
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn_like(parameter))
    return model.eval()


def _tensor_digest(value: Any) -> str:
    from lowbit.qtensor import QTensor

    if isinstance(value, QTensor):
        value = value.dequantize()
    value = value.detach().cpu().contiguous()
    return f"{value.dtype}{tuple(value.shape)}:" + hashlib.sha256(value.view(torch.uint8).numpy().tobytes()
                                                                   if value.numel() else b"").hexdigest()


def _model_digest(model: torch.nn.Module) -> dict[str, Any]:
    torch.manual_seed(1)
    with torch.no_grad():
        output = model(torch.randn(3, 1, 2, 2))
    return {"output": _tensor_digest(output), "classes": sorted({type(m).__name__ for m in model.modules()})}


# ---- writing (the lowbit at hand) ---------------------------------------------------------------------------
def write_all(folder: Path = FOLDER) -> None:
    import tomli_w

    from lowbit._checksum import write_with_sidecar
    from lowbit._io import atomic_write_text
    from lowbit.export import save
    from lowbit.flows import quantize_model
    from lowbit.flows.ptq import CalibrationState
    from lowbit.graph import QGraph, quantize_transform_pass
    from lowbit.graph.stats_file import sealed_statistics_text
    from lowbit.pipeline.checkpoints import save_lowbit
    from lowbit.qtensor import encode
    from lowbit.report.files import write_report

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    save({"plain": torch.randn(3, 4), "codes": encode(torch.randn(4, 8), "affine", bits=4, axis=0)},
         folder / "tensors.safetensors")  # fmt: skip
    save_lowbit(_toy(), folder / "module_v1", model_name="toy", dataset="toy_tiny")
    quantized, _ = quantize_model(_toy(), "int8_weight_only")
    save_lowbit(quantized, folder / "module_v2", model_name="toy", dataset="toy_tiny",
                recipe={"recipe": "int8_weight_only"})  # fmt: skip
    graph, _ = quantize_transform_pass(QGraph(_toy()), {"by": "type", "default": {"config": {"name": None}},
                                                        "linear": {"config": {"name": "integer", "data_in_width": 8,
                                                        "data_in_frac_width": 4, "weight_width": 8,
                                                        "weight_frac_width": 4, "bias_width": 8,
                                                        "bias_frac_width": 4}}})  # fmt: skip
    save_lowbit(graph, folder / "graph", model_name="toy", dataset="toy_tiny")
    atomic_write_text(folder / "statistics.toml", sealed_statistics_text(tomli_w.dumps(STATISTICS)))
    CalibrationState("min_max", 8, True, False, {"fc1": {"min": [-1.0], "max": [2.5]}}, 2).save(
        folder / "calibration.json")
    buffer = io.BytesIO()
    torch.save({"state_dict": {f"model.{k}": v for k, v in _toy().state_dict().items()}}, buffer)
    write_with_sidecar(folder / "last.ckpt", buffer.getvalue())
    import lowbit.report.html as html

    real, html.render_html = html.render_html, lambda report: "<html></html>\n"  # only report.json is read back
    try:
        write_report({"layers": [{"name": "fc1", "sqnr": float("inf")}], "summary": {"version": 1}}, folder / "report")
    finally:
        html.render_html = real
    _write_corpus_cache(folder / "wikipedia-cache.json")
    _write_older(folder)


def _write_corpus_cache(file: Path) -> None:
    """The bytes datasets/wikipedia.py writes for its cache (the same call as its ``articles``)."""
    from lowbit._io import PLACEHOLDER, atomic_write_bytes, sealed

    cached = [["Anarchism", "Anarchism is a political philosophy."], ["Été", "Un mot accentué."]]
    blob = json.dumps({"key": "fixture-key", "seal": PLACEHOLDER, "articles": cached}, ensure_ascii=False).encode()
    atomic_write_bytes(file, sealed(blob))


def _write_older(folder: Path) -> None:
    """Files as earlier lowbits and MASE wrote them (no seal)."""
    import tomli_w

    doc = {"version": 1, "observer": "min_max", "bits": 8, "signed": True, "symmetric": True,
           "ranges": {"fc1": {"min": [-1.0], "max": [1.0]}}, "batches": 1}  # fmt: skip
    (folder / "calibration_v1.json").write_text(json.dumps(doc, indent=1))
    (folder / "statistics_mase.toml").write_text(tomli_w.dumps(STATISTICS))
    old = folder / "module_v1_unsealed"
    old.mkdir(exist_ok=True)
    (old / "state.safetensors").write_bytes((folder / "module_v1" / "state.safetensors").read_bytes())
    (old / "module.json").write_text(json.dumps({"schema": "lowbit.module", "version": 1, "model": "toy",
                                                 "dataset": "toy_tiny", "quantize": None}, indent=1))  # fmt: skip


# ---- reading (compared across lowbits) ----------------------------------------------------------------------
def load_all(folder: Path = FOLDER) -> dict[str, Any]:
    """What lowbit reads from each fixture, as plain JSON values."""
    from lowbit._checksum import verify_sidecar
    from lowbit.export import load
    from lowbit.flows.ptq import CalibrationState
    from lowbit.graph.stats_file import load_statistics
    from lowbit.pipeline.checkpoints import load_checkpoint, load_lowbit
    from lowbit.report.files import read_report

    tensors = load(folder / "tensors.safetensors")
    result: dict[str, Any] = {"tensors.safetensors": {name: _tensor_digest(value) for name, value in tensors.items()}}
    for name in ("module_v1", "module_v2", "graph", "module_v1_unsealed"):
        result[name] = _model_digest(load_lowbit(folder / name))
    for name in ("statistics.toml", "statistics_mase.toml"):
        result[name] = load_statistics(folder / name)
    for name in ("calibration.json", "calibration_v1.json"):
        result[name] = json.loads(json.dumps(CalibrationState.load(folder / name).__dict__))
    assert verify_sidecar(folder / "last.ckpt")
    result["last.ckpt"] = _model_digest(load_checkpoint(_toy(5), folder / "last.ckpt", "pl"))
    report = read_report(folder / "report" / "report.json")
    result["report"] = json.loads(json.dumps(report, allow_nan=True).replace("Infinity", '"inf"'))
    result["wikipedia-cache.json"] = _corpus_cache(folder / "wikipedia-cache.json")
    return result


def _corpus_cache(file: Path) -> Any:
    from lowbit.datasets import wikipedia

    return wikipedia._load_cache(file, "fixture-key")


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else FOLDER
    write_all(target)
    (target / "expected.json").write_text(json.dumps(load_all(target), indent=1, sort_keys=True) + "\n")
    print(f"wrote {sorted(p.name for p in target.iterdir())}")
