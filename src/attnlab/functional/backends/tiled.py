"""The tiled backend: exact FlashAttention-style attention in PyTorch, O(L + S) memory.

Queries are cut into row tiles and keys into spans (``tiled_plan``). For each row tile the
kernel walks its key spans keeping, per row, the running max m, the running sum l and an
unnormalized output (online softmax: Milakov & Gimelshein 2018; Dao et al. 2022/2023); the
division by l is deferred to the end (FlashAttention-2). It keeps the per-row log-sum-exp, which
the backward pass uses to recompute each tile's probabilities instead of storing them.

GQA/MQA costs nothing extra: the G = H / Hkv query heads that share a kv head are stacked along
the row axis, so one (G * rows, D) x (D, keys) matmul serves the whole group.

Scores are kept in base 2 (each query tile is scaled by scale * log2(e) as it is read, the bias
added times log2(e)) so that the kernel can use exp2, at the same accuracy (1 ulp; whether it is
faster than exp depends on the CPU: docs/benchmarks.md has the two timeit lines); the saved
log-sum-exp is in log2 units too (lse2 = lse / ln 2).

Empty tiles of a structured mask are never visited, full ones get no masking work. Additive
bias tensors (with gradient) and structured biases (``StructuredBias``, computed per tile, with
gradient for their parameters) are supported, and so is dropout (counter-based, see ``dropout``).

Reading order: ``tiled_attention`` (bottom) builds a ``TiledSpec`` (the static problem: mask,
schedule, scale, ...; in ``tiled_problem.py``, with ``TiledProblem``, which computes one tile's
masked logits) once and hands it, with the tensors, to ``_TiledAttention``; ``_forward`` is
the online softmax over one row tile's spans (``_raise_max`` is the textbook step,
``_keep_max`` the lazy-rescaling shortcut), ``_backward`` the FlashAttention-2 backward.

Under ``torch.compile`` (``torch.compiler.is_compiling()``) the kernel takes no branch that
depends on tensor values, so that it compiles as one graph (fullgraph=True): every tile is visited
and masked (``make_plan(static=True)``), the max is updated on every span, masks are applied with
``where``. The result is the same exact attention; only the eager kernel skips work.
"""
from __future__ import annotations

import enum
from typing import Optional

import torch
from torch import Tensor

from ..tiles import old_tile_names
from ..bias import StructuredBias
from ..mask_plan import planned
from ..masks import Mask
from ..memory import check_fits_in_memory, check_weights_fit
from ..registry import register_backend
from ..request import Bias
from .func_rules import (bias_param_grads, grads_in_input_dtypes, kernel_grad, none_if_empty, reduce_to,
                         vmap_by_loop)
from .reference import accum_dtype
from .tiled_plan import FINE_K, TileStats, make_plan, tile_sizes
from .tiled_problem import LN2, LOG2E, TiledProblem, TiledSpec, slice_batch

__all__ = ["tiled_attention", "TileStats", "TiledSpec"]

# A span may reuse the running max while its row sums stay below this (fp16 P must stay finite).
STALE_LIMIT = {torch.float16: 2.0 ** 15}


def _exp2_minus(s: Tensor, m: Tensor) -> Tensor:
    """exp2(s - m) in m's (accumulation) dtype; a low-precision s is widened by the subtraction itself."""
    p = torch.sub(s, m) if s.dtype != m.dtype else s.sub_(m)
    return p.exp2_()


def _lse_for_recompute(lse2: Tensor) -> Tensor:
    """LSE for recomputing P = exp2(s - lse2): +inf on empty rows, so their P is exactly 0."""
    return torch.where(lse2 == float("-inf"), float("inf"), lse2)


class RunningMax(enum.Enum):
    """What the next span of a row tile does with the running max."""
    UPDATE = "raise the max to cover the span and rescale the old state (the textbook step)"
    REUSE_IF_FINITE = "reuse it if every row has a finite max (a mask or bias may leave a row at -inf)"
    REUSE = "reuse it while the span's row sums stay bounded (lazy rescaling)"


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


def _forward(pb: TiledProblem):
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


