"""lowbit.export_gguf read by llama.cpp itself (llama-cpp-python): SmolLM2 quantized by lowbit's gguf_* recipes,
written with its tokenizer, loaded and run by llama.cpp; against lowbit's own model on the same tokens:
llama.cpp's tokenization of a text with the exported vocabulary against its tokenization with the file
llama.cpp's own converter wrote (SmolLM2's shipped GGUF; transformers' tokenizer differs from both on runs of
newlines), next-token agreement, perplexity, logits (llama.cpp rounds activations to 8 bits for its quantized
dot products, so only the float file can agree closely).

llama.cpp is not a dependency of lowbit (it compiles llama.cpp from source): build it once beside the project,
e.g. ``python3 -m venv /tmp/lcpvenv && /tmp/lcpvenv/bin/pip install llama-cpp-python`` (about 10 minutes on 2
cores), then point ``--llama-cpp`` at that venv's site-packages (its ctypes binding needs only numpy).

``--peer``: lowbit's gguf_* quantizers against llama.cpp's own (``llama_model_quantize``, pure, of lowbit's float
export), both files scored by the same float32 code after ``lowbit.load_gguf``.

Run: HF_HUB_OFFLINE=1 PYTHONPATH=src python benchmarks/gguf_llama_cpp.py --llama-cpp \
  /tmp/lcpvenv/lib/python3.11/site-packages [--tokens 256] [--recipes float gguf_q8_0 gguf_q4_k] [--peer]
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import tempfile

import numpy as np
import torch

import lowbit
from lowbit.datasets.wikipedia import wikipedia_text
from lowbit.models.smollm2 import load_smollm2, smollm2_gguf


def lowbit_logits(model, ids: list[int]) -> np.ndarray:
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def llama_cpp_logits(llama_module, path: str, ids: list[int], threads: int) -> np.ndarray:
    llm = llama_module.Llama(model_path=path, n_ctx=len(ids) + 8, logits_all=True, verbose=False, n_threads=threads)
    llm.eval(ids)
    logits = np.array(llm.scores[: len(ids)], dtype=np.float32)
    llm.close()
    return logits


def perplexity(logits: np.ndarray, ids: list[int]) -> float:
    shifted = torch.from_numpy(logits[:-1])
    loss = torch.nn.functional.cross_entropy(shifted, torch.tensor(ids[1:]))
    return math.exp(float(loss))


FTYPES = {"gguf_q4_0": "Q4_0", "gguf_q4_1": "Q4_1", "gguf_q5_0": "Q5_0", "gguf_q8_0": "Q8_0", "gguf_q4_k": "Q4_K_S",
          "gguf_q6_k": "Q6_K"}  # fmt: skip


def llama_cpp_quantized(llama_module, float_path: str, recipe: str, threads: int) -> str:
    """llama.cpp's own quantizer on the exported float32 file: every block tensor in the recipe's type
    (``pure``, its own fallbacks for widths that are not whole super-blocks), the token embedding kept F32."""
    params = llama_module.llama_model_quantize_default_params()
    params.nthread, params.pure = threads, True
    params.ftype = getattr(llama_module, f"LLAMA_FTYPE_MOSTLY_{FTYPES[recipe]}")
    params.token_embedding_type = 0  # GGML_TYPE_F32
    out = float_path.replace(".gguf", f"-llama.cpp-{recipe}.gguf")
    if llama_module.llama_model_quantize(float_path.encode(), out.encode(), params) != 0:
        raise RuntimeError(f"llama.cpp could not quantize {float_path} to {FTYPES[recipe]}")
    return out


def peer_rows(llama_module, tokenizer, base, ids: list[int], recipes: list[str], folder: str, threads: int) -> None:
    """Perplexity of lowbit's gguf_* recipe against llama.cpp's quantizer of the same type, both files read by
    lowbit.load_gguf and scored by the same float32 model code (lm_head and embeddings float in both)."""
    float_path = os.path.join(folder, "float-for-peer.gguf")
    lowbit.export_gguf(base, float_path, tokenizer=tokenizer, tokenizer_pre="smollm")
    print(f"float32: ppl {perplexity(lowbit_logits(base, ids), ids):.3f}")
    for recipe in (name for name in recipes if name in FTYPES):
        ours = lowbit.quantize_(copy.deepcopy(base), recipe, skip=["lm_head"])
        peer_path = llama_cpp_quantized(llama_module, float_path, recipe, threads)
        _, theirs = lowbit.load_gguf(peer_path)
        types = sorted(set(theirs.lowbit_gguf["ggml"].values()))
        print(f"{recipe:10s} lowbit ppl {perplexity(lowbit_logits(ours, ids), ids):.3f}; llama.cpp's quantizer "
              f"({'/'.join(types)}) ppl {perplexity(lowbit_logits(theirs, ids), ids):.3f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--llama-cpp", required=True, help="site-packages folder holding llama_cpp")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--recipes", nargs="+", default=["float", "gguf_q8_0", "gguf_q6_k", "gguf_q4_k", "gguf_q4_0"])
    parser.add_argument("--peer", action="store_true", help="also lowbit's quantizers against llama.cpp's")
    args = parser.parse_args()
    sys.path.append(args.llama_cpp)
    import llama_cpp

    tokenizer, base = load_smollm2()
    text = "\n\n".join(wikipedia_text("test"))[:20000]
    ids = tokenizer(text, add_special_tokens=False).input_ids[: args.tokens]
    print(f"llama.cpp via llama-cpp-python {llama_cpp.__version__}; SmolLM2-135M-Instruct; {len(ids)} Wikipedia tokens")
    shipped = llama_cpp.Llama(model_path=str(smollm2_gguf()), vocab_only=True, verbose=False)
    shipped_ids = shipped.tokenize(text.encode(), add_bos=False, special=False)  # llama.cpp on its converter's file
    folder = tempfile.mkdtemp(prefix="lowbit-gguf-")
    for recipe in args.recipes:
        model = copy.deepcopy(base)
        if recipe != "float":
            lowbit.quantize_(model, recipe)
        path = os.path.join(folder, f"{recipe}.gguf")
        written = lowbit.export_gguf(model, path, tokenizer=tokenizer, tokenizer_pre="smollm")
        kinds = sorted({kind for name, kind in written.items() if name.startswith("blk.") and name.endswith(".weight")
                        and kind not in ("F32", "F16")})  # fmt: skip
        llm_ids = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False).tokenize(
            text.encode(), add_bos=False, special=False)  # fmt: skip
        theirs, ours = llama_cpp_logits(llama_cpp, path, ids, args.threads), lowbit_logits(model, ids)
        agree = float((theirs.argmax(-1) == ours.argmax(-1)).mean())
        relative = float(np.abs(theirs - ours).max() / np.abs(ours).max())
        print(f"{recipe:10s} file {os.path.getsize(path) / 2**20:6.1f} MiB, types {', '.join(kinds) or 'F32'}: "
              f"llama.cpp's tokens = on the shipped file {llm_ids == shipped_ids}; ppl llama.cpp {perplexity(theirs, ids):.3f} lowbit "
              f"{perplexity(ours, ids):.3f}; next-token agreement {agree:.3f}; max |logit diff| / max |logit| "
              f"{relative:.2e}")  # fmt: skip
    if args.peer:
        peer_rows(llama_cpp, tokenizer, base, ids, args.recipes, folder, args.threads)


if __name__ == "__main__":
    main()
