"""Host-side preparation for the ``triton`` backend: tile tables, the mask's kernel form, biases.

Nothing here imports Triton. Three things are computed on the host before a launch (the tile
tables of value-described masks -- none, causal, windows -- are then cached by ``triton_attn``):

* **Tile tables.** The mask's ``tile_kinds`` at the kernel's (block_m, block_n) tiles, turned
  into two CSR tables of *runs* of consecutive tiles: per (example, query tile) its non-empty key
  tiles (forward, dq), and per (example, key tile) its query tiles (dk/dv). A run is (first, one
  past the last, flag, slot): flag 2 = FULL and inside the sequence (no masking code runs), 1 =
  PARTIAL or on the ragged edge. EMPTY tiles are never listed. A causal or window mask has two or
  three runs per tile row, so the tables stay small at any length.
* **The mask's kernel form.** Causal and window masks become two integers (left, right);
  padding a length per example; documents the (B|1, S) ids; a dense bool mask is read in place
  through its strides; a block layout (bigbird, block_sparse) through its (H|1, nI, nJ) table.
  Any other mask (strided, fixed, dilated, global, user masks) is ANDed into a *remainder*
  evaluated on the host for each of its PARTIAL tiles (``Mask.block``), deduplicated with
  ``Mask.tile_key`` and passed as (slots, B|1, H|1, block_m, block_n) bitmaps.
* **Biases.** A tensor is read in place through its strides (stride 0 on broadcast dims). A
  structured bias that depends on (head, j - i) only (ALiBi, T5, or ``relative = True``) becomes a
  (B|1, H|1, L + S - 1) table of its values per offset, evaluated by the bias's own ``block`` on
  the host (bit-identical to the reference) and read by the kernel with a row stride of -1.
  O(L + S) memory; autograd carries its gradient back to the bias's parameters.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from typing import Optional

import torch
from torch import Tensor

from ..bias import StructuredBias, relative_table
from ..masks import EMPTY, FULL, PARTIAL, CausalMask, DenseMask, DocumentMask, Mask, PaddingMask, WindowMask, parts
from ..patterns import BlockLayoutMask
from .tiled_plan import TileStats

__all__ = ["TilePlan", "MaskArgs", "make_tile_plan", "compile_mask", "value_key", "is_relative", "bias_form",
           "relative_table", "bias_strides", "diagonal_sums"]

# Bits of the kernels' MFLAGS (triton_attn_kernels: LO, HI, PAD, DOC, DENSE, LAYOUT, BITS).
_LO, _HI, _PAD, _DOC, _DENSE, _LAYOUT, _BITS = 1, 2, 4, 8, 16, 32, 64


@dataclass
class MaskArgs:
    """Everything the kernels need to evaluate the mask on a flagged tile."""
    flags: int                   # MFLAGS bit field
    tensors: tuple               # (PADS, DOCS, DENSEM, LAY, BITMAP), unused ones a 1-element dummy
    params: Tensor               # MP: 15 int64 parameters (see triton_attn_kernels.allowed)
    slots: Optional[Tensor]      # (nq, nk) int32 bitmap slot of each tile, -1 = none


@dataclass
class TilePlan:
    block_m: int
    block_n: int
    nq: int
    nk: int
    row_ptr: Tensor              # (Bm * nq + 1,) int32: runs of query tile (example b, tile qt) at b * nq + qt
    row_runs: Tensor             # (n_runs, 4) int32: first key tile, one past the last, flag, bitmap slot
    col_ptr: Tensor              # (Bm * nk + 1,) int32
    col_runs: Tensor             # (n_runs, 4) int32: first query tile, one past the last, flag, slot
    per_example: bool            # tables differ per example, else shared (index with b = 0)
    kinds: Tensor                # (Bm, nq, nk) int8 tile kinds on the host, for ``stats``
    L: int
    S: int
    B: int

    def stats(self) -> TileStats:
        """The work this plan does, counted like the tiled backend's (computed on demand)."""
        st, kinds = TileStats(), self.kinds
        nonempty = kinds != EMPTY
        st.tiles_total = kinds.numel()
        st.tiles_skipped = int((~nonempty).sum())
        st.tiles_masked = int((kinds == PARTIAL).sum())
        st.tiles_full = st.tiles_total - st.tiles_skipped - st.tiles_masked
        rows = torch.clamp(self.L - torch.arange(self.nq) * self.block_m, max=self.block_m)[:, None]
        cols = torch.clamp(self.S - torch.arange(self.nk) * self.block_n, max=self.block_n)[None, :]
        st.scores = int(((rows * cols) * nonempty).sum()) * (self.B if kinds.shape[0] == 1 else 1)
        return st


