"""The ``rotate`` recipe: QuaRot-style Hadamard rotation of a Llama-architecture decoder, float function kept.

Why: a quantizer with one scale per block loses the small values of a block that holds an outlier. An
orthonormal Hadamard rotation spreads each outlier channel over all channels; done where the model can absorb
it, the float model computes the same function and the Linear layers see inputs and weights without outliers.

What :func:`rotate_model` does, in float64, each weight rounded once back to its dtype:

1. RMSNorm weights folded into the Linears they feed (input_layernorm -> q / k / v, post_attention_layernorm
   -> gate / up, the final norm -> lm_head); the norms' weights become ones. An RMSNorm without weight commutes
   with an orthonormal rotation (it divides by the vector's length, which a rotation keeps).
2. The residual stream rotated by ``Q = diag(signs) H / sqrt(hidden)``: embeddings ``E -> E Q``; Linears
   reading the stream (q / k / v, gate / up, lm_head) ``W -> W Q``; Linears writing to it (o_proj, down_proj)
   ``W -> Q^T W`` and their bias ``b -> Q^T b``. A tied lm_head is untied first (its folded, rotated weight
   is no longer the embedding's): ``info["untied"]``, and ``config.tie_word_embeddings`` becomes False.
3. ``rotate_heads``: each value head's output rotated by a head_dim Hadamard (v_proj rows), undone in o_proj's
   matching input columns; attention mixes value vectors linearly per head, so this is exact.
4. ``online_down``: each MLP becomes :class:`HadamardGatedMLP`, which applies the intermediate-size Hadamard
   to down_proj's input at run time; down_proj's weight takes ``W -> W H`` (so a format on down_proj's input
   quantizes the rotated activations).

Every Linear keeps its name and stays an ``nn.Linear``, so any recipe can follow. Supported: the model types
in :data:`MODEL_TYPES` with an LM head (a base model would return rotated hidden states). Encoders (BERT:
post-LayerNorm, whose mean subtraction and placement after the residual add do not commute with a rotation of
the stream) are refused.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from lowbit.errors import ConfigError
from lowbit.flows.recipes import Rotate, handles
from lowbit.graph.plan import Ready, Transform, apply
from lowbit.ops.hadamard import OnlineHadamard, Rotation, factor_matrices, hadamard_factors, orthonormal_hadamard

log = logging.getLogger("lowbit")

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")  # RMSNorm(x) * w, pre-norm, q/k/v/o + gate/up/down
READERS = {"attention": ("q_proj", "k_proj", "v_proj"), "mlp": ("gate_proj", "up_proj")}


class HadamardGatedMLP(nn.Module):
    """``down_proj(H(act_fn(gate_proj(x)) * up_proj(x)))``: a gated MLP with an online Hadamard ``H`` before
    down_proj; the children keep the replaced MLP's names (gate_proj, up_proj, down_proj, act_fn)."""

    rebuilt_children = ("hadamard",)  # made by __init__ from the MLP (lowbit.load rebuilds the wrapper so)

    def __init__(self, mlp: nn.Module) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        self.act_fn = mlp.act_fn
        weight = self.down_proj.weight
        self.hadamard = OnlineHadamard(self.down_proj.in_features).to(device=weight.device, dtype=weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.hadamard(self.act_fn(self.gate_proj(x)) * self.up_proj(x)))


@handles(Rotate)
def rotate(root: nn.Module, recipe: Rotate) -> dict[str, Any]:
    """The recipe's handler: the rotation as the model's one plan entry, carried out by the plan's apply."""
    return apply(root, {"": Transform(lambda model: rotate_model(model, recipe))}).transformed[""]


def rotate_model(root: nn.Module, recipe: Rotate) -> dict[str, Any]:
    """Rotate ``root`` in place (see the module docstring); returns the info dict."""
    decoder, layers, head_dim = _layout(root)
    hidden = decoder.embed_tokens.weight.shape[1]
    _check_sizes(hidden, head_dim, layers, recipe)
    online_down = recipe.online_down or bool(recipe.online_rotate)
    with torch.no_grad():
        untied = _untie(root, decoder)
        q = Rotation(hidden, seed=recipe.seed if recipe.random_signs else None, where="rotate")
        _set(decoder.embed_tokens.weight, q.right(decoder.embed_tokens.weight))
        for layer in layers:
            _rotate_layer(layer, q, head_dim, recipe, online_down)
        _read_stream(decoder.norm, [root.lm_head], q)
    info = {"recipe": Rotate.name, "model_type": root.config.model_type, "layers": len(layers),
            "hidden_size": hidden, "hadamard_factors": list(hadamard_factors(hidden)),
            "random_signs": recipe.random_signs, "seed": recipe.seed if recipe.random_signs else None,
            "rotate_heads": recipe.rotate_heads, "head_dim": head_dim, "online_down": online_down,
            "folded_norms": 2 * len(layers) + 1, "untied": untied}  # fmt: skip
    if online_down:
        size = layers[0].mlp.down_proj.in_features
        info["online_down_factors"] = list(hadamard_factors(size))
    # kept in the model's config (saved with it by transformers; the report's header reads it)
    root.config.lowbit_rotation = {key: value for key, value in info.items() if key not in ("recipe", "untied")}
    return info


