"""``attnlab show``, ``verify`` and ``demo``: bad paths and values are one ``attnlab: error:`` line, found
before any work (issue #28). The long jobs (training, the experiments) are replaced by stand-ins that fail
the test if they are reached, so a check that comes too late fails fast instead of running for minutes."""
from __future__ import annotations

import pytest

from attnlab.cli import main

UNWRITABLE = "/proc/attnlab-test/out"          # root can write almost anywhere, but not under /proc


def _one_error_line(capsys, message: str) -> str:
    out, err = capsys.readouterr()
    assert err.startswith("attnlab: error: ") and message in err and "Traceback" not in err, err
    assert err.count("\n") == 1, err
    return out


@pytest.fixture
def no_long_jobs(monkeypatch):
    """Training and the experiments raise if reached: every refusal below must come before them."""
    import attnlab.cli.demo as demo
    import attnlab.lab.verify as verify

    def reached(*args, **kwargs):
        raise AssertionError("the long job started before the bad input was refused")
    monkeypatch.setattr(verify, "run_verify", reached)
    monkeypatch.setattr(demo, "_train_gpt", reached)


# -- output directories ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", [
    ["show", "--model", "toy-encoder", "--text", "the dog"],
    ["verify", "--only", "sqrt-dk-scaling"],
    ["demo"],
])
def test_an_out_that_is_a_file_is_refused_before_any_work(command, tmp_path, capsys, no_long_jobs):
    afile = tmp_path / "report.txt"
    afile.write_text("not a directory")
    assert main([*command, "--out", str(afile)]) == 2
    _one_error_line(capsys, f"--out {afile} is a file, not a directory")
    assert afile.read_text() == "not a directory"


@pytest.mark.parametrize("command", [
    ["show", "--model", "toy-encoder", "--text", "the dog"],
    ["verify", "--only", "sqrt-dk-scaling"],
    ["demo"],
])
def test_an_unwritable_out_is_refused_before_any_work(command, capsys, no_long_jobs):
    assert main([*command, "--out", UNWRITABLE]) == 2
    _one_error_line(capsys, f"--out {UNWRITABLE}: /proc is not writable")


# -- values ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["--train-minutes", "0"], "--train-minutes must be a positive number of minutes, got 0"),
    (["--train-minutes", "-2"], "--train-minutes must be a positive number"),
    (["--train-minutes", "nan"], "--train-minutes must be a positive number"),
    (["--train-minutes", "inf"], "--train-minutes must be a positive number"),
    (["--tokens", "0"], "--tokens must be >= 1"),
    (["--tokens", "-5"], "--tokens must be >= 1"),
])
def test_demo_checks_its_numbers_before_training(argv, message, tmp_path, capsys, no_long_jobs):
    assert main(["demo", "--out", str(tmp_path / "d"), *argv]) == 2
    err = capsys.readouterr().err
    assert f"attnlab: error: {message}" in err and "time_limit_min" not in err, err
    assert not (tmp_path / "d").exists()                                  # nothing made


@pytest.mark.parametrize("seed", ["-1", str(2 ** 63)])
def test_verify_refuses_a_seed_torch_cannot_take(seed, tmp_path, capsys, no_long_jobs):
    assert main(["verify", "--seed", seed, "--out", str(tmp_path)]) == 2
    _one_error_line(capsys, f"--seed must be an integer from 0 to 2**63 - 1 = {2 ** 63 - 1}, got {seed}")


def test_ctrl_c_during_the_demos_training_stops_the_demo(tmp_path, monkeypatch, capsys):
    import attnlab.lab.verify as verify
    from attnlab.train.trainer import Trainer

    def interrupted(self, *args, **kwargs):
        self.interrupted = True                    # what the trainer records after the first Ctrl-C
        return []
    monkeypatch.setattr(Trainer, "train", interrupted)
    monkeypatch.setattr(verify, "run_verify", lambda *a, **k: pytest.fail("the demo went on after Ctrl-C"))
    assert main(["demo", "--out", str(tmp_path), "--no-progress"]) == 130
    assert "interrupted" in capsys.readouterr().err
    assert not (tmp_path / "gpt").exists()         # the unfinished model is not put in place
