"""The tiled backend's schedule: which key spans each query tile visits, and which need masking.

The structured mask classifies (query tile x fine key tile) pairs as EMPTY, PARTIAL or FULL.
Runs of non-empty fine tiles are merged into spans of at most ``block_k`` keys, so a sliding
window costs one or two matmuls per query tile and an unmasked row of a causal mask none at all.
Masking work is done only on spans that contain a PARTIAL tile.

For translation-invariant masks (causal, window) consecutive row tiles whose spans sit at the
same offsets from their first row form a *run*: the forward pass computes a whole run with one
batched matmul per span and one shared mask block. A sliding window of W keys is then covered by
narrow row tiles (little wasted work at the band's slanted edges) without paying Python overhead
per tile.
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
    masked: bool          # contains a PARTIAL tile: apply the mask block


@dataclass(frozen=True)
class RowTile:
    """``count`` tiles of ``r1 - r0`` rows each; tile t covers rows and spans shifted by t * height."""
    r0: int
    r1: int
    spans: tuple[Span, ...]
    count: int = 1

    @property
    def height(self) -> int:
        return self.r1 - self.r0

    def split(self) -> list["RowTile"]:
        """The run as single tiles."""
        h = self.height
        return [RowTile(self.r0 + t * h, self.r1 + t * h,
                        tuple(Span(sp.c0 + t * h, sp.c1 + t * h, sp.masked) for sp in self.spans))
                for t in range(self.count)]

    def _shape(self) -> tuple:
        return (self.height,) + tuple((sp.c0 - self.r0, sp.c1 - self.r0, sp.masked) for sp in self.spans)


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
    groups: list[tuple[slice, list[RowTile]]]     # batch slice -> its row tiles (runs)
    stats: TileStats = field(default_factory=TileStats)

    def single_tiles(self) -> list[tuple[slice, list[RowTile]]]:
        """The same schedule with every run split into single tiles (for the backward pass)."""
        return [(bs, [one for run in tiles for one in run.split()]) for bs, tiles in self.groups]


def _runs(tiles: list[RowTile], max_rows: int) -> list[RowTile]:
    """Merge consecutive tiles of identical relative shape into runs of at most ``max_rows`` rows."""
    runs: list[RowTile] = []
    for t in tiles:
        last = runs[-1] if runs else None
        if (last is not None and last._shape() == t._shape() and t.r0 == last.r0 + last.count * last.height
                and (last.count + 1) * last.height <= max_rows):
            runs[-1] = RowTile(last.r0, last.r1, last.spans, last.count + 1)
        else:
            runs.append(t)
    return runs


def _row_tiles(kinds: torch.Tensor, L: int, S: int, block_q: int, block_k: int, fine_k: int,
               stats: TileStats, examples: int) -> list[RowTile]:
    """Row tiles from one (nq, nk_fine) kinds table shared by ``examples`` batch entries."""
    per_span = block_k // fine_k
    rows = []
    for t, row in enumerate(kinds.tolist()):
        r0, r1 = t * block_q, min(L, (t + 1) * block_q)
        spans, start, masked = [], None, False
        for f, kind in enumerate(row + [EMPTY]):           # sentinel closes the last run
            if start is not None and (kind == EMPTY or f - start == per_span):
                c1 = min(S, f * fine_k)
                spans.append(Span(start * fine_k, c1, masked))
                stats.scores += examples * (r1 - r0) * (c1 - start * fine_k)
                start, masked = None, False
            if kind != EMPTY:
                start = f if start is None else start
                masked = masked or kind == PARTIAL
        stats.tiles_total += len(row)
        stats.tiles_skipped += row.count(EMPTY)
        stats.tiles_masked += row.count(PARTIAL)
        stats.tiles_full += len(row) - row.count(EMPTY) - row.count(PARTIAL)
        rows.append(RowTile(r0, r1, tuple(spans)))
    return rows


def make_plan(mask: Optional[Mask], B: int, L: int, S: int, block_q: int, block_k: int,
              fine_k: int, run_rows: int = 0) -> Plan:
    """Schedule for a (B, ., L, S) problem: per batch group, row tiles with their key spans.

    ``run_rows`` > 0 merges equally shaped tiles of a translation-invariant mask into runs of up
    to that many rows (0: no runs).
    """
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
    if run_rows and mask is not None and mask.translation_invariant:
        groups = [(bs, _runs(tiles, run_rows)) for bs, tiles in groups]
    return Plan(groups, stats)
