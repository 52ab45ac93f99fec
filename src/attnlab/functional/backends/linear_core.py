"""The kernel product of linear attention, non-causal and causal (chunked prefix sums).

Linear attention (Katharopoulos et al. 2020, arXiv:2006.16236) replaces exp(s q·k) by a product of
positive features phi(q)·phi(k), so that the sum over keys factors:

    Y_i = sum_{j allowed} (phi(q_i) · phi(k_j)) vhat_j         vhat_j = [v_j, 1]  (Dv + 1)
    out_i = Y_i[:Dv] / (Y_i[Dv] + eps_i)                        (numerator / normalizer)

Carrying the normalizer as an extra value column means one product gives both. Non-causal, Y is
phi(Q) (phi(K)^T Vhat): O(n m (Dv + 1)) instead of O(n^2). Causal, the key sum is a prefix sum;
here it runs chunk by chunk (chunk C): inside a chunk a masked (C x C) product, across chunks a
carried state Shat = [S, z] of shape (m, Dv + 1) in float32 (float64 for float64 inputs):

    Y_c = (phi(Q_c) phi(K_c)^T ∘ tril) Vhat_c + phi(Q_c) Shat_prev;    Shat_prev += phi(K_c)^T Vhat_c

The backward pass (``CausalKernelProduct``) recomputes every chunk instead of keeping the n
prefix states autograd would store for a cumsum (O(n m Dv) memory): one forward sweep rebuilds
Shat_prev for d phi(Q) and the within-chunk terms, one reverse sweep carries
Rhat = sum_{later i} phi(q_i) dY_i^T for the cross-chunk terms of d phi(K) and d Vhat.
Extra memory: O(C^2 + m Dv) per head besides the gradients themselves.

GQA: phi(Q) is (B, Hkv, G, n, m) -- the G = H / Hkv query heads sharing a kv head -- and
phi(K), Vhat are (B, Hkv, n, .), broadcast over G, never repeated.

Example::

    fq, fk = torch.rand(1, 2, 1, 10, 8), torch.rand(1, 2, 10, 8)        # positive features
    vhat = torch.cat([torch.randn(1, 2, 10, 4), torch.ones(1, 2, 10, 1)], -1)
    y = causal_kernel_product(fq, fk, vhat, torch.zeros(1, 2, 8, 5), chunk=4)   # (1, 2, 1, 10, 5)
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["causal_kernel_product", "full_kernel_product", "CausalKernelProduct", "DEFAULT_CHUNK"]

# Measured on the 2-core CI machine (B=1, H=8, D=Dv=64, fp32, causal fwd+bwd, n=16384):
# C=64 is dominated by per-chunk Python overhead, C=256 by the within-chunk quadratic work.
DEFAULT_CHUNK = 128


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


def _tril(c: int, like: Tensor) -> Tensor:
    """(c, c) lower-triangular 0/1 matrix in ``like``'s dtype (query i sees chunk keys j <= i)."""
    return torch.ones(c, c, dtype=like.dtype, device=like.device).tril_()


def _chunks(n: int, chunk: int):
    return [(a, min(a + chunk, n)) for a in range(0, n, chunk)]


def _causal_forward(fq: Tensor, fk: Tensor, vhat: Tensor, s0: Tensor, chunk: int) -> Tensor:
    B, Hkv, G, n, m = fq.shape
    y = fq.new_empty(B, Hkv, G, n, vhat.shape[-1])        # (B, Hkv, G, n, Dv + 1)
    state = s0.clone()                                    # (B, Hkv, m, Dv + 1)
    for a, b in _chunks(n, chunk):
        fq_c, fk_c, v_c = fq[:, :, :, a:b], fk[:, :, a:b], vhat[:, :, a:b]
        scores = (fq_c @ fk_c.unsqueeze(2).transpose(-2, -1)) * _tril(b - a, fq)   # (B, Hkv, G, c, c)
        y[:, :, :, a:b] = scores @ v_c.unsqueeze(2) + fq_c @ state.unsqueeze(2)
        state += fk_c.transpose(-2, -1) @ v_c
    return y


