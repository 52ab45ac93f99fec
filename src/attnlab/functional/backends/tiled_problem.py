"""The tiled kernel's problem: its static spec and what one (row tile, key span) pair computes.

``TiledSpec`` is everything about a call that autograd does not track (mask, bias object, tile plan,
scale, softcap, dropout); ``TiledProblem`` adds the tensors and answers, for one row tile and key
span, the scaled queries, the keys and values, the masked logits (bias added, mask blocks shared
by ``Mask.tile_key``) and the dropout keep mask. The loops that walk the tiles -- the online softmax
forward and the FlashAttention-2 backward -- are in ``tiled.py``.

Example::

    spec = TiledSpec(mask=masks.causal(), bias_s=None, plan=plan, qscale=0.125 * LOG2E)
    pb = TiledProblem(spec, q5, k4, v4, None, ())
    s = pb.logits(pb.qrows(slice(None), t), slice(None), t, sp)    # (B * Hkv, G * lr, lc), base 2
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor

from ..bias import StructuredBias
from ..dropout import keep_mask
from ..masks import Mask
from .reference import accum_dtype
from .tiled_plan import Plan, RowTile, Span

__all__ = ["TiledSpec", "TiledProblem", "slice_batch", "LOG2E", "LN2"]

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

def _to5(t: Tensor, Hkv: int, G: int) -> Tensor:
    """(B|1, H|1, r, c) -> (B|1, Hkv|1, G|1, r, c): split the head dim the way q is grouped."""
    if t.shape[1] == 1:
        return t.unsqueeze(2)
    return t.unflatten(1, (Hkv, G))


def slice_batch(t: Tensor, bs: slice) -> Tensor:
    """Slice the batch dim unless it broadcasts (size 1)."""
    return t if t.shape[0] == 1 else t[bs]


@dataclass(frozen=True, eq=False)
class TiledSpec:
    """The static part of one tiled call: everything but the tensors that autograd tracks.

    Built once by ``tiled_attention``, passed through ``_TiledAttention`` and shared by the
    forward, backward and weights passes.
    """
    mask: Optional[Mask]
    bias_s: Optional[StructuredBias]
    plan: Plan
    qscale: float                          # scale * log2(e): scores in base 2
    softcap: Optional[float] = None        # scores become softcap * tanh(scores / softcap) before bias and mask
    dropout_p: float = 0.0
    seed: Optional[int] = None
    # May the kernel read tensor values to pick a faster path (lazy rescaling, additive masking)?
    # False under torch.compile, where a graph cannot branch on data.
    inspect_data: bool = True


@dataclass
class TiledProblem:
    """One call's spec and tensors: everything the forward, backward and weight passes share."""
    spec: TiledSpec
    q5: Tensor                   # (B, Hkv, G, L, D) queries, input dtype
    k4: Tensor                   # (B, Hkv, S, D)
    v4: Tensor                   # (B, Hkv, S, Dv)
    bias_t: Optional[Tensor]     # (B|1, H|1, L|1, S|1)
    bias_params: tuple[Tensor, ...]
    tile_masks: dict = field(default_factory=dict, init=False, repr=False)   # by (Mask.tile_key, dtype)
    _nonfinite: Optional[bool] = field(default=None, init=False, repr=False)

    @property
    def nonfinite(self) -> bool:
        """q or k holds a NaN/inf (checked once, only where a tile is partly masked): masks are then applied
        with ``where``, since NaN + -inf is NaN and a masked key must never reach a row (as in the reference).
        Assumed without looking under torch.compile (``where`` is right either way). (Not a cached_property:
        its lock is a context manager that dynamo cannot enter.)"""
        if self._nonfinite is None:
            self._nonfinite = not self.q5.is_meta and (
                not self.spec.inspect_data
                or not (bool(torch.isfinite(self.q5).all()) and bool(torch.isfinite(self.k4).all())))
        return self._nonfinite

    @property
    def dims(self):
        B, Hkv, G, L, D = self.q5.shape
        return B, Hkv, G, L, self.k4.shape[2], D, self.v4.shape[3]

    def rows(self, x5: Tensor, bs: slice, t: RowTile) -> Tensor:
        """(Bg, Hkv, G, L, X) -> (Bg * Hkv, G * lr, X): one row tile of q-shaped data."""
        return x5[bs, :, :, t.r0:t.r1].flatten(0, 1).flatten(1, 2)

    def qrows(self, bs: slice, t: RowTile) -> Tensor:
        """Queries of one row tile times scale * log2(e): (Bg * Hkv, G * lr, D) in the input dtype.

        Scaled per tile (in cache) rather than once up front (a full extra pass over q).
        """
        qt = self.rows(self.q5, bs, t)
        if qt.dtype == accum_dtype(qt.dtype):
            return qt * self.spec.qscale
        return (qt.to(accum_dtype(qt.dtype)) * self.spec.qscale).to(qt.dtype)

    def neg_block(self, t: RowTile, c0: int, c1: int, dtype: torch.dtype, device) -> Tensor:
        """The mask of rows t.r0:t.r1, keys c0:c1 as an additive (Bm|1, Hm|1, lr, c1 - c0) block:
        0 where allowed, -inf where not. Blocks with a shareable key (causal, window) are built once."""
        B, Hkv, G, L, S, _, _ = self.dims
        mask = self.spec.mask
        key = mask.tile_key(t.r0, t.r1, c0, c1, L, S)
        if key is not None and (key, dtype) in self.tile_masks:
            return self.tile_masks[key, dtype]
        allowed = mask.tile(t.r0, t.r1, c0, c1, L, S).to(device)
        neg = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, float("-inf"))
        if key is not None:
            self.tile_masks[key, dtype] = neg
        return neg

    def cols(self, x4: Tensor, bs: slice, sp: Span) -> Tensor:
        """(Bg, Hkv, S, X) -> (Bg * Hkv, lc, X): one key span of k- or v-shaped data."""
        return x4[bs, :, sp.c0:sp.c1].flatten(0, 1)

    def logits(self, qt: Tensor, bs: slice, t: RowTile, sp: Span, params=None, with_tanh: bool = False):
        """log2(e) * (cap(scale * q k^T) + bias), masked: (Bg * Hkv, G * lr, lc).

        With a softcap, cap(u) = softcap * tanh(u / softcap) is taken in natural units in the
        accumulation dtype; ``with_tanh`` also returns that tanh (the backward's 1 - tanh^2), else None.

        In the accumulation dtype when a bias is added; otherwise in the input dtype (a
        low-precision s is widened by the subtraction that follows: one pass fewer). The mask is
        applied as an additive 0 / -inf block: a broadcast add was faster than a broadcast
        masked_fill on the AMD Zen 4 (and than folding the block into the matmul as baddbmm's C operand;
        command not recorded).
        """
        B, Hkv, G, L, S, _, _ = self.dims
        kt = self.cols(self.k4, bs, sp).transpose(1, 2)                     # (Bg*Hkv, D, lc)
        bias_s, softcap = self.spec.bias_s, self.spec.softcap
        plain = self.bias_t is None and bias_s is None
        s = torch.bmm(qt, kt)                                               # (Bg*Hkv, G*lr, lc)
        th = None
        if softcap is not None:                                             # s is in base 2: u = s * ln 2
            th = torch.tanh(s.to(accum_dtype(s.dtype)).mul_(LN2 / softcap))
            s = th * (LOG2E * softcap)
        if plain and not sp.masked:
            return (s, th) if with_tanh else s
        lr, lc = t.r1 - t.r0, sp.c1 - sp.c0
        s = s if plain else s.to(accum_dtype(s.dtype))
        s5 = s.view(-1, Hkv, G, lr, lc)
        if self.bias_t is not None:
            b = self.bias_t
            rows = slice(t.r0, t.r1) if b.shape[2] != 1 else slice(None)
            cols = slice(sp.c0, sp.c1) if b.shape[3] != 1 else slice(None)
            s5.add_(_to5(slice_batch(b, bs)[:, :, rows, cols], Hkv, G), alpha=LOG2E)
        if bias_s is not None:
            b = bias_s.tile_values(t.r0, t.r1, sp.c0, sp.c1, L, S, params or self.bias_params)
            s5.add_(_to5(slice_batch(b, bs), Hkv, G).to(s.dtype), alpha=LOG2E)
        for a, z in sp.masked:                       # only the key ranges of PARTIAL tiles
            neg = _to5(slice_batch(self.neg_block(t, a, z, s.dtype, s.device), bs), Hkv, G)
            blk = s5[..., a - sp.c0:z - sp.c0]
            if self.nonfinite:
                blk.copy_(torch.where(neg == 0, blk, neg))
            else:
                blk.add_(neg)
        return (s, th) if with_tanh else s

    def keep(self, bs: slice, t: RowTile, sp: Span, shape) -> Tensor:
        """The dropout keep mask of this tile, in the (Bg * Hkv, G * lr, lc) layout."""
        B, Hkv, G, _, _, _, _ = self.dims
        keep = keep_mask(self.spec.seed, self.spec.dropout_p, B, Hkv * G, t.r0, t.r1, sp.c0, sp.c1,
                         device=self.q5.device)[bs]                          # (Bg, H, lr, lc)
        return keep.reshape(shape)
