"""Issue 46's goals on the real model: SmolLM2 quantized by lowbit, written as GGUF and as compressed-tensors, read
back by the owners' code, every Linear weight compared bit for bit; the compressed-tensors folder loaded by
transformers (compressed-tensors installed) and its logits compared with lowbit's model; the GGUF file read back
by lowbit.load_gguf (the same buffers).

Run: HF_HUB_OFFLINE=1 PYTHONPATH=src python benchmarks/export_smollm2.py [--tokens 128]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import tempfile

import numpy as np
import torch

import lowbit
from lowbit.models.smollm2 import load_smollm2
from lowbit.ops import GGMLLinear, Int4WeightOnlyLinear, Int8DynamicLinear

GGUF_RECIPES = {"gguf_q4_k": {}, "gguf_q6_k": {}, "gguf_q4_0": {}, "gguf_q8_0": {},
                "int4_weight_only g32 f16 symmetric (as Q4_0)": {"recipe": "int4_weight_only", "group_size": 32,
                                                                 "scale_dtype": "f16", "symmetric": True}}  # fmt: skip
CT_RECIPES = {"int4_weight_only g64 (pack-quantized)": {"recipe": "int4_weight_only", "group_size": 64},
              "int4_weight_only g64 symmetric (pack-quantized, symmetric)":
                  {"recipe": "int4_weight_only", "group_size": 64, "symmetric": True},
              "int8_dynamic (int-quantized)": {"recipe": "int8_dynamic"}}  # fmt: skip


def quantized(base, label: str, options: dict):
    options = dict(options)
    recipe = options.pop("recipe", label)
    return lowbit.quantize_(copy.deepcopy(base), recipe, **options)


def expected_weight(module) -> torch.Tensor:
    if isinstance(module, Int8DynamicLinear):
        return module.weight_codes.float() * module.weight_scale.reshape(-1, 1)
    return module.dequantized_weight() if hasattr(module, "dequantized_weight") else module.dequantize_weight()


def check_gguf(base, tokenizer, label: str, options: dict, folder: str) -> None:
    import gguf
    from gguf.quants import dequantize
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    from lowbit.export.gguf_names import linear_tensor_names

    model = quantized(base, label, options)
    path = os.path.join(folder, "model.gguf")
    written = lowbit.export_gguf(model, path, tokenizer=tokenizer, tokenizer_pre="smollm")
    tensors = {tensor.name: tensor for tensor in gguf.GGUFReader(path).tensors}
    config = model.config
    processor = LlamaTensorProcessor(config={"num_attention_heads": config.num_attention_heads,
                                             "num_key_value_heads": config.num_key_value_heads})  # fmt: skip
    names = linear_tensor_names(model, "llama", config.num_hidden_layers)
    same = checked = 0
    for module_name, tensor_name in names.items():
        module = model.get_submodule(module_name)
        if tensor_name not in tensors or not isinstance(module, (GGMLLinear, Int4WeightOnlyLinear)):
            continue
        tensor = tensors[tensor_name]
        values = dequantize(tensor.data, tensor.tensor_type).reshape(tensor.data.shape[0], -1)
        values = processor.process(values, tensor_name).weights
        checked += 1
        same += bool(np.array_equal(values.view(np.uint32), expected_weight(module).numpy().view(np.uint32)))
    _, loaded = lowbit.load_gguf(path)
    ours = dict(model.named_modules())
    buffers = all(torch.equal(value, ours[name].state_dict()[key]) if isinstance(ours[name], GGMLLinear) else True
                  for name, module in loaded.named_modules() if isinstance(module, GGMLLinear)
                  for key, value in module.state_dict().items())  # fmt: skip
    kinds = sorted({kind for kind in written.values() if kind not in ("F32", "F16")})
    print(f"GGUF {label}: {'/'.join(kinds)}; {same} of {checked} Linear weights bit for bit through gguf's reader; "
          f"load_gguf buffers equal {buffers}")  # fmt: skip


def _decompressed(folder: str, name: str) -> torch.Tensor:
    from compressed_tensors.compressors.naive_quantized.base import IntQuantizationCompressor
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationConfig
    from safetensors import safe_open

    compressors = {"pack-quantized": PackedQuantizationCompressor, "int-quantized": IntQuantizationCompressor}
    with open(os.path.join(folder, "config.json")) as handle:
        parsed = QuantizationConfig.model_validate(json.load(handle)["quantization_config"])
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as state:
        local = {key[len(name) + 1:]: state.get_tensor(key) for key in state.keys() if key.startswith(f"{name}.")}
    target = "re:^" + name.replace(".", r"\.") + "$"
    group = next(group for group in parsed.config_groups.values() if target in group.targets)
    return compressors[group.format].decompress(local, group)["weight"]


def check_compressed_tensors(base, tokenizer, label: str, options: dict, folder: str, ids: torch.Tensor) -> None:
    from transformers import AutoModelForCausalLM

    model = quantized(base, label, options)
    target = os.path.join(folder, "ckpt")
    lowbit.export_compressed_tensors(model, target)
    layers = [(name, module) for name, module in model.named_modules() if isinstance(module, (Int4WeightOnlyLinear,
                                                                                               Int8DynamicLinear))]  # fmt: skip
    same = sum(torch.equal(_decompressed(target, name).float().view(torch.int32), expected_weight(module).view(torch.int32))
               for name, module in layers)  # fmt: skip
    line = f"compressed-tensors {label}: {same} of {len(layers)} Linear weights bit for bit through its decompressor"
    try:
        loaded = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    except Exception as error:  # noqa: BLE001 - a benchmark reports what the peer did
        print(f"{line}; transformers could not load the folder: {type(error).__name__}: {str(error)[:200]}")
        return
    with torch.inference_mode():
        theirs, ours = loaded(ids).logits, model(ids).logits
    relative = float((theirs - ours).abs().max() / ours.abs().max())
    agree = float((theirs.argmax(-1) == ours.argmax(-1)).float().mean())
    print(f"{line}; transformers loads it ({type(loaded).__name__}): max |logit diff| / max |logit| {relative:.2e}, "
          f"next-token agreement {agree:.3f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    tokenizer, base = load_smollm2()
    ids = tokenizer(" ".join(["The history of the city begins with a small settlement by the river."] * 8),
                    return_tensors="pt").input_ids[:, : args.tokens]  # fmt: skip
    for label, options in GGUF_RECIPES.items():
        with tempfile.TemporaryDirectory() as folder:
            check_gguf(base, tokenizer, label, options, folder)
    for label, options in CT_RECIPES.items():
        with tempfile.TemporaryDirectory() as folder:
            base.config.save_pretrained(folder)
            check_compressed_tensors(base, tokenizer, label, options, folder, ids)


if __name__ == "__main__":
    main()
