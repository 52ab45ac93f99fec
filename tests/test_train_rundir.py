"""The run directory under failure: one trainer at a time (the lock), an unwritable --out refused before any
work, a full disk during a save, a loss that becomes NaN. Tiny GPT runs on a small corpus: seconds each."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from attnlab.cli import main
from attnlab.data import prepare_lm_data
from attnlab.models import GPTConfig
from attnlab.tasks import get_spec
from attnlab.tasks.lm import LMTask
from attnlab.train import Trainer, TrainConfig, list_checkpoints, load_checkpoint
from attnlab.train import checkpoint as ckpt_mod
from attnlab.train.rundir import LOCK_FILE, NoLock, NonFiniteLoss, RunLock, RunLocked, take_lock

TEXT = "".join(f"line {i}: the cat sat on mat number {i * 7 % 13}.\n" for i in range(120))
TRAIN = ["--preset", "nano", "--max-len", "16", "--batch-size", "4", "--warmup", "1", "--eval-iters", "1",
         "--eval-interval", "2", "--no-progress"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    f = tmp_path_factory.mktemp("corpus") / "text.txt"
    f.write_text(TEXT)
    return f


@pytest.fixture(scope="module")
def data(corpus):
    return prepare_lm_data(str(corpus), "char")


def tiny_trainer(data, out, **over) -> Trainer:
    mcfg = GPTConfig.preset("nano", vocab_size=data.tokenizer.vocab_size, max_len=16, d_model=32, n_layers=2)
    cfg = TrainConfig(**{**dict(steps=6, batch_size=4, lr=3e-3, warmup_steps=1, eval_interval=2, eval_iters=1,
                                checkpoint_interval=2, out_dir=str(out)), **over})
    return Trainer(LMTask(mcfg, data), cfg, progress=False)


def train_cli(corpus, out, *more) -> int:
    return main(["train", "gpt", "--data", str(corpus), "--out", str(out), *TRAIN, *more])


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("attnlab: error:")]


# ------------------------------------------------------------------ the lock
def test_a_second_trainer_on_a_locked_directory_refuses_naming_the_holder(corpus, data, tmp_path, capsys):
    out = tmp_path / "dual"
    held = RunLock(out).acquire()                       # another trainer (flock conflicts across open files)
    try:
        assert train_cli(corpus, out, "--steps", "2") == 2
        err = capsys.readouterr().err
        assert f"being written by another trainer (pid {os.getpid()} on" in err and "started" in err, err
        assert len(error_lines(err)) == 1 and "Traceback" not in err
        assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]      # no metrics, no checkpoint
        with pytest.raises(RunLocked, match="another trainer"):
            tiny_trainer(data, out)                                      # the library refuses as well
    finally:
        held.release()
    assert train_cli(corpus, out, "--steps", "2") == 0                   # free again: it trains
    capsys.readouterr()
    with RunLock(out):                                                   # resuming into a busy run refuses too
        assert main(["train", "gpt", "--out", str(out), "--resume", "--steps", "4", "--no-progress"]) == 2
    assert "being written by another trainer" in capsys.readouterr().err
    assert [p.name for p in list_checkpoints(out)] == ["step-000002"]


def test_a_lock_left_by_a_dead_process_does_not_block_and_its_leftovers_are_cleaned(data, tmp_path):
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom attnlab.train.rundir import RunLock\n"
                               f"lock = RunLock({str(out)!r}).acquire()\nprint('locked', flush=True)\ntime.sleep(120)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunLocked, match=f"pid {holder.pid} on"):
            tiny_trainer(data, out)
    finally:
        holder.send_signal(signal.SIGKILL)                               # killed: no chance to unlock
        holder.wait()
    assert (out / LOCK_FILE).is_file()                                   # the stale file stays...
    half = out / ".tmp-step-000004-999-deadbeef"                         # ...with a save the kill cut short
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"half")
    tr = tiny_trainer(data, out)                                         # ...and blocks nothing
    assert not half.exists()
    tr.train(plot=False)
    assert load_checkpoint(out).step == 6
    assert json.loads((out / LOCK_FILE).read_text())["pid"] == os.getpid()


def test_only_rank_0_locks():
    other_rank = SimpleNamespace(is_main=False, from_main=lambda obj: obj)
    lock = take_lock("/proc/never-created", other_rank)                  # rank 1 writes nothing: no lock, no dir
    assert isinstance(lock, NoLock) and lock.held


# ------------------------------------------------------------------ unwritable output
def test_an_unwritable_out_is_refused_before_any_work(corpus, tmp_path, monkeypatch, capsys):
    spec = get_spec("gpt")

    def no_work(args):
        raise AssertionError("the data were read before --out was checked")

    monkeypatch.setattr(spec, "from_args", no_work)
    assert train_cli(corpus, "/proc/attnlab-run", "--steps", "2") == 2
    err = capsys.readouterr().err
    assert error_lines(err) == ["attnlab: error: --out /proc/attnlab-run: /proc is not writable; choose a "
                                "directory you can write"], err
    assert not os.path.exists("/proc/attnlab-run")


@pytest.mark.parametrize("form", ["--resume RUN", "--out RUN --resume"])
def test_resuming_a_run_in_a_read_only_directory_is_refused_before_any_write(corpus, tmp_path, monkeypatch, capsys,
                                                                             form):
    run = tmp_path / "run"
    assert train_cli(corpus, run, "--steps", "2") == 0
    before = {p.name: p.stat().st_mtime_ns for p in run.iterdir()}
    from attnlab.cli import util
    real = util._can_write_in
    monkeypatch.setattr(util, "_can_write_in", lambda d: d.resolve() != run.resolve() and real(d))  # read-only run
    capsys.readouterr()
    argv = form.replace("RUN", str(run)).split()
    assert main(["train", "gpt", *argv, "--steps", "4", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert len(error_lines(err)) == 1 and "Traceback" not in err, err
    flag = argv[0]
    assert f"{flag} {run}: {run} is not writable" in err and f"--resume {run} --out NEW_DIR" in err, err
    assert {p.name: p.stat().st_mtime_ns for p in run.iterdir()} == before      # nothing written, no lock taken


# ------------------------------------------------------------------ a full disk
def test_a_full_disk_during_a_save_is_one_line_and_the_older_checkpoint_survives(corpus, tmp_path, monkeypatch,
                                                                                    capsys):
    real_write = ckpt_mod._write_file

    def disk_full_at_step_4(path, blob):
        if path.parent.name.startswith(".tmp-step-000004"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real_write(path, blob)

    monkeypatch.setattr(ckpt_mod, "_write_file", disk_full_at_step_4)
    run = tmp_path / "x"
    assert train_cli(corpus, run, "--steps", "6", "--checkpoint-interval", "2") == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(error_lines(err)) == 1, err
    assert "No space left on device" in err and "at step 4" in err, err
    assert f"checkpoint step-000002 and metrics up to step 4 are intact in {run}" in err, err
    assert [p.name for p in run.iterdir() if p.is_dir()] == ["step-000002"]      # no .tmp-step-* left
    assert load_checkpoint(run).step == 2
    assert max(r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())) == 4


# ------------------------------------------------------------------ a non-finite loss
def test_a_huge_learning_rate_stops_at_the_first_nan_loss_without_a_nan_checkpoint(corpus, tmp_path, capsys):
    run = tmp_path / "lr"
    assert train_cli(corpus, run, "--steps", "30", "--lr", "1e30", "--checkpoint-interval", "1") == 1
    err = capsys.readouterr().err
    assert len(error_lines(err)) == 1 and "Traceback" not in err, err
    assert "the training loss is nan" in err or "the training loss is inf" in err, err
    assert "Lower --lr" in err and "training stopped" in err, err
    ckpts = list_checkpoints(run)
    assert ckpts and f"checkpoint {ckpts[-1].name} " in err                     # says which one survived
    for ckpt in ckpts:                                                            # none holds a NaN weight
        weights = load_checkpoint(ckpt).model_state.values()
        assert all(torch.isfinite(t).all() for t in weights), ckpt.name


def test_a_nan_loss_stops_the_trainer_and_keeps_the_last_finite_checkpoint(data, tmp_path):
    tr = tiny_trainer(data, tmp_path)
    real_loss = tr.loss_fn

    def nan_from_step_3(*batch):
        loss = real_loss(*batch)
        return loss * float("nan") if tr.step == 2 else loss

    tr.loss_fn = nan_from_step_3
    before = [p.detach().clone() for p in tr.model.parameters()]
    with pytest.raises(NonFiniteLoss, match=r"step 3: the training loss is nan.*checkpoint step-000002 and metrics "
                                            r"up to step 2 are intact.*Lower --lr"):
        tr.train(plot=False)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000002"]
    assert all(torch.isfinite(p).all() for p in tr.model.parameters())          # the NaN step was never applied
    assert not all(torch.equal(a, b) for a, b in zip(before, tr.model.parameters()))
    tr.model.tok_emb.weight.data[0, 0] = float("inf")                           # a non-finite weight is never saved
    tr.step = 3
    with pytest.raises(NonFiniteLoss, match="tok_emb.weight"):
        tr.save()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000002"]
    assert not any(p.name.startswith(".tmp") for p in tmp_path.iterdir())
