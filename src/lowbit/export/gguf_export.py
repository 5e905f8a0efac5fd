"""``lowbit.export_gguf(model, path, tokenizer=None)``: a Hugging Face Llama-architecture causal LM as the GGUF
file llama.cpp's converter would write, with every quantized Linear in the ggml type that holds its values.

What goes where (docs/storage.md has the table):

- ``GGMLLinear`` (the ``gguf_*`` recipes: Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K; ``lowbit.load_gguf``): its block
  bytes as they are; a simulated ``QuantLinear`` whose only format is a gguf_* weight: the same codes.
- ``Int4WeightOnlyLinear`` with group 32: Q4_0 where every q - zero_point lies in -8..7 (zero point 8, or
  the symmetric recipe's 7) and the scales are float16 values,
  else Q4_1 (d = scale, m = -zero_point * scale) where float16 holds d and m exactly; ``Int8WeightOnlyLinear``:
  Q8_0 where every per-channel scale is a float16 value. Each candidate is checked: its dequantized weight
  must equal the module's bit for bit, or nothing is written.
- Every other quantized layer (another group size, bfloat16 / float32 scales float16 cannot hold, quantized
  activations, other formats) raises :class:`~lowbit.errors.FormatError` naming the layer and the recipe that
  would fit.
- Float weights stay float: F16 for float16 tensors, F32 otherwise (bfloat16 values are float32 values).

Names come from the ``gguf`` package's tensor-name map; Q and K rows are put in llama.cpp's order (its
``permute``, see ``gguf_names``); a tied ``lm_head`` writes no ``output.weight`` (llama.cpp then reads the
token embedding). The file is written beside ``path`` and renamed over it once complete (``_io.atomic_file``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from lowbit._io import atomic_file
from lowbit.errors import ConfigError, FormatError
from lowbit.export.gguf_names import _gguf, architecture_enum, file_rows

ARCHITECTURES = {"llama": "llama"}  # Hugging Face model_type -> GGUF architecture
FIT = ("quantize it with 'gguf_q4_0' / 'gguf_q4_1' / 'gguf_q4_k' (4-bit), 'gguf_q5_0', 'gguf_q6_k' or 'gguf_q8_0' "
       "(8-bit) (lowbit.quantize_(model, ...)), or int4_weight_only with group_size=32, scale_dtype='f16' and "
       "symmetric=True (Q4_0)")  # fmt: skip


def export_gguf(model: nn.Module, path: str | os.PathLike, tokenizer: Any = None, *,
                tokenizer_pre: str = "default") -> dict[str, Any]:  # fmt: skip
    """Write ``model`` (and ``tokenizer``'s vocabulary, when given) as a GGUF file; returns what was written
    (tensor name -> GGML type name)."""
    gguf = _gguf()
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in ARCHITECTURES:
        raise ConfigError(f"export_gguf writes the llama architecture (model_type 'llama'); this model's "
                          f"model_type is {model_type!r}")  # fmt: skip
    architecture = ARCHITECTURES[model_type]
    tensors = list(_tensors(model, config, architecture))
    types = {name: (raw_type.name if raw_type is not None else _float_type(array)) for name, array, raw_type in tensors}
    with atomic_file(path) as temporary:
        writer = gguf.GGUFWriter(str(temporary), architecture)
        _metadata(writer, config, types, Path(path).stem)
        if tokenizer is not None:
            _write_vocabulary(writer, tokenizer, tokenizer_pre)
        for name, array, raw_type in tensors:
            writer.add_tensor(name, array, raw_dtype=raw_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return types


def _write_vocabulary(writer, tokenizer: Any, tokenizer_pre: str) -> None:
    """A Hugging Face fast tokenizer's vocabulary as llama.cpp's converter writes it: a byte-level BPE (GPT-2
    style: Llama 3, SmolLM2, Qwen) as tokenizer model "gpt2" with tokens by id, their types (control for special
    added tokens) and merges; a byte-fallback BPE (SentencePiece-converted: Llama 2, Mistral, TinyLlama) as
    model "llama" with the gguf package's own ``LlamaHfVocab`` tokens, scores and types (the converter's
    ``_set_vocab_llama_hf``), merges kept for readers that rebuild the BPE; then special ids and the chat
    template (``SpecialVocab``). Other tokenizers: ConfigError."""
    import tempfile

    gguf = _gguf()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    model_kind = type(backend.model).__name__ if backend is not None else type(tokenizer).__name__
    if model_kind != "BPE":
        raise ConfigError(f"export_gguf writes BPE tokenizers (byte-level or byte-fallback) only; this one is "
                          f"{model_kind} (export without tokenizer=)")  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        tokenizer.save_pretrained(folder)
        if getattr(backend.model, "byte_fallback", False):
            size = _write_llama_vocabulary(writer, gguf, Path(folder))
        else:
            size = _write_byte_level_vocabulary(writer, gguf, tokenizer, tokenizer_pre)
        gguf.SpecialVocab(folder, load_merges=True, n_vocab=size).add_to_gguf(writer)


def _write_byte_level_vocabulary(writer, gguf, tokenizer: Any, tokenizer_pre: str) -> int:
    vocabulary = tokenizer.get_vocab()
    size = max(vocabulary.values()) + 1
    by_id = {index: token for token, index in vocabulary.items()}
    special = {token.content for token in tokenizer.added_tokens_decoder.values() if token.special}
    tokens = [by_id.get(index, f"[PAD{index}]") for index in range(size)]
    kinds = [gguf.TokenType.CONTROL if token in special else
             gguf.TokenType.USER_DEFINED if index not in by_id else gguf.TokenType.NORMAL
             for index, token in enumerate(tokens)]  # fmt: skip
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(tokenizer_pre)
    writer.add_token_list(tokens)
    writer.add_token_types(kinds)
    return size


def _write_llama_vocabulary(writer, gguf, folder: Path) -> int:
    try:
        vocabulary = gguf.LlamaHfVocab(folder)
    except (FileNotFoundError, TypeError) as error:
        raise ConfigError(f"export_gguf: this byte-fallback tokenizer is not a SentencePiece-style Llama one "
                          f"({error}); export without tokenizer=") from None  # fmt: skip
    tokens, scores, kinds = zip(*vocabulary.all_tokens())
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(list(tokens))
    writer.add_token_scores(list(scores))
    writer.add_token_types(list(kinds))
    return len(tokens)


def _float_type(array: np.ndarray) -> str:
    return "F16" if array.dtype == np.float16 else "F32"


def _float_array(tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.float16:
        return tensor.numpy()
    return tensor.float().numpy()


def _tensors(model: nn.Module, config: Any, architecture: str):
    """(GGUF name, numpy array, GGMLQuantizationType or None for a float array) for every tensor to write."""
    gguf = _gguf()
    layers = int(config.num_hidden_layers)
    name_map = gguf.get_tensor_name_map(architecture_enum(architecture), layers)
    embedding = model.get_input_embeddings()
    done: set[str] = set()
    for module_name, module in model.named_modules():
        if any(module_name.startswith(f"{prefix}.") for prefix in done):
            continue
        if _is_linear(module):
            done.add(module_name)
            if module_name == "lm_head" and getattr(module, "weight", None) is embedding.weight:
                continue  # tied: llama.cpp reads token_embd
            gguf_name = _mapped(name_map, module_name)
            yield from _linear_tensors(module_name, module, gguf_name, architecture, config)
            continue
        for parameter_name, parameter in module.named_parameters(recurse=False):
            yield f"{_mapped(name_map, module_name)}.{parameter_name}", _float_array(parameter), None


def _mapped(name_map, module_name: str) -> str:
    found = name_map.get_name(module_name)
    if found is None:
        raise FormatError(f"export_gguf: {module_name!r} has no GGUF tensor name in llama.cpp's llama layout")
    return found


def _is_linear(module: nn.Module) -> bool:
    from lowbit.nn.modules import QuantModule
    from lowbit.ops import REAL_MODULES

    return isinstance(module, (nn.Linear, QuantModule, *REAL_MODULES.values())) and hasattr(module, "in_features")


def _linear_tensors(module_name: str, module: nn.Module, gguf_name: str, architecture: str, config: Any):
    from lowbit.ops.ggml import GGML_TYPES, ggml_block_bytes

    order = file_rows(f"{gguf_name}.weight", module.out_features, architecture, config)
    held = ggml_module(module_name, module)
    if held is None:  # a float Linear
        weight = _float_array(module.weight)
        yield f"{gguf_name}.weight", weight if order is None else weight[order], None
    else:
        data = ggml_block_bytes(held)
        raw_type = _gguf().GGMLQuantizationType[held.ggml_type.upper()]
        assert held.ggml_type in GGML_TYPES
        yield f"{gguf_name}.weight", np.ascontiguousarray(data if order is None else data[order]), raw_type
    bias = getattr(module, "bias", None)
    if bias is not None:
        bias = _float_array(bias)
        yield f"{gguf_name}.bias", bias if order is None else bias[order], None


def ggml_module(module_name: str, module: nn.Module):
    """The GGMLLinear holding ``module``'s weight exactly, None for a float nn.Linear; FormatError naming the
    layer (and the recipe that would fit) when no ggml type holds it."""
    from lowbit.nn.modules import QuantModule
    from lowbit.ops import GGMLLinear, Int4WeightOnlyLinear, Int8WeightOnlyLinear

    if isinstance(module, GGMLLinear):
        return module
    if isinstance(module, QuantModule):
        return _from_simulated(module_name, module)
    if type(module) is nn.Linear:
        return None
    candidates = []
    if isinstance(module, Int4WeightOnlyLinear) and module.group_size == 32:
        candidates = _int4_candidates(module)
    elif isinstance(module, Int8WeightOnlyLinear) and module.in_features % 32 == 0:
        candidates = _int8_candidates(module)
    for candidate in candidates:
        if _same_bits(candidate.dequantize_weight(), module.dequantized_weight()):
            return candidate
    detail = module.extra_repr() if hasattr(module, "extra_repr") else type(module).__name__
    raise FormatError(f"export_gguf: layer {module_name!r} ({type(module).__name__}: {detail}) has no ggml type that "
                      f"holds its values exactly; {FIT}")  # fmt: skip


def _from_simulated(module_name: str, module) -> Any:
    from lowbit.ops.from_fake import convert_quant_linear
    from lowbit.ops.ggml import GGMLLinear

    weight = module.formats.weight
    if weight is not None and weight.format_name.startswith("gguf_"):
        new, reason = convert_quant_linear(module)
        if isinstance(new, GGMLLinear):
            return new
        raise FormatError(f"export_gguf: layer {module_name!r}: {reason}; GGUF layers are weight-only")
    raise FormatError(f"export_gguf: layer {module_name!r} is simulated ({module.formats.describe()}); no ggml type "
                      f"holds it; {FIT}")  # fmt: skip


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.float().view(torch.int32), b.float().view(torch.int32))


def _int4_candidates(module) -> list:
    from lowbit.ops.ggml import GGMLLinear

    codes = module.codes()
    scale = module.weight_scale.float()
    if module.float_zero:  # q * scale + minimum: Q4_1 where float16 holds both
        return [_built(GGMLLinear, module, "q4_1", codes, scale.half(), module.weight_min.half())]
    zero_point = module.weight_zero_point.float()
    out = []
    signed = module.signed_codes()  # q - zero_point in -8..7: Q4_0's d * (q' - 8) with q' = q - zero_point + 8
    if signed is not None:
        out.append(_built(GGMLLinear, module, "q4_0", signed.to(torch.int16) + 8, scale.half()))
    out.append(_built(GGMLLinear, module, "q4_1", codes, scale.half(), (-zero_point * scale).half()))
    return out


def _int8_candidates(module) -> list:
    from lowbit.ops.ggml import GGMLLinear

    scale = module.weight_scale.float().reshape(-1, 1).expand(-1, module.in_features // 32)
    return [_built(GGMLLinear, module, "q8_0", module.weight_codes, scale.half())]


def _built(cls, module, ggml_type: str, codes, scale, minimum=None):
    new = cls(module.in_features, module.out_features, module.bias is not None, ggml_type)
    if module.bias is not None:
        new.bias.copy_(module.bias)
    return new.set_fields(codes.cpu(), scale.cpu(), None if minimum is None else minimum.cpu())


def _rope_theta(config: Any) -> float | None:
    parameters = getattr(config, "rope_parameters", None) or {}
    return parameters.get("rope_theta", getattr(config, "rope_theta", None))


def _metadata(writer, config: Any, types: dict[str, str], name: str) -> None:
    gguf = _gguf()
    heads = int(config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    writer.add_name(name)
    writer.add_block_count(int(config.num_hidden_layers))
    writer.add_context_length(int(config.max_position_embeddings))
    writer.add_embedding_length(int(config.hidden_size))
    writer.add_feed_forward_length(int(config.intermediate_size))
    writer.add_head_count(heads)
    writer.add_head_count_kv(int(getattr(config, "num_key_value_heads", None) or heads))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(int(config.vocab_size))
    writer.add_rope_dimension_count(int(head_dim))
    if _rope_theta(config) is not None:
        writer.add_rope_freq_base(float(_rope_theta(config)))
    writer.add_file_type(_file_type(gguf, types))


def _file_type(gguf, types: dict[str, str]) -> int:
    """llama.cpp's general.file_type: the type of most Linear weights (as its converter's --outtype)."""
    counts: dict[str, int] = {}
    for name, kind in types.items():
        if name.endswith(".weight") and name.startswith("blk."):
            counts[kind] = counts.get(kind, 0) + 1
    main = max(counts, key=counts.get) if counts else "F32"
    table = {"F32": "ALL_F32", "F16": "MOSTLY_F16", "Q4_0": "MOSTLY_Q4_0", "Q4_1": "MOSTLY_Q4_1", "Q5_0": "MOSTLY_Q5_0",
             "Q8_0": "MOSTLY_Q8_0", "Q4_K": "MOSTLY_Q4_K_S", "Q6_K": "MOSTLY_Q6_K"}  # fmt: skip
    return int(gguf.LlamaFileType[table[main]])