def _runs(code: Tensor, slot: Tensor, device) -> tuple[Tensor, Tensor]:
    """CSR of maximal runs of equal non-zero ``code`` along the last dim of (Bm, R, C).

    A tile with a bitmap slot is a run of its own. Returns (ptr (Bm * R + 1,), runs (n, 4)).
    """
    pad = torch.nn.functional.pad
    own = slot >= 0
    prev, nxt = pad(code, (1, 0))[..., :-1], pad(code, (0, 1))[..., 1:]
    prev_own, next_own = pad(own, (1, 0))[..., :-1], pad(own, (0, 1))[..., 1:]
    nz = code != 0
    start = nz & ((prev != code) | own | prev_own)
    stop = nz & ((nxt != code) | own | next_own)
    first, last = start.nonzero(), stop.nonzero()           # row-major: the i-th start pairs with the i-th stop
    b, r, c = first.unbind(1)
    runs = torch.stack([c, last[:, 2] + 1, code[b, r, c].long(), slot[b, r, c].long()], 1).to(torch.int32)
    counts = torch.bincount(b * code.shape[1] + r, minlength=code.shape[0] * code.shape[1])
    ptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(torch.int32)
    return ptr.to(device), runs.contiguous().to(device)


def make_tile_plan(kinds: Tensor, L: int, S: int, B: int, block_m: int, block_n: int,
                   slots: Optional[Tensor], device) -> TilePlan:
    """Row and column run tables from the mask's (Bm, nq, nk) kinds (None mask: all FULL).

    Host work and table size are O(nq * nk) elementwise and O(number of runs): a causal, window,
    padding or documents mask has a few runs per tile row, however long the sequence.
    """
    Bm, nq, nk = kinds.shape
    edge = torch.zeros(nq, nk, dtype=torch.bool)
    if S % block_n:
        edge[:, -1] = True                                   # keys past S must be masked out
    code = kinds.clone()                                     # EMPTY 0 -> 0, PARTIAL 1 -> 1, FULL 2 -> 2 ...
    code[(kinds == FULL) & edge] = PARTIAL                   # ... but FULL on the ragged edge -> 1
    slot = (slots if slots is not None else torch.full((nq, nk), -1, dtype=torch.int32)).expand(Bm, nq, nk)
    row_ptr, row_runs = _runs(code, slot, device)
    col_ptr, col_runs = _runs(code.transpose(1, 2).contiguous(), slot.transpose(1, 2).contiguous(), device)
    return TilePlan(block_m, block_n, nq, nk, row_ptr, row_runs, col_ptr, col_runs, Bm > 1, kinds, L, S, B)


def value_key(mask: Optional[Mask]):
    """A hashable key that determines the mask completely (no mask, causal, windows), or None.

    Only such masks have their tile tables cached across calls: a tensor-valued mask (padding,
    documents, dense) could change in place between calls.
    """
    key = []
    for p in parts(mask):
        if isinstance(p, CausalMask):
            key.append(("causal",))
        elif isinstance(p, WindowMask):
            key.append(("window", p.left, p.right))
        else:
            return None
    return tuple(key)


def _strides(t: Tensor) -> list[int]:
    """Element strides, 0 on size-1 dims (they broadcast)."""
    return [0 if n == 1 else s for n, s in zip(t.shape, t.stride())]


def _bitmaps(rest: Mask, nonempty: Tensor, L: int, S: int, bm: int, bn: int):
    """(slots (nq, nk) int32, bitmaps (n, Bx, Hx, bm, bn) uint8) for the remainder's PARTIAL tiles."""
    rk = rest.tile_kinds(L, S, bm, bn)                       # (Br, nq, nk)
    need = (rk == PARTIAL).any(0) & nonempty.any(0)
    slots = torch.full(need.shape, -1, dtype=torch.int32)
    seen: dict = {}
    blocks: list[Tensor] = []
    for qt, kt in need.nonzero().tolist():
        r0, r1, c0, c1 = qt * bm, min(L, qt * bm + bm), kt * bn, min(S, kt * bn + bn)
        key = rest.tile_key(r0, r1, c0, c1, L, S)
        if key is None or key not in seen:
            blk = rest.tile(r0, r1, c0, c1, L, S).cpu()     # (B|1, H|1, lr|1, lc|1) bool
            blk = blk.expand(-1, -1, r1 - r0, c1 - c0)          # rows/keys may broadcast (left padding)
            blocks.append(torch.nn.functional.pad(blk.to(torch.uint8), (0, bn - (c1 - c0), 0, bm - (r1 - r0))))
            if key is not None:
                seen[key] = len(blocks) - 1
        slots[qt, kt] = seen[key] if key is not None else len(blocks) - 1
    if not blocks:
        return slots, torch.zeros(1, 1, 1, bm, bn, dtype=torch.uint8)
    Bx = max(b.shape[0] for b in blocks)
    Hx = max(b.shape[1] for b in blocks)
    return slots, torch.stack([b.expand(Bx, Hx, bm, bn) for b in blocks]).contiguous()


