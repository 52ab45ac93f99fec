"""AdamW with decay on weight matrices only, and the warmup + cosine learning-rate schedule.

Weight decay (decoupled, Loshchilov & Hutter 2019) applies to the weights of ``nn.Linear`` layers
only: biases, norm gains and embedding tables (token and learned positions, and the LM head when
it is tied to the token embedding) are not decayed. Shrinking an embedding row towards zero only
because its token is rare is not a regularizer we want (minGPT makes the same choice; nanoGPT
decays every 2-D tensor including embeddings).

Example::

    opt = make_optimizer(model, cfg)
    for g in opt.param_groups: g["lr"] = lr_at(step, cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.steps)
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from .config import TrainConfig

__all__ = ["make_optimizer", "lr_at", "decay_groups"]


def decay_groups(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(decayed, not decayed) parameters, each once (tied weights count once), in a fixed order."""
    embedded = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    linear = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)} - embedded
    decay, no_decay = [], []
    for _, p in model.named_parameters():                  # named_parameters() skips repeats of tied weights
        if p.requires_grad:
            (decay if id(p) in linear else no_decay).append(p)
    return decay, no_decay


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    decay, no_decay = decay_groups(model)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


def lr_at(step: int, lr: float, min_lr: float, warmup_steps: int, total_steps: Optional[int]) -> float:
    """Learning rate for 0-based optimizer step ``step``.

    Linear warmup lr * (step + 1) / warmup_steps for the first warmup_steps steps, then a cosine
    from lr down to min_lr, reached at the last step (total_steps - 1). total_steps None (a
    time-budgeted run before its length is known): lr after warmup.
    """
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if total_steps is None:
        return lr
    span = max(1, total_steps - 1 - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)
