"""Structured sparse attention patterns: Sparse Transformer, Longformer, BigBird and block layouts.

Every pattern is a ``masks.Mask``: it builds any (rows x keys) tile on demand and classifies
tiles exactly (EMPTY = no allowed pair, FULL = every pair allowed), so the tiled and sparse
backends skip empty tiles without ever forming the (L, S) mask. As everywhere in attnlab, query
row ``i`` sits at position ``p = i + S - L`` (bottom-right), so decoding (L < S) needs no special case.

    strided(l)               Child et al. 2019: j <= p and (p - l <= j or (p - j) % l == 0)
    fixed(l, c)              Child et al. 2019: j <= p and (j // l == p // l or j % l >= l - c)
    dilated_window(a, b, d)  Longformer dilation: j = p + t * d for -a <= t <= b
    global_window(w, G)      Longformer: |p - j| <= w / 2 or p in G or j in G (symmetric global)
    bigbird(b, r, seed)      Zaheer et al. 2020 (ITC): window of 3 blocks, blocks 0 and last global,
                             r random blocks per query block (first and last query blocks see all)
    block_sparse(layout, b)  key block J visible from query block I iff layout[I, J] (or [h, I, J])

Example::

    m = masks.strided(4)
    m.dense(10, 10)[0, 0, 9].nonzero().flatten().tolist()   # [1, 5, 6, 7, 8, 9]
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from .mask_base import Mask
from .tiles import EMPTY, FULL, classify, interval_kinds, tile_bounds, tile_reduce

__all__ = ["dilated_window", "strided", "fixed", "global_window", "bigbird", "block_sparse",
           "BIGBIRD_DEFAULT_SEED"]

#: Seed of BigBird's random blocks when none is given, so that an unseeded pattern is reproducible.
BIGBIRD_DEFAULT_SEED = 0
_BIG = 1 << 62


def _check_int(name: str, val, low: int) -> int:
    if isinstance(val, bool) or not isinstance(val, int) or val < low:
        raise ValueError(f"{name}={val!r}: must be an int >= {low}")
    return val


def _fdiv(a: Tensor, b: int) -> Tensor:
    return torch.div(a, b, rounding_mode="floor")


def _positions(L: int, S: int, tile_q: int, tile_k: int):
    """Per tile: first/last query position (nq, 1), first/one-past-last key (1, nk), area (nq, nk)."""
    r0, r1, c0, c1 = tile_bounds(L, S, tile_q, tile_k)
    return r0 + (S - L), r1 - 1 + (S - L), c0, c1, (r1 - r0) * (c1 - c0)


def _progression_any(p0: Tensor, p1: Tensor, c0: Tensor, c1: Tensor, step: int,
                     t_lo: Optional[int], t_hi: Optional[int]) -> Tensor:
    """Does a tile hold a pair with j = p + t * step, t_lo <= t <= t_hi (None = unbounded)?

    For a fixed t the pairs form a diagonal, which meets the tile iff c0 - p1 <= t * step <= c1 - 1 - p0.
    """
    lo = -_fdiv(p1 - c0, step)                                    # ceil((c0 - p1) / step)
    hi = _fdiv(c1 - 1 - p0, step)
    if t_lo is not None:
        lo = torch.clamp(lo, min=t_lo)
    if t_hi is not None:
        hi = torch.clamp(hi, max=t_hi)
    return lo <= hi                                               # (nq, nk)


def _band(p0, p1, c0, c1, left: Optional[int], right: Optional[int]):
    """(empty, full) of the band p - left <= j <= p + right (None = unbounded)."""
    lo = (lambda p: p - left) if left is not None else (lambda p: torch.full_like(p, -_BIG))
    hi = (lambda p: p + right) if right is not None else (lambda p: torch.full_like(p, _BIG))
    kinds = interval_kinds(lo(p0), lo(p1), hi(p0), hi(p1), c0, c1)[0]
    return kinds == EMPTY, kinds == FULL


def _rows_cols(r0: int, r1: int, c0: int, c1: int, L: int, S: int):
    return torch.arange(r0, r1)[:, None] + (S - L), torch.arange(c0, c1)[None, :]   # (lr, 1), (1, lc)


class _DiagonalMask(Mask):
    """A mask that depends on p - j only: tiles with equal shape and diagonal offset are shared."""

    def tile_key(self, r0, r1, c0, c1, L, S):
        return (repr(self), r1 - r0, c1 - c0, r0 + S - L - c0)


class DilatedWindowMask(_DiagonalMask):
    """Keys j = p + t * dilation for -left <= t <= right (Longformer's dilated sliding window)."""

    def __init__(self, left: int, right: int, dilation: int):
        self.left, self.right = _check_int("left", left, 0), _check_int("right", right, 0)
        self.dilation = _check_int("dilation", dilation, 1)

    def tile(self, r0, r1, c0, c1, L, S):
        p, j = _rows_cols(r0, r1, c0, c1, L, S)
        d = j - p
        return ((d >= -self.left * self.dilation) & (d <= self.right * self.dilation)
                & (d % self.dilation == 0))[None, None]          # (1, 1, lr, lc)

    def tile_kinds(self, L, S, tile_q, tile_k):
        p0, p1, c0, c1, area = _positions(L, S, tile_q, tile_k)
        d = self.dilation
        any_ = _progression_any(p0, p1, c0, c1, d, -self.left, self.right)
        # With d > 1 two neighbouring pairs never both qualify: only a single-pair tile can be full.
        full = _band(p0, p1, c0, c1, self.left, self.right)[1] if d == 1 else any_ & (area == 1)
        return classify(~any_, full)[None]                      # (1, nq, nk)

    def __repr__(self):
        return f"dilated_window(left={self.left}, right={self.right}, dilation={self.dilation})"


class StridedMask(_DiagonalMask):
    """Sparse Transformer "strided": the l + 1 previous keys, and every l-th key before them."""

    def __init__(self, stride: int):
        self.stride = _check_int("stride", stride, 1)

    def tile(self, r0, r1, c0, c1, L, S):
        p, j = _rows_cols(r0, r1, c0, c1, L, S)
        return ((j <= p) & ((j >= p - self.stride) | ((p - j) % self.stride == 0)))[None, None]

    def tile_kinds(self, L, S, tile_q, tile_k):
        p0, p1, c0, c1, area = _positions(L, S, tile_q, tile_k)
        l = self.stride
        band_empty, band_full = _band(p0, p1, c0, c1, l, 0)
        any_ = ~band_empty | _progression_any(p0, p1, c0, c1, l, None, 0)
        # Outside the band, two neighbouring pairs cannot both lie on the stride (l >= 2), and the
        # band's edge pair (p - j = l + 1) is not on it either: no tile straddling it is full.
        causal_full = (c1 - 1 <= p0).expand_as(any_)
        full = causal_full if l == 1 else band_full | (any_ & (area == 1))
        return classify(~any_, full)[None]                      # (1, nq, nk)

    def __repr__(self):
        return f"strided({self.stride})"


class FixedMask(Mask):
    """Sparse Transformer "fixed": the own block of l keys, and the last c keys of every block."""

    def __init__(self, stride: int, summary: int):
        self.stride = _check_int("l", stride, 1)
        self.summary = _check_int("c", summary, 0)
        if summary > stride:
            raise ValueError(f"c={summary} summary keys per block cannot exceed the block length l={stride}")

    def tile_key(self, r0, r1, c0, c1, L, S):
        p0 = r0 + S - L                     # invariant under shifting p and j by a multiple of l
        return ("fixed", self.stride, self.summary, r1 - r0, c1 - c0, p0 - c0, p0 % self.stride)

    def tile(self, r0, r1, c0, c1, L, S):
        p, j = _rows_cols(r0, r1, c0, c1, L, S)
        l = self.stride
        return ((j <= p) & ((_fdiv(j, l) == _fdiv(p, l)) | (j % l >= l - self.summary)))[None, None]

    def _summaries_before(self, x: Tensor) -> Tensor:
        """Number of summary keys in [0, x), x >= 0."""
        l, c = self.stride, self.summary
        return _fdiv(x, l) * c + torch.clamp(x % l - (l - c), min=0)

    def tile_kinds(self, L, S, tile_q, tile_k):
        p0, p1, c0, c1, area = _positions(L, S, tile_q, tile_k)
        l, c = self.stride, self.summary
        last = c1 - 1
        # Own block: blocks met by both the rows and the keys; the lowest one holds a pair j <= p
        # unless it is the rows' last block and every key in it lies after the last row.
        b_lo = torch.maximum(_fdiv(p0, l), _fdiv(c0, l))
        b_hi = torch.minimum(_fdiv(p1, l), _fdiv(last, l))
        own_any = (b_lo <= b_hi) & ((b_lo < _fdiv(p1, l)) | (p1 >= c0))
        # Summary keys: the first one at or after c0 must come no later than the last key and row.
        first = torch.where(c0 % l >= l - c, c0, _fdiv(c0, l) * l + (l - c))
        sum_any = (first <= torch.minimum(last, p1)) if c > 0 else torch.zeros_like(own_any)
        # Full: causal everywhere, and every non-summary key shares the (single) block of all rows.
        n_plain = (c1 - c0) - (self._summaries_before(c1) - self._summaries_before(c0))
        b = _fdiv(p0, l)
        lo, hi = torch.maximum(c0, b * l), torch.minimum(c1, (b + 1) * l)
        in_own = torch.where(hi > lo, (hi - lo) - (self._summaries_before(hi) - self._summaries_before(lo)), 0)
        full = (last <= p0) & ((n_plain == 0) | ((b == _fdiv(p1, l)) & (in_own == n_plain)))
        return classify(~(own_any | sum_any), full)[None]                      # (1, nq, nk)

    def __repr__(self):
        return f"fixed(l={self.stride}, c={self.summary})"


class GlobalWindowMask(Mask):
    """Longformer: window |p - j| <= w / 2, plus symmetric global tokens (see all, seen by all)."""

    def __init__(self, w: int, global_ids):
        _check_int("w", w, 0)
        if w % 2:
            raise ValueError(f"w={w} is odd: Longformer's window |i - j| <= w/2 needs an even w "
                             f"(for an asymmetric band use masks.window(left, right))")
        ids = torch.as_tensor(global_ids if global_ids is not None else [], dtype=torch.long).flatten()
        if (ids < 0).any():
            raise ValueError(f"global ids must be key positions >= 0, got {ids.tolist()}")
        self.half, self.ids = w // 2, ids

    def check(self, B, H, L, S):
        if self.ids.numel() and int(self.ids.max()) >= S:
            raise ValueError(f"global id {int(self.ids.max())} is not a key position: there are S={S} keys")

    def _is_global(self, pos: Tensor) -> Tensor:
        """Bool, same shape as pos: is this position a global token (negative positions are not)?"""
        return torch.isin(pos, self.ids)

    def tile(self, r0, r1, c0, c1, L, S):
        p, j = _rows_cols(r0, r1, c0, c1, L, S)
        return (((p - j).abs() <= self.half) | self._is_global(p) | self._is_global(j))[None, None]

    def tile_kinds(self, L, S, tile_q, tile_k):
        p0, p1, c0, c1, _ = _positions(L, S, tile_q, tile_k)
        band_empty, _ = _band(p0, p1, c0, c1, self.half, self.half)
        pos, keys = torch.arange(L) + (S - L), torch.arange(S)
        g_row, g_col = self._is_global(pos), self._is_global(keys)
        any_g = (tile_reduce(g_row, tile_q, False, torch.any)[:, None]
                 | tile_reduce(g_col, tile_k, False, torch.any)[None, :])
        # Full iff every non-global row sees every non-global key through the window.
        nr_lo = tile_reduce(torch.where(g_row, _BIG, pos), tile_q, _BIG, torch.amin)[:, None]
        nr_hi = tile_reduce(torch.where(g_row, -_BIG, pos), tile_q, -_BIG, torch.amax)[:, None]
        nc_lo = tile_reduce(torch.where(g_col, _BIG, keys), tile_k, _BIG, torch.amin)[None, :]
        nc_hi = tile_reduce(torch.where(g_col, -_BIG, keys), tile_k, -_BIG, torch.amax)[None, :]
        no_plain = (nr_lo == _BIG) | (nc_lo == _BIG)
        full = no_plain | ((nc_hi - nr_lo <= self.half) & (nr_hi - nc_lo <= self.half))
        return classify(band_empty & ~any_g, full)[None]                      # (1, nq, nk)

    def __repr__(self):
        return f"global_window(w={2 * self.half}, global_ids={self.ids.tolist()})"


class BlockLayoutMask(Mask):
    """Pairs allowed block by block: row block I (of ``block`` rows) sees key block J iff layout[.., I, J].

    Subclasses give ``layout(L, S)`` -> (Hm, nI, nJ) bool and ``row_offset(L, S)``: 0 when the
    layout indexes query rows, S - L when it indexes query positions (rows with p < 0 see nothing).
    """

    def __init__(self, block: int):
        self.block_size = _check_int("block", block, 1)

    def layout(self, L: int, S: int) -> Tensor:
        raise NotImplementedError

    def row_offset(self, L: int, S: int) -> int:
        return 0

    def tile(self, r0, r1, c0, c1, L, S):
        lay = self.layout(L, S)                                   # (Hm, nI, nJ)
        if 0 in lay.shape[1:]:                                    # L = 0 or S = 0: no block, nothing allowed
            return torch.zeros(1, lay.shape[0], r1 - r0, c1 - c0, dtype=torch.bool)
        b, off = self.block_size, self.row_offset(L, S)
        rows = torch.arange(r0, r1) + off
        cols = torch.arange(c0, c1)
        got = lay[:, _fdiv(rows.clamp(min=0), b)][:, :, _fdiv(cols, b)]   # (Hm, lr, lc)
        return (got & (rows >= 0)[None, :, None])[None]         # (1, Hm, lr, lc)

    def tile_kinds(self, L, S, tile_q, tile_k):
        lay = self.layout(L, S)
        b, off = self.block_size, self.row_offset(L, S)
        r0, r1, c0, c1 = tile_bounds(L, S, tile_q, tile_k)
        p0, p1 = r0 + off, r1 - 1 + off
        # Inclusive ranges of layout rows/cols each tile touches; rows with p < 0 allow nothing.
        I0, I1 = _fdiv(p0.clamp(min=0), b), _fdiv(p1.clamp(min=0), b)
        J0, J1 = _fdiv(c0, b), _fdiv(c1 - 1, b)
        csum = torch.nn.functional.pad(lay.long().cumsum(1).cumsum(2), (1, 0, 1, 0))   # (Hm, nI+1, nJ+1)
        count = csum[:, I1 + 1, J1 + 1] - csum[:, I0, J1 + 1] - csum[:, I1 + 1, J0] + csum[:, I0, J0]
        area = (I1 - I0 + 1) * (J1 - J0 + 1)                      # (nq, nk)
        empty = ((count == 0) | (p1 < 0)).all(0)                  # per-head layouts: empty for every head
        full = ((count == area) & (p0 >= 0)).all(0)
        return classify(empty, full)[None]                      # (1, nq, nk)


class BigBirdMask(BlockLayoutMask):
    """BigBird-ITC over position blocks (see ``bigbird``); the random layout is cached per block count."""

    def __init__(self, block: int, n_random: int, seed: Optional[int]):
        super().__init__(block)
        self.n_random = _check_int("n_random", n_random, 0)
        self.seed = BIGBIRD_DEFAULT_SEED if seed is None else _check_int("seed", seed, 0)
        self._cache: dict[int, Tensor] = {}

    def row_offset(self, L, S):
        return S - L

    def layout(self, L, S):
        nb = -(-S // self.block_size)
        if nb not in self._cache:
            g = torch.Generator().manual_seed(self.seed)
            lay = torch.zeros(nb, nb, dtype=torch.bool)
            if nb == 0:                                           # S = 0: no block to mark (issue #26)
                self._cache[nb] = lay
                return lay[None]
            lay[[0, -1]] = True                                   # global query blocks see everything
            lay[:, [0, -1]] = True                                # and every query block sees them
            for I in range(1, nb - 1):
                lay[I, I - 1:I + 2] = True                        # window of three blocks
                rest = (~lay[I]).nonzero().flatten()
                lay[I, rest[torch.randperm(rest.numel(), generator=g)[:self.n_random]]] = True
            self._cache[nb] = lay
        return self._cache[nb][None]                              # (1, nb, nb)

    def __repr__(self):
        return f"bigbird(block={self.block_size}, n_random={self.n_random}, seed={self.seed})"


class BlockSparseMask(BlockLayoutMask):
    """An explicit block layout (nI, nJ) or per head (H, nI, nJ) over query rows and keys."""

    def __init__(self, layout: Tensor, block: int):
        super().__init__(block)
        if not isinstance(layout, Tensor) or layout.dtype != torch.bool:
            raise TypeError(f"block layout must be a bool tensor (True = compute this block), got "
                            f"{layout.dtype if isinstance(layout, Tensor) else type(layout).__name__}")
        if layout.dim() not in (2, 3):
            raise ValueError(f"block layout has shape {tuple(layout.shape)}; expected (L/block, S/block) "
                             f"or per head (H, L/block, S/block)")
        self.given = layout.cpu()
        self._layout = self.given if layout.dim() == 3 else self.given[None]

    def check(self, B, H, L, S):
        b = self.block_size
        want = (-(-L // b), -(-S // b))
        if tuple(self._layout.shape[1:]) != want:
            raise ValueError(f"block layout of shape {tuple(self.given.shape)} does not fit L={L}, S={S} with "
                             f"block={b}: it needs (ceil(L/block), ceil(S/block)) = {want} blocks")
        if self._layout.shape[0] not in (1, H):
            raise ValueError(f"per-head block layout has {self._layout.shape[0]} heads, q has H={H}")

    def layout(self, L, S):
        return self._layout

    def __repr__(self):
        return f"block_sparse(layout of shape {tuple(self.given.shape)}, block={self.block_size})"


def dilated_window(left: int, right: int, dilation: int = 1) -> Mask:
    """Keys j = p + t * dilation, -left <= t <= right (Longformer's dilated window, arXiv:2004.05150).

    Receptive field (left + right) * dilation; ``dilated_window(w // 2, w // 2, d)`` is Longformer's
    window w with dilation d, ``dilated_window(w, 0, d)`` its one-sided (autoregressive) form.
    """
    return DilatedWindowMask(left, right, dilation)


def strided(l: int) -> Mask:
    """Sparse Transformer strided pattern (arXiv:1904.10509): j <= p and (p - l <= j or l | p - j).

    The local part keeps the paper's l + 1 keys (the reference code keeps l).
    """
    return StridedMask(l)


def fixed(l: int, c: int) -> Mask:
    """Sparse Transformer fixed pattern: j <= p and (same block of l, or one of the last c keys of a block)."""
    return FixedMask(l, c)


def global_window(w: int, global_ids: Sequence[int] | Tensor) -> Mask:
    """Longformer window |p - j| <= w / 2 (w even) plus symmetric global tokens at ``global_ids``."""
    return GlobalWindowMask(w, global_ids)


def bigbird(block: int, n_random: int = 3, seed: Optional[int] = None) -> Mask:
    """BigBird-ITC (arXiv:2007.14062) on blocks of ``block`` positions.

    Query block I sees key blocks I-1, I, I+1, the global blocks 0 and last, and ``n_random``
    blocks drawn without replacement from the others (all of them if fewer remain); query blocks
    0 and last see every block. ``seed=None`` uses ``BIGBIRD_DEFAULT_SEED`` (0), so the pattern
    is the same in every run; the draw depends only on (seed, number of blocks).
    """
    return BigBirdMask(block, n_random, seed)


def block_sparse(layout: Tensor, block: int) -> Mask:
    """An arbitrary block layout: bool (ceil(L/block), ceil(S/block)), or (H, ...) per head.

    Query row i sees key j iff layout[i // block, j // block] (rows index queries, not positions).
    """
    return BlockSparseMask(layout, block)
