"""Relative position representations (Shaw, Uszkoreit, Vaswani 2018, arXiv:1803.02155).

Learned vectors w^K_r and w^V_r (width D, shared by all heads) for clipped offsets
r = clip(j - i, -k, k), so 2k + 1 of each:

    e_ij = q_i . (k_j + w^K_r) * scale          z_i = sum_j a_ij (v_j + w^V_r)

The key term is a bias: q_i . w^K_r only needs the (B, H, L, 2k+1) products q_i . w^K, gathered
per tile by offset, so it plugs into ``attention(bias=...)`` without a (B, H, L, S) tensor.
The value term needs, for each row, the attention mass that falls on each offset bucket; this
module computes it from the weights (the paper's own efficient form also forms the L x S
logits), so ``values=True`` costs O(L * S) memory where ``values=False`` does not.

Example::

    shaw = ShawRelative(head_dim=64, max_distance=16)
    bias = shaw.bias(q, L, S, scale=64 ** -0.5)          # q: (B, H, L, 64)
    out, w = attention(q, k, v, bias=bias, return_weights=True, backend="reference")
    out = out + shaw.value_term(w, L, S)                  # (B, H, L, 64)
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..functional.bias import StructuredBias

__all__ = ["ShawRelative", "ShawKeyBias", "relative_index"]


def relative_index(L: int, S: int, k: int, device=None) -> Tensor:
    """clip(j - i, -k, k) + k for query positions i = row + S - L and keys j: (L, S) in [0, 2k]."""
    i = torch.arange(L, device=device)[:, None] + (S - L)
    j = torch.arange(S, device=device)[None, :]
    return (j - i).clamp(-k, k) + k


class ShawKeyBias(StructuredBias):
    """(q_i . w^K_r) * scale gathered per tile from qw (B, H, L, 2k+1); rows are absolute positions."""

    def __init__(self, qw: Tensor, offset: int, max_distance: int):
        self.params = (qw,)
        self.offset, self.k = offset, max_distance

    def tile(self, i: Tensor, j: Tensor, qw: Tensor) -> Tensor:
        rows = qw[:, :, i[:, 0] - self.offset]                           # (B, H, lr, 2k+1)
        rel = ((j - i).clamp(-self.k, self.k) + self.k)                  # (lr, lc) bucket per pair
        return rows.gather(-1, rel.expand(*rows.shape[:2], *rel.shape))  # (B, H, lr, lc)

    def table(self, L: int, S: int):
        """qw itself: row i, key j reads qw[..., i, clamp(j - (i + S - L), -k, k) + k]."""
        (qw,) = self.params
        return qw, self.k - (S - L)

    def has_table(self, L: int, S: int) -> bool:
        return True


class ShawRelative(nn.Module):
    """The 2k + 1 relative key (and value) embeddings of width head_dim, shared by all heads."""

    kind = "relative"

    def __init__(self, head_dim: int, max_distance: int = 16, *, values: bool = True):
        super().__init__()
        if not isinstance(max_distance, int) or max_distance < 1:
            raise ValueError(f"Shaw relative positions need a clipping distance k >= 1, got {max_distance!r}")
        self.k, self.values = max_distance, values
        self.key_emb = nn.Parameter(torch.randn(2 * max_distance + 1, head_dim) * head_dim ** -0.5)
        self.value_emb = nn.Parameter(torch.zeros(2 * max_distance + 1, head_dim)) if values else None

    def bias(self, q: Tensor, L: int, S: int, *, scale: float) -> ShawKeyBias:
        """The key term for queries q (B, H, L, D) against S keys, as a structured bias."""
        qw = (q @ self.key_emb.to(q.dtype).T) * scale                    # (B, H, L, 2k+1)
        return ShawKeyBias(qw, S - L, self.k)

    def value_term(self, weights: Tensor, L: int, S: int) -> Tensor:
        """sum_j a_ij w^V_clip(j-i): weights (B, H, L, S) -> (B, H, L, D)."""
        if self.value_emb is None:
            raise ValueError("this ShawRelative was built with values=False; it has no value embeddings")
        idx = relative_index(L, S, self.k, weights.device).expand_as(weights)   # (B, H, L, S)
        mass = weights.new_zeros(*weights.shape[:-1], 2 * self.k + 1)
        mass = mass.scatter_add(-1, idx, weights)                        # (B, H, L, 2k+1) mass per offset bucket
        return mass @ self.value_emb.to(mass.dtype)                      # (B, H, L, D)

    def extra_repr(self) -> str:
        return f"k={self.k}, head_dim={self.key_emb.shape[1]}, values={self.values}"
