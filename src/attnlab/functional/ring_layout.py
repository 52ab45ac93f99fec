"""How a global sequence is cut over the ranks of a ring: the ``contiguous`` and ``zigzag`` layouts.

A layout says which global positions rank r holds, as a list of segments ``(start, length)``
in the order they are stored in the rank's shard:

    contiguous (N = P * c):      rank r holds [r*c, (r+1)*c)
    zigzag     (N = 2 * P * c):  rank r holds chunk r, then chunk 2P-1-r (chunks of c)

With causal attention the contiguous layout leaves rank 0 one block of work and rank P-1 all P;
zigzag gives every rank the same work (Llama 3, arXiv:2407.21783; REFERENCES.md section 3).
P = 4, zigzag: r0 {C0, C7}, r1 {C1, C6}, r2 {C2, C5}, r3 {C3, C4}.

Example:
    x = torch.arange(8)
    parts = [shard(x, r, 2, "zigzag", dim=0) for r in range(2)]   # [0 1 6 7], [2 3 4 5]
    assert torch.equal(unshard(parts, "zigzag", dim=0), x)
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

__all__ = ["LAYOUTS", "check_layout", "segments", "shard", "unshard", "positions"]

LAYOUTS = ("zigzag", "contiguous")


def check_layout(layout: str) -> None:
    """Raise a ValueError for an unknown layout name."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown ring layout {layout!r}; choose one of {list(LAYOUTS)}")


def chunks_per_rank(layout: str) -> int:
    """How many equal chunks each rank holds: 2 for zigzag, 1 for contiguous."""
    check_layout(layout)
    return 2 if layout == "zigzag" else 1


def check_divisible(n: int, world: int, layout: str) -> None:
    """Raise a ValueError when a global length n cannot be cut evenly for this layout and world size."""
    per = chunks_per_rank(layout) * world
    if world < 1:
        raise ValueError(f"world size must be >= 1, got P={world}")
    if n % per != 0:
        pad = per - n % per
        raise ValueError(f"ring layout {layout!r} cuts the sequence into {per} equal chunks "
                         f"({chunks_per_rank(layout)} per rank x P={world}), but N={n} is not divisible by {per}; "
                         f"pad the sequence by {pad} positions (masking them with key_padding) to N={n + pad}")


def segments(rank: int, world: int, n: int, layout: str) -> list[tuple[int, int]]:
    """The global positions rank ``rank`` holds, as (start, length) segments in shard order."""
    check_divisible(n, world, layout)
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a world of size {world}")
    if layout == "contiguous":
        c = n // world
        return [(rank * c, c)]
    c = n // (2 * world)
    return [(rank * c, c), ((2 * world - 1 - rank) * c, c)]


def positions(rank: int, world: int, n: int, layout: str, device=None) -> Tensor:
    """The global positions of a rank's shard, in shard order: (n // world,) int64."""
    return torch.cat([torch.arange(s, s + c, device=device) for s, c in segments(rank, world, n, layout)])


def shard(x: Tensor, rank: int, world: int, layout: str = "zigzag", dim: int = 2) -> Tensor:
    """The part of the global sequence ``x`` (sequence along ``dim``) that ``rank`` holds.

    Args:
        x: any tensor with the global sequence (length N) along ``dim``, e.g. q (B, H, N, D)
            with dim=2 or key padding (B, N) with dim=1.
        rank, world: this rank and the number of ranks P.
        layout: "zigzag" (N % 2P == 0) or "contiguous" (N % P == 0).
    Returns:
        x restricted to the rank's positions along ``dim`` (length N / P), a new tensor.
    Example:
        q_local = shard(q, rank, world, "zigzag", dim=2)     # (B, H, N / P, D)
    """
    segs = segments(rank, world, x.shape[dim], layout)
    return torch.cat([x.narrow(dim, s, c) for s, c in segs], dim=dim)


def unshard(shards: Sequence[Tensor], layout: str = "zigzag", dim: int = 2) -> Tensor:
    """Rebuild the global sequence from every rank's shard (in rank order): the inverse of ``shard``.

    Args:
        shards: P tensors, shard r from rank r, all the same shape (length N / P along ``dim``).
    Returns:
        The global tensor (length N along ``dim``).
    Example:
        out = unshard(all_gathered_outputs, "zigzag", dim=2)   # (B, H, N, Dv)
    """
    world = len(shards)
    if world == 0:
        raise ValueError("unshard needs at least one shard")
    ln = shards[0].shape[dim]
    if any(s.shape[dim] != ln for s in shards):
        raise ValueError(f"unshard needs equal shards along dim {dim}; got lengths {[s.shape[dim] for s in shards]}")
    n = ln * world
    pieces: dict[int, Tensor] = {}
    for r, part in enumerate(shards):
        offset = 0
        for s, c in segments(r, world, n, layout):
            pieces[s] = part.narrow(dim, offset, c)
            offset += c
    return torch.cat([pieces[s] for s in sorted(pieces)], dim=dim)
