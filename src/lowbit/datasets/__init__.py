"""Small datasets that ship with lowbit or its dependencies (nothing is downloaded).

- :func:`toy_tiny` (``lowbit.datasets.toy``): MASE's 4-input toy classification data (seed 002).
- :func:`digits` (``lowbit.datasets.digits``): scikit-learn's 8x8 handwritten digits (needs scikit-learn,
  imported only when the data is first asked for).

``get_dataset(name, split)`` looks one up by name; MASE's spelling "toy-tiny" is accepted too.
"""

from __future__ import annotations

from torch.utils.data import TensorDataset

from lowbit.datasets.digits import digits
from lowbit.datasets.toy import toy_tiny
from lowbit.errors import ConfigError, did_you_mean

DATASETS = {"toy_tiny": toy_tiny, "digits": digits}


def get_dataset(name: str, split: str) -> TensorDataset:
    """The ``split`` of the dataset called ``name`` (case and "-" / "_" do not matter)."""
    key = str(name).strip().lower().replace("-", "_")
    if key not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}{did_you_mean(key, DATASETS)}; datasets: {', '.join(DATASETS)}")
    return DATASETS[key](split)


__all__ = ["DATASETS", "digits", "get_dataset", "toy_tiny"]
