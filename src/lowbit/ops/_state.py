"""Derived kernel state shared by the real modules: built lazily, per device, never saved or pickled.

A real module's buffers (codes, scales, zero points, bias) are its whole state. Kernel objects derived from
them (prepacked weights, transposed codes, row sums) live in ``_kernel_state`` and are dropped whenever the
buffers change place or value: ``load_state_dict``, ``.to(device)`` / ``.cuda()`` / ``.half()`` (through
``_apply``), deepcopy and pickling. They are built outside ``torch.inference_mode()``, so a module first
called under inference mode keeps working under ``no_grad`` or autograd afterwards.

Buffers keep their dtypes on ``.to(dtype)`` / ``.half()`` / ``.bfloat16()``: the codes and scales are the
quantized model (a bfloat16 scale cast to float16 would change the numbers), so only the device follows.
The compute dtype follows the input instead (see ``lowbit.ops.routes``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


class DerivedStateMixin(nn.Module):
    _kernel_state: dict[str, Any]

    def derived(self, key: str, build: Callable[[], Any]) -> Any:
        """``build()`` once per key until the buffers change (made as ordinary tensors, not inference ones)."""
        state = self._kernel_state
        if key not in state:
            with torch.inference_mode(False), torch.no_grad():
                state[key] = build()
        return state[key]

    def _apply(self, fn, recurse: bool = True):
        self._kernel_state.clear()

        def keep_dtype(tensor: torch.Tensor) -> torch.Tensor:
            moved = fn(tensor)  # a dtype cast is undone: only the device follows
            return moved if moved.dtype == tensor.dtype else tensor.to(device=moved.device)

        return super()._apply(keep_dtype, recurse)

    def _load_from_state_dict(self, *args, **kwargs):
        self._kernel_state.clear()
        super()._load_from_state_dict(*args, **kwargs)

    def __getstate__(self):
        state = dict(super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__)
        state["_kernel_state"] = {}  # derived kernel objects are never copied or pickled
        return state

