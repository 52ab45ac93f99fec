"""Tile arithmetic shared by every structured mask: tile kinds, tile bounds, row spans.

A kernel cuts the (L, S) score matrix into tiles of ``tile_q`` query rows by ``tile_k`` key
columns (the last row and column of tiles may be short). For each tile a mask answers with a
*kind*: EMPTY (no allowed pair: skip the tile), FULL (every pair allowed: no masking work) or
PARTIAL. A mask may also give, per query row, its allowed keys as a few half-open *spans*
``[lo, hi)`` (``Mask.row_spans``), which the compiled kernel reads instead of tiles.

This module knows nothing about masks; ``mask_base``, ``masks``, ``patterns`` and ``varlen`` build
on it. Example::

    r0, r1, c0, c1 = tile_bounds(L=10, S=7, tile_q=4, tile_k=3)
    r0.flatten().tolist(), c1.flatten().tolist()      # [0, 4, 8], [3, 6, 7]
    classify(torch.tensor([True, False, False]), torch.tensor([False, True, False])).tolist()
    # [EMPTY, FULL, PARTIAL] == [0, 2, 1]
"""
from __future__ import annotations

import functools
import warnings
from typing import Callable

import torch
from torch import Tensor

__all__ = ["EMPTY", "PARTIAL", "FULL", "classify", "tile_bounds", "interval_kinds", "tile_reduce",
           "interval_spans", "intersect_spans", "old_tile_names"]

# Tile kinds. Ordered so that the kind of (a & b) is min(kind(a), kind(b)).
EMPTY, PARTIAL, FULL = 0, 1, 2


def classify(empty: Tensor, full: Tensor) -> Tensor:
    """int8 tile kinds, broadcast shape of two bool tensors: EMPTY where ``empty`` (it wins over
    ``full``), else FULL where ``full``, else PARTIAL."""
    return torch.where(empty, EMPTY, torch.where(full, FULL, PARTIAL)).to(torch.int8)


def tile_bounds(L: int, S: int, tile_q: int, tile_k: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """First and one-past-last row of each query tile, (nq, 1) each, and first and one-past-last
    key of each key tile, (1, nk) each (int64, the last tile clipped to L or S)."""
    r0 = torch.arange(0, L, tile_q)[:, None]                     # (nq, 1)
    c0 = torch.arange(0, S, tile_k)[None, :]                     # (1, nk)
    return r0, torch.clamp(r0 + tile_q, max=L), c0, torch.clamp(c0 + tile_k, max=S)


def interval_kinds(lo_first: Tensor, lo_last: Tensor, hi_first: Tensor, hi_last: Tensor,
                   c0: Tensor, c1: Tensor) -> Tensor:
    """Kinds of tiles whose rows allow the keys [lo(i), hi(i)] (inclusive, both monotone in i).

    lo_first/lo_last, hi_first/hi_last: (nq, 1) bounds at the first and last row of each query tile;
    c0, c1: (1, nk) first and one-past-last key of each key tile. Returns (1, nq, nk) int8.
    """
    full = (c0 >= lo_last) & (c1 - 1 <= hi_first)
    empty = (c1 - 1 < lo_first) | (c0 > hi_last)
    return classify(empty, full)[None]                           # (1, nq, nk)


def tile_reduce(x: Tensor, size: int, fill, op: Callable[..., Tensor]) -> Tensor:
    """Reduce the last dim of x (..., n) over tiles of ``size`` with ``op`` (torch.any, torch.amin, ...):
    (..., nt). The last tile is padded with ``fill``, which must not change its verdict."""
    pad = (-x.shape[-1]) % size
    return op(torch.nn.functional.pad(x, (0, pad), value=fill).unflatten(-1, (-1, size)), -1)


def interval_spans(lo: Tensor, hi: Tensor) -> Tensor:
    """One span per row: (Bm, L) or (L,) bounds -> (Bm, L, 1, 2) int64 ``[lo, max(lo, hi))``."""
    lo, hi = torch.broadcast_tensors(lo.long(), hi.long())
    spans = torch.stack([lo, torch.maximum(lo, hi)], -1)[..., None, :]   # (..., L, 1, 2)
    return spans if spans.dim() == 4 else spans[None]


def intersect_spans(a: Tensor, b: Tensor) -> Tensor:
    """Row-wise intersection of two span lists (Bm, L, Ka, 2) & (Bm, L, Kb, 2) -> (Bm, L, Ka*Kb, 2).

    Every pair of intervals intersects to an interval (possibly empty), so the result is exact;
    single-interval masks (the common case) stay single-interval.
    """
    lo = torch.maximum(a[..., :, None, 0], b[..., None, :, 0])           # (Bm, L, Ka, Kb)
    hi = torch.minimum(a[..., :, None, 1], b[..., None, :, 1])
    return torch.stack([lo, torch.maximum(lo, hi)], -1).flatten(-3, -2)  # (Bm, L, Ka*Kb, 2)


def old_tile_names(kernel: Callable) -> Callable:
    """Let ``kernel`` still take its tile sizes as ``block_q=`` / ``block_k=`` (their names before
    ``tile_q`` / ``tile_k``), with a FutureWarning; both spellings at once are a TypeError."""
    @functools.wraps(kernel)
    def wrapper(*args, **kwargs):
        for old, new in (("block_q", "tile_q"), ("block_k", "tile_k")):
            if old in kwargs:
                if new in kwargs:
                    raise TypeError(f"{kernel.__name__}() got {old}= and {new}=: {old} is the old name of {new}")
                warnings.warn(f"{kernel.__name__}({old}=...) is deprecated: the argument is now {new}",
                              FutureWarning, stacklevel=2)
                kwargs[new] = kwargs.pop(old)
        return kernel(*args, **kwargs)
    return wrapper
