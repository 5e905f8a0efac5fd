"""What machine a benchmark ran on, as one header line for its output table.

Ratios measured by these benchmarks depend on the CPU's instruction sets more than on anything else (int8
GEMMs need VNNI to beat float32, bfloat16 matmuls need AVX512-BF16 or AMX), so every benchmark prints
``header_line()`` and writes it into its table; RESULTS.md groups the tables by ``cpu_class``.

``cpu_class(flags)`` is a pure function of the CPU flag names (no torch), so the library can reuse it.
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Iterable

# The flags that decide how fast integer and bfloat16 kernels can be, in the order they are listed.
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16",
             "amx_tile", "amx_int8", "amx_bf16")  # fmt: skip

def cpu_class(flags: Iterable[str], machine: str | None = None) -> str:
    """The readable name of the library's CPU class (``lowbit.ops.capabilities``) for the flag names ``flags``
    (as /proc/cpuinfo spells them). ``machine`` (``platform.machine()`` by default) only names non-x86 CPUs."""
    present = set(flags)
    machine = machine or platform.machine()
    if not present & {"avx2", "sse2", "avx"} and machine.lower() not in ("x86_64", "amd64", "i386", "i686"):
        return f"{machine} (not x86)"
    from lowbit.ops.capabilities import CLASS_LABELS, Machine  # the library's own classes, with readable names

    return CLASS_LABELS[Machine("cpu", frozenset(present)).cpu_class]


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as file:
            for line in file:
                if not line.strip():
                    if fields:
                        break  # end of the first processor's block
                    continue
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def describe() -> dict:
    """The machine as a dict: cpu, vendor, family, model, flags (the ``ISA_FLAGS`` present; None where the
    flags cannot be read), cpu_class, torch_capability, threads, cpus, torch, gpu (None without CUDA)."""
    import torch

    info = _cpuinfo()
    cpu = info.get("model name") or platform.processor() or platform.machine()
    vendor, family, model = info.get("vendor_id"), info.get("cpu family"), info.get("model")
    if not info:  # Windows names them in platform.processor(): "Intel64 Family 6 Model 85 Stepping 7, GenuineIntel"
        found = re.search(r"Family (\d+) Model (\d+).*?,\s*(\S+)", platform.processor())
        if found:
            family, model, vendor = found.groups()
    listed = info.get("flags")
    if listed is None:  # no /proc/cpuinfo, or a non-x86 one (ARM lists "Features")
        flags = None
        x86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
        kind = "unknown (CPU flags not readable)" if x86 else cpu_class(())
    else:
        names = set(listed.split())
        flags = [flag for flag in ISA_FLAGS if flag in names]
        kind = cpu_class(names)
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu, "vendor": vendor, "family": family, "model": model, "flags": flags, "cpu_class": kind,
            "torch_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
            "cpus": os.cpu_count(), "torch": torch.__version__, "gpu": gpu, "native_target": native_target()}  # fmt: skip


def native_target() -> str:
    """The target lowbit's native kernels are built for: this CPU unless $LOWBIT_NATIVE_MARCH names another
    (an AVX2-class build on an AVX-512 machine, say), so a table says which class's code it timed."""
    from lowbit.native import build

    target = os.environ.get("LOWBIT_NATIVE_MARCH", "").strip()
    fallback = build.fallback()  # the loaded library could not be built with the first choice of flags
    return (f"-march={target}" if target else "this CPU (-march=native)") + (f", but {fallback}" if fallback else "")


def header_line(machine: dict | None = None) -> str:
    """One line naming the machine (``describe()`` unless given); call it after setting the thread count."""
    m = machine or describe()
    numbers = ", ".join(f"{name} {value}" for name, value in (("family", m["family"]), ("model", m["model"])) if value)
    identity = " ".join(part for part in (m["vendor"], numbers) if part)
    flags = " ".join(m["flags"]) if m["flags"] is not None else "unknown"
    emulation = os.environ.get("LOWBIT_BENCH_EMULATED")  # benchmarks/emulate.py: another class's kernels
    kind = m["cpu_class"] + (f", kernels EMULATED as {emulation} (--emulate {emulation})" if emulation else "")
    return (f"machine: {m['cpu']}" + (f" ({identity})" if identity else "") + f"; class {kind}; "
            f"flags {flags or 'none of ' + '/'.join(ISA_FLAGS)}; torch CPU capability {m['torch_capability']}; "
            f"{m['threads']} threads ({m['cpus']} CPUs); torch {m['torch']}; GPU {m['gpu'] or 'none'}; "
            f"native kernels built for {m.get('native_target') or native_target()}")  # fmt: skip


if __name__ == "__main__":
    print(header_line())
