"""attnlab.train: schedule, decay groups, checkpoints (exact, atomic, verified, no pickle), exact resume."""
from __future__ import annotations

import json
import os
import pickle
import shutil
import signal

import pytest
import torch
from safetensors import safe_open

from attnlab.data import prepare_lm_data
from attnlab.models import GPTConfig
from attnlab.train import (CheckpointError, Trainer, TrainConfig, decay_groups, list_checkpoints, load_checkpoint,
                           load_gpt, lr_at)
from attnlab.tasks.lm import LMTask
from attnlab.train import checkpoint as ckpt_mod
from attnlab.train import trainer as trainer_mod

TEXT = "".join(f"line {i}: the cat sat on mat number {i * 7 % 13}.\n" for i in range(120))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    f = tmp_path_factory.mktemp("corpus") / "text.txt"
    f.write_text(TEXT)
    return prepare_lm_data(str(f), "char")


def tiny_trainer(data, out, **over) -> Trainer:
    mcfg = GPTConfig.preset("nano", vocab_size=data.tokenizer.vocab_size, max_len=16, d_model=32, n_layers=2,
                            dropout=0.1)                               # dropout: the torch RNG must resume too
    cfg = TrainConfig(**{**dict(steps=6, batch_size=4, grad_accum=2, lr=3e-3, warmup_steps=2, eval_interval=3,
                                eval_iters=2, checkpoint_interval=100, out_dir=str(out)), **over})
    return Trainer(LMTask(mcfg, data), cfg, progress=False)


def _resumable(path):
    """(checkpoint, its task rebuilt from it): what Trainer.from_checkpoint takes."""
    from attnlab.tasks import get_spec
    ckpt = load_checkpoint(path)
    return ckpt, get_spec("gpt").from_checkpoint(ckpt)


def test_schedule_warmup_peak_cosine_end():
    lr, lo, warm, total = 1e-3, 1e-4, 10, 110
    assert lr_at(0, lr, lo, warm, total) == pytest.approx(lr / warm)
    assert lr_at(warm - 1, lr, lo, warm, total) == pytest.approx(lr)             # peak at the end of warmup
    assert lr_at(warm, lr, lo, warm, total) == pytest.approx(lr)
    assert lr_at(total - 1, lr, lo, warm, total) == pytest.approx(lo)            # min lr at the last step
    mid = warm + (total - 1 - warm) / 2
    assert lr_at(int(mid), lr, lo, warm, total) == pytest.approx((lr + lo) / 2, rel=0.02)
    after = [lr_at(s, lr, lo, warm, total) for s in range(warm, total)]
    assert all(a >= b for a, b in zip(after, after[1:]))
    assert lr_at(50, lr, lo, warm, None) == lr                                   # length unknown yet: peak


def test_weight_decay_only_on_linear_weights(data, tmp_path):
    model = tiny_trainer(data, tmp_path).model
    decay, no_decay = decay_groups(model)
    ids = [id(p) for p in decay + no_decay]
    assert sorted(ids) == sorted(id(p) for p in model.parameters()) and len(set(ids)) == len(ids)
    assert all(p.dim() == 2 for p in decay) and model.tok_emb.weight in no_decay   # tied head: an embedding
    assert not any(p is model.tok_emb.weight for p in decay)
    assert all(any(p is m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)) for p in decay)


