"""The kernel product of linear attention: non-causal in one product, causal fused by segments.

Linear attention (Katharopoulos et al. 2020, arXiv:2006.16236) replaces exp(s q·k) by a product of
positive features phi(q)·phi(k), so that the sum over keys factors:

    Y_i = sum_{j allowed} (phi(q_i) · phi(k_j)) vhat_j         vhat_j = [v_j, 1]  (Dv + 1)
    out_i = Y_i[:Dv] / (Y_i[Dv] + eps)                          (numerator / normalizer)

Carrying the normalizer as an extra value column means one product gives both. Non-causal, Y is
phi(Q) (phi(K)^T Vhat): O(n m (Dv + 1)). Causal, the key sum is a prefix sum, computed by chunks of
C rows: inside a chunk a masked (C x C) product, across chunks a carried state Shat = [S, z] of
shape (m, Dv + 1) in float32 (float64 for float64 inputs):

    Y_c = (phi(Q_c) phi(K_c)^T ∘ tril) Vhat_c + phi(Q_c) Shat_c;    Shat_{c+1} = Shat_c + phi(K_c)^T Vhat_c

The causal path (``causal_linear_attention``) is *fused by segments*: a segment of rows (many
chunks, about ``SEGMENT_ROWS_X_HEADS`` rows x heads) goes from q, k, v slices to its output rows in
one pass -- features, chunk products, chunk states (an exclusive cumsum of the chunks'
phi(K_c)^T Vhat_c), normalization -- and only the state at each segment's start is carried and
saved. Every intermediate is segment-sized, so it stays in cache and reuses the allocator's memory;
the only n-sized tensors a call allocates are its output (and, backward, dq, dk, dv). The backward
pass walks the segments in reverse, recomputes each one from its saved start state under autograd
and pulls back (d out, d state after it) to (dq, dk, dv, d state before it). Why this matters: the
earlier unfused kernel made ~74 (B, H, n, D)-sized temporaries per fwd+bwd step; above n = 16384
(B=1 H=8 D=64) those exceed glibc's 32 MB mmap threshold, so every step page-faulted ~26 such
tensors afresh and streamed all of them through DRAM: time grew as n^1.14 over 4k -> 64k.

FAVOR+-style log-space feature maps need one key stabilizer per head; here it is a running max
updated once per segment (the state is rescaled when it grows, as in online softmax), so an output
never depends on keys of later segments. It cancels between numerator and normalizer.

GQA: phi(Q) is (B, Hkv, G, ., m) -- the G = H / Hkv query heads sharing a kv head -- and
phi(K), Vhat are (B, Hkv, ., .), broadcast over G, never repeated.

Example::

    out = causal_linear_attention(q, k, v, ELU, keep=None, scale=0.125)    # (B, H, L, Dv)
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from .reference import accum_dtype

__all__ = ["causal_linear_attention", "full_kernel_product", "normalize", "query_features", "key_features",
           "DEFAULT_CHUNK", "SEGMENT_ROWS_X_HEADS"]

# chunk 32 / 64 / 128 measured on the CI machine (1 thread, B=1 H=8 D=64 fp32 causal fwd+bwd, n=16384):
# 1.78 / 1.09 / 1.72 s. A segment holds about SEGMENT_ROWS_X_HEADS rows x heads (1024 rows at B*H = 8:
# its slices of q, k, v are 2 MB each), a multiple of the chunk: long enough that Python's per-op
# cost is small, short enough that the intermediates stay in cache.
DEFAULT_CHUNK = 64
SEGMENT_ROWS_X_HEADS = 8192


def normalize(num: Tensor, den: Tensor, eps: float) -> Tensor:
    """num / (den + eps), rows whose normalizer is 0 (no key, or every weight underflowed) -> 0.

    num: (..., Dv); den: (...). Every weight is >= 0, so the result is a convex combination of values.
    """
    den = den + eps
    return num / torch.where(den > 0, den, torch.ones_like(den))[..., None]


def query_features(fmap, x: Tensor) -> Tensor:
    """phi(x) (..., L, m) for queries x (..., L, D); in log space stabilized by the per-row max.

    The row's constant multiplies its numerator and normalizer alike, so it cancels.
    """
    f = fmap.features_(x)
    if not fmap.log_space:
        return f
    return f.sub(f.detach().amax(dim=-1, keepdim=True)).exp_()


def key_features(fmap, x: Tensor, keep: Optional[Tensor], floor: Optional[Tensor] = None):
    """(phi(keys) (B, Hkv, S, m) with padded keys zeroed, c): in log space phi = exp(log phi - c).

    c (B, Hkv, 1, 1) is ONE constant per head for all these keys (a per-key constant would reweight
    the keys and bias the result): the max of log phi over the kept keys and all features, and at
    least ``floor`` (a running max from earlier keys). c is None for maps that are not in log space.
    """
    f = fmap.features_(x)
    if not fmap.log_space:
        return (f if keep is None else f * keep), None
    lf = f.detach() if keep is None else f.detach().masked_fill(~keep, float("-inf"))
    c = lf.amax(dim=(-2, -1), keepdim=True)                       # (B, Hkv, 1, 1)
    if floor is not None:
        c = torch.maximum(c, floor)
    safe = torch.where(torch.isfinite(c), c, torch.zeros_like(c))  # no kept key yet: nothing to stabilize
    phi = f.sub(safe).exp_()
    return (phi if keep is None else phi * keep), c


def full_kernel_product(fq: Tensor, fk: Tensor, v: Tensor) -> Tensor:
    """Non-causal: Y = phi(Q) [phi(K)^T V, phi(K)^T 1], every query against every key.

    Args:
        fq: (B, Hkv, G, L, m) query features; fk: (B, Hkv, S, m) key features; v: (B, Hkv, S, Dv).
    Returns:
        Y (B, Hkv, G, L, Dv + 1): numerators, then the normalizer (without eps) in the last column.
    """
    kv = fk.transpose(-2, -1) @ v                        # (B, Hkv, m, Dv)
    z = fk.sum(dim=-2).unsqueeze(-1)                     # (B, Hkv, m, 1)
    return fq @ torch.cat([kv, z], dim=-1).unsqueeze(2)  # (B, Hkv, G, L, Dv + 1)


def _exclusive_cumsum(x: Tensor, dim: int) -> Tensor:
    """Sum of the entries strictly before each index along ``dim``."""
    c = x.cumsum(dim)
    return torch.cat([torch.zeros_like(c.narrow(dim, 0, 1)), c.narrow(dim, 0, c.shape[dim] - 1)], dim)


class _Spec:
    """What every segment of one call shares: the feature map, sqrt(scale), chunk, tril, dtypes."""

    def __init__(self, fmap, root: float, chunk: int, cdt: torch.dtype, out_dtype: torch.dtype, device):
        self.fmap, self.root, self.chunk, self.cdt, self.out_dtype = fmap, root, chunk, cdt, out_dtype
        self.tril = torch.ones(chunk, chunk, dtype=cdt, device=device).tril_()      # (C, C)


def _chunked(x: Tensor, chunk: int) -> Tensor:
    """(..., r, d) -> (..., nc, C, d), zero rows appended to fill the last chunk."""
    pad = -x.shape[-2] % chunk
    x = F.pad(x, (0, 0, 0, pad)) if pad else x
    return x.unflatten(-2, (x.shape[-2] // chunk, chunk))


def _segment(sp: _Spec, q: Optional[Tensor], k: Tensor, v: Tensor, keep: Optional[Tensor], s: Tensor,
             c: Optional[Tensor]):
    """One segment of r rows, differentiable: (out (B, H, r, Dv) or None, state after, key constant).

    q: (B, H, r, D) aligned with the keys, or None (keys before the first query: the state only);
    k: (B, Hkv, r, D); v: (B, Hkv, r, Dv); keep: (Bm, 1, r, 1) bool or None;
    s: (B, Hkv, m, E) the state before the segment, scaled by exp(-c) when c (B, Hkv, 1, 1) is given.
    """
    B, Hkv, r, _ = k.shape
    fk, c_new = key_features(sp.fmap, k.to(sp.cdt) * sp.root, keep, c)           # (B, Hkv, r, m)
    if c is not None:                                             # the running max grew: rescale the state
        s = s * torch.exp(c - torch.where(torch.isfinite(c_new), c_new, torch.zeros_like(c_new)))
    vh = torch.cat([v.to(sp.cdt), v.new_ones(B, Hkv, r, 1, dtype=sp.cdt)], dim=-1)  # (B, Hkv, r, E)
    kc, vc = _chunked(fk, sp.chunk).unsqueeze(2), _chunked(vh, sp.chunk).unsqueeze(2)  # (B, Hkv, 1, nc, C, .)
    kv = kc.transpose(-2, -1) @ vc                                # (B, Hkv, 1, nc, m, E) per chunk
    if q is None:
        return None, s + kv.sum(3)[:, :, 0], c_new
    fq = query_features(sp.fmap, q.to(sp.cdt) * sp.root).unflatten(1, (Hkv, -1))   # (B, Hkv, G, r, m)
    qc = _chunked(fq, sp.chunk)                                   # (B, Hkv, G, nc, C, m)
    states = _exclusive_cumsum(kv, 3) + s[:, :, None, None]       # (B, Hkv, 1, nc, m, E) before each chunk
    scores = (qc @ kc.transpose(-2, -1)).mul_(sp.tril)            # (B, Hkv, G, nc, C, C)
    y = (scores @ vc + qc @ states).flatten(3, 4)[:, :, :, :r]    # (B, Hkv, G, r, E)
    Dv = vh.shape[-1] - 1
    out = normalize(y[..., :Dv], y[..., Dv], sp.fmap.eps).flatten(1, 2).to(sp.out_dtype)   # (B, H, r, Dv)
    return out, states[:, :, 0, -1] + kv[:, :, 0, -1], c_new


def _spans(start: int, stop: int, rows: int) -> list[tuple[int, int]]:
    return [(a, min(a + rows, stop)) for a in range(start, stop, rows)]


class _Plan:
    """Where the segments of one call lie: key-only segments, then segments of aligned query/key rows.

    Bottom-right alignment: query i sees keys j <= i + off (off = S - L). Keys [0, off) only feed
    the state; queries [0, -off) see no key (output 0); the other n = min(L, S) rows are aligned.
    """

    def __init__(self, L: int, S: int, rows: int):
        off = S - L
        self.q0, self.k0 = max(-off, 0), max(off, 0)               # first aligned query / key
        self.key_only = _spans(0, self.k0, rows)                   # [(a, b)] key positions
        self.aligned = _spans(0, min(L, S), rows)                  # [(a, b)] offsets from (q0, k0)

    def segments(self):
        """(query span or None, key span) of every segment, in order."""
        yield from ((None, kspan) for kspan in self.key_only)
        yield from (((self.q0 + a, self.q0 + b), (self.k0 + a, self.k0 + b)) for a, b in self.aligned)


def _slices(q, k, v, keep, qspan, kspan):
    a, b = kspan
    return (None if qspan is None else q[:, :, qspan[0]:qspan[1]], k[:, :, a:b], v[:, :, a:b],
            None if keep is None else keep[:, :, a:b])


class _CausalLinear(torch.autograd.Function):
    """Causal linear attention fused by segments; the backward recomputes each segment from its start state."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, keep: Optional[Tensor], sp: _Spec, rows: int) -> Tensor:
        B, H, L, _ = q.shape
        Hkv, S, Dv = k.shape[1], k.shape[2], v.shape[3]
        m = sp.fmap.n_features(q.shape[3])
        plan = _Plan(L, S, rows)
        out = q.new_empty(B, H, L, Dv)
        out[:, :, :plan.q0] = 0                                   # queries before the first key
        s = q.new_zeros(B, Hkv, m, Dv + 1, dtype=sp.cdt)           # (B, Hkv, m, E)
        c = q.new_full((B, Hkv, 1, 1), float("-inf"), dtype=sp.cdt) if sp.fmap.log_space else None
        starts, consts = [], []
        for qspan, kspan in plan.segments():
            starts.append(s)
            consts.append(c)
            o, s, c = _segment(sp, *_slices(q, k, v, keep, qspan, kspan), s, c)
            if o is not None:
                out[:, :, qspan[0]:qspan[1]] = o
        ctx.save_for_backward(q, k, v, keep, *starts, *(consts if c is not None else ()))
        ctx.sp, ctx.plan, ctx.nseg = sp, plan, len(starts)
        return out

    @staticmethod
    @once_differentiable                   # the recompute's own graph is not kept: no double backward
    def backward(ctx, dout: Tensor):
        q, k, v, keep, *saved = ctx.saved_tensors
        starts, consts = saved[:ctx.nseg], (saved[ctx.nseg:] or [None] * ctx.nseg)
        want = ctx.needs_input_grad[:3]
        grads = [torch.empty_like(t) if w else None for t, w in zip((q, k, v), want)]
        if grads[0] is not None:
            grads[0][:, :, :ctx.plan.q0] = 0                      # queries before the first key
        ds = None                                                 # d loss / d state after the segment
        for i, (qspan, kspan) in reversed(list(enumerate(ctx.plan.segments()))):
            with torch.enable_grad():
                ins = [t if t is None else t.detach().requires_grad_(w)
                       for t, w in zip(_slices(q, k, v, None, qspan, kspan)[:3], want)]
                s = starts[i].detach().requires_grad_()
                keep_i = None if keep is None else keep[:, :, kspan[0]:kspan[1]]
                o, s_after, _ = _segment(ctx.sp, *ins, keep_i, s, consts[i])
                outs, gouts = ([o] if o is not None else []), ([dout[:, :, qspan[0]:qspan[1]]] if o is not None else [])
                if ds is not None:
                    outs.append(s_after)
                    gouts.append(ds)
                leaves = [t for t in ins if t is not None and t.requires_grad] + [s]
                got = torch.autograd.grad(outs, leaves, gouts, allow_unused=True) if outs else [None] * len(leaves)
            got = list(got)
            for j, (t, w) in enumerate(zip(ins, want)):
                if t is None or not w:
                    continue
                g = got.pop(0)
                if g is not None:
                    span = qspan if j == 0 else kspan
                    grads[j][:, :, span[0]:span[1]] = g
            ds = got.pop(0)
        return grads[0], grads[1], grads[2], None, None, None