def _layout(root: nn.Module) -> tuple[nn.Module, list[nn.Module], int]:
    """(decoder, its layers, head_dim) of a supported model, or a ConfigError saying what is unsupported."""
    config = getattr(root, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in MODEL_TYPES:
        raise ConfigError(f"rotate: model type {model_type!r} ({type(root).__name__}) is not supported; rotate "
                          f"handles pre-RMSNorm decoders with an LM head: {', '.join(MODEL_TYPES)} (BERT-style "
                          "post-LayerNorm encoders are not done)")  # fmt: skip
    decoder = getattr(root, "model", None)
    if getattr(root, "lm_head", None) is None or not hasattr(decoder, "layers"):
        raise ConfigError(f"rotate: {type(root).__name__} has no lm_head Linear over model.layers (give the "
                          "...ForCausalLM model: a base model would return rotated hidden states)")  # fmt: skip
    layers = list(decoder.layers)
    for index, layer in enumerate(layers):
        linears = [*(getattr(layer.self_attn, name, None) for name in (*READERS["attention"], "o_proj")),
                   *(getattr(layer.mlp, name, None) for name in (*READERS["mlp"], "down_proj"))]  # fmt: skip
        if not all(type(linear) is nn.Linear for linear in (*linears, root.lm_head)):
            raise ConfigError(f"rotate: layer {index}'s projections or lm_head are not all plain nn.Linear (already "
                              "quantized?): apply rotate first, then the quantization recipe")  # fmt: skip
    head_dim = getattr(layers[0].self_attn, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return decoder, layers, head_dim


def _check_sizes(hidden: int, head_dim: int, layers: list[nn.Module], recipe: Rotate) -> None:
    factor_matrices(hidden, where=f"rotate (hidden_size {hidden})")  # ConfigError listing buildable sizes
    if recipe.rotate_heads:
        factor_matrices(head_dim, where=f"rotate (head_dim {head_dim}; rotate_heads=False skips it)")
    if recipe.online_down or recipe.online_rotate:
        size = layers[0].mlp.down_proj.in_features
        factor_matrices(size, where=f"rotate (intermediate_size {size}; online_down=False skips it)")


def _untie(root: nn.Module, decoder: nn.Module) -> bool:
    """Give lm_head its own weight where it shares the embedding's; True if it did."""
    if root.lm_head.weight is not decoder.embed_tokens.weight:
        return False
    root.lm_head.weight = nn.Parameter(decoder.embed_tokens.weight.detach().clone())
    root.config.tie_word_embeddings = False
    if hasattr(root, "all_tied_weights_keys"):  # transformers 5 re-ties by this mapping
        root.all_tied_weights_keys = {}
    log.info("rotate: lm_head untied from embed_tokens (the final norm is folded into lm_head and both are "
             "rotated, so they no longer share a weight)")  # fmt: skip
    return True


def _set(parameter: torch.Tensor, value: torch.Tensor) -> None:
    parameter.copy_(value.to(parameter.dtype))


def _read_stream(norm: nn.Module, linears: list[nn.Linear], q: Rotation) -> None:
    """Fold ``norm``'s weight into the Linears it feeds and rotate their inputs: ``W -> (W diag(g)) Q``."""
    gain = norm.weight.detach().double()
    for linear in linears:
        _set(linear.weight, q.right(linear.weight.double() * gain))
    norm.weight.fill_(1.0)


def _write_stream(linear: nn.Linear, q: Rotation, right: Rotation | None = None) -> None:
    """A Linear writing to the stream: ``W -> Q^T W (right)``, ``b -> Q^T b``."""
    weight = q.left_transposed(linear.weight)
    _set(linear.weight, weight if right is None else right.right(weight))
    if linear.bias is not None:
        _set(linear.bias, q.right(linear.bias))


def _rotate_heads(attention: nn.Module, head: torch.Tensor) -> None:
    """Each value head's output ``v -> v H``: v_proj rows ``W_h -> H^T W_h`` (bias too), and o_proj's input
    columns of every attention head ``W[:, h] -> W[:, h] H``."""
    size = head.shape[0]
    v_proj, o_proj = attention.v_proj, attention.o_proj
    rows = v_proj.weight.double().reshape(-1, size, v_proj.in_features)
    _set(v_proj.weight, torch.einsum("km,hkn->hmn", head, rows).reshape(v_proj.weight.shape))
    if v_proj.bias is not None:
        _set(v_proj.bias, (v_proj.bias.double().reshape(-1, size) @ head).reshape(-1))
    columns = o_proj.weight.double().reshape(o_proj.out_features, -1, size)
    _set(o_proj.weight, (columns @ head).reshape(o_proj.weight.shape))


def _rotate_layer(layer: nn.Module, q: Rotation, head_dim: int, recipe: Rotate, online_down: bool) -> None:
    attention, mlp = layer.self_attn, layer.mlp
    _read_stream(layer.input_layernorm, [getattr(attention, name) for name in READERS["attention"]], q)
    _read_stream(layer.post_attention_layernorm, [getattr(mlp, name) for name in READERS["mlp"]], q)
    if recipe.rotate_heads:
        seed = recipe.seed + 1 if recipe.random_signs else None
        _rotate_heads(attention, orthonormal_hadamard(head_dim, seed=seed, where="rotate"))
    _write_stream(attention.o_proj, q)
    down_rotation = None
    if online_down:
        down_rotation = Rotation(mlp.down_proj.in_features, where="rotate")
        apply(layer, {"mlp": Ready(HadamardGatedMLP(mlp))})
    _write_stream(layer.mlp.down_proj, q, down_rotation)
