"""ALiBi: attention with linear biases (Press, Smith, Lewis 2022, arXiv:2108.12409).

No position vectors at all: head h adds -m_h * |i - j| to the score of query position i and
key position j. On the keys a causal model sees (j <= i) this is the paper's -m_h * (i - j);
without a causal mask it is the symmetric form used by encoders such as MosaicBERT.

Slopes (the paper's ``get_slopes``): for n a power of two, m_h = 2^(-8h/n), h = 1..n; otherwise
the slopes for the largest power of two c < n, then every other slope of the 2c sequence.

Example::

    alibi = ALiBi(8)
    out = attention(q, k, v, causal=True, bias=alibi.bias())   # q: (B, 8, L, D); never (B, H, L, S) on tiled
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..functional.bias import StructuredBias

__all__ = ["alibi_slopes", "ALiBi", "AlibiBias"]


def alibi_slopes(n_heads: int) -> Tensor:
    """The paper's head slopes, (n_heads,) float64. 8 heads: 1/2, 1/4, ..., 1/256."""
    if not isinstance(n_heads, int) or n_heads <= 0:
        raise ValueError(f"ALiBi needs a positive number of heads, got {n_heads!r}")

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)                        # first slope = ratio = 2^(-8/n)
        return [start ** (h + 1) for h in range(n)]

    c = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = power_of_two(c)
    if c < n_heads:                                      # fill with the odd steps of the 2c sequence
        slopes += power_of_two(2 * c)[0::2][: n_heads - c]
    return torch.tensor(slopes, dtype=torch.float64)


class AlibiBias(StructuredBias):
    """-m_h |i - j| per tile: (1, H, lr, lc) from slopes (H,)."""

    relative = True                      # a function of (h, j - i) only: kernels read a per-offset table

    def __init__(self, slopes: Tensor):
        self.params = (slopes,)

    def tile(self, i: Tensor, j: Tensor, slopes: Tensor) -> Tensor:
        dist = (i - j).abs().to(slopes.dtype)            # (lr, lc) absolute query minus key position
        return -slopes[:, None, None] * dist             # (H, lr, lc)

    def distance_slopes(self) -> Tensor:
        return self.params[0]

    def kept_key(self) -> tuple:
        return ()                        # tile reads the slopes alone

    def __repr__(self) -> str:
        return f"AlibiBias(heads={self.params[0].numel()})"


class ALiBi(nn.Module):
    """Holds the slopes of n_heads heads; ``bias()`` gives the structured bias for attention()."""

    kind = "bias"

    def __init__(self, n_heads: int):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads).float(), persistent=False)

    def bias(self, q: Tensor | None = None, L: int | None = None, S: int | None = None) -> AlibiBias:
        return AlibiBias(self.slopes)

    def extra_repr(self) -> str:
        return f"heads={self.slopes.numel()}"
