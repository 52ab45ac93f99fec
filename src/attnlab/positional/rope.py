"""Rotary position embedding (RoPE; Su et al. 2021, arXiv:2104.09864).

Each pair of channels (a, b) of q and k is rotated by the angle pos * theta_t, with
theta_t = base^(-2t/D). Because rotations compose, <R_m q, R_n k> = <q, R_(n-m) k>: the score
depends only on the offset n - m, and norms are unchanged. v is never rotated.

Two pairings exist and a checkpoint only works with its own (REFERENCES.md section 4):
``interleaved=True`` pairs (2t, 2t+1) as the paper and GPT-J do; ``False`` pairs (t, t + D/2)
as GPT-NeoX and HF LLaMA do. ``rotary_dim`` < D rotates only the first channels (NeoX's partial
rotary).

Example::

    rope = RoPE(64)
    q = rope(q, positions)     # q: (B, H, L, 64), positions: (L,) or (B, L) absolute positions
    # with a KV cache the new token at row i has position past_len + i; cache k already rotated
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

__all__ = ["RoPE"]


class RoPE(nn.Module):
    """Rotates (B, H, L, D) queries or keys by their positions (no parameters)."""

    def __init__(self, head_dim: int, *, base: float = 10000.0, interleaved: bool = True,
                 rotary_dim: Optional[int] = None):
        super().__init__()
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
            raise ValueError(f"RoPE rotates channel pairs: rotary_dim={rotary_dim} must be even and in "
                             f"(0, head_dim={head_dim}]")
        if base <= 1:
            raise ValueError(f"RoPE base must be > 1, got {base}")
        self.head_dim, self.rotary_dim, self.base, self.interleaved = head_dim, rotary_dim, base, interleaved

    def angles(self, positions: Tensor, dtype: torch.dtype) -> Tensor:
        """pos * theta_t for every position and pair: positions (...,) -> (..., rotary_dim / 2)."""
        # fp32 at least: in half precision pos * theta is wrong by whole radians past a few thousand
        acc = torch.promote_types(dtype, torch.float32)
        t = torch.arange(0, self.rotary_dim, 2, device=positions.device, dtype=acc)
        theta = self.base ** (-t / self.rotary_dim)                     # (D/2,)
        return positions.to(acc)[..., None] * theta

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        """x (B, H, L, D) rotated by positions (L,) or (B, L)."""
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"RoPE was built for head_dim={self.head_dim}, got x with last dim {x.shape[-1]}")
        if positions.dim() not in (1, 2) or positions.shape[-1] != x.shape[-2]:
            raise ValueError(f"positions must be (L,) or (B, L) with L = {x.shape[-2]}, got {tuple(positions.shape)}")
        ang = self.angles(positions, x.dtype)                           # (L, r/2) or (B, L, r/2)
        if ang.dim() == 3:
            ang = ang[:, None]                                          # (B, 1, L, r/2)
        cos, sin = ang.cos(), ang.sin()
        r = self.rotary_dim
        rot, rest = x[..., :r].to(cos.dtype), x[..., r:]
        if self.interleaved:
            a, b = rot[..., 0::2], rot[..., 1::2]                       # (B, H, L, r/2) each
            out = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
        else:
            a, b = rot[..., : r // 2], rot[..., r // 2:]
            out = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
        return torch.cat([out.to(x.dtype), rest], dim=-1)               # (B, H, L, D)

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
                f"interleaved={self.interleaved}")
