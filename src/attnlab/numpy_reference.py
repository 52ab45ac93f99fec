"""Self-attention in NumPy, written to read like the theory; an independent oracle for the tests.

Nothing here touches torch: if a torch backend and this file agree, they agree by arithmetic,
not by sharing code. Notation follows Vaswani et al. (2017), "Attention Is All You Need":

    Q = X W_q,  K = X W_k,  V = X W_v
    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V
    MultiHead(X) = concat(head_1, ..., head_h) W_o,   head_i = Attention(X W_q^i, X W_k^i, X W_v^i)

Example::

    X = np.random.randn(5, 16)                       # 5 tokens, model width 16
    Wq, Wk, Wv = (np.random.randn(16, 16) for _ in range(3))
    out, weights = self_attention(X, Wq, Wk, Wv)     # (5, 16), (5, 5)
"""
from __future__ import annotations

from typing import Optional

import numpy as np

__all__ = ["softmax", "scaled_dot_product_attention", "self_attention", "multi_head_self_attention",
           "sinusoidal_encoding"]


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax; a row of all -inf (nothing allowed) becomes all zeros."""
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - m)
    total = e.sum(axis=axis, keepdims=True)
    return e / np.where(total > 0, total, 1.0)


def scaled_dot_product_attention(Q: np.ndarray, K: np.ndarray, V: np.ndarray,
                                 allowed: Optional[np.ndarray] = None):
    """softmax(Q K^T / sqrt(d_k)) V for Q (..., n, d_k), K (..., m, d_k), V (..., m, d_v).

    ``allowed`` (..., n, m) bool: True = may attend. Returns (output (..., n, d_v), weights (..., n, m)).
    """
    d_k = Q.shape[-1]
    scores = Q @ np.swapaxes(K, -1, -2) / np.sqrt(d_k)      # (..., n, m): similarity of every query to every key
    if allowed is not None:
        scores = np.where(allowed, scores, -np.inf)
    weights = softmax(scores, axis=-1)                     # each row: a distribution over keys
    return weights @ V, weights


def self_attention(X: np.ndarray, W_q: np.ndarray, W_k: np.ndarray, W_v: np.ndarray,
                   allowed: Optional[np.ndarray] = None):
    """Single-head self-attention: queries, keys and values all come from the same sequence X (n, d)."""
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    return scaled_dot_product_attention(Q, K, V, allowed)


def multi_head_self_attention(X: np.ndarray, W_q: np.ndarray, W_k: np.ndarray, W_v: np.ndarray,
                              W_o: np.ndarray, n_heads: int, allowed: Optional[np.ndarray] = None):
    """h heads of width d/h, each attending on its own slice of the projections, concatenated, projected.

    X (n, d); W_q, W_k, W_v, W_o (d, d). Returns (output (n, d), weights (h, n, n)).
    """
    n, d = X.shape
    if d % n_heads:
        raise ValueError(f"model width {d} is not divisible by n_heads={n_heads}")
    d_head = d // n_heads

    def split(M):                                          # (n, d) -> (h, n, d/h)
        return M.reshape(n, n_heads, d_head).transpose(1, 0, 2)

    Q, K, V = split(X @ W_q), split(X @ W_k), split(X @ W_v)
    heads, weights = scaled_dot_product_attention(Q, K, V, allowed)   # (h, n, d/h), (h, n, n)
    concat = heads.transpose(1, 0, 2).reshape(n, d)        # concatenate the heads side by side
    return concat @ W_o, weights


def sinusoidal_encoding(n_positions: int, d: int) -> np.ndarray:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)); shape (n, d)."""
    if d % 2:
        raise ValueError(f"sinusoidal encoding needs an even width, got d={d}")
    pos = np.arange(n_positions)[:, None]                  # (n, 1)
    two_i = np.arange(0, d, 2)[None, :]                    # (1, d/2): the even dims 2i
    angle = pos / np.power(10000.0, two_i / d)             # (n, d/2)
    pe = np.zeros((n_positions, d))
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle)
    return pe
