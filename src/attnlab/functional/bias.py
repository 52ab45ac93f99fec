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

import warnings

from typing import Callable

import torch
from torch import Tensor

__all__ = ["StructuredBias", "FunctionBias", "relative_table"]


class StructuredBias:
    """Base class: ``tile`` returns the bias of one tile, broadcastable to (B, H, r1 - r0, c1 - c0).

    ``params`` are the tensors the bias depends on (may require grad). ``tile`` receives the
    absolute query positions ``i`` (lr, 1) -- already shifted by S - L, bottom-right aligned --
    and key positions ``j`` (1, lc), plus the params, and must be differentiable in the params.
    """

    params: tuple[Tensor, ...] = ()
    #: True when the bias depends on (batch, head, j - i) only (ALiBi, T5 buckets): then a per-offset
    #: table of L + S - 1 values is exact, and kernels read it instead of calling ``tile``.
    relative: bool = False

    def tile(self, i: Tensor, j: Tensor, *params: Tensor) -> Tensor:
        raise NotImplementedError

    def tile_values(self, r0: int, r1: int, c0: int, c1: int, L: int, S: int,
                    params: tuple[Tensor, ...] | None = None) -> Tensor:
        """The bias on the tile of rows r0:r1 and keys c0:c1, as a (B|1, H|1, lr, lc) tensor (what
        ``Mask.tile`` is for masks; ``tile`` itself is the function of positions a bias defines)."""
        params = self.params if params is None else params
        device = params[0].device if params else None
        return self.at(torch.arange(r0, r1, device=device), torch.arange(c0, c1, device=device), L, S, params)

    def block(self, r0: int, r1: int, c0: int, c1: int, L: int, S: int,
              params: tuple[Tensor, ...] | None = None) -> Tensor:
        """Deprecated name of ``tile_values`` (kernels say "tile"; "block" is a transformer layer)."""
        warnings.warn(f"{type(self).__name__}.block(...) is deprecated: call tile_values(...)", FutureWarning,
                      stacklevel=2)
        return self.tile_values(r0, r1, c0, c1, L, S, params)

    def at(self, rows: Tensor, cols: Tensor, L: int, S: int, params: tuple[Tensor, ...]) -> Tensor:
        """The bias at query rows (lr,) and key columns (lc,) (indices, any order): (B|1, H|1, lr, lc).

        Rows sit at positions rows + S - L (bottom-right); ``masks.aligned`` overrides this to use
        each sequence's own positions.
        """
        b = self.tile(rows[:, None] + (S - L), cols[None, :], *params)   # i (lr, 1), j (1, lc)
        return b.reshape((1,) * (4 - b.dim()) + tuple(b.shape))

    def dense(self, L: int, S: int) -> Tensor:
        """The whole bias (B|1, H|1, L, S), differentiable in ``params``."""
        return self.tile_values(0, L, 0, S, L, S)

    def table(self, L: int, S: int) -> "tuple[Tensor, int] | None":
        """The bias as a small table that kernels index, or None (then only ``tile`` describes it).

        Returns ``(T, c0)`` with T of shape (B|1, H|1, L|1, W) such that the bias of query row i and
        key j is ``T[b, h, i (or 0), clamp(j - i + c0, 0, W - 1)]``, differentiable in ``params``.
        A relative bias gives its per-offset table (W = L + S - 1, one row); Shaw's key term gives
        one row of 2k + 1 clipped offsets per query. O(L + S) or O(L k), never O(L S).
        """
        if not self.relative:
            return None
        return relative_table(self, L, S)[:, :, None, :], L - 1

    def has_table(self, L: int, S: int) -> bool:
        """Whether ``table(L, S)`` gives a table, read without building one where the class knows (a relative
        bias; a subclass with its own ``table`` may override this): a backend asks it to accept a request."""
        if type(self).table is StructuredBias.table:
            return self.relative
        return self.table(L, S) is not None

    def distance_slopes(self) -> "Tensor | None":
        """Per-head slopes m (H,) when the bias is exactly -m_h |i - j| (ALiBi), else None.

        Kernels that can compute that form from the slopes alone (the Triton kernel) ask this
        instead of knowing positional schemes by name.
        """
        return None

    def check(self, B: int, H: int, L: int, S: int) -> None:
        probe = self.tile_values(0, min(L, 1), 0, min(S, 1), L, S)
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


def relative_table(bias: StructuredBias, L: int, S: int) -> Tensor:
    """(B|1, H|1, L + S - 1) values of a relative bias at offsets j - p = -(S - 1) ... L - 1.

    Entry d + S - 1 holds the bias at offset d (so query row i and key j read entry j - i + L - 1).
    The offsets <= 0 are read from the last query's row, the others from the last key's column:
    only positions the mask math already uses. Differentiable in the bias's parameters.
    With L = 0 or S = 0 no pair reads it: zeros of width max(L + S - 1, 0), still tied to the parameters.
    """
    if L == 0 or S == 0:
        # the slices below would ask for rows 0 .. L - 2 or key S - 1, and torch.arange(0, -1) raises
        none = bias.tile_values(0, 0, 0, 0, L, S).sum((-2, -1))          # (B|1, H|1) zeros
        return none[..., None] + none.new_zeros(max(L + S - 1, 0))      # a fresh, contiguous (.., W) table
    last_row = bias.tile_values(L - 1, L, 0, S, L, S)        # (B|1, H|1, 1, S): d = -(S-1) .. 0
    last_col = bias.tile_values(0, L - 1, S - 1, S, L, S)    # (B|1, H|1, L-1, 1): d = L-1 .. 1
    Bb = max(last_row.shape[0], last_col.shape[0])
    Hb = max(last_row.shape[1], last_col.shape[1])
    row = last_row[:, :, 0, :].expand(Bb, Hb, S)
    col = last_col[:, :, :, 0].flip(-1).expand(Bb, Hb, L - 1)
    return torch.cat([row, col], -1)                         # (Bb, Hb, L + S - 1)
