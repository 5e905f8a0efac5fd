"""`lowbit machine`: the report of lowbit.ops.machine_report as a table (tests/ops/test_machine_report.py checks
its answers), one line and exit 2 for a device that is not one here."""

from __future__ import annotations

import torch


def test_the_cli_prints_the_report_and_refuses_a_bad_device(lowbit_cli):
    status, out, _err = lowbit_cli("machine")
    assert status == 0 and "probe int_mm_exact" in out and "Int8Conv2d" in out
    status, _out, err = lowbit_cli("machine", "--device", "nonsense")
    assert status == 2 and "not a device" in err and len(err.strip().splitlines()) == 1
    if not torch.cuda.is_available():
        status, _out, err = lowbit_cli("machine", "--device", "cuda")
        assert status == 2 and "no such CUDA device" in err
