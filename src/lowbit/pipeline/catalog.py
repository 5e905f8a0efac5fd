"""Built-in models and datasets by name, as the ``lowbit`` commands and TOML configs refer to them.

=============  =====================================  ==========================
model          what                                   datasets
=============  =====================================  ==========================
toy            ToyNet (seed 002: 4 -> 100 -> 100 -> n) toy_tiny, digits
digits_mlp     DigitsMLP (64 -> 128 -> 64 -> 10)       digits
digits_cnn     DigitsCNN (two 3x3 convs, one linear)   digits
minilm         all-MiniLM-L6-v2 sentence encoder (hf)  sentences
smollm2        SmolLM2-135M-Instruct causal LM (llm)   wikipedia
=============  =====================================  ==========================

Classification datasets give (x, label) batches. ``sentences`` gives tokenized batches of the 40 built-in
sentences (dicts of input_ids / attention_mask); its metric is the cosine of the embeddings to fp32's.
``wikipedia`` gives windows of ``WINDOW_TOKENS`` tokens of the shortened English Wikipedia dump (dicts of
input_ids, [batch, WINDOW_TOKENS]), tokenized with the model's tokenizer; its metric is the perplexity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lowbit.errors import ConfigError, did_you_mean


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    image_size: tuple[int, ...] | None
    num_classes: int | None
    task: str  # "classification" or "embedding"


DATASETS = {
    "toy_tiny": DatasetInfo("toy_tiny", (1, 2, 2), 2, "classification"),
    "digits": DatasetInfo("digits", (1, 8, 8), 10, "classification"),
    "sentences": DatasetInfo("sentences", None, None, "embedding"),
    "wikipedia": DatasetInfo("wikipedia", None, None, "language_modeling"),
}
MODEL_DATASETS = {"toy": ("toy_tiny", "digits"), "digits_mlp": ("digits",), "digits_cnn": ("digits",),
                  "minilm": ("sentences",), "smollm2": ("wikipedia",)}  # fmt: skip
WINDOW_TOKENS = 512  # tokens per window of a language-modeling dataset (GPTQ's protocol uses 2048; 512 fits a CPU)


def canonical(name: Any, known: Any, what: str) -> str:
    key = str(name).strip().lower().replace("-", "_")
    if key not in known:
        raise ConfigError(f"unknown {what} {name!r}{did_you_mean(key, known)}; {what}s: {', '.join(known)}")
    return key


def dataset_info(name: str) -> DatasetInfo:
    return DATASETS[canonical(name, DATASETS, "dataset")]


def check_pair(model: Any, dataset: Any) -> tuple[str, str]:
    """Canonical (model, dataset) names; ConfigError if either is missing, unknown or they do not fit."""
    if model is None or dataset is None:
        missing = " and ".join(n for n, v in (("model", model), ("dataset", dataset)) if v is None)
        raise ConfigError(f"no {missing} given: name it on the command line or in the config "
                          f"(models: {', '.join(MODEL_DATASETS)}; datasets: {', '.join(DATASETS)})")  # fmt: skip
    model, dataset = canonical(model, MODEL_DATASETS, "model"), canonical(dataset, DATASETS, "dataset")
    if dataset not in MODEL_DATASETS[model]:
        raise ConfigError(f"model {model!r} does not take dataset {dataset!r}; it takes {', '.join(MODEL_DATASETS[model])}")
    return model, dataset


def build_model(model: str, dataset: str) -> nn.Module:
    """A freshly initialised built-in model for ``dataset`` (MiniLM: the pretrained encoder)."""
    from lowbit.models import DigitsCNN, DigitsMLP, ToyNet

    model, dataset = check_pair(model, dataset)
    info = DATASETS[dataset]
    builders: dict[str, Callable[[], nn.Module]] = {
        "toy": lambda: ToyNet(info.image_size, info.num_classes),
        "digits_mlp": DigitsMLP,
        "digits_cnn": DigitsCNN,
        "minilm": lambda: _minilm()[1],
        "smollm2": lambda: _smollm2()[1],
    }
    return builders[model]()


def _minilm():
    from lowbit.models.minilm import load_minilm

    return load_minilm()


def _smollm2():
    from lowbit.models.smollm2 import load_smollm2

    return load_smollm2()


class _TokenWindows(Dataset):
    """Windows of WINDOW_TOKENS tokens of one wikipedia split, tokenized with SmolLM2's tokenizer: one dict
    {"input_ids": [WINDOW_TOKENS]} per window."""

    def __init__(self, split: str) -> None:
        from lowbit.datasets.wikipedia import wikipedia_token_ids
        from lowbit.models.causal_lm import token_windows
        from lowbit.models.smollm2 import load_smollm2_tokenizer

        self.windows = token_windows(wikipedia_token_ids(load_smollm2_tokenizer(), split), WINDOW_TOKENS)

    def __len__(self) -> int:
        return self.windows.shape[0]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.windows[index]}


class _Sentences(Dataset):
    """Tokenized built-in sentences: one dict of 1-D tensors per sentence (padded to a common length)."""

    def __init__(self) -> None:
        from lowbit.models.minilm import load_minilm_tokenizer
        from lowbit.models.sentences import SENTENCES

        tokenizer = load_minilm_tokenizer()
        batch = tokenizer(list(SENTENCES), padding=True, truncation=True, max_length=128, return_tensors="pt")
        self.items = [{key: value[i] for key, value in batch.items()} for i in range(len(SENTENCES))]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.items[index]


def get_split(dataset: str, split: str) -> Dataset:
    """One split of a built-in dataset (``sentences`` has one set of sentences for every split)."""
    dataset = canonical(dataset, DATASETS, "dataset")
    if dataset == "sentences":
        return _Sentences()
    if dataset == "wikipedia":
        return _TokenWindows(split)
    from lowbit.datasets import get_dataset

    return get_dataset(dataset, split)


def make_loader(dataset: str, split: str, batch_size: int, *, shuffle: bool = False, seed: int = 0,
                num_workers: int = 0) -> DataLoader:  # fmt: skip
    generator = torch.Generator().manual_seed(seed) if shuffle else None
    return DataLoader(get_split(dataset, split), batch_size=batch_size, shuffle=shuffle, generator=generator,
                      num_workers=num_workers)  # fmt: skip


def model_inputs(batch: Any) -> Any:
    """The model's input from a loader batch: x of (x, label), or the whole dict of a tokenized batch."""
    if isinstance(batch, (tuple, list)):
        return batch[0]
    return batch


__all__ = ["DATASETS", "DatasetInfo", "MODEL_DATASETS", "WINDOW_TOKENS", "build_model", "check_pair", "dataset_info",
           "get_split", "make_loader", "model_inputs"]  # fmt: skip