def _causal_backward(fq, fk, vhat, s0, dy, chunk, need):
    """Gradients of Y with respect to (fq, fk, vhat, s0); ``need`` says which are wanted."""
    B, Hkv, G, n, m = fq.shape
    dfq = torch.zeros_like(fq) if need[0] else None
    dfk = torch.zeros_like(fk)                           # needed by the reverse sweep's accumulation anyway
    dv = torch.zeros_like(vhat)
    spans = _chunks(n, chunk)
    # Forward sweep: everything that needs the state *before* a chunk, or stays inside it.
    state = s0.clone()                                   # (B, Hkv, m, Dv + 1)
    for a, b in spans:
        fq_c, fk_c, v_c, dy_c = fq[:, :, :, a:b], fk[:, :, a:b], vhat[:, :, a:b], dy[:, :, :, a:b]
        tril = _tril(b - a, fq)
        # M_ij = dY_i · vhat_j (i >= j): how Y_i moves with the score phi(q_i)·phi(k_j)
        mix = (dy_c @ v_c.unsqueeze(2).transpose(-2, -1)) * tril                      # (B, Hkv, G, c, c)
        if dfq is not None:
            dfq[:, :, :, a:b] = mix @ fk_c.unsqueeze(2) + dy_c @ state.unsqueeze(2).transpose(-2, -1)
        dfk[:, :, a:b] = (mix.transpose(-2, -1) @ fq_c).sum(2)                        # (B, Hkv, c, m)
        scores = (fq_c @ fk_c.unsqueeze(2).transpose(-2, -1)) * tril                  # (B, Hkv, G, c, c)
        dv[:, :, a:b] = (scores.transpose(-2, -1) @ dy_c).sum(2)                      # (B, Hkv, c, Dv + 1)
        if b < n:
            state += fk_c.transpose(-2, -1) @ v_c
    # Reverse sweep: what later chunks' queries pull back onto this chunk's keys and values.
    later = torch.zeros_like(s0)                         # Rhat (B, Hkv, m, Dv + 1)
    for a, b in reversed(spans):
        fk_c, v_c = fk[:, :, a:b], vhat[:, :, a:b]
        dfk[:, :, a:b] += v_c @ later.transpose(-2, -1)                               # (B, Hkv, c, m)
        dv[:, :, a:b] += fk_c @ later                                                 # (B, Hkv, c, Dv + 1)
        later += (fq[:, :, :, a:b].transpose(-2, -1) @ dy[:, :, :, a:b]).sum(2)
    return dfq, dfk if need[1] else None, dv if need[2] else None, later if need[3] else None


class CausalKernelProduct(torch.autograd.Function):
    """Y_i = sum_{j <= i} (fq_i · fk_j) vhat_j + fq_i^T s0, chunked, with a recomputing backward."""

    @staticmethod
    def forward(ctx, fq: Tensor, fk: Tensor, vhat: Tensor, s0: Tensor, chunk: int) -> Tensor:
        ctx.save_for_backward(fq, fk, vhat, s0)
        ctx.chunk = chunk
        return _causal_forward(fq, fk, vhat, s0, chunk)

    @staticmethod
    def backward(ctx, dy: Tensor):
        fq, fk, vhat, s0 = ctx.saved_tensors
        grads = _causal_backward(fq, fk, vhat, s0, dy.contiguous(), ctx.chunk, ctx.needs_input_grad[:4])
        return (*grads, None)


def causal_kernel_product(fq: Tensor, fk: Tensor, vhat: Tensor, s0: Tensor, chunk: int = DEFAULT_CHUNK) -> Tensor:
    """Causal kernel product, query i against keys 0..i (query and key positions aligned) plus s0.

    Args:
        fq: (B, Hkv, G, n, m) query features; fk: (B, Hkv, n, m) key features;
        vhat: (B, Hkv, n, Dv + 1) values with a ones column;
        s0: (B, Hkv, m, Dv + 1) state from keys before position 0 (zeros if none);
        chunk: rows per chunk (C); memory O(C^2) per head, Python overhead O(n / C).
    Returns:
        Y (B, Hkv, G, n, Dv + 1), differentiable in all four tensors.
    """
    if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
        raise ValueError(f"chunk={chunk!r}: the chunk size must be a positive int (default {DEFAULT_CHUNK})")
    return CausalKernelProduct.apply(fq, fk, vhat, s0, chunk)
