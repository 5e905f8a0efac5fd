"""Quantize a module's parameters once while they do not change.

Evaluation, calibration, reports and search trials call a quantized module many times with the same
weights; quantizing them on every forward repeats work whose answer is already known. A quantized module
keeps, per role (``weight``, ``bias``), the last quantized tensor together with what it was computed from,
and reuses it while all of that is unchanged:

- the parameter itself (the same tensor object, storage pointer, shape, dtype and device: a ``.to()`` or an
  assignment gives a new one) and its ``_version`` counter (bumped by every in-place write: optimizer steps,
  ``load_state_dict``, ``with torch.no_grad(): w.mul_(2)``);
- the module's ``formats`` object (a new RoleFormats means new specs);
- whether inference mode is on (an inference tensor must not leak into autograd).

The cache is used only when no gradient has to flow to the parameter: under ``torch.no_grad`` /
``inference_mode``, or for a parameter that does not require grad. A training step (grad enabled, weight
requiring grad) always quantizes afresh through the straight-through estimator. ``QuantModule._apply``
(``.to()``, ``.half()``, ``.cuda()``) drops the cache so no stale copy is kept in memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

CACHED_ROLES = ("weight", "bias")
_ATTRIBUTE = "_lowbit_quantized_parameters"


def cached_role(module: Any, role: str, value: Any, quantize: Callable[[str, Any], Any]) -> Any:
    """``quantize(role, value)``, reused from the module's cache while its inputs are unchanged."""
    if role not in CACHED_ROLES or not isinstance(value, torch.Tensor) or not _cacheable(value):
        return quantize(role, value)
    key = _key(module, value)
    cache = module.__dict__.setdefault(_ATTRIBUTE, {})
    entry = cache.get(role)
    if entry is not None and _same_key(entry[0], key):
        return entry[1]
    cache.pop(role, None)  # free the stale copy before making the new one
    result = quantize(role, value)
    cache[role] = (key, result)
    return result


def clear(module: Any) -> None:
    """Drop every cached quantized parameter of ``module``."""
    module.__dict__.pop(_ATTRIBUTE, None)


def _cacheable(value: torch.Tensor) -> bool:
    """No gradient path to the parameter is needed (and the tensor has real data)."""
    needs_gradient = torch.is_grad_enabled() and value.requires_grad
    return not needs_gradient and value.device.type != "meta" and value.is_floating_point()


def _key(module: Any, value: torch.Tensor) -> tuple:
    return (value, module.formats, value._version, value.data_ptr(), tuple(value.shape), value.dtype, value.device,
            torch.is_inference_mode_enabled())  # fmt: skip


def _same_key(old: tuple, new: tuple) -> bool:
    """Objects (tensor, formats) by identity, the rest by value."""
    return old[0] is new[0] and old[1] is new[1] and old[2:] == new[2:]
