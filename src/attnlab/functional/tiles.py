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
import sys
import warnings
from typing import Callable

import numpy as np
import torch
from torch import Tensor

__all__ = ["EMPTY", "PARTIAL", "FULL", "classify", "tile_bounds", "interval_kinds", "tile_reduce",
           "interval_spans", "intersect_spans", "old_tile_names", "pack_bits", "bit_spans", "dense_tile_kinds"]

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


def pack_bits(allowed: Tensor) -> Tensor:
    """(Bb, Hb, L, S) bool -> (Bb, Hb, L, ceil(S / 64)) int64, bit j % 64 of word j // 64.

    numpy's ``packbits`` packs 8 keys a byte, the lowest key in the lowest bit, and on a little-endian CPU 8
    such bytes read as one int64 are the word: 1 ms for a 4096 x 4096 mask on the AMD EPYC Zen 3, where the
    torch arithmetic below (the big-endian and torch.compile fallback) took 104 ms, a third of the masked call it
    plans (``backends/native.py``'s bits)."""
    S = allowed.shape[-1]
    pad = (-S) % 64
    x = allowed.cpu()
    x = torch.nn.functional.pad(x, (0, pad)) if pad else x                          # (.., S + pad) bool
    if _LITTLE_ENDIAN and not torch.compiler.is_compiling():           # a graph's tensors have no numpy form
        # C order in: packbits keeps its input's memory order, and the bytes must run along the keys to read as words
        bits = np.packbits(np.ascontiguousarray(x.numpy()), axis=-1, bitorder="little")
        return torch.from_numpy(bits).view(torch.int64)
    x = x.unflatten(-1, (-1, 64)).long()                                            # (.., W, 64)
    weights = torch.ones(64, dtype=torch.long).bitwise_left_shift(torch.arange(64))     # 2^k (bit 63 wraps)
    return (x * weights).sum(-1).contiguous()     # distinct bits never carry, so the sum is an OR


_LITTLE_ENDIAN = sys.byteorder == "little"


def bit_spans(words: Tensor) -> Tensor:
    """(Bb, Hb, L, W) int64 words (``pack_bits``) -> (Bb, L, 1, 2) int64: per query row, the keys [lo, hi) from
    its first to one past its last allowed key in any head ([0, 0) for a row with none).

    Every allowed key lies inside, so these spans ANDed with the bits are the bits: what the compiled kernel
    reads to skip the key chunks outside a row's range, as it does for masks with an interval form (a causal
    key-padding mask given densely ran 1.4-2x faster with them on the AMD EPYC Zen 3). Found on the words, 64
    times fewer elements than the bools: the first and last non-zero word, then the lowest and highest bit
    set in it (its power of two, whose float exponent is the bit's index). In numpy, as unsigned words: the
    same steps in torch took 270-290 us at n = 128-512 (some 40 small ops), a third of a first masked call."""
    Bb, _, L, W = words.shape
    w = np.bitwise_or.reduce(words.cpu().numpy().view(np.uint64), axis=1).reshape(Bb * L, W)   # (R, W): any head
    nonzero = w != 0
    rows = np.arange(Bb * L)
    first = nonzero.argmax(-1)                                               # (R,): the first maximum
    last = W - 1 - nonzero[:, ::-1].argmax(-1)
    low, high = w[rows, first], w[rows, last]                                # (R,) words
    one = np.uint64(1)
    low = low & (~low + one)                                                 # its lowest bit alone: 2^k
    for shift in (1, 2, 4, 8, 16, 32):                                       # every bit below the highest set
        high = high | (high >> np.uint64(shift))
    high = (high >> one) + one                                               # its highest bit alone
    spans = np.empty((Bb * L, 2), dtype=np.int64)
    spans[:, 0] = first * 64 + np.frexp(low.astype(np.float64))[1] - 1     # 2^k = 0.5 * 2^(k + 1): k
    spans[:, 1] = last * 64 + np.frexp(high.astype(np.float64))[1]         # k + 1
    spans[~nonzero.any(-1)] = 0
    return torch.from_numpy(spans).reshape(Bb, L, 1, 2)


def dense_tile_kinds(allowed: Tensor, L: int, S: int, tile_q: int, tile_k: int) -> Tensor:
    """(Bm, nq, nk) int8 kinds of the tiles of a dense (Bm, Hm, L, S) bool mask (True = may attend), over its
    heads: EMPTY where no head allows a pair of the tile, FULL where every head allows every pair.

    Where ``tile_k`` is a multiple of 64 the mask is bit-packed first (``pack_bits``) and each 64-key word
    answers "any" (!= 0) and "all" (every key below S set): 64 times fewer elements to reduce than the bools,
    2-3 ms for a 4096 x 4096 mask where reducing the bools took 15-50 ms on the AMD EPYC Zen 3."""
    m = allowed.expand(-1, -1, L, S).cpu()                                  # (Bm, Hm, L, S)
    nq, nk = -(-L // tile_q), -(-S // tile_k)
    pad_l = nq * tile_q - L
    f = torch.nn.functional.pad
    if tile_k % 64 == 0:
        words = pack_bits(m)                                                # (Bm, Hm, L, W), bits past S are 0
        W = words.shape[-1]
        whole = torch.full((W,), -1, dtype=torch.int64)                     # every bit of a word below S set
        if S % 64:
            whole[-1] = (1 << (S % 64)) - 1
        pad_w, per = nk * (tile_k // 64) - W, tile_k // 64
        # pad with False for "any" and True for "all" so the padding never changes a verdict
        any_ = f(words != 0, (0, pad_w, 0, pad_l), value=False).unflatten(3, (nk, per)).any(4)     # (Bm, Hm, Lp, nk)
        all_ = f(words == whole, (0, pad_w, 0, pad_l), value=True).unflatten(3, (nk, per)).all(4)
    else:
        pad_s = nk * tile_k - S
        any_ = f(m, (0, pad_s, 0, pad_l), value=False).unflatten(3, (nk, tile_k)).any(4)
        all_ = f(m, (0, pad_s, 0, pad_l), value=True).unflatten(3, (nk, tile_k)).all(4)
    any_ = any_.unflatten(2, (nq, tile_q)).any(3).any(1)                    # (Bm, nq, nk)
    all_ = all_.unflatten(2, (nq, tile_q)).all(3).all(1)
    return classify(~any_, all_)
