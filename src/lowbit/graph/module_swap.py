"""``quantize_module_transform_pass``: quantize a model without tracing it, by swapping modules in place.

For models torch.fx cannot capture (Hugging Face transformers, data-dependent control flow). It takes the
same pass_args as :func:`quantize_transform_pass`, with module keys: ``by="type"`` keys are mase_op names
(``linear``, ``layer_norm``, ...), ``by="name"`` keys are qualified module names as ``named_modules()``
gives them (``encoder.layer.0.attention.self.query``), ``by="regex_name"`` keys are regexes fully matched
against those names. Only module ops can be reached this way (functions called inside a module's forward
stay float). Every config is validated before the first module is swapped.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from torch import nn

from lowbit.errors import ConfigError
from lowbit.graph.plan import Simulated, apply
from lowbit.graph.select import Selector, swappable_modules
from lowbit.nn.config import NodeConfig, read_node_config
from lowbit.nn.modules import MODULE_FOR_OP


def quantize_module_transform_pass(model: nn.Module, pass_args: dict[str, Any]) -> tuple[nn.Module, dict[str, Any]]:
    """Swap the selected modules of ``model`` (in place) for quantized copies; returns (model, info)."""
    if not isinstance(model, nn.Module):
        raise ConfigError(f"quantize_module_transform_pass needs an nn.Module, got {type(model).__name__}")
    candidates = swappable_modules(model)
    all_names = [name for name, _ in model.named_modules() if name]
    selector = Selector(pass_args, all_names, "module name of this model")
    plan, skipped, unused = [], [], {}
    for name, module, op in candidates:
        key, config = selector.config_for(op, name)
        parsed = read_node_config(op, config, f"module {name!r} ({op}, config {key!r})",
                                  shared=selector.is_shared(key)) if config else NodeConfig(None)  # fmt: skip
        if parsed.unused:
            unused[name] = parsed.unused
        if parsed.formats is None:
            skipped.append(name)
        else:
            plan.append((name, module, op, parsed.formats))
    _check_named_modules_exist(selector, candidates)
    apply(model, {name: Simulated(formats, op) for name, _, op, formats in plan})
    counts = Counter(op for _, _, op, _ in plan)
    return model, {"quantized": [name for name, *_ in plan], "skipped": skipped, "counts": dict(counts),
                   "unused_keys": unused}  # fmt: skip


def _check_named_modules_exist(selector: Selector, candidates: list[tuple[str, nn.Module, str]]) -> None:
    if selector.by != "name":
        return
    names = {name for name, _, _ in candidates}
    for key in selector.entries:
        if key not in names:
            raise ConfigError(f"module {key!r} has no quantized counterpart (quantizable module types: "
                              f"{', '.join(cls.float_class.__name__ for cls in MODULE_FOR_OP.values())})")  # fmt: skip
