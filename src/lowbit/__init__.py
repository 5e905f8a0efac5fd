"""lowbit: quantize PyTorch models to any arithmetic and measure what that costs.

    >>> import torch, lowbit
    >>> x = torch.randn(4, 64)
    >>> y = lowbit.quantize(x, "affine", bits=4, symmetric=True, axis=0)

Models: ``lowbit.quantize_(model, "int8_dynamic")`` (real int8 kernels), ``lowbit.quantize_(model,
"mxfp4_e2m1")`` (simulated), MASE pass_args, or a typed recipe from ``lowbit.flows``; ``lowbit.save`` /
``lowbit.load`` round-trip the result. Subpackages (``lowbit.ptq``, ``lowbit.ops``, ``lowbit.graph``, ...)
are imported on first use, so ``import lowbit`` stays light.
"""

import importlib

from lowbit._version import __version__
from lowbit.errors import ConfigError, FormatError, LowbitError

# Everything else (torch included) loads when first touched, so that `import lowbit` (and the command line's
# start-up, which must answer Ctrl-C with one line) costs nothing: documented subpackages by name, and
# the public functions from the module that defines them.
_SUBPACKAGES = ("api", "backend", "calibrate", "cli", "config", "convert", "datasets", "export", "flows", "formats",
                "graph", "models", "nn", "ops", "optim", "pipeline", "ptq", "qtensor", "report", "search", "train")  # fmt: skip
_LAZY = {"quantize": "lowbit.api", "warmup": "lowbit.api", "get_backend": "lowbit.backend",
         "set_backend": "lowbit.backend", "ROUNDING_MODES": "lowbit.formats", "FormatSpec": "lowbit.formats",
         "get_format": "lowbit.formats", "list_formats": "lowbit.formats", "QTensor": "lowbit.qtensor",
         "encode": "lowbit.qtensor", "quantize_": "lowbit.flows", "quantize_model": "lowbit.flows",
         "save": "lowbit.export", "load": "lowbit.export", "export_onnx": "lowbit.export",
         "load_gguf": "lowbit.export", "export_gguf": "lowbit.export",
         "export_compressed_tensors": "lowbit.export", "perplexity": "lowbit.models.causal_lm"}  # fmt: skip


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif name in _SUBPACKAGES:
        value = importlib.import_module(f"lowbit.{name}")
    else:
        raise AttributeError(f"module 'lowbit' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_SUBPACKAGES) | set(_LAZY))


__all__ = [
    "ConfigError", "FormatError", "FormatSpec", "LowbitError", "ROUNDING_MODES",
    "formats", "get_backend", "get_format", "list_formats", "quantize", "set_backend", "warmup", "__version__",
]  # fmt: skip
__all__ += ["QTensor", "encode", "load", "save", "export_onnx", "load_gguf", "export_gguf", "export_compressed_tensors"]
__all__ += ["quantize_", "quantize_model", "perplexity"]
