"""``--warmup``: the simulated layers' formats and tensor ranks are collected from the model and handed to
:func:`lowbit.warmup` (replaced here by a recorder: compiling is another test's business), with messages."""

from __future__ import annotations

import torch

import lowbit
from lowbit.pipeline.warming import warm_up


def _recorder(monkeypatch):
    calls = []

    def fake_warmup(spec, shapes, **kwargs):
        calls.append((repr(spec), [tuple(s) for s in shapes], kwargs.get("inference")))
        return len(shapes)

    monkeypatch.setattr(lowbit.api, "warmup", fake_warmup)  # where the pipeline's warm-up looks it up
    return calls


def test_warm_up_collects_each_format_once_per_rank(monkeypatch):
    from lowbit.models import DigitsMLP

    calls = _recorder(monkeypatch)
    model, _ = lowbit.quantize_model(DigitsMLP(), {"by": "type", "linear": {"config": {
        "name": "mxfp4_e2m1", "data_in_name": "mxfp4_e2m1", "weight_name": "mxfp4_e2m1", "bias_name": "e4m3"}}})  # fmt: skip
    assert warm_up(model, (torch.randn(5, 1, 8, 8), torch.zeros(5))) == 2  # one kernel per (format, rank)
    by_format = {name: shapes for name, shapes, _ in calls}
    assert sorted(by_format) == sorted([repr(lowbit.formats.resolve("mxfp4_e2m1")), repr(lowbit.formats.resolve("e4m3"))])
    mx = by_format[repr(lowbit.formats.resolve("mxfp4_e2m1"))]
    assert mx == [(5, 64)]  # fc1's input; the weights [128, 64] ... share its rank-2 kernel
    assert by_format[repr(lowbit.formats.resolve("e4m3"))] == [(128,)]
    assert all(inference for *_, inference in calls)


def test_warmup_flag_on_test_announces_the_wait(lowbit_cli, tmp_path, monkeypatch):
    calls = _recorder(monkeypatch)
    config = tmp_path / "c.toml"
    config.write_text('model = "toy"\ndataset = "toy_tiny"\n[passes.quantize_model]\nrecipe = "mxfp4_e2m1"\n')
    assert lowbit_cli("transform", "--config", str(config), "--project", "w")[0] == 0
    folder = lowbit_cli.software("w") / "transform" / "transformed_ckpt"
    status, _, err = lowbit_cli("test", "toy", "toy_tiny", "--load", str(folder), "--project", "w", "--warmup")
    assert status == 0 and calls
    assert "lowbit: warm-up: compiling quantizer kernels for 1 format(s) ..." in err
    assert "done in" in err


def test_warm_up_of_a_float_model_says_so(monkeypatch, caplog):
    from lowbit.models import DigitsMLP

    calls = _recorder(monkeypatch)
    with caplog.at_level("INFO", logger="lowbit"):
        assert warm_up(DigitsMLP(), torch.randn(2, 1, 8, 8)) == 0
    assert not calls and "no simulated layer" in caplog.text
