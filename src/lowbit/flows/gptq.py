"""The GPTQ drivers: a model's Linear layers rounded by :func:`lowbit.ops.gptq.gptq_quantize` one stage at a
time, in the order the model calls them, each stage's Hessians taken from inputs that went through the layers
already quantized (``quantize_(model, Int4WeightOnly(method="gptq", calibration_data=...))``).

:func:`blockwise_gptq` (what the recipe runs) works one repeated block at a time (a causal LM's decoder
layers, BERT's encoder layers: :mod:`lowbit.flows.blocks`): each block runs on its cached inputs once per
stage inside it and once more to give the next block its inputs. :func:`sequential_gptq` runs the whole model
per stage; it does the layers outside the blocks, and everything in a model without such blocks.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from lowbit.errors import ConfigError
from lowbit.flows.blocks import (
    BlockList,
    BlocksReached,
    Capture,
    blocks_giving,
    call_without_cache,
    capture_block_calls,
    find_blocks,
    hidden_output,
    replaced_forwards,
    stop_at_blocks,
)
from lowbit.flows.recipes import Int4WeightOnly
from lowbit.graph.plan import Ready, Real, apply, build
from lowbit.ops.gptq import HessianAccumulator, gptq_quantize
from lowbit.ops.int4 import SCALE_DTYPES


def gptq_modules(root: nn.Module, targets: dict[str, nn.Module], recipe: Int4WeightOnly,
                 progress: Callable[[str], None] | None = None) -> dict[str, nn.Module]:  # fmt: skip
    """GPTQ-rounded Int4WeightOnlyLinear for every target, quantized in call order."""
    settings = {"damping": recipe.damping, "block_size": recipe.block_size, "act_order": recipe.act_order}

    def quantize_layer(name, module, hessian):
        float_zero = recipe.zero_point_domain == "float"
        result = gptq_quantize(module.weight, hessian, recipe.group_size, SCALE_DTYPES[recipe.scale_dtype],
                               search=recipe.search, float_zero=float_zero, **settings)  # fmt: skip
        options = {"group_size": recipe.group_size, "scale_dtype": recipe.scale_dtype, "codes": result.codes,
                   "scale": result.scale, "zero_point": result.zero_point, "compute_dtype": recipe.compute_dtype,
                   "zero_point_domain": recipe.zero_point_domain}  # fmt: skip
        return build(module, Real(module="Int4WeightOnlyLinear", options=options), name)

    progress = progress or logging.getLogger("lowbit").info
    row_mask = padding_mask if recipe.mask_padding else lambda batch: None
    return blockwise_gptq(root, targets, recipe.calibration_data, call_without_cache, quantize_layer, row_mask,
                          progress)  # fmt: skip


def padding_mask(batch: Any) -> torch.Tensor | None:
    """The attention mask of a Hugging Face batch (its padding tokens stay out of the Hessians), else None."""
    if hasattr(batch, "get") and hasattr(batch, "keys"):
        return batch.get("attention_mask")
    return None


# ---- a model, block after block --------------------------------------------------------------------------------
def blockwise_gptq(root: nn.Module, targets: dict[str, nn.Module], batches: Iterable[Any],
                   run_batch: Callable[[nn.Module, Any], Any],
                   quantize_layer: Callable[[str, nn.Module, torch.Tensor], nn.Module],
                   row_mask: Callable[[Any], torch.Tensor | None] | None = None,
                   progress: Callable[[str], None] | None = None) -> dict[str, nn.Module]:  # fmt: skip
    """:func:`sequential_gptq`'s result (the same layers, stages and Hessians), block by block.

    The targets called before the repeated blocks are quantized first (whole-model stages that stop where
    the blocks begin); then one forward per batch captures every block's arguments
    (:func:`~lowbit.flows.blocks.capture_block_calls`); then for each block, its stages in call order
    (:func:`_next_stage` on the block alone: the first batch runs the block whole, later ones stop once the
    stage is fed) and one run of the quantized block per batch, whose outputs are the next block's inputs;
    last, the targets after the blocks (a causal LM's head) from forwards whose blocks hand back the last
    block's outputs at once. A model without repeated blocks, or whose blocks cannot be run alone (see
    :mod:`lowbit.flows.blocks`), gets :func:`sequential_gptq`. ``progress`` hears of each block.
    """
    batches = list(batches)
    if not batches:
        raise ConfigError("GPTQ needs calibration batches; calibration_data is empty")
    say = progress or (lambda message: None)
    found = find_blocks(root, targets)
    if found is None:
        say("GPTQ: no repeated blocks (a ModuleList of same-class modules holding the layers): whole-model stages")
        return sequential_gptq(root, targets, batches, run_batch, quantize_layer, row_mask, progress)
    inside = {name for members in found.members for name in members}
    outside = {name: module for name, module in targets.items() if name not in inside}
    done: dict[str, nn.Module] = {}
    try:
        prefix = _called_before_blocks(root, found.blocks, batches[0], run_batch, outside)
        if prefix:
            with replaced_forwards(found.blocks, stop_at_blocks):
                done.update(sequential_gptq(root, prefix, batches, _until_blocks(run_batch), quantize_layer, row_mask,
                                            progress))  # fmt: skip
        suffix = {name: module for name, module in outside.items() if name not in prefix}
        capture = capture_block_calls(root, found.blocks, batches, run_batch, suffix)
        if capture.reason is not None:
            say(f"GPTQ: {found.name}'s blocks cannot run alone ({capture.reason}): whole-model stages")
            rest = {name: module for name, module in targets.items() if name not in done}
            done.update(sequential_gptq(root, rest, batches, run_batch, quantize_layer, row_mask, progress))
            return done
        masks = [None if row_mask is None else row_mask(batch) for batch in batches]
        outputs = _gptq_blocks(root, found, capture, masks, quantize_layer, done, say, bool(suffix))
        if suffix:
            with blocks_giving(found.blocks, outputs) as select:
                def run_indexed(model, index):
                    select(index)
                    return run_batch(model, batches[index])

                done.update(sequential_gptq(root, suffix, range(len(batches)), run_indexed, quantize_layer,
                                            lambda index: masks[index], progress))  # fmt: skip
    except BaseException:
        apply(root, {name: Ready(targets[name]) for name in done})
        raise
    return done


def _gptq_blocks(root, found: BlockList, capture: Capture, masks: list, quantize_layer, done: dict, say,
                 keep_last: bool) -> list:  # fmt: skip
    """Quantize every block's targets stage by stage into ``done``; returns the last block's outputs per batch
    (when ``keep_last``: the layers after the blocks need them)."""
    start, hidden, outputs = time.perf_counter(), None, []
    for index, (block, members) in enumerate(zip(found.blocks, found.members)):
        calls = [per_batch[index] for per_batch in capture.calls]

        def run_call(module, batch, calls=calls, hidden=hidden):
            return calls[batch].run(module, None if hidden is None else hidden[batch])

        pending, order = dict(members), _CallOrder()
        while pending:
            stage = _next_stage(block, pending, list(range(len(calls))), run_call, lambda batch: masks[batch], order)
            for name, hessian in stage.items():
                done[name] = quantize_layer(name, pending.pop(name), hessian)
                apply(root, {name: Ready(done[name])})
        if index < len(found.blocks) - 1 or keep_last:
            with torch.no_grad():
                outputs = [run_call(block, batch) for batch in range(len(calls))]
            hidden = [hidden_output(output) for output in outputs]
        say(f"GPTQ block {index + 1}/{len(found.blocks)} ({found.name}.{index}, {len(members)} layers), "
            f"{time.perf_counter() - start:.0f} s")  # fmt: skip
    return outputs


@torch.no_grad()
def _called_before_blocks(root, blocks, batch, run_batch, outside: dict[str, nn.Module]) -> dict[str, nn.Module]:
    """The targets of ``outside`` that one forward of ``batch`` calls before its first block."""
    called: dict[str, nn.Module] = {}

    def watch(name, module):
        def hook(hooked, inputs):
            called.setdefault(name, module)  # returns None: the inputs stay as they are

        return hook

    hooks = [module.register_forward_pre_hook(watch(name, module)) for name, module in outside.items()]
    try:
        with replaced_forwards(blocks, stop_at_blocks):
            _until_blocks(run_batch)(root, batch)
    finally:
        for hook in hooks:
            hook.remove()
    return called


def _until_blocks(run_batch):
    def run(root, batch):
        try:
            return run_batch(root, batch)
        except BlocksReached:
            return None

    return run


# ---- a model, layer after layer --------------------------------------------------------------------------------
def sequential_gptq(root: nn.Module, targets: dict[str, nn.Module], batches: Iterable[Any],
                    run_batch: Callable[[nn.Module, Any], Any],
                    quantize_layer: Callable[[str, nn.Module, torch.Tensor], nn.Module],
                    row_mask: Callable[[Any], torch.Tensor | None] | None = None,
                    progress: Callable[[str], None] | None = None) -> dict[str, nn.Module]:  # fmt: skip
    """Quantize ``targets`` (name -> Linear inside ``root``) in the order the model calls them.

    Each stage runs all calibration batches (``run_batch(root, batch)``; after the first whole forward, each
    only as far as the stage's layers: ``_CallOrder``) through the model as it is now,
    collects H for the next unquantized layer and for every other layer fed the very same input tensor
    (attention's query / key / value), then ``quantize_layer(name, module, H)`` builds their replacements,
    which are swapped in before the next stage. ``progress(message)`` hears of each stage (GPTQ on a
    transformer takes minutes). ``row_mask(batch)`` may give a bool mask [B, T] of the
    rows that count (e.g. the attention mask: padding tokens are left out of H); a layer input of shape
    [B, T, K] then contributes only those rows. Returns name -> new module; on an error the original
    modules are put back.
    """
    batches = list(batches)
    if not batches:
        raise ConfigError("GPTQ needs calibration batches; calibration_data is empty")
    pending, done = dict(targets), {}
    start = time.perf_counter()
    try:
        order = _CallOrder()
        while pending:
            stage = _next_stage(root, pending, batches, run_batch, row_mask, order)
            if progress is not None:
                progress(f"GPTQ {len(done) + len(stage)}/{len(targets)} layers ({', '.join(stage)}), "
                         f"{time.perf_counter() - start:.0f} s")  # fmt: skip
            for name, hessian in stage.items():
                done[name] = quantize_layer(name, pending.pop(name), hessian)
                apply(root, {name: Ready(done[name])})
    except BaseException:
        apply(root, {name: Ready(targets[name]) for name in done})
        raise
    return done


class _StageFed(BaseException):
    """Raised by a hook once this batch has fed the stage's layers: the rest of the forward is not needed
    (a BaseException, so that a ``run_batch`` catching Exception does not carry on past it)."""


class _CallOrder:
    """The targets' calls in the first whole forward (the first stage's first batch): their order, which of
    them read one input tensor, and whether any was called twice. Every later batch then knows which layers
    make up its stage before it runs, and its forward stops once they are fed: a stage early in the model
    costs part of a forward instead of a whole one (GPTQ on MiniLM's 37 layers ran 100 whole forwards). A
    layer called twice in that forward (a shared module) keeps every batch whole."""

    def __init__(self) -> None:
        self.names: list[str] = []  # in call order
        self.group: dict[str, int] = {}  # name -> the place of the first call that read the same tensor
        self.repeated, self.complete = False, False
        self._inputs: list[tuple[weakref.ref, int]] = []  # the tensors read so far, not kept alive

    def note(self, name: str, tensor: torch.Tensor) -> None:
        if name in self.group:
            self.repeated = True
            return
        group = next((place for seen, place in self._inputs if seen() is tensor), len(self.names))
        if group == len(self.names):
            self._inputs.append((weakref.ref(tensor), group))
        self.group[name] = group
        self.names.append(name)

    def close(self) -> None:
        self._inputs.clear()
        self.complete = True

    def stage(self, pending: dict[str, nn.Module]) -> set[str] | None:
        """The layers the next stage holds, or None where its forwards must run whole."""
        first = next((name for name in self.names if name in pending), None)
        if not self.complete or self.repeated or first is None:
            return None
        return {name for name in self.names if name in pending and self.group[name] == self.group[first]}


@torch.no_grad()
def _next_stage(root, pending: dict[str, nn.Module], batches: list, run_batch, row_mask,
                order: _CallOrder | None = None) -> dict[str, torch.Tensor]:  # fmt: skip
    """name -> H of the first pending layer the model calls and of the layers fed that same input tensor.

    ``order`` (one per model, filled by the first stage's first batch): where it knows the stage, a batch's
    forward stops once the stage's layers are fed, each once, and are the ones this batch found."""
    order = order or _CallOrder()
    accumulators: dict[str, HessianAccumulator] = {}
    first: dict[str, Any] = {"input": None, "names": [], "recording": True, "mask": None,  # names: first batch
                             "expected": order.stage(pending)}  # fmt: skip
    calls: dict[str, int] = {}  # per stage layer, its calls in the running batch
    grams: list[tuple[torch.Tensor, torch.Tensor, int]] = []  # (input, its x x^T, rows) in the running batch

    def watch(name):
        def hook(module, inputs):
            if not inputs or not isinstance(inputs[0], torch.Tensor):
                return  # called with keyword arguments only: not seen (an error below if never seen)
            if not order.complete:
                order.note(name, inputs[0])
            if first["recording"] and name not in first["names"]:
                if first["input"] is None:
                    first["input"], first["names"] = inputs[0], [name]
                elif inputs[0] is first["input"]:
                    first["names"].append(name)
            if name in first["names"]:  # only this stage's layers pay for an H
                if name not in accumulators:
                    accumulators[name] = HessianAccumulator(module.in_features, module.weight.device)
                shared = next((entry for entry in grams if entry[0] is inputs[0]), None)
                if shared is None:  # x x^T once per tensor: query / key / value share it
                    shared = (inputs[0], *accumulators[name].gram(_kept_rows(inputs[0], first["mask"])))
                    grams.append(shared)
                accumulators[name].add_gram(*shared[1:])
                calls[name] = calls.get(name, 0) + 1
                if set(calls) == first["expected"] == set(first["names"]) and max(calls.values()) == 1:
                    raise _StageFed

        return hook

    hooks = [module.register_forward_pre_hook(watch(name)) for name, module in pending.items()]
    try:
        for batch in batches:
            first["mask"] = None if row_mask is None else row_mask(batch)
            calls.clear()
            try:
                run_batch(root, batch)
            except _StageFed:
                pass
            if not order.complete:  # the first whole forward
                order.close()
                first["expected"] = order.stage(pending)
            first["recording"] = not first["names"]
            first["input"] = None  # holds no tensor past its batch
            grams.clear()
    finally:
        for hook in hooks:
            hook.remove()
    if not first["names"]:
        missing = ", ".join(sorted(pending)[:3])
        raise ConfigError(f"the calibration batches never reach {missing}: GPTQ needs each layer's inputs")
    return {name: accumulators[name].hessian() for name in first["names"]}


def _kept_rows(inputs: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The rows of ``inputs`` [B, T, K] where ``mask`` [B, T] is set (all rows if the shapes differ)."""
    if mask is None or tuple(inputs.shape[:-1]) != tuple(mask.shape):
        return inputs
    return inputs[mask.to(device=inputs.device, dtype=torch.bool)]  # [rows, K]
