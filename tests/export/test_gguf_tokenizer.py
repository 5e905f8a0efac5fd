"""export_gguf's tokenizer= path, read back by the gguf package's reader and by transformers' own GGUF tokenizer
converter (through load_gguf): a byte-level BPE (GPT-2 style, model "gpt2") and a byte-fallback BPE
(SentencePiece-converted Llama style, model "llama"), both built here from a few pieces, no download."""

from __future__ import annotations

import pytest
import torch

import lowbit
from lowbit.errors import ConfigError

gguf = pytest.importorskip("gguf", reason="the gguf package (llama.cpp's Python side) is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
tokenizers = pytest.importorskip("tokenizers", reason="the tokenizers package is not installed")

SENTENCES = ["the cat sat on the hat", "hello world, the cat", "tab\there ünïcödé 🐱", "a"]


def _byte_level():
    from tokenizers import decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    pieces = sorted(alphabet) + ["Ġt", "he", "Ġthe", "Ġc", "at", "Ġcat", "ll", "Ġh"]
    vocabulary = {piece: index for index, piece in enumerate(pieces)}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "c"), ("a", "t"), ("Ġc", "at"), ("l", "l"), ("Ġ", "h")]
    tokenizer = tokenizers.Tokenizer(models.BPE(vocab=vocabulary, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(["<|endoftext|>"])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>",
                                                bos_token="<|endoftext|>")  # fmt: skip


def _byte_fallback():
    from tokenizers import decoders, models, normalizers

    pieces = ["<unk>", "<s>", "</s>", *[f"<0x{i:02X}>" for i in range(256)], "▁", "a", "c", "e", "h", "l", "o", "t",
              "w", "r", "s", "n", "▁t", "he", "▁the", "▁c", "at", "▁cat", "ll"]  # fmt: skip
    vocabulary = {piece: index for index, piece in enumerate(pieces)}
    merges = [("▁", "t"), ("h", "e"), ("▁t", "he"), ("▁", "c"), ("a", "t"), ("▁c", "at"), ("l", "l")]
    tokenizer = tokenizers.Tokenizer(models.BPE(vocab=vocabulary, merges=merges, unk_token="<unk>", byte_fallback=True,
                                                fuse_unk=True))  # fmt: skip
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                           decoders.Strip(" ", 1, 0)])  # fmt: skip
    return transformers.LlamaTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                           unk_token="<unk>")  # fmt: skip


def _model(vocabulary_size: int, bos: int, eos: int):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=vocabulary_size, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64, bos_token_id=bos, eos_token_id=eos)  # fmt: skip
    return lowbit.quantize_(transformers.LlamaForCausalLM(config).eval(), "gguf_q8_0")


def _field(reader, key: str):
    field = reader.fields[key]
    return field.contents()


@pytest.mark.parametrize(("build", "kind"), [(_byte_level, "gpt2"), (_byte_fallback, "llama")])
def test_vocabulary_round_trips_through_transformers_gguf_reader(tmp_path, build, kind):
    tokenizer = build()
    vocabulary = tokenizer.get_vocab()
    model = _model(len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id)
    lowbit.export_gguf(model, tmp_path / "t.gguf", tokenizer=tokenizer)
    reader = gguf.GGUFReader(str(tmp_path / "t.gguf"))
    assert _field(reader, "tokenizer.ggml.model") == kind
    tokens = _field(reader, "tokenizer.ggml.tokens")
    assert tokens == [piece for piece, _ in sorted(vocabulary.items(), key=lambda item: item[1])]
    assert _field(reader, "tokenizer.ggml.eos_token_id") == tokenizer.eos_token_id
    types = _field(reader, "tokenizer.ggml.token_type")
    assert types[tokenizer.eos_token_id] == gguf.TokenType.CONTROL
    if kind == "llama":
        assert types[vocabulary["<0x41>"]] == gguf.TokenType.BYTE
        assert len(_field(reader, "tokenizer.ggml.scores")) == len(tokens)
    read_back, loaded = lowbit.load_gguf(tmp_path / "t.gguf")
    for sentence in SENTENCES:
        expected = tokenizer(sentence, add_special_tokens=False).input_ids
        assert read_back(sentence, add_special_tokens=False).input_ids == expected, sentence
        assert read_back.decode(expected) == tokenizer.decode(expected)
    ids = torch.tensor([tokenizer(SENTENCES[0]).input_ids])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_other_tokenizer_models_are_refused_in_one_line(tmp_path):
    from tokenizers import models

    unigram = tokenizers.Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0), ("b", -2.0)], unk_id=0))
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=unigram, unk_token="<unk>")
    target = tmp_path / "u.gguf"
    with pytest.raises(ConfigError, match="Unigram"):
        lowbit.export_gguf(_model(3, 0, 0), target, tokenizer=tokenizer)
    assert not target.exists()
