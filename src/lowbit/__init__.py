"""lowbit: quantize PyTorch models to any arithmetic and measure what that costs.

    >>> import torch, lowbit
    >>> x = torch.randn(4, 64)
    >>> y = lowbit.quantize(x, "affine", bits=4, symmetric=True, axis=0)
"""

from lowbit import formats
from lowbit.api import quantize, warmup
from lowbit.backend import get_backend, set_backend
from lowbit.errors import ConfigError, FormatError, LowbitError
from lowbit.formats import ROUNDING_MODES, FormatSpec, get_format, list_formats
from lowbit.convert import quantize_model  # lowbit.ops (kernels) is imported on first use
from lowbit.export import load, save  # safetensors is imported only when they run
from lowbit.qtensor import QTensor, encode

__version__ = "0.1.0"

__all__ = [
    "ConfigError", "FormatError", "FormatSpec", "LowbitError", "ROUNDING_MODES",
    "formats", "get_backend", "get_format", "list_formats", "quantize", "set_backend", "warmup", "__version__",
]  # fmt: skip
__all__ += ["QTensor", "encode", "load", "save"]
__all__ += ["quantize_model"]
