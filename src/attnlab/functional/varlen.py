"""Variable-length sequences: masks (and biases) aligned to each sequence's own length.

``masks.causal()`` and ``masks.window`` align the last query row with the last key of the padded
(L, S) problem. With padded or packed batches that is wrong for every sequence shorter than the
batch: flash-attention's convention (``cu_seqlens``, ``key_padding_mask`` in its ``attention_ref``)
aligns causal, window and ALiBi to each *sequence*. A ``SequenceMask`` holds, per batch row, a
list of sequences: query rows ``[qs, qe)`` that attend key columns ``[ks, ke)``. Inside one
sequence, local query row ``r - qs`` sits at local key position

    p = (r - qs) + (ke - ks) - (qe - qs)         (bottom-right within the sequence)

and sees local keys ``p - left <= j - ks <= p + right`` (causal: right = 0; no window: unbounded).
Rows outside every sequence see nothing (their output is 0). Every row's allowed keys form one
interval, so ``tile_kinds`` and ``row_spans`` are exact and cheap.

Two constructors::

    m = masks.varlen(torch.tensor([0, 3, 8]), causal=True)     # packed: 2 sequences in one row
    m = masks.padded(torch.tensor([5, 2]), side="left", causal=True)   # padded batch of 2

``aligned(bias, mask)`` evaluates a ``StructuredBias`` (ALiBi, T5, ...) at the per-sequence
positions, so ALiBi's distance is measured inside each sequence as well.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .bias import StructuredBias
from .mask_base import Mask
from .tiles import classify, interval_spans, tile_bounds

__all__ = ["SequenceMask", "varlen", "padded", "aligned", "AlignedBias"]

_BIG = 1 << 62


def _int_tensor(x, name: str, dims: tuple[int, ...]) -> Tensor:
    if not isinstance(x, Tensor):
        x = torch.as_tensor(x)
    if x.dim() not in dims or x.dtype.is_floating_point or x.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor with {' or '.join(map(str, dims))} dims, "
                         f"got shape {tuple(x.shape)} dtype {x.dtype}")
    return x.long().cpu()


def _window(causal: bool, window) -> tuple[Optional[int], Optional[int]]:
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if window is not None and (not isinstance(window, (tuple, list)) or len(window) != 2):
        raise ValueError(f"window={window!r}: pass window=(left, right), each a non-negative int or None")
    left, right = (None, None) if window is None else tuple(window)
    for name, val in (("left", left), ("right", right)):
        if val is not None and (isinstance(val, bool) or not isinstance(val, int) or val < 0):
            raise ValueError(f"window {name}={val!r}: must be a non-negative int or None (unbounded); "
                             f"pass window=(left, right)")
    if causal:                                   # flash-attention: causal means window (left, 0)
        right = 0 if right is None else min(right, 0)
    return left, right


class SequenceMask(Mask):
    """Per batch row, N sequences of query rows [qs, qe) x key columns [ks, ke), each with its own
    bottom-right alignment of causal / window. Tensors (Bm, N); Bm = 1 applies to every example."""

    def __init__(self, qs: Tensor, qe: Tensor, ks: Tensor, ke: Tensor, left: Optional[int],
                 right: Optional[int], batched: bool, what: str):
        self.qs, self.qe, self.ks, self.ke = qs, qe, ks, ke           # (Bm, N) each
        self.left, self.right = left, right
        self.batch = qs.shape[0] if batched else None
        self.what = what
        # Python ints, so that check() needs no data-dependent read under torch.compile
        self.q_end, self.k_end = (int(x.max()) if x.numel() else 0 for x in (qe, ke))

    def check(self, B, H, L, S):
        super().check(B, H, L, S)
        for name, end, n, dim in (("queries", self.q_end, L, "L"), ("keys", self.k_end, S, "S")):
            if end > n:
                raise ValueError(f"{self!r}: the sequences need {end} {name} but there are only {n}: "
                                 f"lengths / cu_seqlens must fit in {dim}={n}")

    def ranges(self, L: int, S: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """qs, qe, ks, ke (Bm, N): the sequences' query rows [qs, qe) and key columns [ks, ke)."""
        return self.qs, self.qe, self.ks, self.ke

    def row_bounds(self, L: int, S: int) -> tuple[Tensor, Tensor]:
        """(Bm, L) inclusive key bounds lo, hi of every query row (lo > hi: the row sees nothing)."""
        r = torch.arange(L)[None, :, None]                                        # (1, L, 1)
        qs, qe, ks, ke = (x[:, None, :] for x in self.ranges(L, S))               # (Bm, 1, N)
        inside = (r >= qs) & (r < qe)                                             # (Bm, L, N)
        p = r - qs + (ke - ks) - (qe - qs)                                        # local key position
        lo = ks + (p - self.left if self.left is not None else torch.full_like(p, -_BIG)).clamp(min=0)
        hi = ke - 1 - (ke - ks - 1 - (p + self.right)).clamp(min=0) if self.right is not None else ke - 1
        lo = torch.where(inside, lo, _BIG).amin(-1)                               # (Bm, L)
        hi = torch.where(inside, hi, -_BIG).amax(-1)
        if self.qs.shape[1] == 0:
            lo, hi = torch.full((self.qs.shape[0], L), _BIG), torch.full((self.qs.shape[0], L), -_BIG)
        return lo, hi

    def positions(self, L: int, S: int) -> tuple[Tensor, Tensor]:
        """(Bm, L) local query positions and (Bm, S) local key positions (0 outside every sequence)."""
        r, j = torch.arange(L)[None, :, None], torch.arange(S)[None, :, None]
        qs, qe, ks, ke = (x[:, None, :] for x in self.ranges(L, S))               # (Bm, 1, N)
        qin, kin = (r >= qs) & (r < qe), (j >= ks) & (j < ke)
        qpos = torch.where(qin, r - qs + (ke - ks) - (qe - qs), 0).sum(-1)        # sequences do not overlap
        kpos = torch.where(kin, j - ks, 0).sum(-1)
        return qpos, kpos

    def tile(self, r0, r1, c0, c1, L, S):
        lo, hi = self.row_bounds(L, S)
        j = torch.arange(c0, c1)[None, None, :]
        return ((j >= lo[:, r0:r1, None]) & (j <= hi[:, r0:r1, None]))[:, None]   # (Bm, 1, lr, lc)

    def tile_kinds(self, L, S, tile_q, tile_k):
        lo, hi = self.row_bounds(L, S)                                           # (Bm, L)
        _, _, c0, c1 = tile_bounds(L, S, tile_q, tile_k)                         # (1, nk)
        nq = -(-L // tile_q)
        pad = nq * tile_q - L
        # padded rows count as "sees every key" for FULL and "sees none" for EMPTY: never a verdict change
        lo_f = torch.nn.functional.pad(lo, (0, pad), value=-_BIG).view(-1, nq, tile_q, 1)
        hi_f = torch.nn.functional.pad(hi, (0, pad), value=_BIG).view(-1, nq, tile_q, 1)
        lo_e = torch.nn.functional.pad(lo, (0, pad), value=_BIG).view(-1, nq, tile_q, 1)
        hi_e = torch.nn.functional.pad(hi, (0, pad), value=-_BIG).view(-1, nq, tile_q, 1)
        c0, c1 = c0.view(1, 1, 1, -1), c1.view(1, 1, 1, -1)                    # (1, 1, 1, nk)
        full = ((lo_f <= c0) & (hi_f >= c1 - 1)).all(2)                          # (Bm, nq, nk)
        any_ = ((lo_e <= c1 - 1) & (hi_e >= c0) & (lo_e <= hi_e)).any(2)
        return classify(~any_, full)

    def row_spans(self, L, S):
        lo, hi = self.row_bounds(L, S)
        lo = lo.clamp(0, S)
        return interval_spans(lo, (hi + 1).clamp(0, S).maximum(lo))

    def __repr__(self):
        causal_only = self.left is None and self.right == 0 and "causal" in self.what
        plain = (self.left is None and self.right is None) or causal_only
        win = "" if plain else f", window=({self.left}, {self.right})"
        return f"{self.what}{win})"


def _check_cu(cu: Tensor, name: str) -> Tensor:
    if cu.shape[-1] < 1:
        raise ValueError(f"{name} must hold at least one offset (0), got shape {tuple(cu.shape)}")
    if (cu[..., 0] != 0).any() or (cu[..., 1:] < cu[..., :-1]).any():
        raise ValueError(f"{name}={cu.tolist()} must start at 0 and never decrease (cumulative sequence "
                         f"lengths, as flash-attention's cu_seqlens)")
    return cu


def varlen(cu_seqlens_q, cu_seqlens_k=None, *, causal: bool = False, window=None) -> Mask:
    """Packed sequences as flash-attention's ``cu_seqlens``: sequence n holds query rows
    ``cu_seqlens_q[n]:cu_seqlens_q[n+1]`` and keys ``cu_seqlens_k[n]:cu_seqlens_k[n+1]``; queries
    attend only their own sequence, with causal / window aligned to its end.

    Args:
        cu_seqlens_q: (N + 1,) cumulative query lengths starting at 0, or (B, N + 1) per example.
        cu_seqlens_k: the same for keys; default ``cu_seqlens_q`` (self-attention).
        causal: local key position <= local query position (bottom-right within each sequence).
        window: (left, right) local sliding window, None = unbounded on that side.
    Example:
        m = varlen(torch.tensor([0, 3, 8]), causal=True)      # two documents packed in 8 tokens
        m.dense(8, 8).shape                                  # torch.Size([1, 1, 8, 8])
    """
    cq = _check_cu(_int_tensor(cu_seqlens_q, "cu_seqlens_q", (1, 2)), "cu_seqlens_q")
    ck = cq if cu_seqlens_k is None else _check_cu(_int_tensor(cu_seqlens_k, "cu_seqlens_k", (1, 2)),
                                                   "cu_seqlens_k")
    if cq.shape[-1] != ck.shape[-1]:
        raise ValueError(f"cu_seqlens_q has {cq.shape[-1] - 1} sequences but cu_seqlens_k has "
                         f"{ck.shape[-1] - 1}: give one offset per sequence boundary in both")
    batched = cq.dim() == 2 or ck.dim() == 2
    cq, ck = (x if x.dim() == 2 else x[None] for x in (cq, ck))
    if cq.shape[0] != ck.shape[0] and 1 not in (cq.shape[0], ck.shape[0]):
        raise ValueError(f"cu_seqlens_q is for {cq.shape[0]} examples but cu_seqlens_k for {ck.shape[0]}")
    cq, ck = torch.broadcast_tensors(cq, ck)
    left, right = _window(causal, window)
    return SequenceMask(cq[:, :-1], cq[:, 1:], ck[:, :-1], ck[:, 1:], left, right, batched,
                        f"varlen({cq.shape[-1] - 1} sequences{', causal' if causal else ''}")


def padded(lengths_q, lengths_k=None, *, side: str = "right", causal: bool = False, window=None) -> Mask:
    """A padded batch, one sequence per example: example b has ``lengths_q[b]`` real query rows and
    ``lengths_k[b]`` real keys, first (side="right") or last (side="left"); causal / window are
    aligned to each example's own lengths (flash-attention's ``key_padding_mask`` convention).

    Padded query rows see nothing (output 0). Example:
        m = padded(torch.tensor([4, 2]), side="left", causal=True)     # HF-style left padding
        m.dense(4, 4)[1, 0]            # rows 0-1 padding; rows 2-3 causal over keys 2-3
    """
    lq = _int_tensor(lengths_q, "lengths_q", (1,))
    lk = lq if lengths_k is None else _int_tensor(lengths_k, "lengths_k", (1,))
    if lq.shape != lk.shape:
        raise ValueError(f"lengths_q has {lq.numel()} examples but lengths_k has {lk.numel()}")
    if (lq < 0).any() or (lk < 0).any():
        raise ValueError(f"lengths must be >= 0, got q {lq.tolist()}, k {lk.tolist()}")
    if side not in ("right", "left"):
        raise ValueError(f"padding side={side!r}: use 'right' (real tokens first) or 'left' (real tokens last)")
    left, right = _window(causal, window)
    return _PaddedMask(lq, lk, side, left, right,
                       f"padded(q {lq.tolist()}, k {lk.tolist()}, side={side!r}{', causal' if causal else ''}")


class _PaddedMask(SequenceMask):
    """``padded``: one sequence per example; with side="left" its offsets depend on the padded L, S."""

    def __init__(self, lq: Tensor, lk: Tensor, side: str, left, right, what: str):
        lq, lk = lq[:, None], lk[:, None]                                        # (B, 1)
        z = torch.zeros_like(lq)
        super().__init__(z, lq, z, lk, left, right, True, what)
        self.side = side

    def ranges(self, L, S):
        if self.side == "right":
            return self.qs, self.qe, self.ks, self.ke
        return L - self.qe, torch.full_like(self.qe, L), S - self.ke, torch.full_like(self.ke, S)


class AlignedBias(StructuredBias):
    """A structured bias evaluated at per-sequence positions: ``inner.tile`` receives the local
    query positions (Bm, 1, lr, 1) and local key positions (Bm, 1, 1, lc) of ``mask``."""

    def __init__(self, inner: StructuredBias, mask: SequenceMask):
        if not isinstance(inner, StructuredBias) or not isinstance(mask, SequenceMask):
            raise TypeError(f"aligned(bias, mask) takes a StructuredBias and a masks.varlen / masks.padded "
                            f"mask, got {type(inner).__name__} and {type(mask).__name__}")
        self.inner, self.mask, self.params = inner, mask, tuple(inner.params)
        self._positions: dict = {}                   # (L, S) -> local positions, computed once per shape

    def tile(self, i, j, *params):                 # only ever called through ``at`` below
        return self.inner.tile(i, j, *params)

    def at(self, rows: Tensor, cols: Tensor, L: int, S: int, params) -> Tensor:
        """The bias at query rows (lr,) and key columns (lc,) (indices, not positions): (Bm|1, H|1, lr, lc)."""
        if (L, S) not in self._positions:
            self._positions = {(L, S): self.mask.positions(L, S)}
        qpos, kpos = self._positions[L, S]                                       # (Bm, L), (Bm, S)
        device = params[0].device if params else None
        i = qpos[:, rows.cpu()].to(device)[:, None, :, None]                     # (Bm, 1, lr, 1)
        j = kpos[:, cols.cpu()].to(device)[:, None, None, :]                     # (Bm, 1, 1, lc)
        b = self.inner.tile(i, j, *params)
        return b.reshape((1,) * (4 - b.dim()) + tuple(b.shape))

    def __repr__(self):
        return f"aligned({self.inner!r}, {self.mask!r})"


def aligned(bias: StructuredBias, mask: Mask) -> StructuredBias:
    """``bias`` (e.g. ALiBi) with distances measured inside each sequence of ``mask``.

    Example:
        m = masks.varlen(cu, causal=True)
        out = attention(q, k, v, mask=m, bias=aligned(ALiBi(8).bias(), m))
    """
    return AlignedBias(bias, mask)
