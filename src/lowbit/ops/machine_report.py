"""What the real modules would run on a device of this machine, and why: the CPU's class, every probe's outcome
(:mod:`lowbit.ops.capabilities`) and the automatic path of each real module at a few typical sizes
(:mod:`lowbit.ops.routes`). ``lowbit machine`` prints it; it is the first thing to look at on a CPU or GPU the
project has not measured (docs/real-execution.md, "Machines not measured yet")."""

from __future__ import annotations

import torch

from lowbit import backend, native
from lowbit.ops import capabilities, routes
from lowbit.ops.int4 import Int4WeightOnlyLinear

# A MiniLM feed-forward layer (batch 32 x 66 tokens = 2112 rows) and a few-rows call of it.
LAYER = (384, 1536)
ROWS = (16, 2112)


def report(device: torch.device | str = "cpu") -> list[dict[str, str]]:
    """Rows of (what, answer): the machine, each probe (measured once per device and cached; a timing probe
    takes about a second), then the path each real module takes automatically here."""
    device = torch.device(device)
    machine = capabilities.machine(device)
    kind = capabilities.CLASS_LABELS.get(machine.cpu_class, machine.cpu_class) if device.type == "cpu" else device.type
    rows = [("machine", f"{machine.name} ({kind})")]
    for name in sorted(capabilities.PROBES):
        rows.append((f"probe {name}", "yes" if capabilities.probe(name, device) else "no"))
    rows += _module_paths(device)
    return [{"what": what, "answer": answer} for what, answer in rows]


def _module_paths(device: torch.device) -> list[tuple[str, str]]:
    k, n = LAYER
    compile_allowed = backend.compiling_allowed(max(ROWS) * k, auto_min_elements=0)
    paths = []
    for rows in ROWS:
        for act_bits in (8, 7):
            path = routes.int8_dynamic(device, rows, k, n, act_bits=act_bits, compile_allowed=compile_allowed)
            paths.append((f"Int8DynamicLinear {k} -> {n}, {rows} rows, act_bits={act_bits}", path))
    paths.append((f"W8A8StaticLinear {k} -> {n}, {ROWS[0]} rows", routes.w8a8_static(device, ROWS[0], k, n)))
    paths.append(("Int8Conv2d", routes.int8_conv(device)))
    module = Int4WeightOnlyLinear
    loaded = module.has_native and backend.get_backend() in ("auto", "native") and native.ensure() is not None
    for dtype, label in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16")):
        for rows in (1, 64):
            path = routes.weight_only(device, rows, dtype, module.packed_path, True, module.SMALL_BATCH, loaded)
            paths.append((f"Int4WeightOnlyLinear, {label} compute, {rows} row{'s' * (rows > 1)}", path))
    return paths
