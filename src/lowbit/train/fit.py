"""Training with Lightning: ``fit`` trains a model (float, or fake-quantized = QAT) on a built-in dataset
and leaves ``best.ckpt`` (lowest validation loss) and ``last.ckpt`` in the checkpoint folder.

The Lightning arguments accelerator / devices / num_nodes / strategy pass through unchanged, so
``strategy="ddp", devices=2, accelerator="cpu"`` trains in two processes on one machine (gloo), and the
same call scales to GPUs and nodes. Checkpoints are written atomically with a checksum sidecar
(:mod:`lowbit.train.sealed_io`).

Across runs (:mod:`lowbit.train.run_folder`): a folder holding checkpoints is refused unless
``options["resume"]`` (continue from ``last.ckpt`` through Lightning's ``ckpt_path``: epoch, global step,
optimizer, schedule, the best score so far, the data order and the RNG states) or ``options["overwrite"]``.
``devices`` is bounded by the cores / GPUs present, and DDP workers end with their launcher
(:mod:`lowbit.train.workers`).
"""

from __future__ import annotations

import io
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from lowbit._io import read_regular_file
from lowbit.errors import ConfigError
from lowbit.train.run_folder import is_launched_worker, prepare_run_folder
from lowbit.train.workers import bind_to_launcher, check_devices, mark_launcher


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
    from lowbit.train.sealed_io import SealedCheckpointIO

    _quiet_lightning()
    if is_launched_worker():
        bind_to_launcher()  # a DDP worker: end with the launcher (SIGKILL / SIGTERM of it included)
    if options["task"] != "classification":
        raise ConfigError(f"training needs a classification task; {options['model']!r} is an {options['task']} model")
    check_low_precision(low_precision)
    devices = _devices(options["devices"])
    check_devices(devices, options["accelerator"])
    resume, overwrite = _flag(options, "resume"), _flag(options, "overwrite")
    resume_from = prepare_run_folder(checkpoint_dir, resume=resume, overwrite=overwrite)
    L.seed_everything(options["seed"], workers=True, verbose=False)
    module = ClassifierModule(model, learning_rate=options["learning_rate"], weight_decay=options["weight_decay"],
                              optimizer=options["training_optimizer"], max_epochs=options["max_epochs"],
                              t_max=options["t_max"], eta_min=options["eta_min"], low_precision=low_precision,
                              seed=options["seed"])  # fmt: skip
    if resume_from is not None:
        _check_resumable(module, resume_from)
    data = DataModule(options["dataset"], options["batch_size"], make_loader=make_loader, seed=options["seed"],
                      num_workers=options["num_workers"])  # fmt: skip
    checkpoint = ModelCheckpoint(dirpath=str(checkpoint_dir), filename="best", monitor="val_loss", mode="min",
                                 save_top_k=1, enable_version_counter=False)  # fmt: skip
    # last.ckpt is written at the end of every training epoch (and when max_steps stops one early), whether or not
    # val_loss improved: Lightning's own save_last writes it only beside a new best, so a killed run would resume
    # from its last improvement and repeat the epochs after it.
    latest = ModelCheckpoint(dirpath=str(checkpoint_dir), filename="last", monitor=None, save_top_k=1,
                             save_on_train_epoch_end=True, enable_version_counter=False)  # fmt: skip
    trainer = L.Trainer(
        max_epochs=options["max_epochs"], max_steps=options["max_steps"], accelerator=options["accelerator"],
        devices=devices, num_nodes=options["num_nodes"], strategy=options["strategy"],
        callbacks=[checkpoint, latest], logger=CSVLogger(str(log_dir), name="", version=_log_version(log_dir, resume_from)),
        enable_progress_bar=options["progress"], enable_model_summary=False, deterministic=False,
        log_every_n_steps=options["log_every_n_steps"], accumulate_grad_batches=options["accumulate_grad_batches"],
        precision=options["trainer_precision"], plugins=[SealedCheckpointIO()],
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*number of training batches.*")
        warnings.filterwarnings("ignore", message="Checkpoint directory .* exists and is not empty")  # checked above
        with _launching():
            trainer.fit(module, datamodule=data, ckpt_path=None if resume_from is None else str(resume_from))
    metrics = {key: float(value) for key, value in trainer.callback_metrics.items()}
    best = Path(checkpoint.best_model_path) if checkpoint.best_model_path else None
    last = Path(latest.best_model_path) if latest.best_model_path else None
    return FitResult(best, last, metrics, trainer.is_global_zero, module)


def _check_resumable(module: nn.Module, path: Path) -> None:
    """ConfigError (instead of Lightning's traceback) when ``path`` holds another model's weights, e.g. a QAT
    run resumed without the ``--load`` it started from."""
    import torch

    try:
        state = torch.load(io.BytesIO(read_regular_file(path)), map_location="cpu", weights_only=True).get("state_dict", {})
    except Exception as error:  # unreadable although its checksum held (or it has none)
        raise ConfigError(f"cannot read {path} to resume: {type(error).__name__}: {error}") from None
    own = module.state_dict()
    if set(state) != set(own) or any(state[key].shape != own[key].shape for key in own):
        missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
        raise ConfigError(f"{path} holds another model's weights (missing {missing[:3]}, unexpected {unexpected[:3]}): "
                          f"resume with the model and --load the run started from")  # fmt: skip


def _log_version(log_dir: str | Path, resume_from: Path | None) -> str:
    """A fresh run logs to ``log_dir/metrics.csv``; a resumed one to ``log_dir/resumed-<n>/`` (nothing lost)."""
    if resume_from is None:
        return ""
    number = 1
    while (Path(log_dir) / f"resumed-{number}").exists():
        number += 1
    return f"resumed-{number}"


def _flag(options: Any, name: str) -> bool:
    try:
        return bool(options[name])
    except KeyError:
        return False


class _launching:
    """The launcher's process id in the environment while training runs (its DDP workers inherit it)."""

    def __enter__(self) -> None:
        from lowbit.train.workers import LAUNCHER_VARIABLE

        self.name, self.before = LAUNCHER_VARIABLE, os.environ.get(LAUNCHER_VARIABLE)
        if not is_launched_worker():
            mark_launcher()

    def __exit__(self, *exc: Any) -> None:
        if self.before is None:
            os.environ.pop(self.name, None)
        else:
            os.environ[self.name] = self.before


def _quiet_lightning() -> None:
    """Keep Lightning's banner lines (hardware found, tips) out of the command's output; warnings stay."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated.*")


__all__ = ["FitResult", "fit"]
