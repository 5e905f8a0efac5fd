"""Trial evaluation: the task metric on a fixed subset, with every (layer, formats) quantized module built
once per process and reused, so a layer's weight in a given format is quantized once (the module's weight
cache keeps it while evaluating under ``torch.no_grad``).

Classification: accuracy and loss on the first ``num_samples`` samples of the chosen split. Embedding
(MiniLM): mean / min cosine of each sentence's mean-pooled embedding to the float model's, computed once.
"""

from __future__ import annotations

import copy
import json
import threading
from typing import Any

import torch
from torch import nn

from lowbit.errors import LowbitError
from lowbit.graph.select import swappable_modules
from lowbit.graph.plan import Ready, Simulated, apply, build
from lowbit.nn.roles import RoleFormats


class Evaluator:
    """Runs a plan (layer -> formats or None) on a working copy of ``root`` and measures the task metric."""

    def __init__(self, root: nn.Module, task: str, inputs: Any, labels: torch.Tensor | None = None,
                 batch_size: int = 256) -> None:  # fmt: skip
        self.task, self.inputs, self.labels, self.batch_size = task, inputs, labels, batch_size
        self.work = copy.deepcopy(root).eval()
        self.float_modules = {name: module for name, module, _ in swappable_modules(self.work)}
        self.ops = {name: op for name, _, op in swappable_modules(self.work)}
        self.modules: dict[tuple[str, str], nn.Module] = {}
        self.lock = threading.Lock()  # Optuna's n_jobs threads share the working copy
        self.reference = self._embed(self.work) if task == "embedding" else None
        self.cache_hits = self.cache_misses = 0

    def quantized_module(self, name: str, formats: RoleFormats) -> nn.Module:
        key = (name, json.dumps(formats.to_dict(), sort_keys=True))
        module = self.modules.get(key)
        if module is None:
            self.cache_misses += 1
            module = build(self.float_modules[name], Simulated(formats, self.ops[name]), name).eval()
            self.modules[key] = module
        else:
            self.cache_hits += 1
        return module

    @torch.no_grad()
    def evaluate(self, plan: dict[str, RoleFormats | None]) -> dict[str, float]:
        with self.lock:
            apply(self.work, {name: Ready(float_module if plan.get(name) is None
                                          else self.quantized_module(name, plan[name]))
                              for name, float_module in self.float_modules.items()})  # fmt: skip
            if self.task == "embedding":
                return self._cosines(self._embed(self.work))
            return self._classify()

    def _classify(self) -> dict[str, float]:
        correct, loss = 0, 0.0
        for start in range(0, len(self.labels), self.batch_size):
            x, y = self.inputs[start:start + self.batch_size], self.labels[start:start + self.batch_size]
            logits = self.work(x)
            if not torch.isfinite(logits).all():
                return {"accuracy": 0.0, "loss": float("inf")}
            correct += int((logits.argmax(-1) == y).sum())
            loss += float(nn.functional.cross_entropy(logits.float(), y, reduction="sum"))
        return {"accuracy": correct / len(self.labels), "loss": loss / len(self.labels)}

    def _embed(self, model: nn.Module) -> torch.Tensor:
        states = model(**self.inputs).last_hidden_state
        mask = self.inputs["attention_mask"].unsqueeze(-1).to(states.dtype)
        pooled = (states * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
        return nn.functional.normalize(pooled.float(), dim=-1)

    def _cosines(self, embeddings: torch.Tensor) -> dict[str, float]:
        cosine = torch.nan_to_num((embeddings * self.reference).sum(-1), nan=-1.0)
        return {"mean_cosine": float(cosine.mean()), "min_cosine": float(cosine.min())}


def fixed_subset(dataset: Any, num_samples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``num_samples`` (x, label) pairs of a dataset, stacked."""
    count = min(num_samples, len(dataset))
    if count == 0:
        raise LowbitError("the evaluation split is empty")
    pairs = [dataset[i] for i in range(count)]
    return torch.stack([p[0] for p in pairs]), torch.stack([torch.as_tensor(p[1]) for p in pairs])


def tokenized(sentences: list[str], tokenizer: Any) -> dict[str, torch.Tensor]:
    return dict(tokenizer(sentences, padding=True, truncation=True, max_length=128, return_tensors="pt"))


__all__ = ["Evaluator", "fixed_subset", "tokenized"]
