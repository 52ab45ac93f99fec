"""The tiled backend: exact FlashAttention-style attention in PyTorch, O(L + S) memory.

Queries are cut into row tiles and keys into spans (``tiled_plan``). For each row tile the
kernel walks its key spans keeping, per row, the running max m, the running sum l and an
unnormalized output (online softmax: Milakov & Gimelshein 2018; Dao et al. 2022/2023); the
division by l is deferred to the end (FlashAttention-2). It keeps the per-row log-sum-exp, which
the backward pass uses to recompute each tile's probabilities instead of storing them.

GQA/MQA costs nothing extra: the G = H / Hkv query heads that share a kv head are stacked along
the row axis, so one (G * rows, D) x (D, keys) matmul serves the whole group.

Scores are kept in base 2 (each query tile is scaled by scale * log2(e) as it is read, the bias
added times log2(e)) so that the kernel can use exp2, which is about 3x faster than exp on this
CPU at the same accuracy (1 ulp); the saved log-sum-exp is in log2 units too (lse2 = lse / ln 2).

Empty tiles of a structured mask are never visited, full ones get no masking work. Additive
bias tensors (with gradient) and structured biases (``StructuredBias``, computed per tile, with
gradient for their parameters) are supported, and so is dropout (counter-based, see ``dropout``).

Reading order: ``tiled_attention`` (bottom) builds a ``TiledSpec`` (the static problem: mask,
schedule, scale, ...) once and hands it, with the tensors, to ``_TiledAttention``; ``_forward`` is
the online softmax over one row tile's spans (``_raise_max`` is the textbook step,
``_keep_max`` the lazy-rescaling shortcut), ``_backward`` the FlashAttention-2 backward.

Under ``torch.compile`` (``torch.compiler.is_compiling()``) the kernel takes no branch that
depends on tensor values, so that it compiles as one graph (fullgraph=True): every tile is visited
and masked (``make_plan(static=True)``), the max is updated on every span, masks are applied with
``where``. The result is the same exact attention; only the eager kernel skips work.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor

from ..tiles import old_tile_names
from ..bias import StructuredBias
from ..dropout import keep_mask
from ..masks import Mask
from ..registry import register_backend
from ..request import Bias
from .func_rules import (bias_param_grads, grads_in_input_dtypes, kernel_grad, none_if_empty, reduce_to,
                         vmap_by_loop)
from .reference import accum_dtype
from .tiled_plan import FINE_K, Plan, RowTile, Span, TileStats, make_plan, tile_sizes

__all__ = ["tiled_attention", "TileStats", "TiledSpec"]

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
# A span may reuse the running max while its row sums stay below this (fp16 P must stay finite).
STALE_LIMIT = {torch.float16: 2.0 ** 15}


def _to5(t: Tensor, Hkv: int, G: int) -> Tensor:
    """(B|1, H|1, r, c) -> (B|1, Hkv|1, G|1, r, c): split the head dim the way q is grouped."""
    if t.shape[1] == 1:
        return t.unsqueeze(2)
    return t.unflatten(1, (Hkv, G))


def _batch(t: Tensor, bs: slice) -> Tensor:
    """Slice the batch dim unless it broadcasts (size 1)."""
    return t if t.shape[0] == 1 else t[bs]


def _exp2_minus(s: Tensor, m: Tensor) -> Tensor:
    """exp2(s - m) in m's (accumulation) dtype; a low-precision s is widened by the subtraction itself."""
    p = torch.sub(s, m) if s.dtype != m.dtype else s.sub_(m)
    return p.exp2_()


def _lse_for_recompute(lse2: Tensor) -> Tensor:
    """LSE for recomputing P = exp2(s - lse2): +inf on empty rows, so their P is exactly 0."""
    return torch.where(lse2 == float("-inf"), float("inf"), lse2)


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


class RunningMax(enum.Enum):
    """What the next span of a row tile does with the running max."""
    UPDATE = "raise the max to cover the span and rescale the old state (the textbook step)"
    REUSE_IF_FINITE = "reuse it if every row has a finite max (a mask or bias may leave a row at -inf)"
    REUSE = "reuse it while the span's row sums stay bounded (lazy rescaling)"


