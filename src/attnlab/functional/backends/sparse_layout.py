"""The sparse backend's schedule: which key blocks each query block gathers, and their element masks.

From the mask's tile kinds (EMPTY / PARTIAL / FULL per (query block x key block)) every query
block gets the list of its non-empty key blocks, padded to the longest list with "slots" that
point at block 0 and are masked out. Only PARTIAL blocks are asked for their element mask
(``Mask.tile``, shared between blocks with equal ``Mask.tile_key``); FULL blocks get none.

Under ``torch.compile`` the layout may not depend on tensor values (a graph cannot branch on them):
``make_layout(..., static=True)`` gathers every key block for every query block and masks them all
with one element mask per query block (exact, no skipping).

Example::

    lay = make_layout(masks.window(128, 128), B=1, H=8, L=4096, S=4096, tile_q=64, tile_k=64)
    lay.groups[0][1][0].idx.shape     # (C, 6): query blocks of the first chunk, 6 key blocks each
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor

from ..masks import EMPTY, FULL, PARTIAL, Mask

__all__ = ["SparseStats", "Chunk", "Layout", "make_layout", "chunk_allowed"]


@dataclass
class SparseStats:
    """Work the sparse backend did, counted (not timed), for tests and benchmarks."""
    blocks_total: int = 0      # (query block, key block) pairs of the problem, per schedule
    blocks_computed: int = 0   # non-empty pairs: gathered and computed
    blocks_masked: int = 0     # PARTIAL pairs: element mask applied
    slots_padded: int = 0      # padding slots (query blocks with fewer key blocks than the widest)
    scores: int = 0            # score entries computed per head, summed over the batch (padding included)

    def add(self, other: "SparseStats") -> None:
        for f in self.__dataclass_fields__:
            setattr(self, f, getattr(self, f) + getattr(other, f))


@dataclass
class Chunk:
    """Query blocks computed together: one batched matmul, K key-block slots each."""
    qsel: Tensor               # (C,) long: the query blocks
    idx: Tensor                # (C, K) long: key block of each slot (0 in padding slots)
    kinds: Tensor              # (C, K) int8: EMPTY (padding), PARTIAL or FULL
    part_pos: Tensor           # (P, 2) long: (row in chunk, slot) of each PARTIAL slot
    part_blocks: Optional[Tensor]   # (P, Bm, Hm, bq, bk) bool element masks of those slots
    filled_pos: Tensor         # (F, 2) long: (row in chunk, slot) of each non-padding slot
    all_allowed: bool          # nothing to mask: no PARTIAL or padding slot, no key past S


@dataclass
class Layout:
    groups: list[tuple[slice, list[Chunk]]]     # batch slice -> its chunks
    tile_q: int
    tile_k: int
    stats: SparseStats = field(default_factory=SparseStats)


def _element_block(mask: Mask, qb: int, kb: int, L: int, S: int, bq: int, bk: int, cache: dict) -> Tensor:
    """(Bm, Hm, bq, bk) bool mask of one tile; rows >= L and keys >= S are False."""
    r0, c0 = qb * bq, kb * bk
    r1, c1 = min(L, r0 + bq), min(S, c0 + bk)
    key = mask.tile_key(r0, r1, c0, c1, L, S)
    if key is not None and key in cache:
        return cache[key]
    blk = mask.tile(r0, r1, c0, c1, L, S)
    blk = blk.reshape((1,) * (4 - blk.dim()) + tuple(blk.shape)).cpu()
    blk = blk.expand(-1, -1, r1 - r0, c1 - c0)
    out = torch.nn.functional.pad(blk, (0, bk - (c1 - c0), 0, bq - (r1 - r0)), value=False)
    if key is not None:
        cache[key] = out
    return out


def _chunks(kinds: Tensor, mask: Optional[Mask], bs: slice, L: int, S: int, bq: int, bk: int,
            examples: int, H: int, budget: int, stats: SparseStats, cache: dict) -> list[Chunk]:
    """Chunks from one (nq, nk) kinds table used by ``examples`` batch entries (slice ``bs``).

    Query blocks are sorted by how many key blocks they need, so that a few dense rows (BigBird's
    global blocks, Longformer's global tokens) do not pad every other row to their width.
    """
    nq, nk = kinds.shape
    need = kinds != EMPTY
    counts = need.sum(1)                                          # (nq,)
    by_count = torch.argsort(counts, stable=True)
    order = torch.argsort((~need).to(torch.int8), dim=1, stable=True)   # needed key blocks first, in order
    per_slot = examples * H * bq * bk
    chunks, start, sorted_counts = [], 0, counts[by_count].tolist()
    while start < nq:
        stop = start + 1
        while stop < nq and (stop + 1 - start) * max(sorted_counts[stop], 1) * per_slot <= budget:
            stop += 1
        qsel = by_count[start:stop]
        K = max(sorted_counts[stop - 1], 1)
        valid = torch.arange(K)[None, :] < counts[qsel, None]     # (C, K)
        idx = torch.where(valid, order[qsel, :K], 0)
        slot_kinds = torch.where(valid, kinds[qsel].gather(1, order[qsel, :K]), EMPTY).to(torch.int8)
        part_pos = (slot_kinds == PARTIAL).nonzero()              # (P, 2)
        blocks = None
        if part_pos.numel():
            got = [_element_block(mask, int(qsel[c]), int(idx[c, s]), L, S, bq, bk, cache)
                   for c, s in part_pos.tolist()]
            shape = torch.broadcast_shapes(*(g.shape for g in got))
            blocks = torch.stack([g.expand(shape) for g in got])  # (P, Bm, Hm, bq, bk)
            if blocks.shape[1] > 1:
                blocks = blocks[:, bs]                            # this group's examples only
        cols = idx[:, :, None] * bk + torch.arange(bk)            # (C, K, bk) key positions
        all_allowed = blocks is None and bool(valid.all()) and bool((cols < S).all())
        chunks.append(Chunk(qsel, idx, slot_kinds, part_pos, blocks, valid.nonzero(), all_allowed))
        stats.slots_padded += int((~valid).sum())
        stats.scores += examples * len(qsel) * bq * K * bk
        start = stop
    stats.blocks_total += nq * nk
    stats.blocks_computed += int(need.sum())
    stats.blocks_masked += int((kinds == PARTIAL).sum())
    return chunks


def _static_chunks(mask: Optional[Mask], L: int, S: int, bq: int, bk: int, B: int, H: int, budget: int,
                   stats: SparseStats) -> list[Chunk]:
    """Chunks that read no tensor value: every query block gathers every key block (FULL without a
    mask, else PARTIAL with its element mask, one ``Mask.tile`` of whole key rows per query block)."""
    nq, nk = -(-L // bq), -(-S // bk)
    per_row = max(1, budget // (B * H * bq * nk * bk))           # query blocks per chunk
    kind = FULL if mask is None else PARTIAL
    chunks = []
    for start in range(0, nq, per_row):
        stop = min(nq, start + per_row)
        C = stop - start
        qsel = torch.arange(start, stop)
        idx = torch.arange(nk).expand(C, nk)
        every = torch.stack(torch.meshgrid(torch.arange(C), torch.arange(nk), indexing="ij"), -1).view(-1, 2)
        blocks = None
        if mask is not None:
            rows = []
            for qb in range(start, stop):
                r0, r1 = qb * bq, min(L, qb * bq + bq)
                t = mask.tile(r0, r1, 0, S, L, S)
                t = t.reshape((1,) * (4 - t.dim()) + tuple(t.shape)).cpu().expand(-1, -1, r1 - r0, S)
                t = torch.nn.functional.pad(t, (0, nk * bk - S, 0, bq - (r1 - r0)), value=False)
                rows.append(t.unflatten(-1, (nk, bk)).permute(3, 0, 1, 2, 4))   # (nk, Bm, Hm, bq, bk)
            shape = torch.broadcast_shapes(*(r.shape[1:] for r in rows))
            blocks = torch.cat([r.expand(nk, *shape) for r in rows])    # (C * nk, Bm, Hm, bq, bk)
        chunks.append(Chunk(qsel, idx, torch.full((C, nk), kind, dtype=torch.int8),
                            every if mask is not None else every[:0], blocks, every,
                            mask is None and nk * bk == S))
        stats.scores += B * C * bq * nk * bk
    stats.blocks_total += nq * nk
    stats.blocks_computed += nq * nk
    stats.blocks_masked += nq * nk if mask is not None else 0
    return chunks


def make_layout(mask: Optional[Mask], B: int, H: int, L: int, S: int, tile_q: int, tile_k: int,
                budget: int = 1 << 21, static: bool = False) -> Layout:
    """The chunks of a (B, H, L, S) problem, per distinct per-example mask schedule; ``budget``
    bounds the score entries of one chunk (all heads and examples together). ``static``: a layout
    from the shapes alone (``_static_chunks``), for torch.compile."""
    nq, nk = -(-L // tile_q), -(-S // tile_k)
    if static:
        stats = SparseStats()
        return Layout([(slice(0, B), _static_chunks(mask, L, S, tile_q, tile_k, B, H, budget, stats))],
                      tile_q, tile_k, stats)
    if mask is None:
        kinds = torch.full((1, nq, nk), FULL, dtype=torch.int8)
    else:
        kinds = mask.tile_kinds(L, S, tile_q, tile_k)           # (Bm, nq, nk)
    if kinds.shape[0] > 1 and bool((kinds == kinds[:1]).all()):
        kinds = kinds[:1]                                         # one schedule serves every example
    stats, cache = SparseStats(), {}
    if kinds.shape[0] == 1:
        groups = [(slice(0, B), _chunks(kinds[0], mask, slice(0, B), L, S, tile_q, tile_k, B, H, budget,
                                        stats, cache))]
    else:
        groups = [(slice(b, b + 1), _chunks(kinds[b], mask, slice(b, b + 1), L, S, tile_q, tile_k, 1, H, budget,
                                            stats, cache)) for b in range(kinds.shape[0])]
    return Layout(groups, tile_q, tile_k, stats)


def chunk_allowed(ch: Chunk, S: int, bk: int) -> Optional[Tensor]:
    """(Bm, Hm, C, bq, K, bk) bool element mask of a chunk, or None if nothing is masked.

    Padding slots and keys past S are False; PARTIAL slots take their element block; FULL slots
    are True (their rows past L are discarded by the caller).
    """
    if ch.all_allowed:
        return None
    C, K = ch.kinds.shape
    cols = ch.idx[:, :, None] * bk + torch.arange(bk)             # (C, K, bk) key positions
    base = (ch.kinds != EMPTY)[:, :, None] & (cols < S)           # (C, K, bk)
    bm, hm, bq = (1, 1, 1) if ch.part_blocks is None else ch.part_blocks.shape[1:4]
    allowed = base[:, :, None, None, None, :].expand(C, K, bm, hm, bq, bk).clone()
    if ch.part_blocks is not None:
        allowed[ch.part_pos[:, 0], ch.part_pos[:, 1]] = ch.part_blocks
    return allowed.permute(2, 3, 0, 4, 1, 5)                      # (Bm, Hm, C, bq|1, K, bk)