def test_checkpoint_round_trip_is_exact(data, tmp_path):
    tr = tiny_trainer(data, tmp_path)
    tr.train(max_steps=3)
    assert (tmp_path / "loss.png").stat().st_size > 1000
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.step == 3 and ckpt.path.name == "step-000003"
    for name, t in tr.model.state_dict().items():
        assert torch.equal(ckpt.model_state[name], t), name
    with safe_open(str(ckpt.path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "tok_emb.weight" in keys and "lm_head.weight" not in keys           # tied weight stored once
    sd = tr.optimizer.state_dict()
    assert ckpt.optimizer_state["param_groups"] == sd["param_groups"]
    for idx, entry in sd["state"].items():
        for k, v in entry.items():
            assert torch.equal(ckpt.optimizer_state["state"][idx][k], v), (idx, k)
    assert torch.equal(ckpt.rng["torch"], torch.get_rng_state())
    assert torch.equal(ckpt.rng["batches"], tr.sampler.state())
    assert ckpt.tokenizer_json == data.tokenizer.to_json() and ckpt.train_config == tr.cfg.to_dict()
    model, tok = load_gpt(tmp_path)
    assert not model.training and model.lm_head.weight is model.tok_emb.weight
    x = torch.tensor([tok.encode("line 3")])
    tr.model.eval()
    assert torch.equal(model(x), tr.model(x))


def test_stop_and_resume_gives_the_same_losses(data, tmp_path):
    whole = tiny_trainer(data, tmp_path / "whole")
    losses = whole.train(plot=False)
    first = tiny_trainer(data, tmp_path / "split")
    head = first.train(max_steps=4, plot=False)
    torch.manual_seed(123)                                                     # resume must not depend on it
    (tmp_path / "split" / "metrics.jsonl").open("a").write(json.dumps({"step": 99, "loss": 0.0}) + "\n")
    second = Trainer.from_checkpoint(*_resumable(tmp_path / "split"), progress=False)
    tail = second.train(plot=False)
    assert len(losses) == 6 and head + tail == losses                          # bit-identical floats
    for (n, a), b in zip(whole.model.state_dict().items(), second.model.state_dict().values()):
        assert torch.equal(a, b), n
    steps = [r["step"] for r in second.metrics.records() if "loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6]                                         # the crashed run's step 99 is gone


def test_fresh_run_refuses_a_directory_with_checkpoints(data, tmp_path):
    tiny_trainer(data, tmp_path).train(max_steps=1, plot=False)
    with pytest.raises(ValueError, match="already holds checkpoints.*--resume"):
        tiny_trainer(data, tmp_path)


@pytest.fixture(scope="module")
def two_checkpoints(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("two")
    tiny_trainer(data, out, checkpoint_interval=2).train(max_steps=4, plot=False)
    assert [p.name for p in list_checkpoints(out)] == ["step-000002", "step-000004"]
    return out


@pytest.mark.parametrize("damage", ["truncate-weights", "flip-weights", "flip-state", "truncate-json", "edit-json"])
def test_damaged_checkpoint_is_a_clear_error_and_the_previous_one_loads(two_checkpoints, tmp_path, damage):
    shutil.copytree(two_checkpoints, tmp_path, dirs_exist_ok=True)
    prev, last = list_checkpoints(tmp_path)
    kind, what = damage.split("-")
    path = last / {"weights": "model.safetensors", "state": "train_state.safetensors", "json": "checkpoint.json"}[what]
    raw = path.read_bytes()
    if kind == "truncate":
        path.write_bytes(raw[: len(raw) // 2])
    elif kind == "flip":
        path.write_bytes(raw[:-5] + bytes([raw[-5] ^ 1]) + raw[-4:])
    else:
        meta = json.loads(raw)
        meta["step"] = 5
        path.write_text(json.dumps(meta))
    problem = {"truncate-weights": "truncated", "flip-weights": "SHA-256", "flip-state": "SHA-256",
               "truncate-json": "not valid JSON", "edit-json": "corrupted"}[damage]
    with pytest.raises(CheckpointError, match=rf"{path.name} is .*{problem}.*earlier checkpoint is .*step-000002"):
        load_checkpoint(tmp_path)
    assert load_checkpoint(prev).step == 2


def test_resuming_an_older_checkpoint_refuses_to_mix_histories(two_checkpoints, data):
    prev = list_checkpoints(two_checkpoints)[0]
    with pytest.raises(ValueError, match="newer than step 2 \\(step-000004\\).*move them away"):
        Trainer.from_checkpoint(*_resumable(prev), progress=False)


def test_interrupted_write_leaves_the_last_good_checkpoint(data, tmp_path, monkeypatch):
    tr = tiny_trainer(data, tmp_path)
    tr.train(max_steps=2, plot=False)
    good = load_checkpoint(tmp_path)
    real_write, calls = ckpt_mod._write_file, []

    def crash_on_second(path, blob):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full (simulated)")
        real_write(path, blob)

    monkeypatch.setattr(ckpt_mod, "_write_file", crash_on_second)
    tr.step = 3
    with pytest.raises(OSError, match="simulated"):
        tr.save()
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == ["step-000002"]  # no half checkpoint, no temp dir
    again = load_checkpoint(tmp_path)
    assert again.step == good.step == 2
    assert all(torch.equal(again.model_state[k], v) for k, v in good.model_state.items())


def test_loading_never_unpickles(data, tmp_path, monkeypatch):
    tiny_trainer(data, tmp_path).train(max_steps=1, plot=False)

    def forbidden(*args, **kwargs):
        raise AssertionError("a checkpoint load unpickled something")

    for obj, name in [(pickle, "load"), (pickle, "loads"), (pickle, "Unpickler"), (torch, "load")]:
        monkeypatch.setattr(obj, name, forbidden)
    assert load_checkpoint(tmp_path).step == 1
    load_gpt(tmp_path)


class FakeClock:
    """time.perf_counter for the trainer: every reading is one second later (timing made deterministic)."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        self.now += 1.0
        return self.now


def test_time_budget_sizes_the_schedule_and_stops(data, tmp_path, monkeypatch):
    tr = tiny_trainer(data, tmp_path, steps=None, time_limit_min=10.0, calibrate_steps=2, eval_interval=50)
    tr._size_to_budget(s_per_step=0.5, elapsed=30.0)
    steps = tr.cfg.steps
    assert 0.9 * 600 < 30 + steps * 0.5 + tr.extra["calibration"]["eval_s"] * (steps / 50 + 1) <= 600
    clock = FakeClock()
    monkeypatch.setattr(trainer_mod, "time", clock)
    quick = tiny_trainer(data, tmp_path / "q", steps=None, time_limit_min=1.0, calibrate_steps=3, eval_interval=4)
    quick.train(plot=False)
    assert quick.extra["calibration"]["steps"] == quick.cfg.steps == quick.step > 3    # sized, then run to the end
    assert quick.extra["calibration"]["at_step"] > 3                                   # re-sized at an evaluation
    assert clock.now <= 60
    assert load_checkpoint(tmp_path / "q").step == quick.step


def test_ctrl_c_finishes_the_step_checkpoints_and_stops(data, tmp_path, monkeypatch):
    tr = tiny_trainer(data, tmp_path)
    real_step = tr._train_step

    def step_then_interrupt():
        loss = real_step()
        if tr.step == 1:                                            # during the 2nd step
            os.kill(os.getpid(), signal.SIGINT)
        return loss

    monkeypatch.setattr(tr, "_train_step", step_then_interrupt)
    before = signal.getsignal(signal.SIGINT)     # default_int_handler, or SIG_IGN in a background job
    assert len(tr.train(plot=False)) == 2
    assert load_checkpoint(tmp_path).step == 2
    assert signal.getsignal(signal.SIGINT) is before                # the caller's handler is restored


def test_bf16_autocast_trains(data, tmp_path):
    tr = tiny_trainer(data, tmp_path, bf16="on", steps=2)
    losses = tr.train(plot=False)
    assert tr.bf16 and all(torch.isfinite(torch.tensor(losses)))
    with pytest.raises(ValueError, match="bf16 must be one of"):
        TrainConfig(bf16="maybe")


def test_resume_writes_where_the_checkpoint_lies_not_where_it_was_saved(data, tmp_path):
    tiny_trainer(data, tmp_path / "a", checkpoint_interval=2).train(max_steps=4, plot=False)
    shutil.move(tmp_path / "a", tmp_path / "moved")                    # stored out_dir now names nothing
    tr = Trainer.from_checkpoint(*_resumable(tmp_path / "moved"), progress=False)
    assert tr.out == tmp_path / "moved"
    tr.train(plot=False)
    assert [p.name for p in list_checkpoints(tmp_path / "moved")] == ["step-000004", "step-000006"]
    assert not (tmp_path / "a").exists()
    # a branch into a directory that holds another run's checkpoints would prune them: refused
    tiny_trainer(data, tmp_path / "other").train(max_steps=1, plot=False)
    with pytest.raises(ValueError, match="already holds checkpoints of another run"):
        Trainer.from_checkpoint(*_resumable(tmp_path / "moved"), progress=False, out_dir=str(tmp_path / "other"))
    assert [p.name for p in list_checkpoints(tmp_path / "other")] == ["step-000001"]


def test_ctrl_c_is_reported_to_the_caller(data, tmp_path, monkeypatch):
    tr = tiny_trainer(data, tmp_path)
    real_step = tr._train_step

    def step_then_interrupt():
        loss = real_step()
        os.kill(os.getpid(), signal.SIGINT)
        return loss

    monkeypatch.setattr(tr, "_train_step", step_then_interrupt)
    tr.train(plot=False)
    assert tr.interrupted and tr.step == 1                            # the CLI turns this into exit status 130
    again = tiny_trainer(data, tmp_path / "b")
    again.train(max_steps=1, plot=False)
    assert not again.interrupted


def test_weights_only_loading(data, tmp_path):
    tiny_trainer(data, tmp_path).train(max_steps=1, plot=False)
    (list_checkpoints(tmp_path)[-1] / "train_state.safetensors").unlink()
    with pytest.raises(CheckpointError, match="train_state.safetensors is missing"):
        load_checkpoint(tmp_path)
    ckpt = load_checkpoint(tmp_path, train_state=False)
    assert ckpt.optimizer_state is None and ckpt.rng == {} and "lm_head.weight" in ckpt.model_state
    load_gpt(tmp_path)                                                # generation needs nothing more
