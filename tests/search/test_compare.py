"""The front against the uniform presets: per preset the best member beating it on both axes (strictly:
equal bits is not fewer), the one sentence, and both in front.json / search.html of a real search run."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest

from lowbit.search.compare import beats, compare_presets, comparison_axes, comparison_rows
from lowbit.search.front import dominates

DIRECTIONS = {"accuracy": "maximize", "weight_bits": "minimize"}
PRESETS = {"int8": {"accuracy": 0.99, "weight_bits": 8.5}, "mxfp4": {"accuracy": 0.9, "weight_bits": 4.25},
           "ternary": {"accuracy": 0.5, "weight_bits": 2.0}}  # fmt: skip


def member(number: int, accuracy: float, bits: float) -> dict:
    return {"number": number, "metrics": {"accuracy": accuracy, "weight_bits": bits, "loss": 1.0 - accuracy}}


def test_one_member_beats_every_preset():
    front = [member(3, 0.995, 1.9), member(5, 0.999, 6.0)]
    result = compare_presets(front, PRESETS, "accuracy", DIRECTIONS)
    assert result["beats_every_preset"] == {"trial": 3, "accuracy": 0.995, "weight_bits": 1.9}
    # int8: both beat it, trial 5 has the better accuracy; ternary (2.0 bits): only trial 3 has fewer bits
    assert result["presets"]["int8"]["beaten_by"]["trial"] == 5
    assert result["presets"]["mxfp4"]["beaten_by"]["trial"] == 3
    assert result["presets"]["ternary"]["beaten_by"] == {"trial": 3, "accuracy": 0.995, "weight_bits": 1.9}
    assert result["sentence"] == "trial 3 beats every preset at once (accuracy 0.9950 at 1.900 bits per weight)."
    row = ["ternary", "0.5000", "2.000", "trial 3: accuracy 0.9950 at 1.900 bits per weight"]
    assert comparison_rows(result)[2] == row


def test_a_ternary_like_preset_stays_unbeaten():
    front = [member(1, 0.999, 6.0), member(2, 0.95, 3.0)]
    result = compare_presets(front, PRESETS, "accuracy", DIRECTIONS)
    assert result["beats_every_preset"] is None
    assert result["presets"]["int8"]["beaten_by"]["trial"] == 1
    assert result["presets"]["mxfp4"]["beaten_by"] == {"trial": 2, "accuracy": 0.95, "weight_bits": 3.0}
    assert result["presets"]["ternary"] == {"accuracy": 0.5, "weight_bits": 2.0, "beaten_by": None}
    assert result["sentence"] == ("no front member beats every preset at once: that needs accuracy above 0.9900 (int8) "
                                  "at fewer than 2.000 bits per weight (ternary); unbeaten: ternary (accuracy 0.5000 "
                                  "at 2.000 bits per weight).")  # fmt: skip
    assert comparison_rows(result)[2][3] == "none"


def test_ties_do_not_beat():
    ternary = PRESETS["ternary"]
    same_bits, same_accuracy = member(1, 0.9, 2.0), member(2, 0.5, 1.0)
    for record in (same_bits, same_accuracy):  # Pareto-dominates the preset, yet does not beat it on both axes
        assert dominates(record["metrics"], ternary, DIRECTIONS)
        assert not beats(record["metrics"], ternary, DIRECTIONS)
    result = compare_presets([same_bits, same_accuracy], {"ternary": ternary}, "accuracy", DIRECTIONS)
    assert result["presets"]["ternary"]["beaten_by"] is None and result["beats_every_preset"] is None
    assert result["sentence"].endswith("unbeaten: ternary (accuracy 0.5000 at 2.000 bits per weight).")


def test_every_preset_beaten_but_by_different_members():
    front = [member(1, 0.999, 6.0), member(2, 0.95, 1.5)]
    result = compare_presets(front, PRESETS, "accuracy", DIRECTIONS)
    assert [result["presets"][name]["beaten_by"]["trial"] for name in PRESETS] == [1, 2, 2]
    assert result["sentence"].endswith("each preset is beaten, but by different members.")


def test_loss_is_minimized_and_missing_bits_give_no_comparison():
    assert comparison_axes("loss", {"loss": "minimize"}) == {"loss": "minimize", "weight_bits": "minimize"}
    assert comparison_axes("accuracy", {"average_bitwidth": "minimize"})["accuracy"] == "maximize"
    presets = {"int8": {"loss": 0.2, "weight_bits": 8.5}, "ternary": {"loss": 0.9, "weight_bits": 2.0}}
    result = compare_presets([member(4, 0.85, 1.5)], presets, "loss", {"loss": "minimize"})  # loss 0.15
    assert result["beats_every_preset"]["trial"] == 4
    assert result["beats_every_preset"]["loss"] == pytest.approx(0.15)
    assert compare_presets([member(4, 0.85, 1.5)], {"int8": {"loss": 0.2}}, "loss", {}) is None


def test_search_outputs_carry_the_comparison(tmp_path):
    pytest.importorskip("optuna")
    from lowbit.search import run_search
    from tests.search.configs import DIGITS_PRESETS

    (tmp_path / "search.toml").write_text(DIGITS_PRESETS)
    result = run_search(tmp_path / "search.toml", tmp_path / "out")
    document = json.loads((Path(tmp_path) / "out" / "front.json").read_text())
    comparison, uniform = document["comparison"], document["uniform"]
    assert comparison == json.loads(json.dumps(result["comparison"]))
    assert set(comparison["presets"]) == set(uniform) == {"int8", "int4_g32", "mxfp8", "mxfp4", "fp8", "ternary"}
    for name, values in comparison["presets"].items():
        assert (values["accuracy"], values["weight_bits"]) == (uniform[name]["accuracy"], uniform[name]["weight_bits"])
    # the trials are uniform int8 / mxfp4 (grid): neither beats mxfp4 (a tie) nor ternary (more bits)
    by_trial = {r["number"]: r["metrics"] for r in result["records"]}
    assert {by_trial[m["trial"]]["weight_bits"] for m in document["front"]} <= {8.5, 4.25}
    assert uniform["ternary"]["weight_bits"] < 4.25
    assert comparison["presets"]["mxfp4"]["beaten_by"] is None and comparison["presets"]["ternary"]["beaten_by"] is None
    assert comparison["beats_every_preset"] is None
    ternary = uniform["ternary"]
    unbeaten = f"ternary (accuracy {ternary['accuracy']:.4f} at {ternary['weight_bits']:.3f} bits per weight)"
    assert comparison["sentence"].startswith("no front member beats every preset at once: that needs accuracy above")
    assert unbeaten in comparison["sentence"]
    page = (tmp_path / "out" / "search.html").read_text()
    assert "Front against the uniform presets" in page and html.escape(comparison["sentence"]) in page
    assert page.index("Front against the uniform presets") < page.index("<h2>Uniform presets</h2>")
