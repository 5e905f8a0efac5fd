"""``lowbit.ptq``: the post-training quantization flows (static, dynamic, weight-only), which live in
:mod:`lowbit.flows.ptq`; this name stays because the docs and users' code call them ``lowbit.ptq.*``."""

from lowbit.flows.ptq import (
    DEFAULT_OPS,
    OBSERVERS,
    CalibrationState,
    calibrate,
    quantize_dynamic,
    quantize_static,
    quantize_weight_only,
)

__all__ = ["DEFAULT_OPS", "OBSERVERS", "CalibrationState", "calibrate", "quantize_dynamic", "quantize_static",
           "quantize_weight_only"]  # fmt: skip