def _backward(pb: TiledProblem, out5: Tensor, lse2: Tensor, dout5: Tensor, want_bias: bool):
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
                    target = slice_batch(dbias, bs)[:, :, rows, cols]
                    target += reduce_to(g, target.shape)
                if dparams:
                    # a per-example bias (B, ...) meets a per-example schedule (bs = one example)
                    grads = bias_param_grads(
                        lambda params: slice_batch(
                            pb.spec.bias_s.tile_values(t.r0, t.r1, sp.c0, sp.c1, L, S, params), bs),
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
        out5, lse2 = _forward(TiledProblem(spec, q5, k, v, bias_t, bias_params))   # out5 in fp32 (fp64)
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
            pb = TiledProblem(spec, q5, k, v, bias_t, tuple(params))
            grads = _backward(pb, out5, lse2, dout5.contiguous(), want_bias)
            return grads_in_input_dtypes(*grads, q5, k, v, bias_t, params)

        dq5, dk, dv, dbias, *dparams = kernel_grad(run, dout5, q5, k, v, bias_t, out5, lse2, *params)
        return (dq5, dk, dv, none_if_empty(dbias), None, *dparams)

    @staticmethod
    def vmap(info, in_dims, *args):
        return vmap_by_loop(_TiledAttention.apply, info, in_dims, args)


def _weights(pb: TiledProblem, lse2: Tensor) -> Tensor:
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
    if mask is not None and not static:                 # the plan classifies every (row tile, FINE_K keys) cell
        nq, nk = -(-L // tile_q), -(-S // min(FINE_K, tile_k))
        check_fits_in_memory(f"the tiled backend classifies the mask's (nq, nk) = ({nq}, {nk}) tiles of "
                             f"{tile_q} x {min(FINE_K, tile_k)} (1 byte each)", nq * nk, q.device,
                             "use backend='native' (the mask as row intervals, O(L) memory) or a larger tile_q")
    if return_weights:                                  # checked before the forward runs (issue #26)
        check_weights_fit("the tiled backend", B, H, L, S, accum_dtype(q.dtype), q.device)
    fine_k = min(FINE_K, tile_k)                        # planned once per mask and sizes (never in a graph)
    plan = planned(mask, ("tiled", B, L, S, tile_q, tile_k, fine_k),
                   lambda: make_plan(mask, B, L, S, tile_q, tile_k, fine_k, static=static))
    if stats is not None:
        stats.add(plan.stats)
    bias_t = bias if isinstance(bias, Tensor) else None
    bias_s = bias if isinstance(bias, StructuredBias) else None
    params = bias_s.params if bias_s is not None else ()
    spec = TiledSpec(mask=mask, bias_s=bias_s, plan=plan, qscale=scale * LOG2E, softcap=softcap,
                     dropout_p=dropout_p, seed=dropout_seed, inspect_data=not static)
    # float16 on the CPU runs as float32 (inputs converted once per call, output rounded once), as in the
    # compiled kernel (csrc/bindings.cpp, `computed`): torch's CPU fp16 matmul returns fp16 logits, whose
    # rounding cost the bias gradient 3.4x the same-dtype reference's error on a W = 3 window
    # (tests/test_functional.py), and off AVX512-FP16 it is a scalar fallback (1.3 GFLOP/s on an AMD EPYC
    # Zen 3 with AVX2, against sgemm's 190). On a GPU float16 stays float16: its tensor cores are the point.
    half = q.dtype == torch.float16 and q.device.type == "cpu"
    if half:
        q, k, v = q.float(), k.float(), v.float()
        bias_t = bias_t.float() if bias_t is not None and bias_t.dtype == torch.float16 else bias_t
    q5 = q.reshape(B, Hkv, H // Hkv, L, D)
    out5, lse2, _ = _TiledAttention.apply(q5, k, v, bias_t, spec, *params)
    out = out5.reshape(B, H, L, v.shape[3])
    out = out.half() if half else out
    if return_weights:
        with torch.no_grad():
            return out, _weights(TiledProblem(spec, q5, k, v, bias_t, params), lse2)
    return out
