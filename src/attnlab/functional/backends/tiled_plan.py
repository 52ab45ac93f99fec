"""The tiled backend's schedule: which key spans each query tile visits, and which need masking.

The structured mask classifies (query tile x fine key tile) pairs as EMPTY, PARTIAL or FULL.
Runs of non-empty fine tiles are merged into spans of at most ``block_k`` keys, so a sliding
window costs one or two matmuls per query tile and an unmasked row of a causal mask none at all.
Masking work is done only on spans that contain a PARTIAL tile.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from ..masks import EMPTY, PARTIAL, Mask

__all__ = ["Span", "RowTile", "Plan", "TileStats", "make_plan"]


@dataclass(frozen=True)
class Span:
    c0: int
    c1: int
    masked: tuple[tuple[int, int], ...] = ()   # key ranges [a, b) of PARTIAL tiles: mask only these


@dataclass(frozen=True)
class RowTile:
    r0: int
    r1: int
    spans: tuple[Span, ...]


@dataclass
class TileStats:
    """Work the tiled backend did, counted (not timed), for tests and benchmarks."""
    tiles_total: int = 0       # (query tile, fine key tile) pairs in the full problem, per batch group
    tiles_skipped: int = 0     # EMPTY: never computed
    tiles_masked: int = 0      # PARTIAL: computed and masked
    tiles_full: int = 0        # FULL: computed, no masking work
    scores: int = 0            # score entries computed per head, summed over the batch

    def add(self, other: "TileStats") -> None:
        for f in self.__dataclass_fields__:
            setattr(self, f, getattr(self, f) + getattr(other, f))


@dataclass
class Plan:
    groups: list[tuple[slice, list[RowTile]]]     # batch slice -> its row tiles
    stats: TileStats = field(default_factory=TileStats)


def _row_tiles(kinds: torch.Tensor, L: int, S: int, block_q: int, block_k: int, fine_k: int,
               stats: TileStats, examples: int) -> list[RowTile]:
    """Row tiles from one (nq, nk_fine) kinds table shared by ``examples`` batch entries."""
    per_span = block_k // fine_k
    rows = []
    for t, row in enumerate(kinds.tolist()):
        r0, r1 = t * block_q, min(L, (t + 1) * block_q)
        spans, start, masked = [], None, []
        for f, kind in enumerate(row + [EMPTY]):           # sentinel closes the last run
            if start is not None and (kind == EMPTY or f - start == per_span):
                c1 = min(S, f * fine_k)
                spans.append(Span(start * fine_k, c1, tuple(masked)))
                stats.scores += examples * (r1 - r0) * (c1 - start * fine_k)
                start, masked = None, []
            if kind != EMPTY:
                start = f if start is None else start
            if kind == PARTIAL:
                a, b = f * fine_k, min(S, (f + 1) * fine_k)
                if masked and masked[-1][1] == a:
                    masked[-1] = (masked[-1][0], b)        # extend the current masked range
                else:
                    masked.append((a, b))
        stats.tiles_total += len(row)
        stats.tiles_skipped += row.count(EMPTY)
        stats.tiles_masked += row.count(PARTIAL)
        stats.tiles_full += len(row) - row.count(EMPTY) - row.count(PARTIAL)
        rows.append(RowTile(r0, r1, tuple(spans)))
    return rows


def make_plan(mask: Optional[Mask], B: int, L: int, S: int, block_q: int, block_k: int,
              fine_k: int) -> Plan:
    """Schedule for a (B, ., L, S) problem: per batch group, row tiles with their key spans."""
    if block_k % fine_k:
        raise ValueError(f"block_k={block_k} must be a multiple of fine_k={fine_k}")
    stats = TileStats()
    if mask is None:
        nq, nk = -(-L // block_q), -(-S // fine_k)
        kinds = torch.full((1, nq, nk), 2, dtype=torch.int8)
    else:
        kinds = mask.tile_kinds(L, S, block_q, fine_k)      # (Bm, nq, nk)
    if kinds.shape[0] > 1 and bool((kinds == kinds[:1]).all()):
        kinds = kinds[:1]                                   # same schedule for every example: batch them
    if kinds.shape[0] == 1:
        groups = [(slice(0, B), _row_tiles(kinds[0], L, S, block_q, block_k, fine_k, stats, B))]
    else:
        groups = [(slice(b, b + 1), _row_tiles(kinds[b], L, S, block_q, block_k, fine_k, stats, 1))
                  for b in range(kinds.shape[0])]
    return Plan(groups, stats)
