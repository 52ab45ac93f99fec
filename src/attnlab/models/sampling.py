"""Choosing the next token from logits: temperature, top-k, top-p (nucleus), greedy at T = 0.

Example::

    nxt = sample_next(logits, temperature=0.8, top_k=40, top_p=0.95, generator=g)   # (B, V) -> (B,)
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["sample_next", "check_sampling"]


def check_sampling(*, temperature: float = 1.0, top_k: Optional[int] = None, top_p: Optional[float] = None) -> None:
    """ValueError for knobs no sampler can use (negative or non-finite temperature, top_k < 1, top_p outside (0, 1])."""
    if not 0 <= temperature < float("inf"):
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def sample_next(logits: Tensor, *, temperature: float = 1.0, top_k: Optional[int] = None,
                top_p: Optional[float] = None, generator: Optional[torch.Generator] = None) -> Tensor:
    """One token id per row of logits (B, V). temperature 0 = greedy (argmax)."""
    check_sampling(temperature=temperature, top_k=top_k, top_p=top_p)
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]           # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the tokens ranked above it already reach top_p (the first always stays)
        drop = probs.cumsum(-1) - probs >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
