"""The sparse backend: exact block-sparse attention that gathers only the key blocks a mask needs.

For every query block (``tile_q`` rows) the schedule (``sparse_layout``) lists the key blocks
that the mask's tile kinds mark non-empty, padded to the longest list. A chunk of query blocks
is then computed with one batched matmul over (batch, kv head, query block):

    q block (G * bq, D)  x  gathered keys (K * bk, D)^T  ->  scores (G * bq, K * bk)

where G = H / Hkv query heads share a kv head (GQA costs nothing extra) and K is the number of
key blocks per query block. All of a row's keys are present at once, so the softmax is a plain
(safe) softmax, not an online one. Element masks are evaluated only on PARTIAL blocks; FULL
blocks get none. Work and memory are O(L * K * bk): a window of w keys costs O(n * w), not O(n^2).

The backward pass is written by hand (FlashAttention-2's equations, Dao 2023): it keeps only
q, k, v, the float32 output and the row log-sum-exp, and recomputes each chunk's probabilities;
dk and dv are scattered back onto the key blocks with ``index_add_``.

Under ``torch.compile`` the kernel reads no tensor value to choose a path, so that it compiles as
one graph (fullgraph=True): the layout gathers every key block (``make_layout(static=True)``) and
masks are applied with ``where``. Same exact result; only the eager kernel skips blocks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from ..tiles import old_tile_names
from ..bias import StructuredBias
from ..dropout import keep_at
from ..mask_plan import planned
from ..masks import Mask
from ..memory import check_fits_in_memory, check_weights_fit
from ..patterns import BlockLayoutMask
from ..registry import register_backend
from ..request import Bias
from .func_rules import bias_param_grads, grads_in_input_dtypes, kernel_grad, none_if_empty, vmap_by_loop
from .reference import accum_dtype
from .sparse_layout import Chunk, Layout, SparseStats, chunk_allowed, make_layout

__all__ = ["sparse_attention", "SparseStats"]

# Score entries per chunk (all heads): big enough that the Python loop is short, small enough
# that the chunk's few passes over its scores stay in the last-level cache.
CHUNK_SCORES = 1 << 21
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def default_blocks(mask: Optional[Mask]) -> tuple[int, int]:
    """(tile_q, tile_k): the pattern's own block for block layouts (BigBird, block_sparse), else 64 x 64."""
    if isinstance(mask, BlockLayoutMask) and 16 <= mask.block_size <= 256:
        return mask.block_size, mask.block_size
    return 64, 64


def _to7(x: Tensor, Hkv: int, G: int) -> Tensor:
    """(Bx, H|1, C, bq, K, bk) -> (Bx, Hkv|1, C, G|1, bq, K, bk): the scores' head grouping."""
    if x.shape[1] == 1:
        return x.unsqueeze(3)
    return x.unflatten(1, (Hkv, G)).permute(0, 1, 3, 2, 4, 5, 6)


def _batch(t: Tensor, bs: slice) -> Tensor:
    return t if t.shape[0] == 1 else t[bs]


def _keep(seed: int, p: float, B: int, H: int, bs: slice, rows: Tensor, cols: Tensor) -> Tensor:
    """Dropout keep mask (Bg, H, C, bq, K, bk) at gathered positions; the same hash as ``dropout.keep_mask``."""
    bh = torch.arange(B * H, dtype=torch.int64, device=rows.device).view(B, H)[bs]
    # rows (C, bq) and cols (C, K, bk) placed on the (Bg, H, C, bq, K, bk) axes
    return keep_at(seed, p, bh.view(*bh.shape, 1, 1, 1, 1), rows[:, :, None, None], cols[:, None])


@dataclass(frozen=True, eq=False)
class SparseSpec:
    """The static part of one sparse call: everything but the tensors that autograd tracks.
    Built once by ``sparse_attention`` and passed through ``_SparseAttention``."""
    bias_s: Optional[StructuredBias]
    layout: Layout
    scale: float
    softcap: Optional[float] = None
    dropout_p: float = 0.0
    seed: Optional[int] = None
    want_weights: bool = False
    # May the kernel read tensor values to pick a faster path (additive masking)? False under
    # torch.compile, where a graph cannot branch on data.
    inspect_data: bool = True


