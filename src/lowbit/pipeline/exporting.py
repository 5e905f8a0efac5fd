"""``lowbit export``: a transformed model (a ``transformed_ckpt`` folder) to QDQ ONNX and / or lowbit's
safetensors file. The example input for ONNX is a batch of the model's dataset."""

from __future__ import annotations

import os
from pathlib import Path

from lowbit.errors import ConfigError
from lowbit.pipeline.catalog import check_pair, get_split, make_loader, model_inputs
from lowbit.pipeline.checkpoints import load_lowbit, saved_origin


def export(folder: str | os.PathLike, *, onnx_path: str | None = None, safetensors_path: str | None = None,
           batch_size: int = 1, dataset: str | None = None) -> list[str]:  # fmt: skip
    folder = Path(folder)
    if not folder.exists():
        raise ConfigError(f"checkpoint {folder} does not exist")
    model = load_lowbit(folder).eval()
    written = []
    if safetensors_path:
        from lowbit.export import save

        save(model, safetensors_path)
        written.append(safetensors_path)
    if onnx_path:
        from lowbit.export import export_onnx

        example = _example_input(folder, dataset, batch_size)
        export_onnx(model, example, onnx_path, dynamic_batch=True)
        written.append(onnx_path)
    return written


def _example_input(folder: Path, dataset: str | None, batch_size: int):
    model_name, saved_dataset = saved_origin(folder)
    dataset = dataset or saved_dataset
    if dataset is None:
        raise ConfigError(f"{folder} does not say which dataset its model takes: pass --dataset")
    if model_name is not None:
        check_pair(model_name, dataset)
    if batch_size < 1:
        raise ConfigError(f"--batch-size must be at least 1, got {batch_size}")
    if dataset == "sentences":
        raise ConfigError("ONNX export of the MiniLM model is not supported by lowbit export (export the float model with transformers)")
    get_split(dataset, "test")  # a clear error for an unknown dataset before the loader is made
    return model_inputs(next(iter(make_loader(dataset, "test", batch_size))))


__all__ = ["export"]
