"""What a number format family tells the backend: its record.

Every format class carries one ``FormatRecord`` (``FormatSpec.format_record``), built once per class when the
class is defined. The backend (``lowbit.backend``) picks the native kernel, a compiled kernel or the eager path
from this record and from the spec's public properties alone; it never calls a format's private methods and
never imports ``lowbit.formats``. The record sits on the floor below both (it imports nothing of lowbit).

A record holds functions that take the spec first (unbound methods of the format class, or plain functions),
so one record serves every spec of its class.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

# native(spec, x, out_dtype) -> tensor or None: the kernel's result for x (contiguous, on the CPU; float32, or a
# half type where ``native_takes_halves``), bit for bit ``eager(spec, x, None, out_dtype)`` once cast to
# out_dtype; None where the kernel does not take these parameters or this layout.
NativeBinding = Callable[[Any, Any, Any], Any]
# eager(spec, x, generator, out_dtype) -> tensor: the whole job in torch ops (up-cast half types, quantize,
# narrow to out_dtype or x's dtype); the compiled path hands this same function to torch.compile.
EagerFunction = Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class FormatRecord:
    """How one format family runs. ``native`` None: no native kernel (the backend skips that path at once).

    ``native_takes_halves``: the kernel also takes bfloat16 / float16 x and answers in x's dtype (else the
    backend widens x and narrows the float32 result). ``upcast_before_kernel``: a compiled kernel takes half
    types widened to float32 (block reductions run faster so).
    """

    eager: EagerFunction
    native: NativeBinding | None = None
    native_takes_halves: bool = False
    upcast_before_kernel: bool = False
