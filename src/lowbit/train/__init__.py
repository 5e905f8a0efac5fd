"""Training and quantization-aware training on Lightning (the ``train`` extra): ``fit`` and the Lightning
module / data module it uses. Imported only by the ``lowbit train`` command and by users who ask."""

from lowbit.train.fit import FitResult, fit

__all__ = ["FitResult", "fit"]
