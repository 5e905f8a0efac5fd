"""`lowbit machine` / lowbit.ops.machine_report: the machine's class, every probe and the automatic path of each
real module, the same answers the modules' own choice gives (checked for every CPU class with injected
capabilities, and on this machine)."""

from __future__ import annotations

import pytest
import torch

from lowbit.ops import capabilities, routes
from lowbit.ops.machine_report import LAYER, ROWS, report


def answers(device: str = "cpu") -> dict[str, str]:
    return {row["what"]: row["answer"] for row in report(device)}


# What each injected class answers for the MiniLM-sized layer: 16 rows with act_bits 8 and 7, 2112 rows (where
# compiled or plain int_mm depends on whether this process may compile), the static Linear, the convolution.
EXPECTED = {
    "avx2": ("fbgemm_pairs", "fbgemm", {"fbgemm_pairs"}, "float_codes", "reference"),
    "avx512_vnni": ("fbgemm", "fbgemm", {"compiled", "int_mm"}, "fbgemm", "onednn"),
    "amx": ("fbgemm", "fbgemm", {"onednn"}, "fbgemm", "onednn"),
}


@pytest.mark.parametrize("cpu_class", sorted(EXPECTED))
def test_every_class_reports_its_routes(cpu_class):
    k, n = LAYER
    few, many = ROWS
    with capabilities.injected(cpu_class):
        got = answers()
    dynamic = f"Int8DynamicLinear {k} -> {n}"
    few_8, few_7, many_8, static, conv = EXPECTED[cpu_class]
    assert got["machine"].endswith(f"({capabilities.CLASS_LABELS[cpu_class]})")
    assert got[f"{dynamic}, {few} rows, act_bits=8"] == few_8
    assert got[f"{dynamic}, {few} rows, act_bits=7"] == few_7
    assert got[f"{dynamic}, {many} rows, act_bits=8"] in many_8
    assert got[f"W8A8StaticLinear {k} -> {n}, {few} rows"] == static
    assert got["Int8Conv2d"] == conv
    for name, outcome in capabilities.CLASS_PRESETS[cpu_class][1].items():
        assert got[f"probe {name}"] == ("yes" if outcome else "no")


def test_this_machine_answers_as_the_routes_do():
    got = answers()
    for name in capabilities.PROBES:
        assert got[f"probe {name}"] == ("yes" if capabilities.probe(name, "cpu") else "no")
    k, n = LAYER
    cpu = torch.device("cpu")
    assert got[f"Int8DynamicLinear {k} -> {n}, {ROWS[0]} rows, act_bits=8"] == routes.int8_dynamic(cpu, ROWS[0], k, n)
    assert got["Int8Conv2d"] == routes.int8_conv(cpu)
    assert got["Int4WeightOnlyLinear, float32 compute, 1 row"] in ("native", "dequantize")  # never bfloat16
    assert got["Int4WeightOnlyLinear, bfloat16 compute, 64 rows"] == "dequantize_bf16"
