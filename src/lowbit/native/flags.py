"""The compiler flags the native library is built with (build.py tries the sets in order): exact IEEE
arithmetic, this CPU's instruction set first, and torch's OpenMP runtime where it can be shared."""

from __future__ import annotations

import os
from pathlib import Path

# Exact IEEE semantics: no -ffast-math, no FMA contraction, no errno calls in the rounding functions.
# -fno-trapping-math changes no value (no reassociation, no contraction): it tells the compiler that no one
# reads floating-point exception flags, so it may compute a float operation that the source keeps behind a
# condition and select the result. Without it, GCC leaves such loops scalar wherever the target has no masked
# vector operations: on an AVX2-class build 563 loops stayed scalar ("control flow in loop") and 896
# vectorised; with it 87 and 1667 (GCC 12; AVX-512 masks hid most of this on the machines we tuned on).
BASE_FLAGS = ["-O3", "-std=c11", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math", "-fPIC", "-shared",
              "-pthread"]  # fmt: skip
ARCH_FLAGS = [["-march=native"], []]  # the second: compilers / targets without -march=native
OPENMP_FLAGS = ["-fopenmp"]


def choices() -> list[list[str]]:
    """Flag sets to try in order: with OpenMP first where torch's pool can be shared, each with -march=native
    first."""
    threading_choices = [OPENMP_FLAGS, []] if openmp_wanted() else [[]]
    return [optimisation() + BASE_FLAGS[1:] + arch + extra for extra in threading_choices for arch in arch_choices()]


def optimisation() -> list[str]:
    """-O3, or ``$LOWBIT_NATIVE_OPT`` (0-3): a build at -O1 takes about a quarter of the time and gives the
    same bits (exactness comes from the other flags), with slower kernels; the build tests use it (the level
    is part of the cache key)."""
    level = os.environ.get("LOWBIT_NATIVE_OPT", "").strip()
    if not level:
        return BASE_FLAGS[:1]
    if level not in ("0", "1", "2", "3"):
        raise ValueError(f"LOWBIT_NATIVE_OPT={level!r} is not an optimisation level (0, 1, 2 or 3)")
    return [f"-O{level}"]


def arch_choices() -> list[list[str]]:
    """-march=native then none; ``$LOWBIT_NATIVE_MARCH`` (say ``x86-64-v3``: AVX2 without AVX-512) builds for
    that target instead, to run another CPU class's code on this one (a target this CPU cannot run fails
    its first call: the variable is for tests and benchmarks)."""
    target = os.environ.get("LOWBIT_NATIVE_MARCH", "").strip()
    if not target:
        return ARCH_FLAGS
    if not all(character.isalnum() or character in "-_." for character in target):
        raise ValueError(f"LOWBIT_NATIVE_MARCH={target!r} is not a compiler target name")
    return [[f"-march={target}"]]


def openmp_wanted() -> bool:
    """Whether to build on OpenMP: torch's runtime in this process is GNU OpenMP (libgomp is mapped), so the
    library shares torch's thread pool instead of starting a second runtime."""
    if os.environ.get("LOWBIT_NATIVE_OPENMP", "").strip().lower() in ("0", "false", "no", "off"):
        return False
    try:
        maps = Path("/proc/self/maps").read_text(errors="replace")
    except OSError:  # not Linux: threads of our own
        return False
    runtimes = {line.rsplit("/", 1)[-1] for line in maps.splitlines() if "omp" in line.rsplit("/", 1)[-1]}
    return any(name.startswith("libgomp") for name in runtimes) and not any(
        name.startswith(("libiomp", "libomp")) for name in runtimes)  # fmt: skip
