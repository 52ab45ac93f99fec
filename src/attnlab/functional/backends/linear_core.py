"""The kernel product of linear attention, non-causal and causal (chunked prefix sums).

Linear attention (Katharopoulos et al. 2020, arXiv:2006.16236) replaces exp(s q·k) by a product of
positive features phi(q)·phi(k), so that the sum over keys factors:

    Y_i = sum_{j allowed} (phi(q_i) · phi(k_j)) vhat_j         vhat_j = [v_j, 1]  (Dv + 1)
    out_i = Y_i[:Dv] / (Y_i[Dv] + eps)                          (numerator / normalizer)

Carrying the normalizer as an extra value column means one product gives both. Non-causal, Y is
phi(Q) (phi(K)^T Vhat): O(n m (Dv + 1)) instead of O(n^2). Causal, the key sum is a prefix sum,
computed by chunks of C rows: inside a chunk a masked (C x C) product, across chunks a carried
state Shat = [S, z] of shape (m, Dv + 1) in float32 (float64 for float64 inputs):

    Y_c = (phi(Q_c) phi(K_c)^T ∘ tril) Vhat_c + phi(Q_c) Shat_c;    Shat_{c+1} = Shat_c + phi(K_c)^T Vhat_c

To keep Python overhead low the chunks are processed a *segment* (``segment`` rows, many chunks)
at a time: the chunk states inside a segment are an exclusive cumsum of the chunks' phi(K_c)^T
Vhat_c, and only the state at each segment's start is carried (and saved) from one segment to
the next. The backward pass (``CausalKernelProduct``) recomputes each segment's chunk products
and states from the saved segment-start states, walking the segments in reverse while carrying
Rhat = sum_{later i} phi(q_i) dY_i^T for the cross-chunk terms of d phi(K) and d Vhat; it never
holds the n prefix states a cumsum-based autograd graph would store (O(n m Dv) memory).
Extra memory: O(segment (C + m Dv / C)) per head, plus n / segment saved states of m (Dv + 1).

GQA: phi(Q) is (B, Hkv, G, n, m) -- the G = H / Hkv query heads sharing a kv head -- and
phi(K), Vhat are (B, Hkv, n, .), broadcast over G, never repeated.

Example::

    fq, fk = torch.rand(1, 2, 1, 10, 8), torch.rand(1, 2, 10, 8)        # positive features
    vhat = torch.cat([torch.randn(1, 2, 10, 4), torch.ones(1, 2, 10, 1)], -1)
    y = causal_kernel_product(fq, fk, vhat, torch.zeros(1, 2, 8, 5), chunk=4)   # (1, 2, 1, 10, 5)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["causal_kernel_product", "full_kernel_product", "CausalKernelProduct", "DEFAULT_CHUNK",
           "DEFAULT_SEGMENT"]

# Measured on the CI machine, 1 thread (B=1, H=8, D=Dv=64, fp32, causal fwd+bwd, n=16384):
# chunk 32 / 64 / 128: 1.78 / 1.09 / 1.72 s; segment (chunk 64) 256 / 512 / 1024 / 2048 / 4096 / 16384:
# 1.11 / 0.92 / 0.89 / 0.99 / 1.15 / 1.35 s (longer segments leave cache, shorter ones pay Python overhead).
DEFAULT_CHUNK = 64
DEFAULT_SEGMENT = 1024      # rows per vectorized segment (a multiple of the chunk is used)


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


def _sum_g(x: Tensor) -> Tensor:
    """Sum over the query-group dim 2 (a free squeeze when G = 1)."""
    return x.squeeze(2) if x.shape[2] == 1 else x.sum(2)


def _exclusive_cumsum(x: Tensor, dim: int, reverse: bool = False) -> Tensor:
    """sum of the entries strictly before (after, if reverse) each index along ``dim``."""
    if reverse:
        return _exclusive_cumsum(x.flip(dim), dim).flip(dim)
    c = x.cumsum(dim)
    return torch.cat([torch.zeros_like(c.narrow(dim, 0, 1)), c.narrow(dim, 0, c.shape[dim] - 1)], dim)


class _Segment:
    """One segment's rows cut into chunks: q (B, Hkv, G, nc, C, m), k (B, Hkv, 1, nc, C, m), v (.., E)."""

    def __init__(self, fq: Tensor, fk: Tensor, vh: Tensor, a: int, b: int, chunk: int, tril: Tensor):
        B, Hkv, G, _, m = fq.shape
        nc = (b - a) // chunk
        self.q = fq[:, :, :, a:b].reshape(B, Hkv, G, nc, chunk, m)
        self.k = fk[:, :, a:b].reshape(B, Hkv, 1, nc, chunk, m)
        self.v = vh[:, :, a:b].reshape(B, Hkv, 1, nc, chunk, vh.shape[-1])
        self.tril = tril

    def scores(self) -> Tensor:
        """(B, Hkv, G, nc, C, C): phi(q_i)·phi(k_j) within each chunk, j <= i."""
        return (self.q @ self.k.transpose(-2, -1)).mul_(self.tril)

    def states(self, s: Tensor) -> Tensor:
        """(B, Hkv, 1, nc, m, E): the state before each chunk, given the state s before the segment."""
        kv = self.k.transpose(-2, -1) @ self.v                                    # per chunk phi(K)^T Vhat
        return _exclusive_cumsum(kv, 3).add_(s[:, :, None, None])