def causal_linear_attention(q: Tensor, k: Tensor, v: Tensor, fmap, *, keep: Optional[Tensor], scale: float,
                            chunk: int = DEFAULT_CHUNK, segment: Optional[int] = None) -> Tensor:
    """Causal linear attention, bottom-right aligned (query i sees keys j <= i + S - L), fused by segments.

    Args:
        q: (B, H, L, D); k: (B, Hkv, S, D); v: (B, Hkv, S, Dv); H % Hkv == 0.
        fmap: a feature map (``linear.FeatureMap``: ``features_``, ``log_space``, ``eps``, ``n_features``).
        keep: (Bm, 1, S, 1) bool, False = padded key (dropped), or None.
        scale: >= 0; the features see sqrt(scale) * q and sqrt(scale) * k.
        chunk: rows per chunk (C): the masked within-chunk product costs O(n C) per head.
        segment: rows per fused segment (rounded to a multiple of C); None = about
            ``SEGMENT_ROWS_X_HEADS`` / (B * H) rows. Memory O(segment C) per head, Python ops O(n / segment).
    Returns:
        out (B, H, L, Dv) in q's dtype; rows with no key are 0. Differentiable in q, k and v.
    Example:
        out = causal_linear_attention(q, k, v, EluFeatures(), keep=None, scale=q.shape[-1] ** -0.5)
    """
    for name, val in (("chunk", chunk), ("segment", segment)):
        if val is None and name == "segment":
            continue
        if not isinstance(val, int) or isinstance(val, bool) or val < 1:
            raise ValueError(f"{name}={val!r}: the {name} size must be a positive int "
                             f"(default {DEFAULT_CHUNK if name == 'chunk' else 'about 8192 / (B * H) rows'})")
    B, H, L, _ = q.shape
    if segment is None:
        segment = SEGMENT_ROWS_X_HEADS // max(B * H, 1)
    rows = max(chunk, segment - segment % chunk)
    sp = _Spec(fmap, math.sqrt(scale), chunk, accum_dtype(q.dtype), q.dtype, q.device)
    return _CausalLinear.apply(q, k, v, keep, sp, rows)
