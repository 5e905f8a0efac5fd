"""Quantized layers: one module per op, format-agnostic, plus quantized functional ops.

Each takes a :class:`RoleFormats` (role -> format); :func:`parse_node_config` builds one from a MASE-style
flat config (``data_in_width``, ``weight_frac_width``, ...).
"""

from lowbit.nn.config import OP_ROLES, QUANTIZABLE_OPS, parse_node_config
from lowbit.nn.logicnets import LogicNetsLinear, prune_to_fan_in
from lowbit.nn.lutnet import LUTNetLinear
from lowbit.nn.functional import FUNCTION_FOR_OP, QUANT_FUNCTIONS
from lowbit.nn.modules import (
    MODULE_FOR_OP, QUANT_MODULES, QuantBatchNorm2d, QuantConv1d, QuantConv2d, QuantEmbedding, QuantGELU,
    QuantLayerNorm, QuantLinear, QuantModule, QuantReLU, QuantSoftmax,
)  # fmt: skip
from lowbit.nn.roles import ROLES, RoleFormats

__all__ = [
    "FUNCTION_FOR_OP", "MODULE_FOR_OP", "OP_ROLES", "QUANTIZABLE_OPS", "QUANT_FUNCTIONS", "QUANT_MODULES", "ROLES",
    "QuantBatchNorm2d", "QuantConv1d", "QuantConv2d", "QuantEmbedding", "QuantGELU", "QuantLayerNorm",
    "LUTNetLinear", "LogicNetsLinear", "QuantLinear", "QuantModule", "prune_to_fan_in", "QuantReLU", "QuantSoftmax", "RoleFormats", "parse_node_config",
]  # fmt: skip