def _segments(n: int, segment: int):
    return [(a, min(a + segment, n)) for a in range(0, n, segment)]


def _causal_forward(fq, fk, vh, s0, chunk, segment):
    """Y (B, Hkv, G, n, E) and the state before every segment (B, Hkv, nseg, m, E); n % chunk == 0."""
    B, Hkv, G, n, _ = fq.shape
    E = vh.shape[-1]
    tril = torch.ones(chunk, chunk, dtype=fq.dtype, device=fq.device).tril_()
    y = fq.new_empty(B, Hkv, G, n, E)
    starts, s = [], s0
    for a, b in _segments(n, segment):
        seg = _Segment(fq, fk, vh, a, b, chunk, tril)
        st = seg.states(s)                                                        # (B, Hkv, 1, nc, m, E)
        yc = seg.scores() @ seg.v + seg.q @ st                                    # (B, Hkv, G, nc, C, E)
        y[:, :, :, a:b] = yc.flatten(3, 4)
        starts.append(s)
        s = st[:, :, 0, -1] + seg.k[:, :, 0, -1].transpose(-2, -1) @ seg.v[:, :, 0, -1]
    return y, (torch.stack(starts, 2) if starts else s0[:, :, None, :, :0])


def _causal_backward(fq, fk, vh, starts, dy, chunk, segment):
    """Gradients of Y with respect to (fq, fk, vh, s0), segment by segment in reverse."""
    tril = torch.ones(chunk, chunk, dtype=fq.dtype, device=fq.device).tril_()
    dfq, dfk, dvh = torch.empty_like(fq), torch.empty_like(fk), torch.empty_like(vh)
    B, Hkv, _, n, m = fq.shape
    later = fq.new_zeros(B, Hkv, m, vh.shape[-1])                                 # Rhat (B, Hkv, m, E)
    spans = _segments(n, segment)
    for i in reversed(range(len(spans))):
        a, b = spans[i]
        seg = _Segment(fq, fk, vh, a, b, chunk, tril)
        dyc = dy[:, :, :, a:b].reshape(seg.q.shape[:-1] + (vh.shape[-1],))      # (B, Hkv, G, nc, C, E)
        # M_ij = dY_i · vhat_j (j <= i): how Y_i moves with the score phi(q_i)·phi(k_j)
        mix = (dyc @ seg.v.transpose(-2, -1)).mul_(tril)                          # (B, Hkv, G, nc, C, C)
        st = seg.states(starts[:, :, i])
        dfq[:, :, :, a:b] = (mix @ seg.k + dyc @ st.transpose(-2, -1)).flatten(3, 4)
        # what the queries of later chunks (this segment's, then later segments') pull back
        pulled = _sum_g(seg.q.transpose(-2, -1) @ dyc)                            # (B, Hkv, nc, m, E)
        after = _exclusive_cumsum(pulled, 2, reverse=True).add_(later[:, :, None])
        kc, vc = seg.k[:, :, 0], seg.v[:, :, 0]                                   # (B, Hkv, nc, C, .)
        dfk[:, :, a:b] = (_sum_g(mix.transpose(-2, -1) @ seg.q) + vc @ after.transpose(-2, -1)).flatten(2, 3)
        dvh[:, :, a:b] = (_sum_g(seg.scores().transpose(-2, -1) @ dyc) + kc @ after).flatten(2, 3)
        later = later + pulled.sum(2)
    return dfq, dfk, dvh, later


