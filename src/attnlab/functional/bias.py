"""Structured additive biases: computed per tile, never materialized as (B, H, L, S).

A structured bias is a function of (query rows, key columns) and a few parameter tensors
(ALiBi slopes, a T5 bucket table, ...). The tiled backend asks it for one tile at a time and,
in the backward pass, pulls the tile's gradient back onto the parameters with autograd.

Example::

    slopes = torch.tensor([0.5, 0.25])                       # one per head
    alibi = FunctionBias(lambda i, j, s: -s[:, None, None] * (i - j).abs(), slopes)
    out = attention(q, k, v, bias=alibi)                     # q: (B, 2, L, D)
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

__all__ = ["StructuredBias", "FunctionBias"]


class StructuredBias:
    """Base class: ``tile`` returns the bias of one tile, broadcastable to (B, H, r1 - r0, c1 - c0).

    ``params`` are the tensors the bias depends on (may require grad). ``tile`` receives the
    absolute query positions ``i`` (lr, 1) -- already shifted by S - L, bottom-right aligned --
    and key positions ``j`` (1, lc), plus the params, and must be differentiable in the params.
    """

    params: tuple[Tensor, ...] = ()

    def tile(self, i: Tensor, j: Tensor, *params: Tensor) -> Tensor:
        raise NotImplementedError

    def block(self, r0: int, r1: int, c0: int, c1: int, L: int, S: int,
              params: tuple[Tensor, ...] | None = None) -> Tensor:
        """The bias of rows r0:r1 and keys c0:c1, as a (B|1, H|1, lr, lc) tensor."""
        params = self.params if params is None else params
        device = params[0].device if params else None
        return self.at(torch.arange(r0, r1, device=device), torch.arange(c0, c1, device=device), L, S, params)

    def at(self, rows: Tensor, cols: Tensor, L: int, S: int, params: tuple[Tensor, ...]) -> Tensor:
        """The bias at query rows (lr,) and key columns (lc,) (indices, any order): (B|1, H|1, lr, lc).

        Rows sit at positions rows + S - L (bottom-right); ``masks.aligned`` overrides this to use
        each sequence's own positions.
        """
        b = self.tile(rows[:, None] + (S - L), cols[None, :], *params)   # i (lr, 1), j (1, lc)
        return b.reshape((1,) * (4 - b.dim()) + tuple(b.shape))

    def dense(self, L: int, S: int) -> Tensor:
        """The whole bias (B|1, H|1, L, S), differentiable in ``params``."""
        return self.block(0, L, 0, S, L, S)

    def check(self, B: int, H: int, L: int, S: int) -> None:
        probe = self.block(0, min(L, 1), 0, min(S, 1), L, S)
        if probe.dim() != 4 or probe.shape[0] not in (1, B) or probe.shape[1] not in (1, H):
            raise ValueError(f"{type(self).__name__} gives tiles of shape {tuple(probe.shape)}, which do not "
                             f"broadcast to (B, H, lr, lc) with B={B}, H={H}")


class FunctionBias(StructuredBias):
    """A structured bias from a function ``fn(i, j, *params)`` of positions (i: (lr, 1), j: (1, lc))."""

    def __init__(self, fn: Callable[..., Tensor], *params: Tensor):
        self.fn, self.params = fn, tuple(params)

    def tile(self, i, j, *params):
        return self.fn(i, j, *params)

    def __repr__(self):
        return f"FunctionBias({getattr(self.fn, '__name__', 'fn')}, {len(self.params)} params)"
