"""Structured attention masks: True = may attend, composable with ``&``.

A structured mask never has to exist as an (L, S) tensor. It answers four questions (the
protocol is ``Mask`` in ``mask_base.py``; tile kinds and spans are defined in ``tiles.py``):

* ``tile(r0, r1, c0, c1, L, S)`` -- which pairs of one (query rows x key columns) tile may attend,
  as a bool tensor broadcastable to ``(B, H, r1 - r0, c1 - c0)``;
* ``tile_kinds(L, S, tile_q, tile_k)`` -- for every tile, whether it is EMPTY (skip it), FULL
  (no masking work) or PARTIAL, as an int8 tensor ``(Bm, nq, nk)`` where ``Bm`` is 1 or B;
* ``dense(L, S)`` -- the whole mask as a bool tensor broadcastable to ``(B, H, L, S)``;
* ``row_spans(L, S)`` -- per query row, the allowed keys as a short list of half-open intervals
  ``(Bm, L, K, 2)`` (or None when the mask has no such form): what the compiled kernel reads.

Query row ``i`` sits at absolute position ``i + S - L`` (bottom-right alignment), which makes
causal and window masks right for KV-cache decoding (L < S) with no special case::

    causal, L=2, S=5          causal, L=5, S=2 (rows 0-2 see nothing -> output 0)
        k0 k1 k2 k3 k4            k0 k1
    q0   1  1  1  1  0        q0   0  0
    q1   1  1  1  1  1        q1   0  0
                              q2   0  0
                              q3   1  0
                              q4   1  1

This module is the public namespace: the sparse patterns (``patterns.py``: strided, fixed,
bigbird, ...) and per-sequence masks (``varlen.py``) are re-exported here.

Example::

    m = masks.causal() & masks.padding(torch.tensor([5, 3]))
    m.dense(5, 5).shape          # torch.Size([2, 1, 5, 5])
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .mask_base import AndMask, Mask, parts
from .mask_plan import kept_for
from .patterns import bigbird, block_sparse, dilated_window, fixed, global_window, strided
from .tiles import (EMPTY, FULL, PARTIAL, classify, dense_tile_kinds, intersect_spans, interval_kinds, interval_spans,
                    tile_bounds, tile_reduce)
from .varlen import aligned, padded, varlen

__all__ = ["Mask", "causal", "padding", "from_key_mask", "window", "documents", "dense", "EMPTY", "PARTIAL", "FULL",
           # the sparse patterns (patterns.py) and per-sequence masks (varlen.py), re-exported
           "strided", "fixed", "dilated_window", "global_window", "bigbird", "block_sparse",
           "varlen", "padded", "aligned",
           # for kernels: the parts of an & combination, and intersecting row spans
           "AndMask", "parts", "intersect_spans"]


class CausalMask(Mask):
    """Query i may see key j iff j <= i + S - L (bottom-right aligned)."""

    def tile_key(self, r0, r1, c0, c1, L, S):
        return ("causal", r1 - r0, c1 - c0, r0 + S - L - c0)

    def tile(self, r0, r1, c0, c1, L, S):
        i = torch.arange(r0, r1)[:, None] + (S - L)
        j = torch.arange(c0, c1)[None, :]
        return (j <= i)[None, None]                              # (1, 1, lr, lc)

    def tile_kinds(self, L, S, tile_q, tile_k):
        r0, r1, c0, c1 = tile_bounds(L, S, tile_q, tile_k)
        off = S - L
        lo = torch.full_like(r0, -(1 << 62))
        return interval_kinds(lo, lo, r0 + off, r1 - 1 + off, c0, c1)

    def row_spans(self, L, S):
        hi = (torch.arange(L) + (S - L + 1)).clamp(0, S)             # (L,) one past the last key
        return interval_spans(torch.zeros_like(hi), hi)

    def __repr__(self):
        return "causal()"


_CAUSAL = CausalMask()


class WindowMask(Mask):
    """Query at position p = i + S - L may see keys p - left <= j <= p + right; None = unbounded."""

    def __init__(self, left: Optional[int], right: Optional[int]):
        for name, val in (("left", left), ("right", right)):
            if val is not None and (not isinstance(val, int) or val < 0):
                raise ValueError(f"window {name}={val!r}: must be a non-negative int or None (unbounded)")
        self.left, self.right = left, right

    def tile_key(self, r0, r1, c0, c1, L, S):
        return ("window", self.left, self.right, r1 - r0, c1 - c0, r0 + S - L - c0)

    def _lo_hi(self, rows: Tensor, off: int):
        big = 1 << 62
        lo = rows + off - self.left if self.left is not None else torch.full_like(rows, -big)
        hi = rows + off + self.right if self.right is not None else torch.full_like(rows, big)
        return lo, hi

    def tile(self, r0, r1, c0, c1, L, S):
        lo, hi = self._lo_hi(torch.arange(r0, r1)[:, None], S - L)
        j = torch.arange(c0, c1)[None, :]
        return ((j >= lo) & (j <= hi))[None, None]

    def tile_kinds(self, L, S, tile_q, tile_k):
        r0, r1, c0, c1 = tile_bounds(L, S, tile_q, tile_k)
        lo_first, hi_first = self._lo_hi(r0, S - L)
        lo_last, hi_last = self._lo_hi(r1 - 1, S - L)
        return interval_kinds(lo_first, lo_last, hi_first, hi_last, c0, c1)

    def row_spans(self, L, S):
        lo, hi = self._lo_hi(torch.arange(L), S - L)                # (L,) inclusive bounds
        return interval_spans(lo.clamp(0, S), (hi + 1).clamp(0, S))

    def __repr__(self):
        return f"window(left={self.left}, right={self.right})"


class PaddingMask(Mask):
    """Example b may attend its lengths[b] real keys: the first ones (side="right", keys j <
    lengths[b]) or the last ones (side="left", keys j >= S - lengths[b], as HF decoders pad
    batches for generation)."""

    def __init__(self, lengths: Tensor, side: str = "right"):
        if not isinstance(lengths, Tensor):
            lengths = torch.as_tensor(lengths)
        if lengths.dim() != 1 or lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
            raise ValueError(f"padding lengths must be a 1-D integer tensor (B,), got shape "
                             f"{tuple(lengths.shape)} dtype {lengths.dtype}")
        if (lengths < 0).any():
            raise ValueError(f"padding lengths must be >= 0, got {lengths.tolist()}")
        if side not in ("right", "left"):
            raise ValueError(f"padding side={side!r}: use 'right' (real keys first) or 'left' (real keys last)")
        self.lengths = lengths.long().cpu()
        self.batch = lengths.numel()
        self.side = side
        # a Python int, so that check() needs no data-dependent read under torch.compile
        self.max_length = int(self.lengths.max()) if self.batch else 0

    def _key_range(self, S: int) -> tuple[Tensor, Tensor]:
        """(B,) first and one-past-last real key of each example."""
        if self.side == "right":
            return torch.zeros_like(self.lengths), self.lengths
        return S - self.lengths, torch.full_like(self.lengths, S)

    def tile(self, r0, r1, c0, c1, L, S):
        lo, hi = self._key_range(S)
        j = torch.arange(c0, c1)[None, :]
        return ((j >= lo[:, None]) & (j < hi[:, None]))[:, None, None, :]   # (B, 1, 1, lc)

    def tile_kinds(self, L, S, tile_q, tile_k):
        r0, _, c0, c1 = tile_bounds(L, S, tile_q, tile_k)
        lo, hi = (x[:, None, None] for x in self._key_range(S))     # (B, 1, 1)
        kinds = classify((c1 <= lo) | (c0 >= hi), (c0 >= lo) & (c1 <= hi))   # (B, 1, nk)
        return kinds.expand(-1, r0.shape[0], -1).contiguous()       # (B, nq, nk)

    def row_spans(self, L, S):
        lo, hi = (x.clamp(0, S)[:, None].expand(-1, L) for x in self._key_range(S))   # (B, L)
        return interval_spans(lo, hi)

    def check(self, B: int, H: int, L: int, S: int) -> None:
        super().check(B, H, L, S)
        if self.max_length > S:
            raise ValueError(f"padding lengths {self.lengths.tolist()} exceed the S={S} keys: a length counts "
                             f"the real keys of an example, so it must be <= {S}")

    def __repr__(self):
        side = "" if self.side == "right" else ", side='left'"
        return f"padding({self.lengths.tolist()}{side})"


class DocumentMask(Mask):
    """Packed sequences: query i may attend key j iff they carry the same document id.

    ``ids`` label the S keys, shape (S,) or (B, S). Query i sits at key position i + S - L
    (bottom-right) and takes that key's id; if L > S the first L - S queries have no position
    and see nothing, as with ``causal``.
    """

    def __init__(self, ids: Tensor):
        if not isinstance(ids, Tensor):
            ids = torch.as_tensor(ids)
        if ids.dim() not in (1, 2) or ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise ValueError(f"document ids must be an integer tensor (S,) or (B, S), got shape "
                             f"{tuple(ids.shape)} dtype {ids.dtype}")
        self.ids = (ids if ids.dim() == 2 else ids[None]).long().cpu()   # (Bm, S)
        self.batch = self.ids.shape[0] if ids.dim() == 2 else None

    def check(self, B, H, L, S):
        super().check(B, H, L, S)
        if self.ids.shape[1] != S:
            raise ValueError(f"document ids have length {self.ids.shape[1]} but there are S={S} keys: "
                             f"give one id per key")

    def tile(self, r0, r1, c0, c1, L, S):
        pos = torch.arange(r0, r1) + (S - L)                       # query positions; < 0: none
        qi = self.ids[:, pos.clamp(min=0)]                         # (Bm, lr)
        kj = self.ids[:, c0:c1]                                    # (Bm, lc)
        return ((qi[:, :, None] == kj[:, None, :]) & (pos >= 0)[None, :, None])[:, None]   # (Bm, 1, lr, lc)

    @staticmethod
    def _tile_range(ids: Tensor, size: int):
        """Per-tile min and max of ids (Bm, n) -> two (Bm, nt) tensors."""
        n = ids.shape[1]
        return (tile_reduce(ids, size, int(ids.max()) if n else 0, torch.amin),
                tile_reduce(ids, size, int(ids.min()) if n else 0, torch.amax))

    def tile_kinds(self, L, S, tile_q, tile_k):
        pos = torch.arange(L) + (S - L)
        qlo, qhi = self._tile_range(self.ids[:, pos.clamp(min=0)], tile_q)     # (Bm, nq)
        klo, khi = self._tile_range(self.ids, tile_k)               # (Bm, nk)
        qlo, qhi, klo, khi = qlo[:, :, None], qhi[:, :, None], klo[:, None, :], khi[:, None, :]
        kinds = classify((qhi < klo) | (khi < qlo), (qlo == qhi) & (klo == khi) & (qlo == klo))  # (Bm, nq, nk)
        # Rows with no position (L > S) see nothing: such tiles are at most PARTIAL, EMPTY if all rows are.
        r0, r1, _, _ = tile_bounds(L, S, tile_q, tile_k)
        first_pos, last_pos = (r0.T + (S - L)), (r1.T - 1 + (S - L))       # (1, nq)
        kinds[(kinds == FULL) & (first_pos < 0)[:, :, None]] = PARTIAL
        kinds[((last_pos < 0)[:, :, None]).expand_as(kinds)] = EMPTY
        return kinds

    def row_spans(self, L, S):
        ids = self.ids                                                   # (Bm, S)
        if S == 0 or torch.compiler.is_compiling():
            # the contiguity check below reads the ids, and a graph cannot branch on data: compiled,
            # the mask goes the dense (bit-packed) way, which is exact for any ids
            return None
        change = torch.ones_like(ids, dtype=torch.bool)
        change[:, 1:] = ids[:, 1:] != ids[:, :-1]                        # (Bm, S) a run starts here
        run = change.long().cumsum(1) - 1                                # (Bm, S) run index of each key
        n_runs = int(run[:, -1].max()) + 1
        # each document must be one contiguous run, else its keys are not one interval
        if any(torch.unique(row).numel() != int(r[-1]) + 1 for row, r in zip(ids, run)):
            return None
        pos = torch.arange(L) + (S - L)                                  # (L,) query positions
        keys = torch.arange(S).expand_as(ids)
        start = torch.full((ids.shape[0], n_runs), S, dtype=torch.long).scatter_reduce(1, run, keys, "amin")
        end = torch.zeros((ids.shape[0], n_runs), dtype=torch.long).scatter_reduce(1, run, keys + 1, "amax")
        r = run[:, pos.clamp(min=0)]                                     # (Bm, L) the query's run
        lo, hi = start.gather(1, r), end.gather(1, r)
        hi = torch.where(pos >= 0, hi, lo)                               # rows with no position see nothing
        return interval_spans(lo, hi)

    def __repr__(self):
        return f"documents(ids of shape {tuple(self.ids.shape)})"


class DenseMask(Mask):
    """An explicit bool tensor broadcastable to (B, H, L, S); True = may attend."""

    def __init__(self, allowed: Tensor):
        if not isinstance(allowed, Tensor) or allowed.dtype != torch.bool:
            raise TypeError(f"a dense mask must be a bool tensor (True = may attend), got "
                            f"{type(allowed).__name__ if not isinstance(allowed, Tensor) else allowed.dtype}; "
                            f"for an additive float mask pass it as bias=")
        if allowed.dim() > 4:
            raise ValueError(f"mask has {allowed.dim()} dims {tuple(allowed.shape)}; it must broadcast to (B, H, L, S)")
        self.given_shape = tuple(allowed.shape)
        self.allowed = allowed.reshape((1,) * (4 - allowed.dim()) + tuple(allowed.shape))
        self.batch = self.allowed.shape[0] if self.allowed.shape[0] != 1 else None

    def check(self, B, H, L, S):
        want = (B, H, L, S)
        if any(m not in (1, w) for m, w in zip(self.allowed.shape, want)):
            raise ValueError(f"mask of shape {self.given_shape} does not broadcast to "
                             f"(B, H, L, S) = {want}: each dim must equal that size or 1")

    def tile(self, r0, r1, c0, c1, L, S):
        m = self.allowed
        rows = slice(r0, r1) if m.shape[2] != 1 else slice(None)
        cols = slice(c0, c1) if m.shape[3] != 1 else slice(None)
        return m[:, :, rows, cols]

    def tile_kinds(self, L, S, tile_q, tile_k):
        return dense_tile_kinds(self.allowed, L, S, tile_q, tile_k)

    def to(self, device):
        allowed = self.allowed.to(device)
        if allowed is self.allowed:           # already there: the same mask, so the plans kept with it are read
            return self
        moved = DenseMask(allowed)
        moved.given_shape = self.given_shape          # keep the caller's shape for messages
        return moved

    def __repr__(self):
        return f"dense(bool tensor of shape {self.given_shape})"


def causal() -> Mask:
    """Bottom-right aligned causal mask: query i sees keys j <= i + S - L.

    One shared object (it has no state): ``attention(causal=True)`` in every layer and step then reads
    the plans made for it once (functional/mask_plan.py)."""
    return _CAUSAL


def window(left: Optional[int], right: Optional[int] = 0) -> Mask:
    """Sliding window: the query at position p sees keys p - left ... p + right (None = unbounded).

    ``window(256, 0)`` is a causal sliding window; ``window(128, 128)`` a symmetric local one.
    """
    return WindowMask(left, right)


def from_key_mask(key_mask: Tensor) -> Optional[Mask]:
    """The structured mask a (B, S) bool key mask (True = a real key) describes: None when every key is
    real, ``padding(lengths)`` when each example's real keys come first, ``padding(lengths, "left")``
    when they come last, else ``dense`` (B, 1, 1, S). Kernels skip a padding mask's empty tiles and read
    it as intervals; a dense one they must read entry by entry. It looks at the values (on a GPU, one
    host sync): a model calls it once per forward, not once per layer (issue #29).

    >>> from_key_mask(torch.tensor([[True, True, False], [True, True, True]]))
    padding([2, 3])
    """
    if not isinstance(key_mask, Tensor) or key_mask.dtype != torch.bool or key_mask.dim() != 2:
        raise ValueError(f"a key mask is a (B, S) bool tensor, True = real key; got "
                         f"{getattr(key_mask, 'dtype', type(key_mask).__name__)} "
                         f"{tuple(getattr(key_mask, 'shape', ()))}")
    S = key_mask.shape[1]
    lengths = key_mask.sum(-1)                                             # (B,)
    if bool((lengths == S).all()):
        return None
    j = torch.arange(S, device=key_mask.device)                            # (S,)
    if torch.equal(key_mask, j < lengths[:, None]):
        return padding(lengths)
    if torch.equal(key_mask, j >= (S - lengths)[:, None]):
        return padding(lengths, side="left")
    return dense(key_mask[:, None, None, :])


def padding(lengths, side: str = "right") -> Mask:
    """Per-example key lengths (B,): example b attends keys j < lengths[b] (side="right"), or its
    last lengths[b] keys, j >= S - lengths[b] (side="left": the padding comes first).

    Causal and window stay aligned to the padded S (bottom-right); for masks aligned to each
    sequence's own length (flash-attention's convention) use ``padded`` or ``varlen``.
    """
    return PaddingMask(lengths, side)


def documents(ids) -> Mask:
    """Packed documents: ids (S,) or (B, S) label each key; attention stays within a document."""
    return DocumentMask(ids)


def dense(allowed: Tensor) -> Mask:
    """Wrap a bool tensor broadcastable to (B, H, L, S) (True = may attend).

    One mask per tensor object (``kept_for``): a bool tensor passed as ``mask=`` to every layer (as PyTorch code
    passes ``attn_mask``) is wrapped by the same ``DenseMask`` on each call, so the kernels' plans kept with it
    (``mask_plan.py``: the packed bits, each row's range, auto's count of empty tiles) are built once, not per
    call: 0.4 ms of a 0.7 ms call at n = 128 on the AMD EPYC Zen 3. The mask holds a ``detach()``ed alias of the
    tensor (the same storage and version counter, so an in-place edit is seen and re-planned).

    >>> t = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    >>> dense(t) is dense(t)
    True
    """
    return kept_for(allowed, ("dense",), DenseMask, reads_values=False)
