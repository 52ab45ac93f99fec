"""The trainer on a task that is not a language model; the task registry; `attnlab train NAME` / `attnlab eval`."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from attnlab.cli import main
from attnlab.tasks import get_spec, load_model, task_names
from attnlab.train import DrawSampler, Task, Trainer, TrainConfig, load_checkpoint


class LinearModel(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.proj = nn.Linear(d, 1)

    def loss(self, x, y):                                          # x: (B, d), y: (B,)
        return ((self.proj(x).squeeze(-1) - y) ** 2).mean()


class RegressionTask:
    """y = x · w_true + noise, drawn per batch from the sampler's generator: a task the trainer has never seen."""
    name, unit = "regression", "ex"

    def __init__(self, d: int = 4):
        self.d = d
        self.w_true = torch.arange(1.0, d + 1)                     # (d,)

    def _draw(self, g, b):
        x = torch.randn(b, self.d, generator=g)                    # (b, d)
        return x, x @ self.w_true + 0.01 * torch.randn(b, generator=g)

    def model_config(self):
        return {"d": self.d}

    def build_model(self):
        return LinearModel(self.d)

    def info(self):
        return {"name": "regression", "d": self.d}

    def tokenizer_json(self):
        return None

    def sampler(self, batch_size, seed):
        return DrawSampler(self._draw, batch_size, seed)

    def eval_batches(self, batch_size, n, seed):
        return DrawSampler(self._draw, batch_size, seed).fixed_batches(n)

    def units_per_batch(self, batch_size):
        return batch_size

    def val_metrics(self, val_loss):
        return {}

    def evaluate(self, model):
        return {"weight_error": float((model.proj.weight[0].detach() - self.w_true).abs().max())}


def _cfg(out, **over):
    return TrainConfig(**{**dict(steps=8, batch_size=16, lr=0.1, min_lr=0.01, warmup_steps=1, eval_interval=4,
                                 eval_iters=2, checkpoint_interval=100, weight_decay=0.0, out_dir=str(out)), **over})


def test_the_trainer_trains_any_task_and_records_it_in_the_checkpoint(tmp_path):
    task = RegressionTask()
    assert isinstance(task, Task)                                  # the protocol is what the trainer needs
    tr = Trainer(task, _cfg(tmp_path, steps=150, lr=0.2), progress=False)
    losses = tr.train(plot=False)
    assert losses[-1] < 0.05 * losses[0] and task.evaluate(tr.model)["weight_error"] < 0.2
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.extra["task"] == "regression" and ckpt.extra["data"] == task.info()
    assert ckpt.model_config == {"d": 4} and ckpt.tokenizer_json is None
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(r["examples_per_s"] > 0 for r in records if "loss" in r)   # throughput counted in the task's unit


def test_a_generic_task_resumes_bit_for_bit(tmp_path):
    whole = Trainer(RegressionTask(), _cfg(tmp_path / "whole"), progress=False).train(plot=False)
    first = Trainer(RegressionTask(), _cfg(tmp_path / "split"), progress=False).train(max_steps=3, plot=False)
    ckpt = load_checkpoint(tmp_path / "split")
    rest = Trainer.from_checkpoint(ckpt, RegressionTask(), progress=False).train(plot=False)
    assert first + rest == whole


def test_resuming_with_a_different_model_config_is_refused(tmp_path):
    Trainer(RegressionTask(), _cfg(tmp_path), progress=False).train(max_steps=1, plot=False)
    with pytest.raises(ValueError, match="differs from the checkpoint"):
        Trainer.from_checkpoint(load_checkpoint(tmp_path), RegressionTask(d=5), progress=False)


def test_registry_knows_every_model_of_the_theory_and_refuses_others():
    assert set(task_names()) >= {"gpt", "seq2seq", "vit", "captioner", "evoformer"}
    for name in task_names():
        spec = get_spec(name)
        assert spec.name == name and spec.help
    with pytest.raises(ValueError, match="unknown model/task 'bert'.*gpt"):
        get_spec("bert")


TEXT = "".join(f"line {i}: the cat sat on mat number {i * 7 % 13}.\n" for i in range(120))
GPT_FLAGS = ["--preset", "nano", "--max-len", "16", "--batch-size", "4", "--steps", "2", "--warmup", "1",
             "--eval-iters", "1", "--eval-interval", "2", "--no-progress"]


def test_cli_trains_gpt_then_eval_prints_its_metric(tmp_path, capsys):
    corpus = tmp_path / "t.txt"
    corpus.write_text(TEXT)
    run = tmp_path / "run"
    assert main(["train", "gpt", "--data", str(corpus), "--out", str(run), *GPT_FLAGS]) == 0
    out = capsys.readouterr().out
    assert "gpt on held-out data: loss" in out and "attnlab generate" in out
    assert main(["eval", str(run), "--json"]) == 0
    metric = json.loads(capsys.readouterr().out)
    model, task = load_model(run)
    assert metric == {"task": "gpt", **task.evaluate(model)}       # the same numbers, recomputed
    # resuming a run as another model is refused, naming the right command
    assert main(["train", "seq2seq", "--out", str(run), "--resume"]) == 2
    assert "trained 'gpt', not 'seq2seq'" in capsys.readouterr().err


def test_cli_eval_of_a_missing_checkpoint_is_a_clear_error(tmp_path, capsys):
    assert main(["eval", str(tmp_path / "nothing")]) == 2
    assert "attnlab: error:" in capsys.readouterr().err
