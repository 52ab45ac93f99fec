"""``KVCache``: preallocated keys and values for incremental decoding.

Keys are stored after RoPE (each at its own position), so a cached key never needs rotating
again. Capacity is fixed up front; appending past it is an error rather than a silent copy.

Example::

    cache = KVCache(batch=2, n_kv_heads=4, head_dim=16, capacity=64)
    k_all, v_all = cache.append(k_new, v_new)     # k_new: (2, 4, t, 16) -> k_all: (2, 4, length, 16)
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["KVCache"]


class KVCache:
    """Keys and values (B, Hkv, capacity, D) of which the first ``length`` positions are filled."""

    def __init__(self, batch: int, n_kv_heads: int, head_dim: int, capacity: int, *,
                 dtype: torch.dtype = torch.float32, device=None):
        if capacity <= 0:
            raise ValueError(f"KV cache capacity must be positive, got {capacity}")
        self.capacity, self.length = capacity, 0
        self.k = torch.zeros(batch, n_kv_heads, capacity, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)

    @property
    def keys(self) -> Tensor:
        return self.k[:, :, : self.length]                                 # (B, Hkv, length, D)

    @property
    def values(self) -> Tensor:
        return self.v[:, :, : self.length]

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store t new positions (B, Hkv, t, D); return all filled keys and values."""
        t = k.shape[2]
        if k.shape[:2] != self.k.shape[:2] or k.shape[3] != self.k.shape[3] or v.shape != k.shape:
            raise ValueError(f"cache holds (B, Hkv, *, D) = {tuple(self.k.shape[:2])}, *, {self.k.shape[3]}; "
                             f"got k {tuple(k.shape)} and v {tuple(v.shape)}")
        if self.length + t > self.capacity:
            raise ValueError(f"KV cache is full: {self.length} + {t} new positions > capacity {self.capacity}; "
                             "make a larger cache with new_cache(batch, capacity)")
        # Written without autograd history: a cache holds inference state, not a graph.
        self.k[:, :, self.length: self.length + t] = k.detach()
        self.v[:, :, self.length: self.length + t] = v.detach()
        self.length += t
        return self.keys, self.values

    def select(self, rows: Tensor) -> None:
        """Reorder or copy batch rows in place: row r becomes old row ``rows[r]`` (beam search).

        ``rows`` is an int64 (B',) index; B' may differ from B (e.g. B -> B * beam when beams
        are created), and the capacity and filled length are kept.
        """
        if rows.dim() != 1:
            raise ValueError(f"rows must be a 1-D index of batch rows, got shape {tuple(rows.shape)}")
        self.k, self.v = self.k[rows], self.v[rows]                        # (B', Hkv, capacity, D)

    def reset(self) -> None:
        self.length = 0