class _Problem:
    """Inputs regrouped into blocks, and the per-chunk pieces the forward and backward share."""

    def __init__(self, spec: SparseSpec, q, k, v, bias_t, params):
        bias_s, layout, scale = spec.bias_s, spec.layout, spec.scale
        B, H, L, D = q.shape
        Hkv, S = k.shape[1], k.shape[2]
        bq, bk = layout.tile_q, layout.tile_k
        nq, nk = -(-L // bq), -(-S // bk)
        G = H // Hkv
        self.dims = (B, H, Hkv, G, L, S, D, v.shape[3])
        pad = torch.nn.functional.pad
        acc = accum_dtype(q.dtype)
        # Scaled once here (O(L * D)) rather than on every score entry; times log2(e) so that the
        # scores are in base 2 and the kernel can use exp2 (as in tiled).
        qs = (q.to(acc) * (scale * LOG2E)).to(q.dtype)
        qs = pad(qs, (0, 0, 0, nq * bq - L))                                    # (B, H, nq * bq, D)
        self.qb = qs.reshape(B, Hkv, G, nq, bq, D).transpose(2, 3)                # (B, Hkv, nq, G, bq, D)
        self.kb = pad(k, (0, 0, 0, nk * bk - S)).reshape(B, Hkv, nk, bk, D)      # (B, Hkv, nk, bk, D)
        self.vb = pad(v, (0, 0, 0, nk * bk - S)).reshape(B, Hkv, nk, bk, -1)     # (B, Hkv, nk, bk, Dv)
        self.bias_t, self.bias_s, self.params = bias_t, bias_s, params
        self.layout, self.scale = layout, scale
        # logits(): NaN/inf in q or k (assumed under torch.compile, where ``where`` is right either way)
        self.nonfinite = not q.is_meta and (not spec.inspect_data or not (
            bool(torch.isfinite(q).all()) and bool(torch.isfinite(k).all())))
        self.dropout_p, self.seed = spec.dropout_p, spec.seed
        self.softcap = spec.softcap
        self.tanh: Optional[Tensor] = None    # the last chunk's tanh(u / softcap), for the backward

    def chunks(self):
        """(batch slice, chunk) pairs, in order."""
        for bs, chunks in self.layout.groups:
            for ch in chunks:
                yield bs, ch

    def positions(self, ch: Chunk):
        """Absolute query rows (C, bq) and key columns (C, K, bk) of a chunk (unclamped)."""
        bq, bk = self.layout.tile_q, self.layout.tile_k
        return ch.qsel[:, None] * bq + torch.arange(bq), ch.idx[:, :, None] * bk + torch.arange(bk)

    def bias_chunk(self, bs, ch: Chunk, params=None) -> Optional[Tensor]:
        """The bias of a chunk, (Bb, Hb, C, bq, K, bk), or None; padded rows and keys are clamped."""
        _, _, _, _, L, S, _, _ = self.dims
        r, c = self.positions(ch)
        r, c = r.clamp(max=L - 1).to(self.qb.device), c.clamp(max=S - 1).to(self.qb.device)
        if self.bias_t is not None:
            b = _batch(self.bias_t, bs)
            ri = r if b.shape[2] != 1 else torch.zeros_like(r)
            cj = c if b.shape[3] != 1 else torch.zeros_like(c)
            return b[:, :, ri[:, :, None, None], cj[:, None]]       # (Bb, Hb, C, bq, K, bk)
        if self.bias_s is not None:
            params = self.params if params is None else params
            tiles = []
            for t in range(r.shape[0]):
                tiles.append(self.bias_s.at(r[t], c[t].flatten(), L, S, params))   # (B|1, H|1, bq, K * bk)
            b = _batch(torch.stack(tiles, 2), bs)                    # (Bb, Hb, C, bq, K * bk)
            return b.unflatten(-1, (c.shape[1], c.shape[2]))
        return None

    def logits(self, bs, ch: Chunk, params=None):
        """Scaled, capped, biased, masked scores (Bg, Hkv, C, G, bq, K, bk) in the accumulation dtype,
        and the query chunk and gathered keys and values (Bg * Hkv * C, G * bq | K * bk, D | Dv).
        With a softcap, ``self.tanh`` keeps this chunk's tanh for the backward's 1 - tanh^2."""
        B, H, Hkv, G, L, S, D, Dv = self.dims
        bq, bk = self.layout.tile_q, self.layout.tile_k
        dev = self.qb.device
        C, K = ch.idx.shape
        ix = ch.idx.to(dev)
        qc = self.qb[bs].index_select(2, ch.qsel.to(dev)).reshape(-1, G * bq, D)   # (Bg*Hkv*C, G*bq, D)
        kg = self.kb[bs].index_select(2, ix.flatten()).reshape(-1, K * bk, D)      # (Bg*Hkv*C, K*bk, D)
        vg = self.vb[bs].index_select(2, ix.flatten()).reshape(-1, K * bk, Dv)
        s = torch.bmm(qc, kg.transpose(1, 2))                       # (Bg*Hkv*C, G*bq, K*bk)
        s = s.to(accum_dtype(s.dtype)).view(-1, Hkv, C, G, bq, K, bk)
        if self.softcap is not None:                                # base 2: u = s * ln 2, capped in natural units
            self.tanh = torch.tanh(s * (LN2 / self.softcap))
            s = self.tanh * (LOG2E * self.softcap)
        b = self.bias_chunk(bs, ch, params)
        if b is not None:
            s = s.add_(_to7(b.to(s.dtype), Hkv, G), alpha=LOG2E)    # base 2, like the scores
        allowed = chunk_allowed(ch, S, bk)
        if allowed is not None and self.nonfinite:
            # NaN + -inf is NaN: with a NaN/inf in q or k, a masked key must not reach its row (as in the reference)
            s = torch.where(_to7(_batch(allowed, bs).to(dev), Hkv, G), s, float("-inf"))
        elif allowed is not None:
            # An additive 0 / -inf block the size of one head: cheaper than a broadcast masked_fill.
            neg = torch.zeros(allowed.shape, dtype=s.dtype).masked_fill_(~allowed, float("-inf"))
            s = s.add_(_to7(_batch(neg, bs).to(dev), Hkv, G))
        return s, qc, kg, vg

    def keep(self, bs, ch: Chunk) -> Tensor:
        """Dropout multiplier keep / (1 - p) in the scores' (Bg, Hkv, C, G, bq, K, bk) layout."""
        B, H, Hkv, G, _, _, _, _ = self.dims
        r, c = self.positions(ch)
        keep = _keep(self.seed, self.dropout_p, B, H, bs, r.to(self.qb.device), c.to(self.qb.device))
        return _to7(keep, Hkv, G).to(accum_dtype(self.qb.dtype)) / (1.0 - self.dropout_p)


def _flat(x: Tensor) -> Tensor:
    """(Bg, Hkv, C, G, bq, K, bk) -> (Bg * Hkv * C, G * bq, K * bk), the matmul layout."""
    n0, n1, n2, n3, n4, n5, n6 = x.shape
    return x.reshape(n0 * n1 * n2, n3 * n4, n5 * n6)


def _forward(pb: _Problem, want_weights: bool):
    B, H, Hkv, G, L, S, D, Dv = pb.dims
    dt, acc = pb.qb.dtype, accum_dtype(pb.qb.dtype)
    nq, bq, bk = pb.qb.shape[2], pb.layout.tile_q, pb.layout.tile_k
    out = pb.qb.new_zeros(B, Hkv, nq, G, bq, Dv, dtype=acc)
    lse = pb.qb.new_full((B, Hkv, nq, G, bq), float("-inf"), dtype=acc)
    w7 = pb.qb.new_zeros(B, Hkv, G, nq, bq, pb.kb.shape[2], bk, dtype=acc) if want_weights else None
    for bs, ch in pb.chunks():
        s, _, _, vg = pb.logits(bs, ch)
        qsel = ch.qsel.to(s.device)
        m = s.amax((-2, -1), keepdim=True)
        m = torch.where(m == float("-inf"), 0.0, m)                 # empty rows: exp2(-inf - 0) = 0, no NaN
        p = s.sub_(m).exp2_()                                       # (Bg, Hkv, C, G, bq, K, bk) unnormalized
        l = p.sum((-2, -1), keepdim=True)
        lse[bs, :, qsel] = (m + torch.log2(l)).flatten(-3)        # base 2
        inv_l = 1.0 / torch.where(l > 0, l, 1.0)                    # empty rows: l = 0 -> output 0
        if w7 is not None:
            qi, si = ch.filled_pos.unbind(1)
            target = w7[bs].permute(3, 5, 0, 1, 2, 4, 6)             # (nq, nk, Bg, Hkv, G, bq, bk) view
            target[ch.qsel[qi], ch.idx[qi, si]] = (p * inv_l).permute(2, 5, 0, 1, 3, 4, 6)[qi, si]
        if pb.dropout_p > 0.0:
            p = p * pb.keep(bs, ch)
        o = torch.bmm(_flat(p).to(dt), vg)                           # (Bg*Hkv*C, G*bq, Dv)
        # Normalized after the matmul: a pass over (G*bq, Dv) instead of (G*bq, K*bk).
        out[bs, :, qsel] = o.view(-1, Hkv, len(qsel), G, bq, Dv).to(acc) * inv_l.flatten(-2)
    weights = None
    if w7 is not None:
        weights = w7.reshape(B, H, nq * bq, -1)[:, :, :L, :S]
    return out, lse, weights


def _backward(pb: _Problem, out: Tensor, lse: Tensor, dout: Tensor, want_bias: bool):
    B, H, Hkv, G, L, S, D, Dv = pb.dims
    dt, acc = pb.qb.dtype, accum_dtype(pb.qb.dtype)
    bq, bk = pb.layout.tile_q, pb.layout.tile_k
    delta = (dout.to(acc) * out).sum(-1)                            # (B, Hkv, nq, G, bq)
    lse = torch.where(lse == float("-inf"), float("inf"), lse)      # empty rows recompute P = 0
    dq = torch.zeros(pb.qb.shape, dtype=acc, device=pb.qb.device)
    dk = torch.zeros(pb.kb.shape, dtype=acc, device=pb.kb.device)
    dv = torch.zeros(pb.vb.shape, dtype=acc, device=pb.vb.device)
    # row-major whatever the bias's layout: _scatter_bias views it by rows (a transposed bias crashed, issue #26)
    dbias = torch.zeros_like(pb.bias_t, dtype=acc, memory_format=torch.contiguous_format) if want_bias else None
    dparams = [torch.zeros_like(p) for p in pb.params]
    for bs, ch in pb.chunks():
        s, qc, kg, vg = pb.logits(bs, ch)
        C, K = ch.idx.shape
        qsel = ch.qsel.to(s.device)
        p = s.sub_(lse[bs][:, :, qsel, :, :, None, None]).exp2_()   # (Bg, Hkv, C, G, bq, K, bk)
        do = dout[bs][:, :, qsel].reshape(-1, G * bq, Dv)
        keep = pb.keep(bs, ch) if pb.dropout_p > 0.0 else None
        pd = p * keep if keep is not None else p
        ix = ch.idx.flatten().to(s.device)
        dvg = torch.bmm(_flat(pd).transpose(1, 2).to(dt), do)      # (Bg*Hkv*C, K*bk, Dv)
        dv[bs].index_add_(2, ix, dvg.view(-1, Hkv, C * K, bk, Dv).to(acc))
        dp = torch.bmm(do, vg.transpose(1, 2)).to(acc).view(p.shape)
        if keep is not None:
            dp = dp * keep
        ds = p.mul_(dp.sub_(delta[bs][:, :, qsel, :, :, None, None]))   # gradient of the logits
        if dbias is not None or dparams:
            g6 = ds.permute(0, 1, 3, 2, 4, 5, 6).flatten(1, 2)      # (Bg, H, C, bq, K, bk)
        if dbias is not None:
            r, c = pb.positions(ch)
            _scatter_bias(dbias, g6, bs, r.clamp(max=L - 1), c.clamp(max=S - 1))
        if dparams:
            grads = bias_param_grads(lambda params: pb.bias_chunk(bs, ch, params), pb.params, g6)
            for acc_g, g_ in zip(dparams, grads):
                if g_ is not None:
                    acc_g += g_
        if pb.tanh is not None:                                     # through the cap: d tanh = 1 - tanh^2
            ds = ds.mul_(pb.tanh.square_().neg_().add_(1.0))
        dsf = _flat(ds).to(dt)
        dq[bs, :, qsel] = torch.bmm(dsf, kg).view(-1, Hkv, C, G, bq, D).to(acc)
        dkg = torch.bmm(dsf.transpose(1, 2), qc)                     # (Bg*Hkv*C, K*bk, D), q scaled by scale*log2(e)
        dk[bs].index_add_(2, ix, dkg.view(-1, Hkv, C * K, bk, D).to(acc))
    # ds is the gradient of the natural logits; dk was taken against q scaled by scale * log2(e).
    return dq.mul_(pb.scale), dk.mul_(LN2), dv, dbias, dparams


def _scatter_bias(dbias: Tensor, g6: Tensor, bs: slice, r: Tensor, c: Tensor) -> None:
    """Add a chunk's logit gradient g6 (Bg, H, C, bq, K, bk) into dbias (Bb, Hb, Lb, Sb)."""
    Bb, Hb, Lb, Sb = dbias.shape
    target = _batch(dbias, bs)
    g = g6.sum(1, keepdim=True) if Hb == 1 else g6
    g = (g.sum(0, keepdim=True) if target.shape[0] == 1 else g).to(dbias.dtype)
    ri = r[:, :, None, None] if Lb != 1 else torch.zeros(1, 1, 1, 1, dtype=torch.long)
    cj = c[:, None] if Sb != 1 else torch.zeros(1, 1, 1, 1, dtype=torch.long)
    flat = (ri * Sb + cj).expand(g.shape[2:]).flatten().to(dbias.device)
    target.view(target.shape[0] * Hb, Lb * Sb).index_add_(1, flat, g.flatten(2).flatten(0, 1))


class _SparseAttention(torch.autograd.Function):
    """(q, k, v, bias_t, spec, *params) -> (out, fp32 block output, lse, weights or empty).

    setup_context + a vmap rule (``func_rules``): works under torch.func (grad, vmap, jacrev)."""

    @staticmethod
    def forward(q, k, v, bias_t, spec: SparseSpec, *params):
        pb = _Problem(spec, q, k, v, bias_t, params)
        out, lse, weights = _forward(pb, spec.want_weights)
        B, H, Hkv, G, L, S, D, Dv = pb.dims
        # (B, Hkv, nq, G, bq, Dv) -> (B, H, L, Dv)
        res = out.transpose(2, 3).reshape(B, H, -1, Dv)[:, :, :L].to(q.dtype)
        return res, out, lse, (weights if weights is not None else q.new_empty(0))

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, bias_t, spec, *params = inputs
        _, out, lse, weights = output
        ctx.save_for_backward(q, k, v, bias_t, out, lse, *params)
        ctx.spec = spec
        ctx.mark_non_differentiable(out, lse, weights)

    @staticmethod
    def backward(ctx, dout, _dacc, _dlse, _dweights):
        q, k, v, bias_t, out, lse, *params = ctx.saved_tensors
        spec = ctx.spec
        want_bias = bias_t is not None and ctx.needs_input_grad[3]

        def run(dout, q, k, v, bias_t, out, lse, *params):
            pb = _Problem(spec, q, k, v, bias_t, tuple(params))
            B, H, Hkv, G, L, S, D, Dv = pb.dims
            nq, bq = out.shape[2], pb.layout.tile_q
            dout = torch.nn.functional.pad(dout, (0, 0, 0, nq * bq - L))
            dout = dout.reshape(B, Hkv, G, nq, bq, Dv).transpose(2, 3).contiguous()      # (B, Hkv, nq, G, bq, Dv)
            dq, dk, dv, dbias, dparams = _backward(pb, out, lse, dout.to(q.dtype), want_bias)
            dq = dq.transpose(2, 3).reshape(B, H, -1, D)[:, :, :L]
            dk, dv = dk.reshape(B, Hkv, -1, D)[:, :, :S], dv.reshape(B, Hkv, -1, Dv)[:, :, :S]
            return grads_in_input_dtypes(dq, dk, dv, dbias, dparams, q, k, v, bias_t, params)

        dq, dk, dv, dbias, *dparams = kernel_grad(run, dout, q, k, v, bias_t, out, lse, *params)
        return (dq, dk, dv, none_if_empty(dbias), None, *dparams)

    @staticmethod
    def vmap(info, in_dims, *args):
        return vmap_by_loop(_SparseAttention.apply, info, in_dims, args)


def _check_memory(q: Tensor, B: int, H: int, L: int, S: int, tile_q: int, tile_k: int, return_weights: bool) -> None:
    """MemoryError before any work (issue #26) when the schedule's (nq, nk) block tables (the tile kinds, the
    needed-block flags and their int64 sort order: 10 bytes per block pair) or the returned weights (padded to
    whole blocks, in the accumulation dtype) cannot fit in the memory the device has available."""
    if torch.compiler.is_compiling():           # the static layout has no such tables; no SymInts in strings
        return
    nq, nk = -(-L // tile_q), -(-S // tile_k)
    check_fits_in_memory(f"the sparse backend plans (nq, nk) = ({nq}, {nk}) blocks of {tile_q} x {tile_k} "
                         f"in tables of 10 bytes per block pair", 10 * nq * nk, q.device,
                         "use larger tile_q / tile_k, or backend='tiled' or 'native' (O(L + S) memory)")
    if return_weights:
        check_weights_fit("the sparse backend", B, H, L, S, accum_dtype(q.dtype), q.device, blocks=(tile_q, tile_k))


@register_backend("sparse", summary="exact block-sparse kernel: gathers only the key blocks the mask needs, "
                                    "batched over query blocks; O(n * w) time and memory")
@old_tile_names
def sparse_attention(q: Tensor, k: Tensor, v: Tensor, *, mask: Optional[Mask] = None,
                     bias: Optional[Bias] = None, scale: Optional[float] = None, dropout_p: float = 0.0,
                     dropout_seed: Optional[int] = None, return_weights: bool = False,
                     tile_q: Optional[int] = None, tile_k: Optional[int] = None,
                     stats: Optional[SparseStats] = None, softcap: Optional[float] = None):
    """Exact attention computed only on the (query block x key block) pairs the mask leaves non-empty.

    Args:
        q: (B, H, L, D); k: (B, Hkv, S, D); v: (B, Hkv, S, Dv).
        mask, bias, scale, dropout_p, dropout_seed, return_weights, softcap: as for the reference backend.
        tile_q, tile_k: block sizes (default 64 x 64, or a block pattern's own block).
        stats: if given, filled with the blocks computed, masked and padded (a count, not a time).
    Returns:
        out (B, H, L, Dv); with return_weights also the (B, H, L, S) weights.
    Example:
        q, k, v = (torch.randn(1, 8, 4096, 64) for _ in range(3))
        out = sparse_attention(q, k, v, mask=masks.bigbird(64, 3), scale=0.125)
    """
    B, H, L, D = q.shape
    S = k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    dq_, dk_ = default_blocks(mask)
    tile_q, tile_k = (dq_ if tile_q is None else tile_q), (dk_ if tile_k is None else tile_k)
    for name, val in (("tile_q", tile_q), ("tile_k", tile_k)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ValueError(f"sparse backend: {name}={val!r} must be a positive int")
    _check_memory(q, B, H, L, S, tile_q, tile_k, return_weights)
    static = torch.compiler.is_compiling()              # a graph may not branch on tensor values
    layout = planned(mask, ("sparse", B, H, L, S, tile_q, tile_k, CHUNK_SCORES),   # once per mask and sizes
                     lambda: make_layout(mask, B, H, L, S, tile_q, tile_k, CHUNK_SCORES, static=static))
    if stats is not None:
        stats.add(layout.stats)
    bias_t = bias if isinstance(bias, Tensor) else None
    bias_s = bias if isinstance(bias, StructuredBias) else None
    params = bias_s.params if bias_s is not None else ()
    spec = SparseSpec(bias_s=bias_s, layout=layout, scale=scale, softcap=softcap, dropout_p=dropout_p,
                      seed=dropout_seed, want_weights=return_weights, inspect_data=not static)
    out, _, _, weights = _SparseAttention.apply(q, k, v, bias_t, spec, *params)
    return (out, weights) if return_weights else out
