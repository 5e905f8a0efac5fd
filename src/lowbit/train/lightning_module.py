"""The Lightning wrappers: a classifier module (cross-entropy, accuracy) and a data module over the built-in
datasets. A fake-quantized model trains through them unchanged: lowbit's quantizers pass gradients
straight through, so training a transformed model is quantization-aware training."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch import nn

from lowbit.optim import LowPrecisionOptimizer
from lowbit.train.optimizer_state import wrap_optimizer

OPTIMIZERS = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}


class ClassifierModule(L.LightningModule):
    """Wraps ``model`` (logits out); logs train_loss / train_acc per step, val_loss / val_acc per epoch."""

    def __init__(self, model: nn.Module, *, learning_rate: float = 1e-3, weight_decay: float = 0.0,
                 optimizer: str = "adam", max_epochs: int = 1, t_max: int | None = None,
                 eta_min: float = 0.0, low_precision: dict[str, Any] | None = None,
                 seed: int | None = None) -> None:  # fmt: skip
        super().__init__()
        self.model = model
        self.learning_rate, self.weight_decay = learning_rate, weight_decay
        self.optimizer_name, self.max_epochs = optimizer, max_epochs
        self.t_max, self.eta_min = t_max or max_epochs, eta_min  # the cosine schedule (MASE's t_max / eta_min)
        self.loss = nn.CrossEntropyLoss()
        self.low_precision, self.low_precision_seed = low_precision, seed  # [low_precision_optimizer] (None: float state)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def _step(self, batch: Any, stage: str) -> torch.Tensor:
        x, y = batch
        logits = self.model(x)
        loss = self.loss(logits, y)
        accuracy = (logits.argmax(dim=-1) == y).float().mean()
        on_step = stage == "train"
        self.log(f"{stage}_loss", loss, on_step=on_step, on_epoch=True, prog_bar=True, sync_dist=True)
        self.log(f"{stage}_acc", accuracy, on_step=on_step, on_epoch=True, prog_bar=True, sync_dist=True)
        return loss

    def training_step(self, batch: Any, batch_index: int) -> torch.Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: Any, batch_index: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch: Any, batch_index: int) -> None:
        self._step(batch, "test")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["lowbit_rng"] = rng_states()  # a resumed run continues the same random streams
        generators = getattr(self._low_precision_optimizer(), "_generators", {})  # stochastic rounding's draws
        checkpoint["lowbit_rng"]["rounding"] = {key: g.get_state() for key, g in generators.items()}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Runs before the optimizer exists: the rounding generators' states wait for configure_optimizers."""
        if isinstance(checkpoint.get("lowbit_rng"), dict):
            set_rng_states(checkpoint["lowbit_rng"])
            self.restored_rounding = checkpoint["lowbit_rng"].get("rounding") or {}

    def _low_precision_optimizer(self) -> Any:
        trainer = self._trainer
        optimizers = trainer.optimizers if trainer is not None else []
        return next((o for o in optimizers if isinstance(o, LowPrecisionOptimizer)), None)

    def configure_optimizers(self):
        optimizer_class = OPTIMIZERS[self.optimizer_name]
        extra = {"momentum": 0.9} if self.optimizer_name == "sgd" else {}
        optimizer = optimizer_class(self.parameters(), lr=self.learning_rate, weight_decay=self.weight_decay, **extra)
        optimizer = wrap_optimizer(optimizer, self.low_precision, self.low_precision_seed)
        if isinstance(optimizer, LowPrecisionOptimizer) and optimizer.seed is not None:
            for key, state in getattr(self, "restored_rounding", {}).items():  # resumed: the same draws go on
                generator = torch.Generator(device=key)
                generator.set_state(state)
                optimizer._generators[key] = generator
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, self.t_max), eta_min=self.eta_min)
        return {"optimizer": optimizer, "lr_scheduler": schedule}


def rng_states() -> dict[str, Any]:
    import random

    import numpy

    kind, keys, position, has_gauss, gauss = numpy.random.get_state()  # plain values: weights_only loads them
    numpy_state = [kind, torch.from_numpy(keys.astype("int64")), int(position), int(has_gauss), float(gauss)]
    states = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    import random

    import numpy

    if "python" in states:
        random.setstate(_as_python_state(states["python"]))
    if "numpy" in states:
        kind, keys, position, has_gauss, gauss = states["numpy"]
        numpy.random.set_state((kind, keys.numpy().astype("uint32"), position, has_gauss, gauss))
    if isinstance(states.get("torch"), torch.Tensor):
        torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available() and len(states["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(states["cuda"])


def _as_python_state(state: Any) -> tuple:
    version, internal, gauss = state  # a checkpoint round trip may turn the tuples into lists
    return (version, tuple(internal), gauss)


class DataModule(L.LightningDataModule):
    """train / validation / test loaders of a built-in dataset; the training order is seeded. ``make_loader``
    is the catalog's loader factory (``lowbit.pipeline.catalog.make_loader``), given by the caller so that
    this floor imports nothing from the pipeline above it."""

    def __init__(self, dataset: str, batch_size: int, *, make_loader: Any, seed: int = 0, num_workers: int = 0) -> None:
        super().__init__()
        self.dataset, self.batch_size, self.seed, self.num_workers = dataset, batch_size, seed, num_workers
        self.make_loader = make_loader

        self.shuffle_generator: torch.Generator | None = None  # the training order's random stream
        self.restored_shuffle_state: torch.Tensor | None = None

    def _loader(self, split: str, shuffle: bool = False):
        return self.make_loader(self.dataset, split, self.batch_size, shuffle=shuffle, seed=self.seed,
                           num_workers=self.num_workers)  # fmt: skip

    def train_dataloader(self):
        loader = self._loader("train", shuffle=True)
        self.shuffle_generator = getattr(loader, "generator", None)
        if self.shuffle_generator is not None and self.restored_shuffle_state is not None:
            self.shuffle_generator.set_state(self.restored_shuffle_state)  # resumed: the next epoch's order
        return loader

    def state_dict(self) -> dict[str, Any]:
        """Saved in each checkpoint: where the training order's random stream stands."""
        generator = self.shuffle_generator
        return {} if generator is None else {"shuffle_generator": generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if isinstance(state.get("shuffle_generator"), torch.Tensor):
            self.restored_shuffle_state = state["shuffle_generator"]

    def val_dataloader(self):
        return self._loader("validation")

    def test_dataloader(self):
        return self._loader("test")


__all__ = ["ClassifierModule", "DataModule", "OPTIMIZERS"]
