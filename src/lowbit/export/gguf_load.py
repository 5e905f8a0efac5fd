"""``lowbit.load_gguf(path) -> (tokenizer, model)``: a GGUF file as a Hugging Face causal LM whose Linear
layers hold the file's own ggml codes.

transformers reads the file (config, tokenizer, every tensor dequantized to float32 by ``gguf.quants``);
then each Linear whose tensor in the file is Q4_0 / Q4_1 / Q5_0 / Q8_0 / Q4_K / Q6_K becomes a :class:`~lowbit.ops.GGMLLinear`
built from the file's block bytes (read with ``gguf.GGUFReader``, rows put in transformers' order: see
``gguf_names``), so its ``dequantize_weight()`` is bit for bit the float32 weight transformers made. A tied
``lm_head`` (no ``output.weight`` in the file) takes the token embedding's blocks. Linear layers stored in
another type (Q2_K, Q3_K, Q5_K, IQ types, ...) stay the float32 weights transformers dequantized, with a warning
naming them; float tensors (F32 / F16 / BF16) stay float.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lowbit.errors import ConfigError, FormatError
from lowbit.export.gguf_names import PERMUTED_ARCHITECTURES, linear_tensor_names, model_rows
from lowbit.graph.plan import Ready, apply

HELD_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K")
FLOAT_TYPES = ("F32", "F16", "BF16", "F64")


def _read(path: Path):
    from gguf import GGUFReader

    if not path.is_file():
        raise ConfigError(f"load_gguf: {str(path)!r} is not a file")
    try:
        return GGUFReader(str(path))
    except (ValueError, OSError, KeyError) as error:
        raise FormatError(f"load_gguf: {str(path)!r} is not a readable GGUF file: {error}") from None


def _field(reader, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return None
    return field.contents() if hasattr(field, "contents") else field.parts[field.data[0]].tolist()[0]


def _hf_model(path: Path, with_tokenizer: bool):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(path.parent), path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name) if with_tokenizer else None
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    return tokenizer, model.eval()


def load_gguf(path: str | os.PathLike, compute_dtype: str | None = None) -> tuple[Any, nn.Module]:
    """(tokenizer, model) of the GGUF file at ``path`` (tokenizer None when the file has no vocabulary); see the
    module docstring. ``compute_dtype`` is GGMLLinear's option (None: the input's dtype)."""
    path = Path(path)
    reader = _read(path)
    architecture = _field(reader, "general.architecture")
    tokenizer, model = _hf_model(path, "tokenizer.ggml.model" in reader.fields)
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    layers = int(getattr(model.config, "num_hidden_layers", 0) or 0)
    names = linear_tensor_names(model, architecture, layers)
    if "output.weight" not in tensors and "token_embd.weight" in tensors:
        names = {name: ("token_embd.weight" if tensor == "output.weight" else tensor) for name, tensor in names.items()}
    converted, dequantized, plan = {}, {}, {}
    for module_name, tensor_name in names.items():
        tensor = tensors.get(tensor_name)
        if tensor is None:
            continue
        kind = tensor.tensor_type.name
        if kind in HELD_TYPES:
            module = model.get_submodule(module_name)
            plan[module_name] = Ready(_ggml_linear(module, tensor, kind, architecture, model.config, compute_dtype))
            converted[module_name] = kind
        elif kind not in FLOAT_TYPES:
            dequantized[module_name] = kind
    apply(model, plan)
    if dequantized:
        listed = ", ".join(f"{name} ({kind})" for name, kind in list(dequantized.items())[:4])
        warnings.warn(f"load_gguf: {len(dequantized)} Linear layer(s) are stored in GGUF types lowbit holds no module "
                      f"for; they are dequantized to float32: {listed}{' ...' if len(dequantized) > 4 else ''}",
                      stacklevel=2)  # fmt: skip
    model.lowbit_gguf = {"path": str(path), "architecture": architecture, "ggml": converted, "float": dequantized}
    return tokenizer, model


def _ggml_linear(module: nn.Module, tensor, kind: str, architecture: str, config: Any, compute_dtype: str | None):
    if not isinstance(module, nn.Linear):
        raise FormatError(f"load_gguf: {tensor.name} maps to a {type(module).__name__}, not an nn.Linear")
    bias = module.bias.detach() if module.bias is not None else None
    new = module_from_tensor(tensor, (module.out_features, module.in_features), architecture, config, bias, compute_dtype)
    return new.to(module.weight.device)


def module_from_tensor(tensor, shape: tuple[int, int], architecture: str, config: Any, bias: torch.Tensor | None = None,
                       compute_dtype: str | None = None):  # fmt: skip
    """The GGMLLinear of a GGUF reader's tensor of a held type for a [out, in] Hugging Face weight (rows in
    transformers' order)."""
    from lowbit.ops.ggml import from_block_bytes

    kind = tensor.tensor_type.name
    if kind not in HELD_TYPES:
        raise FormatError(f"{tensor.name}: GGUF type {kind} has no lowbit module (held: {', '.join(HELD_TYPES)})")
    data = tensor.data.reshape(shape[0], -1)
    order = model_rows(tensor.name, shape[0], architecture, config)
    if order is not None:
        data = data[order]
    return from_block_bytes(kind.lower(), data, shape, bias, compute_dtype)


__all__ = ["HELD_TYPES", "PERMUTED_ARCHITECTURES", "load_gguf", "module_from_tensor"]
