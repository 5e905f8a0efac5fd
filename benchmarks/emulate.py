"""``--emulate avx2``: run a benchmark with the kernels an AVX2 CPU without VNNI runs, on any x86 CPU.

fbgemm, oneDNN and ATen read their instruction-set limits when torch loads, and lowbit's native kernels are
compiled for a target, so the switch cannot be flipped inside a running process: :func:`apply` re-executes
the benchmark once with the environment set (fbgemm's AVX2 kernels, which add u8 x s8 pairs in saturating
int16 exactly as a Zen 3 does; oneDNN held to AVX2; ATen's AVX2 kernels; lowbit's C kernels built for
x86-64-v3; a fresh Inductor cache, see the Makefile's test-no-vnni) and the table's header says
"emulated". Speeds measured this way are the AVX2 code's speed on this CPU's cores, caches and memory: a real
AVX2 machine confirms them (RESULTS.md keeps real-AVX2 rows apart).
"""

from __future__ import annotations

import os
import sys
import tempfile

EMULATIONS = {
    "avx2": {"FBGEMM_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
             "LOWBIT_NATIVE_MARCH": "x86-64-v3"},
}  # fmt: skip
MARKER = "LOWBIT_BENCH_EMULATED"


def requested(argv: list[str]) -> str | None:
    """The NAME of ``--emulate NAME`` / ``--emulate=NAME`` in ``argv`` (None without one)."""
    for index, argument in enumerate(argv):
        if argument == "--emulate" and index + 1 < len(argv):
            return argv[index + 1]
        if argument.startswith("--emulate="):
            return argument.split("=", 1)[1]
    return None


def apply(argv: list[str] | None = None) -> str | None:
    """Call before torch is imported: re-execute this script under the emulation ``--emulate`` names (once),
    and return the emulation in force (None without one). An unknown name exits with status 2."""
    argv = sys.argv if argv is None else argv
    name = requested(argv[1:])
    if name is None:
        return None
    if name not in EMULATIONS:
        print(f"--emulate {name!r}: unknown; choose from {', '.join(EMULATIONS)}", file=sys.stderr)
        raise SystemExit(2)
    if os.environ.get(MARKER) == name:
        return name
    environment = {**os.environ, **EMULATIONS[name], MARKER: name,
                   "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="lowbit-emulated-inductor-")}  # fmt: skip
    os.execve(sys.executable, [sys.executable, *argv], environment)
    return name  # not reached


def emulated() -> str | None:
    """The emulation this process runs under (set by :func:`apply`), for the table's header."""
    return os.environ.get(MARKER) or None