@dataclass
class _Problem:
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
        applied as an additive 0 / -inf block: a broadcast add is ~10x faster than a broadcast
        masked_fill here (and than folding the block into the matmul as baddbmm's C operand).
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
            s5.add_(_to5(_batch(b, bs)[:, :, rows, cols], Hkv, G), alpha=LOG2E)
        if bias_s is not None:
            b = bias_s.tile_values(t.r0, t.r1, sp.c0, sp.c1, L, S, params or self.bias_params)
            s5.add_(_to5(_batch(b, bs), Hkv, G).to(s.dtype), alpha=LOG2E)
        for a, z in sp.masked:                       # only the key ranges of PARTIAL tiles
            neg = _to5(_batch(self.neg_block(t, a, z, s.dtype, s.device), bs), Hkv, G)
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


def _raise_max(s: Tensor, m: Tensor, guard: bool, first: bool):
    """The textbook online-softmax step: raise the running max m to cover the span's logits s.

    Returns p = exp2(s - m_new) (n, R, lc), its row sums (n, R, 1), alpha = exp2(m - m_new) (n, R, 1)
    that rescales the state kept so far (None on the first span: nothing kept yet) and m_new.
    ``guard``: a mask or bias may leave a row with only -inf so far; 0 is subtracted there, so exp2
    gives 0, not NaN.
    """
    m_new = torch.maximum(m, s.amax(-1, keepdim=True).to(m.dtype))
    m_use = torch.where(m_new == float("-inf"), 0.0, m_new) if guard else m_new
    p = _exp2_minus(s, m_use)                                               # (n, R, lc), unnormalized
    alpha = None if first else torch.exp2(m - m_use)
    return p, p.sum(-1, keepdim=True), alpha, m_new


def _keep_max(s: Tensor, m: Tensor, limit: float):
    """Lazy rescaling: the span keeps the running max m, so the old state needs no rescaling and
    the max no update (one pass fewer). Safe while m is a real logit of every row (exp2(s - m)
    cannot lose a row's mass to underflow) and the new row sums stay at most ``limit`` (far from
    overflow). Returns (p, row sums, None: nothing to rescale), or None when a sum exceeds the
    limit (s is then consumed: the caller recomputes it and takes ``_raise_max``).
    """
    p = _exp2_minus(s, m)                                                   # (n, R, lc)
    rowsum = p.sum(-1, keepdim=True)
    if not bool(rowsum.max() <= limit):
        return None
    return p, rowsum, None


def _accumulate(l: Optional[Tensor], acc: Optional[Tensor], p: Tensor, rowsum: Tensor, alpha: Optional[Tensor],
                v: Tensor, dt: torch.dtype) -> tuple[Tensor, Tensor]:
    """l <- alpha * l + rowsum, acc <- alpha * acc + p @ v (no alpha: the max was kept; no acc: the
    first span). acc (n, R, Dv) is in the accumulation dtype, the matmul in the input dtype ``dt``."""
    if acc is None:
        return rowsum, torch.bmm(p.to(dt), v).to(rowsum.dtype)
    if alpha is not None:
        l.mul_(alpha)
        acc.mul_(alpha)
    l.add_(rowsum)
    if acc.dtype == dt:
        acc.baddbmm_(p, v)
    else:
        acc.add_(torch.bmm(p.to(dt), v))
    return l, acc


def _forward(pb: _Problem):
    """Online-softmax forward: out (B, Hkv, G, L, Dv) in the accumulation dtype, lse2 (B, Hkv, G, L)."""
    spec = pb.spec
    B, Hkv, G, L, S, D, Dv = pb.dims
    dt = pb.q5.dtype
    acc_dt = accum_dtype(dt)
    out5 = pb.q5.new_empty(B, Hkv, G, L, Dv, dtype=acc_dt)
    lse2 = pb.q5.new_empty(B, Hkv, G, L, dtype=acc_dt)
    guard = spec.mask is not None or pb.bias_t is not None or spec.bias_s is not None
    # after an update, may the next span keep the max? Only rows whose max is finite can.
    after_update = (RunningMax.UPDATE if not spec.inspect_data else
                    RunningMax.REUSE_IF_FINITE if guard else RunningMax.REUSE)
    limit = STALE_LIMIT.get(dt, 2.0 ** 64)
    for bs, tiles in spec.plan.groups:
        for t in tiles:
            qt = pb.qrows(bs, t)                                            # (Bg*Hkv, G*lr, D)
            n, R = qt.shape[0], qt.shape[1]
            m = qt.new_full((n, R, 1), float("-inf"), dtype=acc_dt)         # running max (base 2)
            l, acc = None, None                                             # running sum, unnormalized output
            policy = RunningMax.UPDATE
            for sp in t.spans:
                s = pb.logits(qt, bs, t, sp)                                 # (n, R, lc)
                if policy is RunningMax.REUSE_IF_FINITE:                    # checked only when a span follows
                    policy = RunningMax.REUSE if bool(torch.isfinite(m).all()) else RunningMax.UPDATE
                step = _keep_max(s, m, limit) if policy is RunningMax.REUSE else None
                if step is None:
                    if policy is RunningMax.REUSE:                          # rare: s was consumed, redo it properly
                        s = pb.logits(qt, bs, t, sp)
                    p, rowsum, alpha, m = _raise_max(s, m, guard, first=acc is None)
                    policy = after_update
                else:
                    p, rowsum, alpha = step
                if spec.dropout_p > 0.0:
                    p = p * pb.keep(bs, t, sp, p.shape) / (1.0 - spec.dropout_p)
                l, acc = _accumulate(l, acc, p, rowsum, alpha, pb.cols(pb.v4, bs, sp), dt)
            if acc is None:                                                 # a row tile with nothing to see
                l, acc = qt.new_zeros((n, R, 1), dtype=acc_dt), qt.new_zeros((n, R, Dv), dtype=acc_dt)
            o = acc / l.clamp_min(torch.finfo(acc_dt).tiny)                 # rows with l == 0 -> 0
            out5[bs, :, :, t.r0:t.r1] = o.view(-1, Hkv, G, t.r1 - t.r0, Dv)
            lse2[bs, :, :, t.r0:t.r1] = (m + torch.log2(l)).view(-1, Hkv, G, t.r1 - t.r0)
    return out5, lse2


def _backward(pb: _Problem, out5: Tensor, lse2: Tensor, dout5: Tensor, want_bias: bool):
    """FlashAttention-2 backward: recompute P from the LSE tile by tile.

    Returns gradients for q (as q5), k, v, the bias tensor and the structured bias parameters.
    """
    B, Hkv, G, L, S, D, Dv = pb.dims
    dt = pb.q5.dtype
    acc_dt = accum_dtype(dt)
    # D_i = dO_i . O_i, from the unrounded output: rounding O to bf16 first would cost accuracy.
    delta5 = (dout5.to(acc_dt) * out5).sum(-1)                              # (B, Hkv, G, L)
    lse2 = _lse_for_recompute(lse2)
    dq5 = torch.zeros(B, Hkv, G, L, D, dtype=acc_dt, device=pb.q5.device)
    dk4 = torch.zeros(B, Hkv, S, D, dtype=acc_dt, device=pb.q5.device)
    dv4 = torch.zeros(B, Hkv, S, Dv, dtype=acc_dt, device=pb.q5.device)
    dbias = torch.zeros_like(pb.bias_t, dtype=acc_dt) if want_bias else None
    dparams = [torch.zeros_like(p) for p in pb.bias_params]
    for bs, tiles in pb.spec.plan.groups:
        for t in tiles:
            qt = pb.qrows(bs, t)                                            # (n, R, D)
            dot = pb.rows(dout5, bs, t)                                     # (n, R, Dv)
            lse = pb.rows(lse2.unsqueeze(-1), bs, t)                        # (n, R, 1)
            delta = pb.rows(delta5.unsqueeze(-1), bs, t)                    # (n, R, 1)
            dq = torch.zeros(qt.shape, dtype=acc_dt, device=qt.device)
            lr = t.r1 - t.r0
            for sp in t.spans:
                lc = sp.c1 - sp.c0
                s, th = pb.logits(qt, bs, t, sp, with_tanh=True)
                p = _exp2_minus(s, lse)                                     # (n, R, lc) exact probabilities
                pd = p
                if pb.spec.dropout_p > 0.0:
                    keep = pb.keep(bs, t, sp, p.shape).to(p.dtype) / (1.0 - pb.spec.dropout_p)
                    pd = p * keep
                kt, vt = pb.cols(pb.k4, bs, sp), pb.cols(pb.v4, bs, sp)      # (n, lc, D), (n, lc, Dv)
                dv4[bs, :, sp.c0:sp.c1] += torch.bmm(pd.transpose(1, 2).to(dt), dot).view(-1, Hkv, lc, Dv)
                dp = torch.bmm(dot, vt.transpose(1, 2)).to(acc_dt)          # (n, R, lc)
                if pb.spec.dropout_p > 0.0:
                    dp.mul_(keep)
                ds = p.mul_(dp.sub_(delta))                                 # (n, R, lc) d logits
                if dbias is not None:
                    g = ds.view(-1, Hkv * G, lr, lc)
                    rows = slice(t.r0, t.r1) if dbias.shape[2] != 1 else slice(None)
                    cols = slice(sp.c0, sp.c1) if dbias.shape[3] != 1 else slice(None)
                    target = _batch(dbias, bs)[:, :, rows, cols]
                    target += reduce_to(g, target.shape)
                if dparams:
                    # a per-example bias (B, ...) meets a per-example schedule (bs = one example)
                    grads = bias_param_grads(
                        lambda params: _batch(pb.spec.bias_s.tile_values(t.r0, t.r1, sp.c0, sp.c1, L, S, params), bs),
                        pb.bias_params, ds.view(-1, Hkv * G, lr, lc))
                    for acc_g, g_ in zip(dparams, grads):
                        if g_ is not None:
                            acc_g += g_
                if th is not None:                                          # through the cap: d tanh = 1 - tanh^2
                    ds = ds.mul_(th.square_().neg_().add_(1.0))
                ds_lp = ds.to(dt)
                dq.add_(torch.bmm(ds_lp, kt))
                dk4[bs, :, sp.c0:sp.c1] += torch.bmm(ds_lp.transpose(1, 2), qt).view(-1, Hkv, lc, D)
            dq5[bs, :, :, t.r0:t.r1] = dq.view(-1, Hkv, G, lr, D)
    # ds is the gradient of the natural logits z = s2 * ln 2, with s2 = qscale * q.k; the k gradient
    # was taken against already scaled query tiles.
    return dq5.mul_(LN2 * pb.spec.qscale), dk4.mul_(LN2), dv4, dbias, dparams


class _TiledAttention(torch.autograd.Function):
    """(q5, k, v, bias_t, spec, *bias_params) -> (out5, lse2, out5 in fp32 or empty).

    setup_context + a vmap rule (``func_rules``): works under torch.func (grad, vmap, jacrev)."""

    @staticmethod
    def forward(q5, k, v, bias_t, spec: TiledSpec, *bias_params):
        out5, lse2 = _forward(_Problem(spec, q5, k, v, bias_t, bias_params))   # out5 in fp32 (fp64)
        out = out5.to(q5.dtype)
        # the unrounded output, kept for the backward's D_i (an output, as setup_context sees only those)
        acc = out5 if out is not out5 else out5.new_empty(0)
        return out, lse2, acc

    @staticmethod
    def setup_context(ctx, inputs, output):
        q5, k, v, bias_t, spec, *params = inputs
        out, lse2, acc = output
        ctx.save_for_backward(q5, k, v, bias_t, acc if acc.numel() else out, lse2, *params)
        ctx.spec = spec
        ctx.mark_non_differentiable(lse2, acc)

    @staticmethod
    def backward(ctx, dout5, _dlse, _dacc):
        q5, k, v, bias_t, out5, lse2, *params = ctx.saved_tensors
        spec = ctx.spec
        want_bias = bias_t is not None and ctx.needs_input_grad[3]

        def run(dout5, q5, k, v, bias_t, out5, lse2, *params):
            pb = _Problem(spec, q5, k, v, bias_t, tuple(params))
            grads = _backward(pb, out5, lse2, dout5.contiguous(), want_bias)
            return grads_in_input_dtypes(*grads, q5, k, v, bias_t, params)

        dq5, dk, dv, dbias, *dparams = kernel_grad(run, dout5, q5, k, v, bias_t, out5, lse2, *params)
        return (dq5, dk, dv, none_if_empty(dbias), None, *dparams)

    @staticmethod
    def vmap(info, in_dims, *args):
        return vmap_by_loop(_TiledAttention.apply, info, in_dims, args)


def _weights(pb: _Problem, lse2: Tensor) -> Tensor:
    """Exact attention weights (B, H, L, S) recomputed tile by tile from the saved LSE."""
    B, Hkv, G, L, S, _, _ = pb.dims
    w = pb.q5.new_zeros(B, Hkv, G, L, S, dtype=lse2.dtype)
    lse2 = _lse_for_recompute(lse2)
    for bs, tiles in pb.spec.plan.groups:
        for t in tiles:
            qt = pb.qrows(bs, t)
            lse = pb.rows(lse2.unsqueeze(-1), bs, t)
            for sp in t.spans:
                p = _exp2_minus(pb.logits(qt, bs, t, sp), lse)
                w[bs, :, :, t.r0:t.r1, sp.c0:sp.c1] = p.view(-1, Hkv, G, t.r1 - t.r0, sp.c1 - sp.c0)
    return w.view(B, Hkv * G, L, S)


@register_backend("tiled", summary="exact tiled online-softmax kernel (FlashAttention-2 style), O(n) memory, "
                                   "skips empty mask tiles")
@old_tile_names
def tiled_attention(q: Tensor, k: Tensor, v: Tensor, *, mask: Optional[Mask] = None,
                    bias: Optional[Bias] = None, scale: float, dropout_p: float = 0.0,
                    dropout_seed: Optional[int] = None, return_weights: bool = False,
                    tile_q: Optional[int] = None, tile_k: Optional[int] = None,
                    stats: Optional[TileStats] = None, softcap: Optional[float] = None):
    """Exact attention over (query tile x key span) blocks; never materializes (L, S).

    Args:
        q: (B, H, L, D); k: (B, Hkv, S, D); v: (B, Hkv, S, Dv).
        mask, bias, scale, dropout_p, dropout_seed, return_weights, softcap: as for the reference backend.
        tile_q, tile_k: tile sizes (defaults: ``tiled_plan.tile_sizes``, tuned for CPU); tile_k a multiple of 64.
        stats: if given, filled with the tiles computed, masked and skipped.
    Returns:
        out (B, H, L, Dv); with return_weights also (B, H, L, S) weights, recomputed from the LSE.
    Example:
        q, k, v = (torch.randn(1, 8, 4096, 64) for _ in range(3))
        out = tiled_attention(q, k, v, mask=masks.window(128, 128), scale=0.125)
    """
    B, H, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    dq, dk = tile_sizes(q.dtype, mask)
    tile_q, tile_k = tile_q or dq, tile_k or dk
    static = torch.compiler.is_compiling()              # a graph may not branch on tensor values
    plan = make_plan(mask, B, L, S, tile_q, tile_k, min(FINE_K, tile_k), static=static)
    if stats is not None:
        stats.add(plan.stats)
    bias_t = bias if isinstance(bias, Tensor) else None
    bias_s = bias if isinstance(bias, StructuredBias) else None
    params = bias_s.params if bias_s is not None else ()
    spec = TiledSpec(mask=mask, bias_s=bias_s, plan=plan, qscale=scale * LOG2E, softcap=softcap,
                     dropout_p=dropout_p, seed=dropout_seed, inspect_data=not static)
    q5 = q.reshape(B, Hkv, H // Hkv, L, D)
    out5, lse2, _ = _TiledAttention.apply(q5, k, v, bias_t, spec, *params)
    out = out5.reshape(B, H, L, v.shape[3])
    if return_weights:
        with torch.no_grad():
            return out, _weights(_Problem(spec, q5, k, v, bias_t, params), lse2)
    return out
