"""Native (C) quantizers: one pass over memory per format, bit-identical to the eager torch path.

Formats implement ``FormatSpec._native`` with the kernels of :mod:`lowbit.native.kernels`; the backend
(``lowbit.backend``) calls it for float32 / float16 / bfloat16 tensors on the CPU once the library is
loaded (see :mod:`lowbit.native.build`: compiled once per machine, on a background thread, and cached).
"""

from lowbit.native.build import answered, disabled, ensure, error, library, start_background_build

__all__ = ["answered", "disabled", "ensure", "error", "library", "start_background_build"]
