"""Training tasks by name: what ``attnlab train NAME`` and ``attnlab eval CHECKPOINT`` can make.

Each name maps to a module defining ``SPEC`` (a ``train.task.TaskSpec``); modules are imported on
first use, so the CLI starts fast. ``load_model(path)`` rebuilds any trained model from its
checkpoint: the checkpoint's ``extra["task"]`` names the task (GPT checkpoints written before
tasks existed have none and are GPT).

Example::

    spec = get_spec("seq2seq")                 # TaskSpec
    model, task = load_model("runs/seq2seq-reversal")
    task.evaluate(model)                       # {"exact_match": 0.997, ...}
"""
from __future__ import annotations

import importlib
from typing import Union

from torch import nn

__all__ = ["TASK_MODULES", "task_names", "get_spec", "load_model"]

TASK_MODULES: dict[str, str] = {
    "gpt": "attnlab.tasks.lm",
    "seq2seq": "attnlab.tasks.seq2seq",
    "vit": "attnlab.tasks.vit",
    "captioner": "attnlab.tasks.captioner",
    "evoformer": "attnlab.tasks.evoformer",
    "vqa": "attnlab.tasks.vqa",
    "code": "attnlab.tasks.code",
    "msa": "attnlab.tasks.msa",
}


def task_names() -> list[str]:
    return list(TASK_MODULES)


def get_spec(name: str):
    """The TaskSpec registered under ``name``; an unknown name is a ValueError listing the known ones."""
    if name not in TASK_MODULES:
        raise ValueError(f"unknown model/task {name!r}; choose from {task_names()}")
    return importlib.import_module(TASK_MODULES[name]).SPEC


def load_model(path: Union[str, "object"]) -> tuple[nn.Module, object]:
    """(model in eval mode, task) from a checkpoint directory written by the trainer."""
    from ..train.checkpoint import load_checkpoint
    ckpt = load_checkpoint(path, train_state=False)          # the model needs weights only
    task = get_spec(ckpt.extra.get("task", "gpt")).from_checkpoint(ckpt)
    model = task.build_model()
    model.load_state_dict(ckpt.model_state)
    return model.eval(), task
