"""Structured attention masks: True = may attend, composable with ``&``.

A structured mask never has to exist as an (L, S) tensor. It answers three questions:

* ``block(r0, r1, c0, c1, L, S)`` -- which pairs of one (query rows x key columns) tile may attend,
  as a bool tensor broadcastable to ``(B, H, r1 - r0, c1 - c0)``;
* ``tile_kinds(L, S, block_q, block_k)`` -- for every tile, whether it is EMPTY (skip it), FULL
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

Example::

    m = masks.causal() & masks.padding(torch.tensor([5, 3]))
    m.dense(5, 5).shape          # torch.Size([2, 1, 5, 5])
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["Mask", "causal", "padding", "window", "documents", "dense", "varlen", "padded", "aligned",
           "EMPTY", "PARTIAL", "FULL"]

# Tile kinds. Ordered so that the kind of (a & b) is min(kind(a), kind(b)).
EMPTY, PARTIAL, FULL = 0, 1, 2


def _bounds(n: int, size: int) -> Tensor:
    """(nt,) start of each tile of ``size`` over ``n`` positions; the last tile may be short."""
    return torch.arange(0, n, size)


def _interval_kinds(lo_first: Tensor, lo_last: Tensor, hi_first: Tensor, hi_last: Tensor,
                    c0: Tensor, c1: Tensor) -> Tensor:
    """Kinds of tiles whose rows allow keys in [lo(i), hi(i)] (inclusive, monotone in i).

    lo_first/lo_last, hi_first/hi_last: (nq, 1) bounds at the first and last row of each row tile;
    c0, c1: (1, nk) first and one-past-last key of each column tile.
    """
    full = (c0 >= lo_last) & (c1 - 1 <= hi_first)
    empty = (c1 - 1 < lo_first) | (c0 > hi_last)
    kinds = torch.full(full.shape, PARTIAL, dtype=torch.int8)
    kinds[full] = FULL
    kinds[empty] = EMPTY
    return kinds.unsqueeze(0)                                    # (1, nq, nk)


def _tile_starts(L: int, S: int, block_q: int, block_k: int):
    r0 = _bounds(L, block_q)[:, None]                            # (nq, 1)
    r1 = torch.clamp(r0 + block_q, max=L)
    c0 = _bounds(S, block_k)[None, :]                            # (1, nk)
    c1 = torch.clamp(c0 + block_k, max=S)
    return r0, r1, c0, c1


class Mask:
    """Base class of structured masks. Subclasses define ``block`` and ``tile_kinds``."""

    #: batch size the mask is tied to (padding lengths, document ids, dense masks), or None.
    batch: Optional[int] = None

    def block(self, r0: int, r1: int, c0: int, c1: int, L: int, S: int) -> Tensor:
        raise NotImplementedError

    def tile_kinds(self, L: int, S: int, block_q: int, block_k: int) -> Tensor:
        raise NotImplementedError

    def dense(self, L: int, S: int) -> Tensor:
        """(B|1, H|1, L, S) bool, True = may attend."""
        return self.block(0, L, 0, S, L, S)

    def row_spans(self, L: int, S: int) -> Optional[Tensor]:
        """Per query row, the keys it may attend as K half-open intervals, or None.

        Returns an int64 tensor ``(Bm, L, K, 2)`` (Bm 1 or B) of ``[lo, hi)`` pairs with
        ``0 <= lo <= hi <= S`` (an empty interval has lo == hi); key j is allowed for row i iff it
        lies in one of row i's intervals. None means the mask has no short interval form (dense
        masks, scattered patterns): a kernel then reads ``dense``. K stays small (1 for causal,
        window, padding and contiguous documents), so a kernel can skip by rows, not only by tiles.
        """
        return None

    def block_key(self, r0: int, r1: int, c0: int, c1: int, L: int, S: int):
        """A hashable key such that tiles with equal keys have equal blocks, or None (no sharing).

        Masks that depend only on j - i (causal, window) return the tile's shape and diagonal
        offset, so the tiled kernel builds each distinct block once per call.
        """
        return None

    def check(self, B: int, H: int, L: int, S: int) -> None:
        """Raise ValueError if this mask cannot apply to a (B, H, L, S) problem."""
        if self.batch is not None and self.batch not in (1, B):
            raise ValueError(f"{self!r} is for batch size {self.batch}, but q has batch size {B}: "
                             f"build the mask from per-example data of length {B}")

    def __and__(self, other: "Mask") -> "Mask":
        if isinstance(other, Tensor):
            raise TypeError(f"{self!r} & a {other.dtype} tensor {tuple(other.shape)}: wrap the tensor as a mask "
                            "first, e.g. masks.causal() & masks.dense(bool_tensor)")
        if not isinstance(other, Mask):
            return NotImplemented
        return AndMask(self, other)

    def __rand__(self, other) -> "Mask":          # tensor & mask: torch declined, so it lands here
        return self.__and__(other)

    def to(self, device) -> "Mask":
        return self


class CausalMask(Mask):
    """Query i may see key j iff j <= i + S - L (bottom-right aligned)."""

    def block_key(self, r0, r1, c0, c1, L, S):
        return ("causal", r1 - r0, c1 - c0, r0 + S - L - c0)

    def block(self, r0, r1, c0, c1, L, S):
        i = torch.arange(r0, r1)[:, None] + (S - L)
        j = torch.arange(c0, c1)[None, :]
        return (j <= i)[None, None]                              # (1, 1, lr, lc)

    def tile_kinds(self, L, S, block_q, block_k):
        r0, r1, c0, c1 = _tile_starts(L, S, block_q, block_k)
        off = S - L
        lo = torch.full_like(r0, -(1 << 62))
        return _interval_kinds(lo, lo, r0 + off, r1 - 1 + off, c0, c1)

    def row_spans(self, L, S):
        hi = (torch.arange(L) + (S - L + 1)).clamp(0, S)             # (L,) one past the last key
        return _spans(torch.zeros_like(hi), hi)

    def __repr__(self):
        return "causal()"


class WindowMask(Mask):
    """Query at position p = i + S - L may see keys p - left <= j <= p + right; None = unbounded."""

    def __init__(self, left: Optional[int], right: Optional[int]):
        for name, val in (("left", left), ("right", right)):
            if val is not None and (not isinstance(val, int) or val < 0):
                raise ValueError(f"window {name}={val!r}: must be a non-negative int or None (unbounded)")
        self.left, self.right = left, right

    def block_key(self, r0, r1, c0, c1, L, S):
        return ("window", self.left, self.right, r1 - r0, c1 - c0, r0 + S - L - c0)

    def _lo_hi(self, rows: Tensor, off: int):
        big = 1 << 62
        lo = rows + off - self.left if self.left is not None else torch.full_like(rows, -big)
        hi = rows + off + self.right if self.right is not None else torch.full_like(rows, big)
        return lo, hi

    def block(self, r0, r1, c0, c1, L, S):
        lo, hi = self._lo_hi(torch.arange(r0, r1)[:, None], S - L)
        j = torch.arange(c0, c1)[None, :]
        return ((j >= lo) & (j <= hi))[None, None]

    def tile_kinds(self, L, S, block_q, block_k):
        r0, r1, c0, c1 = _tile_starts(L, S, block_q, block_k)
        lo_first, hi_first = self._lo_hi(r0, S - L)
        lo_last, hi_last = self._lo_hi(r1 - 1, S - L)
        return _interval_kinds(lo_first, lo_last, hi_first, hi_last, c0, c1)

    def row_spans(self, L, S):
        lo, hi = self._lo_hi(torch.arange(L), S - L)                # (L,) inclusive bounds
        return _spans(lo.clamp(0, S), (hi + 1).clamp(0, S))

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

    def block(self, r0, r1, c0, c1, L, S):
        lo, hi = self._key_range(S)
        j = torch.arange(c0, c1)[None, :]
        return ((j >= lo[:, None]) & (j < hi[:, None]))[:, None, None, :]   # (B, 1, 1, lc)

    def tile_kinds(self, L, S, block_q, block_k):
        r0, r1, c0, c1 = _tile_starts(L, S, block_q, block_k)
        lo, hi = (x[:, None, None] for x in self._key_range(S))     # (B, 1, 1)
        kinds = torch.full((self.batch, r0.shape[0], c0.shape[1]), PARTIAL, dtype=torch.int8)
        kinds[((c0 >= lo) & (c1 <= hi)).expand_as(kinds)] = FULL
        kinds[((c1 <= lo) | (c0 >= hi)).expand_as(kinds)] = EMPTY
        return kinds

    def row_spans(self, L, S):
        lo, hi = (x.clamp(0, S)[:, None].expand(-1, L) for x in self._key_range(S))   # (B, L)
        return _spans(lo, hi)

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

    def block(self, r0, r1, c0, c1, L, S):
        pos = torch.arange(r0, r1) + (S - L)                       # query positions; < 0: none
        qi = self.ids[:, pos.clamp(min=0)]                         # (Bm, lr)
        kj = self.ids[:, c0:c1]                                    # (Bm, lc)
        return ((qi[:, :, None] == kj[:, None, :]) & (pos >= 0)[None, :, None])[:, None]   # (Bm, 1, lr, lc)

    @staticmethod
    def _tile_range(ids: Tensor, size: int):
        """Per-tile min and max of ids (Bm, n) -> two (Bm, nt) tensors."""
        n = ids.shape[1]
        pad = (-n) % size
        lo = torch.nn.functional.pad(ids, (0, pad), value=int(ids.max()) if n else 0)
        hi = torch.nn.functional.pad(ids, (0, pad), value=int(ids.min()) if n else 0)
        return lo.view(ids.shape[0], -1, size).amin(-1), hi.view(ids.shape[0], -1, size).amax(-1)

    def tile_kinds(self, L, S, block_q, block_k):
        pos = torch.arange(L) + (S - L)
        qlo, qhi = self._tile_range(self.ids[:, pos.clamp(min=0)], block_q)    # (Bm, nq)
        klo, khi = self._tile_range(self.ids, block_k)              # (Bm, nk)
        qlo, qhi, klo, khi = qlo[:, :, None], qhi[:, :, None], klo[:, None, :], khi[:, None, :]
        kinds = torch.full(torch.broadcast_shapes(qlo.shape, klo.shape), PARTIAL, dtype=torch.int8)
        kinds[(qlo == qhi) & (klo == khi) & (qlo == klo)] = FULL
        kinds[(qhi < klo) | (khi < qlo)] = EMPTY
        # Rows with no position (L > S) see nothing: such tiles are at most PARTIAL, EMPTY if all rows are.
        r0, r1, _, _ = _tile_starts(L, S, block_q, block_k)
        first_pos, last_pos = (r0.T + (S - L)), (r1.T - 1 + (S - L))       # (1, nq)
        kinds[(kinds == FULL) & (first_pos < 0)[:, :, None]] = PARTIAL
        kinds[((last_pos < 0)[:, :, None]).expand_as(kinds)] = EMPTY
        return kinds

    def row_spans(self, L, S):
        ids = self.ids                                                   # (Bm, S)
        if S == 0:
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
        return _spans(lo, hi)

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

    def block(self, r0, r1, c0, c1, L, S):
        m = self.allowed
        rows = slice(r0, r1) if m.shape[2] != 1 else slice(None)
        cols = slice(c0, c1) if m.shape[3] != 1 else slice(None)
        return m[:, :, rows, cols]

    def tile_kinds(self, L, S, block_q, block_k):
        m = self.allowed.expand(-1, -1, L, S).cpu()
        pad_l, pad_s = (-L) % block_q, (-S) % block_k
        # pad with True for "all" and False for "any" so the padding never changes a verdict
        def tiles(x):
            return x.unflatten(2, (-1, block_q)).unflatten(4, (-1, block_k))  # (Bm, Hm, nq, bq, nk, bk)
        f = torch.nn.functional.pad
        all_ = tiles(f(m, (0, pad_s, 0, pad_l), value=True)).all(5).all(3).all(1)
        any_ = tiles(f(m, (0, pad_s, 0, pad_l), value=False)).any(5).any(3).any(1)
        kinds = torch.full(all_.shape, PARTIAL, dtype=torch.int8)
        kinds[all_] = FULL
        kinds[~any_] = EMPTY
        return kinds                                              # (Bm, nq, nk)

    def to(self, device):
        moved = DenseMask(self.allowed.to(device))
        moved.given_shape = self.given_shape          # keep the caller's shape for messages
        return moved

    def __repr__(self):
        return f"dense(bool tensor of shape {self.given_shape})"


class AndMask(Mask):
    """Pairs allowed by both masks."""

    def __init__(self, a: Mask, b: Mask):
        self.a, self.b = a, b
        batches = {x for x in (a.batch, b.batch) if x is not None}
        if len(batches) > 1:
            raise ValueError(f"cannot combine masks for batch sizes {sorted(batches)}")
        self.batch = batches.pop() if batches else None

    def check(self, B, H, L, S):
        self.a.check(B, H, L, S)
        self.b.check(B, H, L, S)

    def block_key(self, r0, r1, c0, c1, L, S):
        a, b = self.a.block_key(r0, r1, c0, c1, L, S), self.b.block_key(r0, r1, c0, c1, L, S)
        return None if a is None or b is None else (a, b)

    def block(self, r0, r1, c0, c1, L, S):
        a = self.a.block(r0, r1, c0, c1, L, S)
        b = self.b.block(r0, r1, c0, c1, L, S)
        return a.to(b.device) & b

    def tile_kinds(self, L, S, block_q, block_k):
        return torch.minimum(self.a.tile_kinds(L, S, block_q, block_k), self.b.tile_kinds(L, S, block_q, block_k))

    def row_spans(self, L, S):
        a, b = self.a.row_spans(L, S), self.b.row_spans(L, S)
        return None if a is None or b is None else intersect_spans(a, b)

    def to(self, device):
        return AndMask(self.a.to(device), self.b.to(device))

    def __repr__(self):
        return f"({self.a!r} & {self.b!r})"


def _spans(lo: Tensor, hi: Tensor) -> Tensor:
    """(Bm, L) or (L,) bounds -> (Bm, L, 1, 2) spans with hi >= lo."""
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


def parts(mask: Optional[Mask]) -> list[Mask]:
    """The masks ANDed together in ``mask`` (flattened)."""
    if mask is None:
        return []
    if isinstance(mask, AndMask):
        return parts(mask.a) + parts(mask.b)
    return [mask]


def causal() -> Mask:
    """Bottom-right aligned causal mask: query i sees keys j <= i + S - L."""
    return CausalMask()


def window(left: Optional[int], right: Optional[int] = 0) -> Mask:
    """Sliding window: the query at position p sees keys p - left ... p + right (None = unbounded).

    ``window(256, 0)`` is a causal sliding window; ``window(128, 128)`` a symmetric local one.
    """
    return WindowMask(left, right)


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
    """Wrap a bool tensor broadcastable to (B, H, L, S) (True = may attend)."""
    return DenseMask(allowed)

from .patterns import bigbird, block_sparse, dilated_window, fixed, global_window, strided  # noqa: E402,F401  (sparse patterns)
from .varlen import aligned, padded, varlen  # noqa: E402,F401  (per-sequence alignment)
