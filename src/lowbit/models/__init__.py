"""Built-in models: the seed-002 toy network; the MiniLM adapter lives in :mod:`lowbit.models.minilm`
(optional ``hf`` extra, imported only when used)."""

from lowbit.models.digits import DigitsCNN, DigitsMLP
from lowbit.models.toy import ToyNet

__all__ = ["DigitsCNN", "DigitsMLP", "ToyNet"]
