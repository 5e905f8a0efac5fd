"""Block-sequential calibration: the repeated blocks of a model (a causal LM's decoder layers, BERT's encoder
layers), the inputs each block receives for every calibration batch, and forwards that skip the blocks.

A data-driven algorithm (GPTQ today) uses these to work on one block at a time: capture the blocks' inputs
once, run block i alone on its cached inputs as often as it needs, then feed block i's outputs to block i + 1;
no whole-model forward per stage.

The blocks (:func:`find_blocks`): of every ``nn.ModuleList`` of two or more modules of one class, each holding
(strictly inside) at least one target, the one whose blocks hold the most targets; a model without one gets
None (the caller falls back to whole-model forwards). A block's hidden state is its first positional argument
(or its ``hidden_states`` keyword); its output is that tensor, or a tuple / list whose first item is it, of the
same shape as the input.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch
from torch import nn

from lowbit._model import model_arguments


class BlockList(NamedTuple):
    """The repeated blocks: the ModuleList's name, its blocks, and the targets inside each (name -> module)."""

    name: str
    blocks: list[nn.Module]
    members: list[dict[str, nn.Module]]


def find_blocks(root: nn.Module, targets: dict[str, nn.Module]) -> BlockList | None:
    """The ModuleList of same-class blocks holding the most targets (see the module docstring), or None."""
    best: BlockList | None = None
    for name, module in root.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) < 2 or len({type(b) for b in module}) != 1:
            continue
        prefix = f"{name}." if name else ""
        if any(f"{prefix}{index}" in targets for index in range(len(module))):
            continue  # the list's items are targets themselves (a list of Linears): no blocks around them
        members = [{target: layer for target, layer in targets.items() if target.startswith(f"{prefix}{index}.")}
                   for index in range(len(module))]  # fmt: skip
        if not all(members):
            continue
        if best is None or sum(map(len, members)) > sum(map(len, best.members)):
            best = BlockList(name, list(module), members)
    return best


# ---- one block's call ------------------------------------------------------------------------------------------
@dataclasses.dataclass
class BlockCall:
    """The arguments one block received for one batch; ``slot`` is where its hidden state sits (an index
    into ``args`` or a keyword)."""

    args: tuple
    kwargs: dict[str, Any]
    slot: int | str

    @classmethod
    def of(cls, args: tuple, kwargs: dict[str, Any]) -> BlockCall | None:
        kwargs = {key: (None if _is_cache(value) else value) for key, value in kwargs.items()}
        if args and isinstance(args[0], torch.Tensor):
            return cls(tuple(args), kwargs, 0)
        if not args and isinstance(kwargs.get("hidden_states"), torch.Tensor):
            return cls((), kwargs, "hidden_states")
        return None

    @property
    def hidden(self) -> torch.Tensor:
        return self.args[self.slot] if isinstance(self.slot, int) else self.kwargs[self.slot]

    def run(self, block: nn.Module, hidden: torch.Tensor | None = None) -> Any:
        """``block`` called with these arguments, its hidden state replaced by ``hidden`` when given."""
        args, kwargs = self.args, self.kwargs
        if hidden is not None and isinstance(self.slot, int):
            args = (hidden, *args[1:])
        elif hidden is not None:
            kwargs = {**kwargs, self.slot: hidden}
        return block(*args, **kwargs)


def hidden_output(output: Any) -> torch.Tensor | None:
    """The hidden state in a block's output: the tensor itself or the first item of a tuple / list."""
    if isinstance(output, (tuple, list)) and output:
        output = output[0]
    return output if isinstance(output, torch.Tensor) else None


def _is_cache(value: Any) -> bool:
    """A key / value cache object (Hugging Face's Cache classes): never reused across block calls."""
    return any(klass.__name__ == "Cache" for klass in type(value).__mro__)


def call_without_cache(model: nn.Module, batch: Any) -> Any:
    """``model`` on ``batch`` (as :func:`lowbit._model.call_model`), with ``use_cache=False`` where its forward
    takes that keyword: a calibration forward must not grow a key / value cache that later block calls read."""
    args, kwargs = model_arguments(batch)
    try:
        takes_cache = "use_cache" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        takes_cache = False
    if takes_cache and "use_cache" not in kwargs:
        kwargs["use_cache"] = False
    return model(*args, **kwargs)


