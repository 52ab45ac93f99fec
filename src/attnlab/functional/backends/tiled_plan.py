"""The tiled backend's schedule: which key spans each query tile visits, and which need masking.

The structured mask classifies (query tile x fine key tile) pairs as EMPTY, PARTIAL or FULL.
Runs of non-empty fine tiles are merged into spans of at most ``tile_k`` keys, so a sliding
window costs one or two matmuls per query tile and an unmasked row of a causal mask none at all.
Masking work is done only on spans that contain a PARTIAL tile.

The tile sizes live here too (``tile_sizes``, ``FINE_K``, ``skip_grid``): the kernel and
``auto``'s estimate of how much a mask lets it skip (``auto_rule.skippable``) read them from one place.

Under ``torch.compile`` the schedule may not depend on tensor values (a graph cannot branch on
them), so ``make_plan(..., static=True)`` visits every tile and masks every one of them: exact,
with no skipping.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from ..masks import EMPTY, FULL, PARTIAL, CausalMask, Mask

__all__ = ["Span", "RowTile", "Plan", "TileStats", "make_plan", "tile_sizes", "skip_grid", "FINE_K"]

FINE_K = 64     # granularity (keys) at which the mask is classified; spans are merged runs of these


def tile_sizes(dtype: torch.dtype, mask: Optional[Mask]) -> tuple[int, int]:
    """(tile_q, tile_k): the tiled kernel's default row tile and key span, measured fastest on the
    2-core Zen 4 CI machine (docs/benchmarks.md).

    Wide tiles when whole rows are computed (no mask, causal); narrower row tiles for banded and
    block masks, where a tall tile wastes work at the band's slanted edges. In bf16/fp16 the
    matmuls are cheap and the fp32 softmax passes dominate: 256 x 256 keeps them in cache.
    """
    if mask is None or isinstance(mask, CausalMask):
        return (256, 512) if dtype in (torch.float32, torch.float64) else (256, 256)
    return 128, 512


def skip_grid(dtype: torch.dtype, mask: Optional[Mask]) -> tuple[int, int]:
    """(rows, keys) of the tiles the kernel classifies, and so skips, by default: its row tile by
    ``FINE_K`` keys. ``mask.tile_kinds(L, S, *skip_grid(dtype, mask))`` is what the kernel sees."""
    tile_q, tile_k = tile_sizes(dtype, mask)
    return tile_q, min(FINE_K, tile_k)


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


def _row_tiles(kinds, L: int, S: int, tile_q: int, tile_k: int, fine_k: int,
               stats: TileStats, examples: int) -> list[RowTile]:
    """Row tiles from one (nq, nk_fine) kinds table (a tensor or nested lists) shared by ``examples``
    batch entries."""
    per_span = tile_k // fine_k
    rows = []
    for t, row in enumerate(kinds.tolist() if isinstance(kinds, torch.Tensor) else kinds):
        r0, r1 = t * tile_q, min(L, (t + 1) * tile_q)
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


def make_plan(mask: Optional[Mask], B: int, L: int, S: int, tile_q: int, tile_k: int,
              fine_k: int, static: bool = False) -> Plan:
    """Schedule for a (B, ., L, S) problem: per batch group, row tiles with their key spans.

    ``static``: plan from the shapes alone (every tile of a mask PARTIAL, one group for the whole
    batch), never reading the mask's tensors -- what a torch.compile graph needs.
    """
    if tile_k % fine_k:
        raise ValueError(f"tile_k={tile_k} must be a multiple of fine_k={fine_k}")
    stats = TileStats()
    nq, nk = -(-L // tile_q), -(-S // fine_k)
    if mask is None:
        kinds = [[FULL] * nk] * nq
    elif static:
        kinds = [[PARTIAL] * nk] * nq
    else:
        kinds = mask.tile_kinds(L, S, tile_q, fine_k)      # (Bm, nq, nk)
    if isinstance(kinds, list):
        return Plan([(slice(0, B), _row_tiles(kinds, L, S, tile_q, tile_k, fine_k, stats, B))], stats)
    if kinds.shape[0] > 1 and bool((kinds == kinds[:1]).all()):
        kinds = kinds[:1]                                   # same schedule for every example: batch them
    if kinds.shape[0] == 1:
        groups = [(slice(0, B), _row_tiles(kinds[0], L, S, tile_q, tile_k, fine_k, stats, B))]
    else:
        groups = [(slice(b, b + 1), _row_tiles(kinds[b], L, S, tile_q, tile_k, fine_k, stats, 1))
                  for b in range(kinds.shape[0])]
    return Plan(groups, stats)
