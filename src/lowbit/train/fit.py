"""Training with Lightning: ``fit`` trains a model (float, or fake-quantized = QAT) on a built-in dataset
and leaves ``best.ckpt`` (lowest validation loss) and ``last.ckpt`` in the checkpoint folder.

The Lightning arguments accelerator / devices / num_nodes / strategy pass through unchanged, so
``strategy="ddp", devices=2, accelerator="cpu"`` trains in two processes on one machine (gloo), and the
same call scales to GPUs and nodes. Lightning writes checkpoints through a temporary file, so a crash
never leaves half a checkpoint.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from lowbit.errors import ConfigError


@dataclass
class FitResult:
    best: Path | None
    last: Path | None
    metrics: dict[str, float]
    is_global_zero: bool
    module: Any  # the ClassifierModule, holding the trained model


def _devices(value: Any) -> Any:
    return int(value) if isinstance(value, str) and value.isdigit() else value


def fit(model: nn.Module, options: Any, checkpoint_dir: str | Path, log_dir: str | Path,
        low_precision: dict[str, Any] | None = None, *, make_loader: Any) -> FitResult:  # fmt: skip
    """Train ``model`` as ``options`` say (an EffectiveOptions or a mapping with the run option names);
    ``low_precision``: a checked [low_precision_optimizer] table (the optimizer state's formats);
    ``make_loader(dataset, split, batch_size, shuffle=, seed=, num_workers=)``: the data loaders."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    from lowbit.train.lightning_module import ClassifierModule, DataModule
    from lowbit.train.optimizer_state import check_low_precision

    _quiet_lightning()
    if options["task"] != "classification":
        raise ConfigError(f"training needs a classification task; {options['model']!r} is an {options['task']} model")
    check_low_precision(low_precision)
    L.seed_everything(options["seed"], workers=True, verbose=False)
    module = ClassifierModule(model, learning_rate=options["learning_rate"], weight_decay=options["weight_decay"],
                              optimizer=options["training_optimizer"], max_epochs=options["max_epochs"],
                              t_max=options["t_max"], eta_min=options["eta_min"], low_precision=low_precision,
                              seed=options["seed"])  # fmt: skip
    data = DataModule(options["dataset"], options["batch_size"], make_loader=make_loader, seed=options["seed"],
                      num_workers=options["num_workers"])  # fmt: skip
    checkpoint = ModelCheckpoint(dirpath=str(checkpoint_dir), filename="best", monitor="val_loss", mode="min",
                                 save_top_k=1, save_last=True, enable_version_counter=False)  # fmt: skip
    trainer = L.Trainer(
        max_epochs=options["max_epochs"], max_steps=options["max_steps"], accelerator=options["accelerator"],
        devices=_devices(options["devices"]), num_nodes=options["num_nodes"], strategy=options["strategy"],
        callbacks=[checkpoint], logger=CSVLogger(str(log_dir), name="", version=""),
        enable_progress_bar=options["progress"], enable_model_summary=False, deterministic=False,
        log_every_n_steps=options["log_every_n_steps"], accumulate_grad_batches=options["accumulate_grad_batches"],
        precision=options["trainer_precision"],
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*number of training batches.*")
        trainer.fit(module, datamodule=data)
    metrics = {key: float(value) for key, value in trainer.callback_metrics.items()}
    best = Path(checkpoint.best_model_path) if checkpoint.best_model_path else None
    last = Path(checkpoint.last_model_path) if checkpoint.last_model_path else None
    return FitResult(best, last, metrics, trainer.is_global_zero, module)


def _quiet_lightning() -> None:
    """Keep Lightning's banner lines (hardware found, tips) out of the command's output; warnings stay."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated.*")


__all__ = ["FitResult", "fit"]
