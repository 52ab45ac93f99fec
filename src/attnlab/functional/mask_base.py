"""The structured-mask protocol: ``Mask``, its ``&`` (``AndMask``) and ``parts``.

Every mask family (``masks``: causal, window, padding, documents, dense; ``patterns``: sparse
patterns; ``varlen``: per-sequence masks) subclasses ``Mask`` from here, and ``masks`` re-exports
them all, so the import graph is one-way: tiles <- mask_base <- {masks' classes, patterns,
varlen} <- masks. A new mask defines ``tile`` and ``tile_kinds`` (and, if it can, ``row_spans``
and ``tile_key``); ``docs/design.md`` lists the kernels that read each method.

Example::

    class EvenKeys(Mask):                       # query rows may see even key positions only
        def tile(self, r0, r1, c0, c1, L, S):
            return (torch.arange(c0, c1) % 2 == 0)[None, None, None]          # (1, 1, 1, lc)
        def tile_kinds(self, L, S, tile_q, tile_k):    # all PARTIAL: always correct, never skips
            return torch.full((1, -(-L // tile_q), -(-S // tile_k)), tiles.PARTIAL, dtype=torch.int8)
"""
from __future__ import annotations

import warnings
from typing import Optional

import torch
from torch import Tensor

from .tiles import intersect_spans

__all__ = ["Mask", "AndMask", "parts"]

# The names a subclass written before the "tile" rename may define, and their new names.
_OLD_NAMES = {"block": "tile", "block_key": "tile_key"}
# The attribute in which a mask keeps the plans the kernels derived from it (mask_plan.py).
PLANS_ATTR = "_attnlab_plans"


class Mask:
    """Base class of structured masks (True = may attend). Subclasses define ``tile`` and ``tile_kinds``.

    ``block`` and ``block_key`` are the old names of ``tile`` and ``tile_key``: a subclass that
    still defines them works (with a DeprecationWarning when the class is created), and calling
    them forwards to the new methods (with a DeprecationWarning).
    """

    #: batch size the mask is tied to (padding lengths, document ids, dense masks), or None.
    batch: Optional[int] = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for old, new in _OLD_NAMES.items():
            if old in cls.__dict__ and new not in cls.__dict__:
                warnings.warn(f"{cls.__name__} defines Mask.{old}, the old name of Mask.{new}: rename it "
                              f"(same arguments); it is used as {new} for now", DeprecationWarning, stacklevel=2)
                setattr(cls, new, cls.__dict__[old])

    def tile(self, r0: int, r1: int, c0: int, c1: int, L: int, S: int) -> Tensor:
        """Which pairs of the tile (query rows r0:r1 x keys c0:c1) of an (L, S) problem may attend:
        bool, broadcastable to (B, H, r1 - r0, c1 - c0)."""
        raise NotImplementedError(f"{type(self).__name__} must define tile(r0, r1, c0, c1, L, S)")

    def tile_kinds(self, L: int, S: int, tile_q: int, tile_k: int) -> Tensor:
        """(Bm, nq, nk) int8 kinds (``tiles.EMPTY/PARTIAL/FULL``) of the tiles of ``tile_q`` rows
        by ``tile_k`` keys (Bm 1 or B). A tile called EMPTY or FULL must be so; PARTIAL is always safe."""
        raise NotImplementedError(f"{type(self).__name__} must define tile_kinds(L, S, tile_q, tile_k)")

    def dense(self, L: int, S: int) -> Tensor:
        """(B|1, H|1, L, S) bool, True = may attend."""
        return self.tile(0, L, 0, S, L, S)

    def row_spans(self, L: int, S: int) -> Optional[Tensor]:
        """Per query row, the keys it may attend as K half-open intervals, or None.

        Returns an int64 tensor ``(Bm, L, K, 2)`` (Bm 1 or B) of ``[lo, hi)`` pairs with
        ``0 <= lo <= hi <= S`` (an empty interval has lo == hi); key j is allowed for row i iff it
        lies in one of row i's intervals. None means the mask has no short interval form (dense
        masks, scattered patterns): a kernel then reads ``dense``. K stays small (1 for causal,
        window, padding and contiguous documents), so a kernel can skip by rows, not only by tiles.
        """
        return None

    def tile_key(self, r0: int, r1: int, c0: int, c1: int, L: int, S: int):
        """A hashable key such that tiles with equal keys have equal ``tile`` results, or None (no sharing).

        Masks that depend only on j - i (causal, window) return the tile's shape and diagonal
        offset, so the tiled kernel builds each distinct tile once per call.
        """
        return None

    def block(self, r0: int, r1: int, c0: int, c1: int, L: int, S: int) -> Tensor:
        """Deprecated: the old name of ``tile``."""
        warnings.warn("Mask.block is deprecated: call Mask.tile (same arguments)", DeprecationWarning, stacklevel=2)
        return _new_method(self, "block")(r0, r1, c0, c1, L, S)

    def block_key(self, r0: int, r1: int, c0: int, c1: int, L: int, S: int):
        """Deprecated: the old name of ``tile_key``."""
        warnings.warn("Mask.block_key is deprecated: call Mask.tile_key (same arguments)", DeprecationWarning,
                      stacklevel=2)
        return _new_method(self, "block_key")(r0, r1, c0, c1, L, S)

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

    def __getstate__(self):
        """A pickled or copied mask leaves its plans behind (they hold weak references; mask_plan.py)."""
        state = dict(self.__dict__)
        state.pop(PLANS_ATTR, None)
        return state


def _new_method(mask: Mask, old: str):
    """``mask``'s method under the new name of ``old``, from the first class in its MRO that defines it
    as more than an alias of its old-name method: so ``super().block(...)`` inside an old-style
    subclass of a built-in mask reaches the built-in ``tile``, not the subclass's ``block`` again."""
    new = _OLD_NAMES[old]
    for cls in type(mask).__mro__:
        fn = cls.__dict__.get(new)
        if fn is not None and fn is not cls.__dict__.get(old):
            return fn.__get__(mask)
    raise AssertionError(f"Mask defines {new}")            # unreachable: Mask itself defines it


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

    def tile_key(self, r0, r1, c0, c1, L, S):
        a, b = self.a.tile_key(r0, r1, c0, c1, L, S), self.b.tile_key(r0, r1, c0, c1, L, S)
        return None if a is None or b is None else (a, b)

    def tile(self, r0, r1, c0, c1, L, S):
        a = self.a.tile(r0, r1, c0, c1, L, S)
        b = self.b.tile(r0, r1, c0, c1, L, S)
        return a.to(b.device) & b

    def tile_kinds(self, L, S, tile_q, tile_k):
        return torch.minimum(self.a.tile_kinds(L, S, tile_q, tile_k), self.b.tile_kinds(L, S, tile_q, tile_k))

    def row_spans(self, L, S):
        a, b = self.a.row_spans(L, S), self.b.row_spans(L, S)
        return None if a is None or b is None else intersect_spans(a, b)

    def to(self, device):
        a, b = self.a.to(device), self.b.to(device)
        return self if a is self.a and b is self.b else AndMask(a, b)

    def __repr__(self):
        return f"({self.a!r} & {self.b!r})"


def parts(mask: Optional[Mask]) -> list[Mask]:
    """The masks ANDed together in ``mask`` (flattened); [] for None."""
    if mask is None:
        return []
    if isinstance(mask, AndMask):
        return parts(mask.a) + parts(mask.b)
    return [mask]
