"""Evaluation on a built-in dataset's test split: accuracy and loss for classifiers; for an embedding
model (MiniLM), the cosine of each sentence embedding to the float model's (mean and min); for a causal LM
(SmolLM2 on wikipedia), the perplexity of the first ``windows`` test windows (:func:`lowbit.perplexity`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lowbit.errors import LowbitError
from lowbit.pipeline.catalog import make_loader
from lowbit.pipeline.progress import progress, waiting


@torch.no_grad()
def evaluate(model: nn.Module, options: Any, split: str = "test") -> dict[str, float]:
    if options["task"] == "embedding":
        return _embedding_metrics(model)
    if options["task"] == "language_modeling":
        return _language_metrics(model, options, split)
    loader = make_loader(options["dataset"], split, options["batch_size"], num_workers=options["num_workers"])
    was_training = model.training
    model.eval()
    correct = total = 0
    loss_sum = 0.0
    try:
        for x, y in progress(loader, f"testing on {split}", enabled=options["progress"]):
            logits = model(x)
            if not torch.isfinite(logits).all():
                raise LowbitError("the model produced NaN or Inf outputs on the test data")
            loss_sum += float(nn.functional.cross_entropy(logits, y, reduction="sum"))
            correct += int((logits.argmax(dim=-1) == y).sum())
            total += len(y)
    finally:
        model.train(was_training)
    return {"accuracy": correct / total, "loss": loss_sum / total, "samples": total}


def _embedding_metrics(model: nn.Module) -> dict[str, float]:
    from lowbit.models.minilm import embed, load_minilm
    from lowbit.models.sentences import SENTENCES

    with waiting("embedding the test sentences with the model and with fp32 MiniLM", slow=False):
        tokenizer, reference = load_minilm()
        sentences = list(SENTENCES)
        cosine = (embed(model.eval(), tokenizer, sentences) * embed(reference, tokenizer, sentences)).sum(-1)
    return {"mean_cosine": float(cosine.mean()), "min_cosine": float(cosine.min()), "samples": len(sentences)}


def _language_metrics(model: nn.Module, options: Any, split: str) -> dict[str, float]:
    from lowbit.models.causal_lm import perplexity
    from lowbit.pipeline.catalog import WINDOW_TOKENS, get_split

    windows = get_split(options["dataset"], split).windows  # [n, WINDOW_TOKENS]
    count = min(options["windows"], windows.shape[0])
    with waiting(f"perplexity over {count} {split} windows of {WINDOW_TOKENS} tokens", slow=False):
        value = perplexity(model, windows[:count].reshape(-1), WINDOW_TOKENS, count, batch_size=options["batch_size"])
    return {"perplexity": value, "windows": count, "tokens_per_window": WINDOW_TOKENS}


__all__ = ["evaluate"]
