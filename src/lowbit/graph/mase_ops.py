"""MASE's node classification: every fx node gets a ``mase_type`` and a ``mase_op``.

- placeholder / output nodes: type and op are "placeholder" / "output".
- call_module: type "module_related_func" (BatchNorm: "module", Embedding: "implicit_func"); the op is the
  first class in :data:`MODULE_OPS` the module is an instance of (quantized modules subclass the float
  ones, so they keep their op); other modules are "user_defined_module".
- call_function: the function's ``__name__`` is matched against the builtin, module-related and implicit
  name lists; an exact name wins, otherwise the longest list entry contained in it (MASE's substring
  rule; one- and two-letter entries only match exactly). Unmatched functions are "user_defined_func"
  (MASE raises there).
- call_method: type "implicit_func", op the method name. get_attr: type "get_attr", op "constant".
"""

from __future__ import annotations

from typing import NamedTuple

from torch import fx, nn

# Order matters: the first isinstance match wins (as in MASE).
MODULE_OPS: tuple[tuple[type[nn.Module], str], ...] = (
    (nn.AdaptiveAvgPool1d, "adaptive_avg_pool1d"), (nn.AdaptiveAvgPool2d, "adaptive_avg_pool2d"),
    (nn.AdaptiveMaxPool1d, "adaptive_max_pool1d"), (nn.AdaptiveMaxPool2d, "adaptive_max_pool2d"),
    (nn.AvgPool1d, "avg_pool1d"), (nn.AvgPool2d, "avg_pool2d"), (nn.MaxPool1d, "max_pool1d"),
    (nn.MaxPool2d, "max_pool2d"), (nn.BatchNorm1d, "batch_norm1d"), (nn.BatchNorm2d, "batch_norm2d"),
    (nn.Conv2d, "conv2d"), (nn.Conv1d, "conv1d"), (nn.ConvTranspose2d, "convtranspose2d"),
    (nn.LayerNorm, "layer_norm"), (nn.GroupNorm, "group_norm"), (nn.InstanceNorm2d, "instance_norm2d"),
    (nn.Linear, "linear"), (nn.ReLU, "relu"), (nn.SELU, "selu"), (nn.Tanh, "tanh"), (nn.GELU, "gelu"),
    (nn.Softsign, "softsign"), (nn.Softplus, "softplus"), (nn.Hardtanh, "hardtanh"),
    (nn.Embedding, "embedding"), (nn.ReLU6, "relu6"), (nn.Dropout, "dropout"), (nn.Hardswish, "hardswish"),
    (nn.Hardsigmoid, "hardsigmoid"), (nn.Sigmoid, "sigmoid"), (nn.Softmax, "softmax"),
    (nn.Hardshrink, "hardshrink"), (nn.SiLU, "silu"), (nn.ELU, "elu"), (nn.Softshrink, "softshrink"),
    (nn.LogSigmoid, "logsigmoid"), (nn.CrossEntropyLoss, "crossentropyloss"), (nn.Flatten, "flatten"),
    (nn.Identity, "identity"), (nn.Upsample, "upsample"),
)  # fmt: skip
# Module ops whose mase_type is not "module_related_func".
MODULE_TYPE_EXCEPTIONS = {"batch_norm1d": "module", "batch_norm2d": "module", "embedding": "implicit_func"}

BUILTIN_FUNCS = (
    "add", "sub", "mul", "truediv", "floordiv", "div", "matmul", "bmm", "mean", "pow", "sqrt", "rsqrt", "neg",
    "exp", "log", "sum", "max", "min", "cat", "stack", "eq", "ne", "lt", "gt", "le", "ge", "abs", "erf",
    "cumsum", "where", "clamp", "einsum", "baddbmm", "addmm",
)  # fmt: skip
MODULE_RELATED_FUNCS = (
    "linear", "conv1d", "conv2d", "conv_transpose2d", "relu", "relu6", "gelu", "silu", "selu", "tanh",
    "sigmoid", "softmax", "log_softmax", "layer_norm", "group_norm", "batch_norm", "instance_norm",
    "dropout", "hardtanh", "softplus", "softsign", "elu", "hardswish", "hardsigmoid", "max_pool1d",
    "max_pool2d", "avg_pool1d", "avg_pool2d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
    "scaled_dot_product_attention",
)  # fmt: skip
IMPLICIT_FUNCS = (
    "size", "view", "flatten", "reshape", "permute", "transpose", "t", "contiguous", "getitem", "getattr",
    "unsqueeze", "squeeze", "expand", "repeat", "embedding", "chunk", "split", "type_as", "to", "ones",
    "zeros", "arange", "full", "masked_fill", "finfo", "dim", "float", "long", "int", "clone", "detach",
)  # fmt: skip
# Function names whose mase_op differs from the matched name.
FUNCTION_OP_NAMES = {"batch_norm": "batch_norm2d", "conv_transpose2d": "convtranspose2d", "iadd": "add"}


class MaseKind(NamedTuple):
    mase_type: str
    mase_op: str


def classify(node: fx.Node, modules: dict[str, nn.Module]) -> MaseKind:
    """The (mase_type, mase_op) of one node; ``modules`` is ``dict(graph_module.named_modules())``."""
    if node.op in ("placeholder", "output"):
        return MaseKind(node.op, node.op)
    if node.op == "call_module":
        return _classify_module(modules[node.target])
    if node.op == "call_function":
        return _classify_function(getattr(node.target, "__name__", str(node.target)))
    if node.op == "call_method":
        return MaseKind("implicit_func", str(node.target))
    return MaseKind("get_attr", "constant")


def _classify_module(module: nn.Module) -> MaseKind:
    for cls, op in MODULE_OPS:
        if isinstance(module, cls):
            return MaseKind(MODULE_TYPE_EXCEPTIONS.get(op, "module_related_func"), op)
    return MaseKind("user_defined_module", type(module).__name__.lower())


def _classify_function(name: str) -> MaseKind:
    lists = (("builtin_func", BUILTIN_FUNCS), ("module_related_func", MODULE_RELATED_FUNCS),
             ("implicit_func", IMPLICIT_FUNCS))  # fmt: skip
    best: tuple[int, str, str] | None = None
    for mase_type, names in lists:
        for candidate in names:
            exact = candidate == name
            inside = len(candidate) >= 3 and candidate in name
            if exact:
                return MaseKind(mase_type, FUNCTION_OP_NAMES.get(candidate, candidate))
            if inside and (best is None or len(candidate) > best[0]):
                best = (len(candidate), mase_type, candidate)
    if best is None:
        return MaseKind("user_defined_func", name)
    return MaseKind(best[1], FUNCTION_OP_NAMES.get(best[2], best[2]))