# ---- forwards with the blocks replaced -------------------------------------------------------------------------
class BlocksReached(BaseException):
    """Raised in place of a block's forward: the rest of the model's forward is not needed (a BaseException,
    so that a ``run_batch`` catching Exception does not carry on past it)."""


@contextmanager
def replaced_forwards(blocks: list[nn.Module], make: Callable[[int, Callable], Callable]) -> Iterator[None]:
    """Each block's ``forward`` replaced by ``make(index, original_forward)`` while inside (an instance
    attribute, so the block keeps its attributes, hooks and place in the model); put back whatever happens."""
    saved = [block.__dict__.get("forward") for block in blocks]
    try:
        for index, block in enumerate(blocks):
            block.forward = make(index, block.forward)
        yield
    finally:
        for block, forward in zip(blocks, saved):
            if forward is None:
                block.__dict__.pop("forward", None)
            else:
                block.forward = forward


def stop_at_blocks(index: int, original: Callable) -> Callable:
    """A forward (for :func:`replaced_forwards`) that stops the model's forward where the blocks begin."""

    def forward(*args, **kwargs):
        raise BlocksReached

    return forward


class Capture(NamedTuple):
    """Per batch, per block, the block's call; ``reason`` says why the blocks cannot be run one by one
    (then ``calls`` is empty and the caller runs whole-model forwards instead)."""

    calls: list[list[BlockCall]]
    reason: str | None


@torch.no_grad()
def capture_block_calls(root: nn.Module, blocks: list[nn.Module], batches: list, run_batch: Callable,
                        watched: dict[str, nn.Module]) -> Capture:  # fmt: skip
    """Every block's arguments for every batch, from one forward per batch that runs the first block only.

    The first block runs for real; every later block records its arguments and returns the first block's
    output for this batch (the right structure; its values are never used), and the forward stops at the
    last block. A module of ``watched`` (targets outside the blocks) called between the first block and the
    last makes the capture fail (its inputs would come from blocks not yet run), as do blocks called out of
    order or a hidden state that cannot be found.
    """
    state: dict[str, Any] = {"calls": [], "first": None, "between": None, "reason": None}

    def make(index, original):
        def forward(*args, **kwargs):
            call, calls = BlockCall.of(args, kwargs), state["calls"]
            if call is None or len(calls) != index:
                state["reason"] = "a block without a tensor hidden state" if call is None else "blocks out of order"
                raise BlocksReached
            calls.append(call)
            if index == 0:
                state["first"] = original(*call.args, **call.kwargs)
                output = hidden_output(state["first"])
                if output is None or output.shape != call.hidden.shape:
                    state["reason"] = "a block whose output is not a hidden state of its input's shape"
                    raise BlocksReached
            if index == len(blocks) - 1:
                raise BlocksReached
            return state["first"]

        return forward

    def watch(name):
        def hook(module, inputs):
            if state["calls"] and state["between"] is None:
                state["between"] = name

        return hook

    captured: list[list[BlockCall]] = []
    hooks = [module.register_forward_pre_hook(watch(name)) for name, module in watched.items()]
    try:
        with replaced_forwards(blocks, make):
            for batch in batches:
                state["calls"] = []
                try:
                    run_batch(root, batch)
                except BlocksReached:
                    pass
                if state["reason"] is None and len(state["calls"]) != len(blocks):
                    state["reason"] = f"only {len(state['calls'])} of the {len(blocks)} blocks were called"
                if state["reason"] is None and state["between"] is not None:
                    state["reason"] = f"{state['between']} is called between the blocks"
                if state["reason"] is not None:
                    return Capture([], state["reason"])
                captured.append(state["calls"])
    finally:
        for hook in hooks:
            hook.remove()
    return Capture(captured, None)


@contextmanager
def blocks_giving(blocks: list[nn.Module], outputs: list[Any]) -> Iterator[Callable[[int], None]]:
    """While inside, every block returns ``outputs[b]`` (the last block's real output for batch b) at once;
    yields ``select(b)``, to be called before the model runs batch b. A forward then costs only what comes
    before and after the blocks (a causal LM's embedding, final norm and head)."""
    current = {"batch": 0}

    def make(index, original):
        return lambda *args, **kwargs: outputs[current["batch"]]

    with replaced_forwards(blocks, make):
        yield lambda batch: current.__setitem__("batch", batch)