def compile_mask(mask: Optional[Mask], B: int, H: int, L: int, S: int, bm: int, bn: int,
                 device) -> tuple[Tensor, MaskArgs]:
    """The mask's tile kinds (Bm, nq, nk) at (bm, bn) tiles and its kernel form."""
    nq, nk = -(-L // bm), -(-S // bn)
    dummy = torch.zeros(1, dtype=torch.int64, device=device)
    mp = [0] * 15
    flags, pads, docs, dense, lay, bitmap, slots = 0, dummy, dummy, dummy, dummy, dummy, None
    if mask is None:
        params = torch.tensor(mp, dtype=torch.int64, device=device)
        return torch.full((1, nq, nk), FULL, dtype=torch.int8), MaskArgs(0, (dummy,) * 5, params, None)
    lo = hi = None
    rest: list[Mask] = []
    for p in parts(mask):
        if isinstance(p, CausalMask) or (isinstance(p, WindowMask) and p.right is not None):
            right = 0 if isinstance(p, CausalMask) else p.right
            hi = right if hi is None else min(hi, right)
        if isinstance(p, WindowMask) and p.left is not None:
            lo = p.left if lo is None else min(lo, p.left)
        if isinstance(p, (CausalMask, WindowMask)):
            continue
        if isinstance(p, PaddingMask) and p.side == "right":      # left padding goes to the bitmaps
            n = p.lengths.expand(B).to(device)
            pads = n if not flags & _PAD else torch.minimum(pads, n)
            flags |= _PAD
        elif isinstance(p, DocumentMask) and not flags & _DOC:
            docs, flags = p.ids.to(device).contiguous(), flags | _DOC
            mp[2] = S if docs.shape[0] > 1 else 0
        elif isinstance(p, DenseMask) and not flags & _DENSE:
            dense, flags = p.allowed.to(device).view(torch.uint8), flags | _DENSE
            mp[3:7] = _strides(dense)
        elif isinstance(p, BlockLayoutMask) and not flags & _LAYOUT:
            lay, flags = p.layout(L, S).to(device=device, dtype=torch.uint8).contiguous(), flags | _LAYOUT
            mp[7:12] = [_strides(lay)[0], lay.shape[2], 1, p.block_size, p.row_offset(L, S)]
        else:
            rest.append(p)
    if lo is not None:
        flags, mp[0] = flags | _LO, lo
    if hi is not None:
        flags, mp[1] = flags | _HI, hi
    kinds = mask.tile_kinds(L, S, bm, bn)
    if rest:
        slots, bits = _bitmaps(reduce(lambda a, b: a & b, rest), kinds != EMPTY, L, S, bm, bn)
        bitmap, flags = bits.to(device), flags | _BITS
        _, Bx, Hx, _, _ = bits.shape
        mp[12:15] = [Bx * Hx * bm * bn, Hx * bm * bn if Bx > 1 else 0, bm * bn if Hx > 1 else 0]
    params = torch.tensor(mp, dtype=torch.int64, device=device)
    return kinds, MaskArgs(flags, (pads, docs, dense, lay, bitmap), params, slots)


def is_relative(bias: StructuredBias) -> bool:
    """Does this structured bias depend on (head, j - i) only (so a per-offset table is exact)?"""
    return bias.relative is True


def bias_form(bias, L: int, S: int) -> tuple[int, Optional[Tensor], bool, list[int]]:
    """How the kernels read ``bias``: (kind, tensor, is it a relative table, [offset, strides]).

    kind 0: no bias; 1: a tensor (the bias itself, or a relative table); 2: -m_h |i - j| computed in
    the kernel from fp32 slopes (``StructuredBias.distance_slopes``) when they need no gradient (a
    table carries that).
    """
    if bias is None:
        return 0, None, False, [0] * 5
    if isinstance(bias, Tensor):
        return 1, bias, False, bias_strides(bias, False, L)
    slopes = bias.distance_slopes()
    if (slopes is not None and slopes.dtype == torch.float32 and slopes.dim() == 1
            and not (torch.is_grad_enabled() and slopes.requires_grad)):
        return 2, slopes, False, [0, 0, slopes.stride(0) if slopes.numel() > 1 else 0, 0, 0]
    table = relative_table(bias, L, S)
    return 1, table, True, bias_strides(table, True, L)


def bias_strides(t: Tensor, relative: bool, L: int) -> list[int]:
    """[offset, stride b, h, l, s] to read bias[b, h, i, j] from ``t`` (a relative table: t[b, h, j - i + L - 1])."""
    st = _strides(t)
    if relative:
        return [(L - 1) * st[2], st[0], st[1], -st[2], st[2]]
    return [0] + st


def diagonal_sums(g: Tensor) -> Tensor:
    """(..., L, S) -> (..., L + S - 1): entry d + L - 1 sums g[i, j] over j - i = d (deterministic)."""
    *lead, L, S = g.shape
    f = torch.nn.functional.pad(g.flip(-2), (0, L))          # row r = L-1-i, padded to S + L
    f = f.flatten(-2)[..., : L * (S + L - 1)].unflatten(-1, (L, S + L - 1))   # row r shifted right by r
    return f.sum(-2)
