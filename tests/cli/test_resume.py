"""Training resume and the project folder across runs: ``--resume`` continues from last.ckpt (epoch, optimizer,
schedule, data order) to the same weights as an uninterrupted run; a folder holding checkpoints is refused
without --resume / --overwrite; --overwrite keeps the previous best; a bit-flipped last.ckpt is refused."""

from __future__ import annotations

import json

import pytest
import torch

from lowbit.cli import main

pytest.importorskip("lightning")
COMMON = ["train", "toy", "toy_tiny", "--accelerator", "cpu", "--t-max", "2", "--no-progress",
          "--print-config", "false"]


def _train(root, project, *extra) -> int:
    return main([*COMMON, "--project-dir", str(root), "--project", project, *extra])


def _checkpoints(root, project):
    return root / project / "software" / "training_ckpts"


def _load(path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One uninterrupted 2-epoch run, and one stopped after epoch 1 then resumed to epoch 2."""
    root = tmp_path_factory.mktemp("resume")
    assert _train(root, "whole", "--max-epochs", "2") == 0
    assert _train(root, "parts", "--max-epochs", "1") == 0
    first = _load(_checkpoints(root, "parts") / "last.ckpt")
    assert _train(root, "parts", "--max-epochs", "2", "--resume") == 0
    return root, first


def test_resume_continues_at_the_next_epoch_with_the_optimizer_state(runs):
    root, first = runs
    assert first["epoch"] == 0 and first["optimizer_states"][0]["state"]  # Adam's moments were saved
    whole, parts = _load(_checkpoints(root, "whole") / "last.ckpt"), _load(_checkpoints(root, "parts") / "last.ckpt")
    assert parts["epoch"] == whole["epoch"] == 1
    assert parts["global_step"] == whole["global_step"] == 2 * first["global_step"]
    assert parts["lr_schedulers"][0]["last_epoch"] == whole["lr_schedulers"][0]["last_epoch"] == 2
    for key, value in whole["state_dict"].items():  # seeded data order: bit-identical weights
        assert torch.equal(parts["state_dict"][key], value), key
    for (_, a), (_, b) in zip(sorted(whole["optimizer_states"][0]["state"].items()),
                              sorted(parts["optimizer_states"][0]["state"].items())):  # fmt: skip
        assert torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])


def test_a_fresh_run_that_stops_early_differs(runs):
    """Guards the test above: restarting at epoch 0 (the old --load behaviour) would not match."""
    root, first = runs
    whole = _load(_checkpoints(root, "whole") / "last.ckpt")
    assert any(not torch.equal(first["state_dict"][key], value) for key, value in whole["state_dict"].items())


def test_a_project_with_checkpoints_is_refused(runs, capsys):
    root, _ = runs
    before = (_checkpoints(root, "whole") / "best.ckpt").read_bytes()
    capsys.readouterr()
    assert _train(root, "whole", "--max-epochs", "1") == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "--resume" in error and "--overwrite" in error
    assert (_checkpoints(root, "whole") / "best.ckpt").read_bytes() == before


def test_resume_without_a_last_checkpoint_and_both_flags_are_refused(tmp_path, capsys):
    assert _train(tmp_path, "none", "--max-epochs", "1", "--resume") == 2
    assert "nothing to resume" in capsys.readouterr().err
    assert _train(tmp_path, "none", "--max-epochs", "1", "--resume", "--overwrite") == 2
    assert "contradict" in capsys.readouterr().err


def test_a_bit_flipped_last_checkpoint_is_refused_naming_it(runs, capsys, tmp_path):
    root, _ = runs
    import shutil

    shutil.copytree(_checkpoints(root, "whole"), _checkpoints(tmp_path, "flip"))
    last = _checkpoints(tmp_path, "flip") / "last.ckpt"
    data = bytearray(last.read_bytes())
    data[len(data) // 2] ^= 0x10
    last.write_bytes(bytes(data))
    capsys.readouterr()
    assert _train(tmp_path, "flip", "--max-epochs", "3", "--resume") == 2
    error = capsys.readouterr().err
    assert "last.ckpt" in error and "checksum" in error


def test_overwrite_keeps_the_previous_best(runs, tmp_path):
    root, _ = runs
    import shutil

    shutil.copytree(_checkpoints(root, "whole"), _checkpoints(tmp_path, "again"))
    previous = (_checkpoints(tmp_path, "again") / "best.ckpt").read_bytes()
    assert _train(tmp_path, "again", "--max-epochs", "1", "--overwrite") == 0
    folder = _checkpoints(tmp_path, "again")
    assert (folder / "best.previous.ckpt").read_bytes() == previous
    assert json.loads((folder / "best.previous.ckpt.sha256").read_text())["sha256"]
    assert _load(folder / "last.ckpt")["epoch"] == 0  # a fresh start, not a continuation


def test_resuming_a_finished_run_trains_no_further(runs):
    root, _ = runs
    last = _checkpoints(root, "whole") / "last.ckpt"
    before = _load(last)
    assert _train(root, "whole", "--max-epochs", "2", "--resume") == 0
    after = _load(last)
    assert after["global_step"] == before["global_step"]
    assert all(torch.equal(after["state_dict"][key], value) for key, value in before["state_dict"].items())


def test_last_checkpoint_is_the_latest_epoch_even_when_val_loss_stops_improving(tmp_path):
    """At a learning rate of 1e-30 (no weight moves by an ulp) val_loss never improves after epoch 0: best.ckpt
    stays at epoch 0 while last.ckpt follows every epoch, and a max_steps that ends an epoch early is saved too
    (Lightning's save_last would leave last.ckpt at epoch 0, and a resumed run would repeat the epochs after it)."""
    assert _train(tmp_path, "flat", "--max-epochs", "3", "--learning-rate", "1e-30") == 0
    folder = _checkpoints(tmp_path, "flat")
    best, last = _load(folder / "best.ckpt"), _load(folder / "last.ckpt")
    assert best["epoch"] == 0 and last["epoch"] == 2 and last["global_step"] == 3 * best["global_step"]
    steps = last["global_step"]
    assert _train(tmp_path, "flat", "--max-epochs", "5", "--max-steps", str(steps + 2), "--learning-rate", "1e-30",
                  "--resume") == 0  # fmt: skip
    assert _load(folder / "last.ckpt")["global_step"] == steps + 2


def test_a_run_killed_mid_training_resumes_from_its_last_checkpoint(tmp_path):
    """A real SIGKILL: the checkpoints left are intact (their checksums hold) and --resume continues."""
    import os
    import signal
    import subprocess
    import sys
    import time

    argv = [sys.executable, "-m", "lowbit", *COMMON, "--max-epochs", "1000", "--project-dir", str(tmp_path),
            "--project", "killed"]  # fmt: skip
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env={**os.environ, "PYTHONWARNINGS": "ignore"})  # fmt: skip
    last = _checkpoints(tmp_path, "killed") / "last.ckpt"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (last.exists() and _load(last)["global_step"] >= 8):
            time.sleep(0.2)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    steps = _load(last)["global_step"]
    assert steps >= 8
    assert main([*COMMON, "--project-dir", str(tmp_path), "--project", "killed", "--max-epochs", "1000",
                 "--max-steps", str(steps + 8), "--resume"]) == 0  # fmt: skip
    assert _load(last)["global_step"] == steps + 8


def test_stochastic_rounding_of_a_low_precision_optimizer_resumes_its_draws(tmp_path):
    """QAT with stochastically rounded optimizer state: the rounding generator's state travels in last.ckpt,
    so the resumed run draws what the uninterrupted one drew."""
    config = tmp_path / "lp.toml"
    config.write_text('model = "toy"\ndataset = "toy_tiny"\nlearning_rate = 0.05\n\n[low_precision_optimizer]\n'
                      'weight = {name = "integer", width = 8, frac_width = 5}\ngrad = "e5m2"\nstochastic = true\n'
                      'seed = 3\n')  # fmt: skip
    common = ["train", "--config", str(config), "--accelerator", "cpu", "--t-max", "2", "--no-progress",
              "--print-config", "false", "--project-dir", str(tmp_path)]  # fmt: skip
    assert main([*common, "--project", "whole", "--max-epochs", "2"]) == 0
    assert main([*common, "--project", "parts", "--max-epochs", "1"]) == 0
    assert main([*common, "--project", "parts", "--max-epochs", "2", "--resume"]) == 0
    whole = _load(_checkpoints(tmp_path, "whole") / "last.ckpt")
    parts = _load(_checkpoints(tmp_path, "parts") / "last.ckpt")
    assert parts["lowbit_rng"]["rounding"]  # the generator's state was saved
    for key, value in whole["state_dict"].items():
        assert torch.equal(parts["state_dict"][key], value), key


def test_rng_states_round_trip_through_a_weights_only_checkpoint(tmp_path):
    import random

    import numpy

    from lowbit.train.lightning_module import rng_states, set_rng_states

    torch.save({"rng": rng_states()}, tmp_path / "rng.pt")
    first = (torch.rand(3), numpy.random.rand(3), random.random())
    set_rng_states(torch.load(tmp_path / "rng.pt", weights_only=True)["rng"])
    second = (torch.rand(3), numpy.random.rand(3), random.random())
    assert torch.equal(first[0], second[0]) and (first[1] == second[1]).all() and first[2] == second[2]


def test_resuming_with_another_model_is_one_clear_error(runs, tmp_path, capsys):
    root, _ = runs
    import shutil

    shutil.copytree(_checkpoints(root, "whole"), _checkpoints(tmp_path, "other"))
    capsys.readouterr()
    status = main(["train", "digits_mlp", "digits", "--accelerator", "cpu", "--no-progress", "--print-config", "false",
                   "--project-dir", str(tmp_path), "--project", "other", "--max-epochs", "3", "--resume"])  # fmt: skip
    error = capsys.readouterr().err.strip()
    assert status == 2 and len(error.splitlines()) == 1 and "another model's weights" in error


def test_training_metrics_name_the_best_checkpoint_they_describe(runs):
    from lowbit._checksum import digest_file

    root, _ = runs
    for project in ("whole", "parts"):
        folder = _checkpoints(root, project)
        metrics = json.loads((folder / "metrics.json").read_text())
        assert metrics["best_sha256"] == digest_file(folder / "best.ckpt") and len(metrics["best_sha256"]) == 64
        assert metrics["best"] == str(folder / "best.ckpt")


def test_resume_removes_the_earlier_runs_metrics_first(runs, tmp_path):
    """A resumed run killed before it ends leaves no metrics.json that describes an older best.ckpt."""
    import shutil

    from lowbit.train.run_folder import prepare_run_folder

    root, _ = runs
    folder = _checkpoints(tmp_path, "stale")
    shutil.copytree(_checkpoints(root, "whole"), folder)
    assert (folder / "metrics.json").exists()
    assert prepare_run_folder(folder, resume=True, overwrite=False) == folder / "last.ckpt"
    assert not (folder / "metrics.json").exists() and (folder / "best.ckpt").exists()
