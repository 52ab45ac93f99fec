"""What the trainer trains: a ``Task`` bundles a model kind with its data, batches and metric.

The trainer (``trainer.Trainer``) owns the loop — AdamW, schedule, clipping, accumulation,
validation, time budget, checkpoints, resume, DDP — and asks the task for everything
model- or data-specific:

- ``build_model()``: a fresh model whose ``loss(*batch)`` returns the mean training loss (a scalar);
- ``model_config()``: JSON-ready; saved in every checkpoint, and enough (with ``info()``) for the
  task's ``TaskSpec.from_checkpoint`` to rebuild the task and the model;
- ``sampler(batch_size, seed)``: training batches (tuples of tensors with the batch first), with
  ``state()`` / ``set_state()`` so a resumed run draws the same batches;
- ``eval_batches(batch_size, n, seed)``: fixed validation batches (the same at every evaluation);
- ``evaluate(model)``: the task metric on held-out data (exact match, accuracy...), a dict of floats.

Optional: ``title()`` (the loss plot's title after the model size), ``loss_label`` (its y axis),
``describe()`` (the CLI's one line about the data; default: the flat items of ``info()``) and
``size_estimate(batch_size)`` (a ``sizes.SizeEstimate`` of one training step, checked against the
memory available before the model is built; default: the parameters of ``model_config()`` alone).

Tasks with generated data draw each batch from a seeded ``torch.Generator`` (``DrawSampler``),
so the data are reproducible, resumable and never stored.

Example::

    task = SortingTask(...)                         # any Task
    trainer = Trainer(task, TrainConfig(steps=500, out_dir="runs/sort"))
    trainer.train()
    metric = task.evaluate(trainer.model)           # {"exact_match": 0.996, ...}
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol, Union, runtime_checkable

import torch
from torch import Tensor, nn

from .config import check_seed

__all__ = ["Task", "Sampler", "DrawSampler", "TaskSpec", "check_options"]

Batch = tuple[Tensor, ...]


@runtime_checkable
class Sampler(Protocol):
    def next(self) -> Batch: ...
    def state(self) -> Tensor: ...
    def set_state(self, state: Tensor) -> None: ...


@runtime_checkable
class Task(Protocol):
    name: str        # registry name: "gpt", "seq2seq", "vit", "captioner", "evoformer", ...
    unit: str        # what one row of a batch is, for throughput: "tok" (per token) or "ex" (per example)

    def model_config(self) -> dict: ...
    def build_model(self) -> nn.Module: ...
    def info(self) -> dict: ...                                   # describes the data; stored in checkpoints
    def tokenizer_json(self) -> Optional[str]: ...
    def sampler(self, batch_size: int, seed: int) -> Sampler: ...
    def eval_batches(self, batch_size: int, n: int, seed: int) -> list[Batch]: ...
    def units_per_batch(self, batch_size: int) -> int: ...       # tokens or examples in one micro-batch
    def val_metrics(self, val_loss: float) -> dict: ...          # logged beside each validation loss
    def evaluate(self, model: nn.Module) -> dict: ...            # the task metric on held-out data


class DrawSampler:
    """Batches made by ``draw(generator, batch_size)`` from its own seeded generator (resumable).

    Example::

        def draw(g, b):                                   # reversal: x -> x reversed
            x = torch.randint(3, 13, (b, 8), generator=g)  # (b, 8)
            return x, x.flip(1)
        s = DrawSampler(draw, batch_size=32, seed=0)
        src, tgt = s.next()
    """

    def __init__(self, draw: Callable[[torch.Generator, int], Batch], batch_size: int, seed: int = 0):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.draw, self.batch_size = draw, batch_size
        self.generator = torch.Generator().manual_seed(seed)

    def next(self) -> Batch:
        return tuple(self.draw(self.generator, self.batch_size))

    def fixed_batches(self, n: int) -> list[Batch]:
        return [self.next() for _ in range(n)]

    def state(self) -> Tensor:
        return self.generator.get_state()

    def set_state(self, state: Tensor) -> None:
        self.generator.set_state(state)


@dataclass
class TaskSpec:
    """How the CLI makes a task: ``attnlab train NAME [options]`` and ``attnlab eval CHECKPOINT``.

    ``add_arguments`` adds the task's own options (the trainer's — steps, time limit, batch size,
    lr, seed, out, resume... — are added for every task); ``from_args`` makes the task for a new
    run; ``from_checkpoint`` rebuilds it from a checkpoint (its ``model_config`` and
    ``extra["data"]``, which holds ``info()``); ``train_defaults`` are this task's TrainConfig
    defaults (e.g. a time budget that fits the issue's 10 minutes): a dict, or a function of the
    parsed arguments returning one; ``run_name(args)`` names the default run directory
    ``runs/<run_name>`` (default: the task's name); ``validate(args)`` refuses option values no run
    can use (a ValueError naming the flag), before any data is read or any directory is made.
    """
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    from_args: Callable[[argparse.Namespace], Task]
    from_checkpoint: Callable[..., Task]                  # (Checkpoint) -> Task
    train_defaults: Union[dict, Callable[[argparse.Namespace], dict]] = field(default_factory=dict)
    run_name: Optional[Callable[[argparse.Namespace], str]] = None
    validate: Callable[[argparse.Namespace], None] = lambda args: None

    def defaults_for(self, args: argparse.Namespace) -> dict:
        return dict(self.train_defaults(args) if callable(self.train_defaults) else self.train_defaults)

    def run_dir(self, args: argparse.Namespace) -> str:
        return f"runs/{self.run_name(args) if self.run_name else self.name}"


def check_options(args: argparse.Namespace, *, positive: tuple = (), non_negative: tuple = (), seeds: tuple = (),
                  at_most: Optional[dict] = None) -> None:
    """ValueError naming the first flag whose value no run can use: ``positive`` flags must be >= 1,
    ``non_negative`` >= 0, ``seeds`` in [0, 2**63), ``at_most`` {flag: limit}. Unset (None) values pass.

    >>> check_options(argparse.Namespace(patch=0), positive=("--patch",))
    Traceback (most recent call last):
    ValueError: --patch must be >= 1, got 0
    """
    def value(flag: str):
        return getattr(args, flag.lstrip("-").replace("-", "_"), None)

    for flag in positive:
        if value(flag) is not None and value(flag) < 1:
            raise ValueError(f"{flag} must be >= 1, got {value(flag)}")
    for flag in non_negative:
        if value(flag) is not None and value(flag) < 0:
            raise ValueError(f"{flag} must be >= 0, got {value(flag)}")
    for flag in seeds:
        if value(flag) is not None:
            check_seed(value(flag), flag)
    for flag, limit in (at_most or {}).items():
        if value(flag) is not None and value(flag) > limit:
            raise ValueError(f"{flag} must be at most {limit:,}, got {value(flag):,}")
