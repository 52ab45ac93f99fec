"""T5's bucketed relative position bias (Raffel et al. 2020, arXiv:1910.10683).

The key-minus-query offset n = j - i is put in a bucket: small distances get a bucket each,
larger ones share logarithmically wider buckets up to ``max_distance``, beyond which all share
the last. Each head learns one scalar per bucket. The bidirectional form (encoders) splits the
buckets between past and future keys; the causal form (decoder self-attention) sends every
future key to bucket 0, where the causal mask hides it anyway. T5 shares one table across all
layers of a stack and does not scale its logits by 1/sqrt(D) (pass scale=1.0 to match a checkpoint).

Example::

    t5 = T5Bias(n_heads=8, bidirectional=True)
    out = attention(q, k, v, bias=t5.bias())        # computed per tile on the tiled backend
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..functional.bias import StructuredBias

__all__ = ["t5_bucket", "T5Bias", "T5BucketBias"]


def t5_bucket(rel: Tensor, *, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128) -> Tensor:
    """Bucket index of each offset rel = key position - query position (any shape, int)."""
    n_buckets = num_buckets // 2 if bidirectional else num_buckets
    if bidirectional:
        ret = (rel > 0).long() * n_buckets               # future keys use the upper half
        a = rel.abs()
    else:
        ret = torch.zeros_like(rel, dtype=torch.long)
        a = (-rel).clamp(min=0)                          # future keys -> distance 0 -> bucket 0
    exact = n_buckets // 2
    # float32 log, then truncation: the arithmetic T5 checkpoints were trained with
    far = exact + (torch.log(a.float().clamp(min=1) / exact) / math.log(max_distance / exact)
                   * (n_buckets - exact)).long()
    far = far.clamp(max=n_buckets - 1)
    return ret + torch.where(a < exact, a.long(), far)


class T5BucketBias(StructuredBias):
    """table[bucket(j - i), h] per tile: (1, H, lr, lc) from a (num_buckets, H) table."""

    relative = True                      # a function of (h, j - i) only: kernels read a per-offset table

    def __init__(self, table: Tensor, bidirectional: bool, max_distance: int):
        self.params = (table,)
        self.bidirectional, self.max_distance = bidirectional, max_distance

    def kept_key(self) -> tuple:
        return self.bidirectional, self.max_distance

    def tile(self, i: Tensor, j: Tensor, table: Tensor) -> Tensor:
        b = t5_bucket(j - i, bidirectional=self.bidirectional, num_buckets=table.shape[0],
                      max_distance=self.max_distance)    # (lr, lc)
        return table[b].permute(2, 0, 1)                 # (H, lr, lc)


class T5Bias(nn.Module):
    """The learned (num_buckets, H) table; ``bias()`` gives the structured bias for attention()."""

    kind = "bias"

    def __init__(self, n_heads: int, *, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128):
        super().__init__()
        min_buckets = 4 if bidirectional else 2
        if num_buckets < min_buckets or max_distance <= num_buckets // (4 if bidirectional else 2):
            raise ValueError(f"T5 bias needs num_buckets >= {min_buckets} and max_distance beyond the exact "
                             f"buckets; got num_buckets={num_buckets}, max_distance={max_distance}")
        self.bidirectional, self.max_distance = bidirectional, max_distance
        self.table = nn.Embedding(num_buckets, n_heads)

    def bias(self, q: Tensor | None = None, L: int | None = None, S: int | None = None) -> T5BucketBias:
        return T5BucketBias(self.table.weight, self.bidirectional, self.max_distance)

    def extra_repr(self) -> str:
        return f"buckets={self.table.num_embeddings}, heads={self.table.embedding_dim}, " \
               f"bidirectional={self.bidirectional}, max_distance={self.max_distance}"
