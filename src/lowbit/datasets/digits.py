"""scikit-learn's handwritten digits (1797 images of 8x8 pixels, 10 classes), shipped inside scikit-learn:
nothing is downloaded. Pixels are scaled from 0..16 to [0, 1] and shaped (N, 1, 8, 8).

Splits are fixed: a stratified 70 / 15 / 15 split (train / validation / test) with seed 0, so every run
and every process sees the same images.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch.utils.data import TensorDataset

from lowbit.errors import ConfigError, LowbitError, did_you_mean

SPLITS = ("train", "validation", "test")


@functools.lru_cache(maxsize=1)
def _arrays() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError:
        raise LowbitError("the digits dataset needs scikit-learn: pip install 'lowbit[data]'") from None
    images, labels = load_digits(return_X_y=True)
    images = (images / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    train_x, rest_x, train_y, rest_y = train_test_split(images, labels, test_size=0.3, random_state=0, stratify=labels)
    val_x, test_x, val_y, test_y = train_test_split(rest_x, rest_y, test_size=0.5, random_state=0, stratify=rest_y)
    return {"train": (train_x, train_y), "validation": (val_x, val_y), "test": (test_x, test_y)}


def digits(split: str) -> TensorDataset:
    """One split as a TensorDataset of (images float32 [N, 1, 8, 8], labels int64 [N])."""
    if split not in SPLITS:
        raise ConfigError(f"unknown digits split {split!r}{did_you_mean(str(split), SPLITS)}; splits: {', '.join(SPLITS)}")
    images, labels = _arrays()[split]
    return TensorDataset(torch.from_numpy(images.copy()), torch.from_numpy(labels.astype(np.int64)))
