"""toy_tiny: MASE's smallest dataset, as seed 002 used it (the Aug-2023 version).

Each sample is 4 values drawn uniformly from [-5, 5), shaped (1, 2, 2) as a one-channel 2x2 image; the
label is 1 when the 4 values sum to more than 0, else 0. Each split has 512 samples drawn from its own
fixed NumPy ``RandomState`` seed (train 0, validation 1, test 2), so every run sees the same data. The
label is decided on the float64 draws before they are stored as float32, as MASE did. (MASE moved to 10240
samples from [-1, 1) in Sept. 2023; this is the earlier data, whose statistics seed 002 shows.)
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import TensorDataset

from lowbit.errors import ConfigError, did_you_mean

SEEDS = {"train": 0, "validation": 1, "test": 2}
ALIASES = {"val": "validation"}  # MASE 2023 called the validation split "val"
SAMPLES_PER_SPLIT = 512
IMAGE_SIZE, NUM_CLASSES = (1, 2, 2), 2


def toy_tiny(split: str, n: int | None = None) -> TensorDataset:
    """One split as a TensorDataset of (x float32 [N, 1, 2, 2], y int64 [N]).

    ``n`` (default 512) draws more or fewer samples from the same stream: a smaller ``n`` gives a prefix
    of the larger one.
    """
    split = ALIASES.get(split, split)
    if split not in SEEDS:
        names = [*SEEDS, *ALIASES]
        raise ConfigError(f"unknown toy_tiny split {split!r}{did_you_mean(str(split), names)}; "
                          f"splits: {', '.join(SEEDS)}")  # fmt: skip
    if n is None:
        n = SAMPLES_PER_SPLIT
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"toy_tiny: n must be a positive integer, got {n!r}")
    draws = (np.random.RandomState(SEEDS[split]).rand(n, 4) - 0.5) * 10  # [n, 4] float64 in [-5, 5)
    labels = (draws.sum(axis=1) > 0).astype(np.int64)
    images = draws.astype(np.float32).reshape(n, *IMAGE_SIZE)
    return TensorDataset(torch.from_numpy(images), torch.from_numpy(labels))


__all__ = ["IMAGE_SIZE", "NUM_CLASSES", "SAMPLES_PER_SPLIT", "toy_tiny"]