class CausalKernelProduct(torch.autograd.Function):
    """Y_i = sum_{j <= i} (fq_i · fk_j) vhat_j + fq_i^T s0, by segments of chunks, recomputing backward."""

    @staticmethod
    def forward(ctx, fq: Tensor, fk: Tensor, vhat: Tensor, s0: Tensor, chunk: int, segment: int) -> Tensor:
        n = fq.shape[3]
        pad = -n % chunk                                  # zero rows: no key mass, and their Y is dropped
        if pad:
            fq, fk, vhat = F.pad(fq, (0, 0, 0, pad)), F.pad(fk, (0, 0, 0, pad)), F.pad(vhat, (0, 0, 0, pad))
        segment = max(chunk, segment - segment % chunk)
        y, starts = _causal_forward(fq, fk, vhat, s0, chunk, segment)
        ctx.save_for_backward(fq, fk, vhat, starts)
        ctx.shape = (n, pad, chunk, segment)
        return y[:, :, :, :n]

    @staticmethod
    def backward(ctx, dy: Tensor):
        fq, fk, vhat, starts = ctx.saved_tensors
        n, pad, chunk, segment = ctx.shape
        dy = F.pad(dy, (0, 0, 0, pad)) if pad else dy.contiguous()
        dfq, dfk, dvh, ds0 = _causal_backward(fq, fk, vhat, starts, dy, chunk, segment)
        return dfq[:, :, :, :n], dfk[:, :, :n], dvh[:, :, :n], ds0, None, None


def causal_kernel_product(fq: Tensor, fk: Tensor, vhat: Tensor, s0: Tensor, chunk: int = DEFAULT_CHUNK,
                          segment: int = DEFAULT_SEGMENT) -> Tensor:
    """Causal kernel product, query i against keys 0..i (query and key positions aligned) plus s0.

    Args:
        fq: (B, Hkv, G, n, m) query features; fk: (B, Hkv, n, m) key features;
        vhat: (B, Hkv, n, Dv + 1) values with a ones column;
        s0: (B, Hkv, m, Dv + 1) state from keys before position 0 (zeros if none);
        chunk: rows per chunk (C): the masked within-chunk product costs O(n C) per head;
        segment: rows processed at once (rounded to a multiple of C): memory O(segment C), Python
            overhead O(n / segment).
    Returns:
        Y (B, Hkv, G, n, Dv + 1), differentiable in all four tensors.
    """
    for name, val in (("chunk", chunk), ("segment", segment)):
        if not isinstance(val, int) or isinstance(val, bool) or val < 1:
            raise ValueError(f"{name}={val!r}: the {name} size must be a positive int "
                             f"(default {DEFAULT_CHUNK if name == 'chunk' else DEFAULT_SEGMENT})")
    return CausalKernelProduct.apply(fq, fk, vhat, s0, chunk, segment)
