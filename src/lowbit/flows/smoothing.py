"""Per-input-channel scales migrated between a Linear's input and its weight, folded into the op before it.

For a Linear fed x, ``W x = (W diag(s)) (x / s)`` for any positive s: the weight's columns take s and the
input is divided by s. Where x is made by an op whose output channels can absorb 1 / s (an RMSNorm / LayerNorm
weight, and a LayerNorm's bias; a Linear's output rows and bias), the division costs nothing at run time and
the float model computes the same function. SmoothQuant (:func:`smooth_quant`) and AWQ (``flows.awq``) only
differ in how they choose s.

The groups (:func:`smoothing_groups`), found from the structure of Hugging Face's classes, not from names of one
model: in a pre-norm decoder layer (Llama, Mistral, Qwen, SmolLM: ``input_layernorm``, ``self_attn.{q,k,v,o}_proj``,
``post_attention_layernorm`` (``pre_feedforward_layernorm`` where a layer has one), ``mlp.{gate,up,down}_proj``):
input norm -> q / k / v, MLP norm -> gate / up, v_proj -> o_proj (attention is linear in the values; with
grouped-query attention each value channel feeds ``repeat`` query heads, so o_proj's columns take s repeated),
up_proj -> down_proj (the MLP is linear in up's output); and a causal LM's final ``model.norm`` -> ``lm_head``. In a BERT layer (``attention.self.{query,key,value}``,
``attention.output.dense``): value -> attention.output.dense only; its LayerNorms also feed the residual sums
(post-norm) and intermediate.dense reaches output.dense through GELU, so those are skipped with the reason.
A norm is folded only where a probe shows its output channels scale with its weight (Gemma's ``1 + weight``
norms do not); a group whose consumer's weight is shared (tied) with another module is skipped, unless the
caller is about to replace that consumer by a quantized module (``untie``: it then gets its own copy).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Container
from typing import Any

import torch
from torch import nn

from lowbit._model import run_batches


@dataclasses.dataclass
class SmoothGroup:
    """A producer (its qualified name and module) whose output channels feed every consumer Linear's inputs:
    channel for channel (``repeat`` 1), or each producer head of ``head_dim`` channels read by ``repeat``
    consecutive consumer heads (grouped-query attention's v_proj -> o_proj)."""

    producer: str
    module: nn.Module
    consumers: dict[str, nn.Linear]
    repeat: int = 1
    head_dim: int = 1
    untie: tuple[str, ...] = ()  # consumers whose shared (tied) weight gets its own copy when folded

    @property
    def channels(self) -> int:
        return next(iter(self.consumers.values())).in_features // self.repeat

    def expand(self, scale: torch.Tensor) -> torch.Tensor:
        """A producer-sized scale as the consumers' input channels see it."""
        if self.repeat == 1:
            return scale
        heads = scale.reshape(-1, 1, self.head_dim)
        return heads.expand(heads.shape[0], self.repeat, self.head_dim).reshape(-1)

    def reduce(self, stat: torch.Tensor, how: str = "max") -> torch.Tensor:
        """A consumer-sized statistic per producer channel (max or mean over the repeated heads)."""
        if self.repeat == 1:
            return stat
        heads = stat.reshape(-1, self.repeat, self.head_dim)
        return (heads.amax(1) if how == "max" else heads.mean(1)).reshape(-1)


# ---- finding the groups ----------------------------------------------------------------------------------------
def _linear(module: Any, *path: str) -> nn.Linear | None:
    for part in path:
        module = getattr(module, part, None)
    return module if isinstance(module, nn.Linear) else None


def _decoder_groups(name: str, layer: nn.Module) -> tuple[list[tuple], dict[str, str]]:
    """(producer path, consumer paths, repeat, head_dim) of a pre-norm decoder layer; skipped -> reason."""
    attention, mlp = layer.self_attn, getattr(layer, "mlp", None)
    groups, skipped = [], {}
    qkv = [f"self_attn.{part}" for part in ("q_proj", "k_proj", "v_proj") if _linear(attention, part)]
    if len(qkv) == 3:
        groups.append(("input_layernorm", qkv, 1, 1))
    value, output = _linear(attention, "v_proj"), _linear(attention, "o_proj")
    head_dim = getattr(attention, "head_dim", None)
    if value is not None and output is not None and isinstance(head_dim, int):
        if getattr(attention, "v_norm", None) is not None:
            skipped[f"{name}.self_attn.o_proj"] = "the values are normalised after v_proj: not foldable"
        elif output.in_features % value.out_features or value.out_features % head_dim:
            skipped[f"{name}.self_attn.o_proj"] = "o_proj's inputs are not whole repeats of v_proj's heads"
        else:
            groups.append(("self_attn.v_proj", ["self_attn.o_proj"], output.in_features // value.out_features,
                           head_dim))  # fmt: skip
    norm = "pre_feedforward_layernorm" if hasattr(layer, "pre_feedforward_layernorm") else "post_attention_layernorm"
    if mlp is not None and _linear(mlp, "gate_proj") and _linear(mlp, "up_proj"):
        groups.append((norm, ["mlp.gate_proj", "mlp.up_proj"], 1, 1))
        if _linear(mlp, "down_proj"):
            groups.append(("mlp.up_proj", ["mlp.down_proj"], 1, 1))
    return groups, skipped


def _encoder_groups(name: str, layer: nn.Module) -> tuple[list[tuple], dict[str, str]]:
    """The same for a BERT layer: value -> attention.output.dense; the rest skipped with the reason."""
    self_attention = getattr(layer.attention, "self")
    head_dim = getattr(self_attention, "attention_head_size", None)
    groups, skipped = [], {}
    if _linear(layer, "attention", "output", "dense") and isinstance(head_dim, int):
        groups.append(("attention.self.value", ["attention.output.dense"], 1, head_dim))
    skipped[f"{name}.attention.self.query/key/value"] = ("the LayerNorm before them also feeds the residual sum "
                                                         "(post-norm): not foldable")  # fmt: skip
    skipped[f"{name}.intermediate.dense"] = "the LayerNorm before it also feeds the residual sum: not foldable"
    if _linear(layer, "output", "dense"):
        skipped[f"{name}.output.dense"] = "its input comes through GELU: not foldable"
    return groups, skipped


def _is_decoder_layer(module: nn.Module) -> bool:
    return (hasattr(module, "self_attn") and hasattr(module, "input_layernorm")
            and _linear(module.self_attn, "q_proj") is not None)  # fmt: skip


def _is_encoder_layer(module: nn.Module) -> bool:
    return _linear(module, "attention", "self", "value") is not None and hasattr(module, "intermediate")


def _head_groups(name: str, module: nn.Module) -> tuple[list[tuple], dict[str, str]]:
    """A causal LM's final norm -> lm_head (``model.norm``, ``lm_head``)."""
    norm = getattr(getattr(module, "model", None), "norm", None)
    return ([("model.norm", ["lm_head"], 1, 1)] if norm is not None else []), {}


def smoothing_groups(root: nn.Module, untie: Container[str] = ()) -> tuple[list[SmoothGroup], dict[str, str]]:
    """Every foldable (producer, consumers) group of ``root`` and, per skipped place, why. A consumer whose
    weight is shared with another module (an lm_head tied to the embedding) is skipped unless it is in
    ``untie`` (layers about to be replaced by quantized modules: the fold gives them their own copy)."""
    found, skipped = [], {}
    shared = _shared_weights(root)
    for name, layer in root.named_modules():
        if _is_decoder_layer(layer):
            raw, why = _decoder_groups(name, layer)
        elif _is_encoder_layer(layer):
            raw, why = _encoder_groups(name, layer)
        elif _linear(layer, "lm_head") is not None:
            raw, why = _head_groups(name, layer)
        else:
            continue
        skipped.update(why)
        prefix = f"{name}." if name else ""
        for producer_path, consumer_paths, repeat, head_dim in raw:
            producer = layer.get_submodule(producer_path)
            consumers = {f"{prefix}{path}": layer.get_submodule(path) for path in consumer_paths}
            tied = tuple(consumer for consumer, module in consumers.items() if id(module.weight) in shared)
            problem = _producer_problem(producer, consumers, repeat) or next(
                (f"{consumer}'s weight is shared with another module" for consumer in tied if consumer not in untie),
                None)  # fmt: skip
            if problem:
                skipped[f"{prefix}{producer_path}"] = problem
            else:
                found.append(SmoothGroup(f"{prefix}{producer_path}", producer, consumers, repeat, head_dim, tied))
    return found, skipped


def _shared_weights(root: nn.Module) -> set[int]:
    seen: dict[int, int] = {}
    for _, parameter in root.named_parameters(remove_duplicate=False):
        seen[id(parameter)] = seen.get(id(parameter), 0) + 1
    return {key for key, count in seen.items() if count > 1}


def _producer_problem(producer: nn.Module, consumers: dict[str, nn.Linear], repeat: int) -> str | None:
    """Why ``producer``'s output channels cannot absorb a scale (None where they can)."""
    widths = {module.in_features for module in consumers.values()}
    if len(widths) != 1:
        return f"its consumers take different widths {sorted(widths)}"
    channels = widths.pop() // repeat
    if isinstance(producer, nn.Linear):
        return None if producer.out_features == channels else f"{producer.out_features} outputs, {channels} inputs"
    weight = getattr(producer, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.shape != (channels,):
        return f"{type(producer).__name__} has no per-channel weight of {channels}"
    return _norm_probe(producer)


@torch.no_grad()
def _norm_probe(norm: nn.Module) -> str | None:
    """None where dividing ``norm``'s weight (and bias) by s divides its output channels by s."""
    trial = copy.deepcopy(norm).double()
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(3, trial.weight.shape[0], generator=generator, dtype=torch.float64)
    scale = torch.rand(trial.weight.shape[0], generator=generator, dtype=torch.float64) + 0.5
    before = trial(inputs)
    _divide_producer(trial, scale)
    if not torch.allclose(trial(inputs), before / scale, rtol=1e-9, atol=1e-12):
        return f"{type(norm).__name__}'s output does not scale with its weight: not foldable"
    return None


# ---- folding ---------------------------------------------------------------------------------------------------
@torch.no_grad()
def _divide_producer(producer: nn.Module, scale: torch.Tensor) -> None:
    weight = producer.weight
    scale = scale.to(device=weight.device, dtype=weight.dtype)
    weight.div_(scale.unsqueeze(1) if weight.dim() == 2 else scale)
    if getattr(producer, "bias", None) is not None:
        producer.bias.div_(scale)


@torch.no_grad()
def fold_scale(group: SmoothGroup, scale: torch.Tensor) -> None:
    """x' = x / s at the producer, W' = W * s along the consumers' inputs (``scale``: producer-sized, > 0)."""
    if scale.shape != (group.channels,) or not bool((scale > 0).all()) or not bool(torch.isfinite(scale).all()):
        raise ValueError(f"{group.producer}: a scale must be {group.channels} positive finite numbers")
    scale = scale.double()
    _divide_producer(group.module, scale)
    expanded = group.expand(scale)
    for name, module in group.consumers.items():
        if name in group.untie:
            module.weight = nn.Parameter(module.weight.detach().clone(), requires_grad=module.weight.requires_grad)
        module.weight.mul_(expanded.to(device=module.weight.device, dtype=module.weight.dtype))


# ---- statistics and SmoothQuant --------------------------------------------------------------------------------
def input_maxima(root: nn.Module, modules: dict[str, nn.Module], batches) -> dict[str, torch.Tensor]:
    """Per watched module that the batches reach: max |x| per input channel over the calibration batches."""
    maxima: dict[str, torch.Tensor] = {}

    def watch(name):
        def hook(module, inputs):
            peak = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).abs().amax(0).float()
            maxima[name] = peak if name not in maxima else torch.maximum(maxima[name], peak)

        return hook

    run_batches(root, batches, {module: watch(name) for name, module in modules.items()})
    return maxima


def smooth_quant(root: nn.Module, batches, alpha: float, targets: dict[str, nn.Module] | None = None) -> dict[str, Any]:
    """SmoothQuant: s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) per input channel, folded into every group
    whose consumers are all in ``targets`` (all groups when None); returns info (smoothed, skipped)."""
    groups, skipped = smoothing_groups(root, untie=targets or ())
    if targets is not None:
        kept = [group for group in groups if all(name in targets for name in group.consumers)]
        skipped.update({group.producer: "a consumer is not quantized" for group in groups if group not in kept})
        groups = kept
    first = {group.producer: next(iter(group.consumers.items())) for group in groups}
    maxima = input_maxima(root, dict(first.values()), list(batches))
    smoothed, ranges = {}, {}
    for group in groups:
        consumer = first[group.producer][0]
        if consumer not in maxima:
            skipped[group.producer] = "the calibration batches never reach it"
            continue
        activation = group.reduce(maxima[consumer]).double()
        weight = torch.stack([module.weight.detach().abs().amax(0) for module in group.consumers.values()]).amax(0)
        weight = group.reduce(weight.double().cpu())
        scale = activation.cpu().clamp_min(1e-5).pow(alpha) / weight.clamp_min(1e-5).pow(1 - alpha)
        scale = scale.clamp(1e-5, 1e5)
        fold_scale(group, scale)
        smoothed[group.producer] = sorted(group.consumers)
        ranges[group.producer] = [round(float(scale.min()), 4), round(float(scale.max()), 4)]
    return {"smoothquant": alpha, "smoothed": smoothed, "smoothing_scale_ranges": ranges, "smoothing_skipped": skipped}
