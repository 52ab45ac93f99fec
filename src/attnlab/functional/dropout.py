"""Counter-based attention dropout: the keep mask of (b, h, i, j) is a hash of (seed, b, h, i, j).

Why a hash and not torch's RNG stream: the tiled backend must regenerate exactly the same mask
tile by tile in its backward pass (FlashAttention regenerates it from a Philox offset instead of
storing it), and any tiling -- or the reference backend's single dense pass -- must draw the same
mask for the same seed. A stateless hash of the coordinates gives all three.
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["keep_mask", "keep_at", "new_seed"]

_M32 = 0xFFFFFFFF
_MUL = 0x45D9F3B          # < 2**27, so (x < 2**32) * _MUL never overflows int64


def _mix(x: Tensor) -> Tensor:
    """A 32-bit integer finalizer (xor-shift-multiply); x int64 in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = (x * _MUL) & _M32
    x = x ^ (x >> 16)
    x = (x * _MUL) & _M32
    return x ^ (x >> 16)


def new_seed() -> int:
    """A fresh seed from torch's global generator, so ``torch.manual_seed`` makes dropout reproducible."""
    return int(torch.randint(0, 2**31 - 1, (1,)).item())


def keep_mask(seed: int, p: float, B: int, H: int, r0: int, r1: int, c0: int, c1: int,
              device=None) -> Tensor:
    """(B, H, r1 - r0, c1 - c0) bool: True where the weight is kept (probability 1 - p).

    Example::

        keep = keep_mask(seed=7, p=0.1, B=2, H=4, r0=0, r1=16, c0=0, c1=16)
        keep.float().mean()          # about 0.9
    """
    bh = torch.arange(B * H, device=device, dtype=torch.int64).view(B, H, 1, 1)
    i = torch.arange(r0, r1, device=device, dtype=torch.int64).view(1, 1, -1, 1)
    j = torch.arange(c0, c1, device=device, dtype=torch.int64).view(1, 1, 1, -1)
    return keep_at(seed, p, bh, i, j)                            # (B, H, lr, lc)


def keep_at(seed: int, p: float, bh: Tensor, i: Tensor, j: Tensor) -> Tensor:
    """The keep mask at arbitrary coordinates: int64 index tensors that broadcast together.

    ``bh`` = b * H + h, ``i`` the query row, ``j`` the key column; the result has their
    broadcast shape. ``keep_mask`` is this on a rectangle; a backend that gathers scattered
    key blocks (sparse) passes its gathered positions and gets the same draws.
    """
    x = _mix((bh + (seed & _M32) * 0x9E37) & _M32)
    x = _mix((x ^ (i * 0x85EB)) & _M32)
    x = _mix((x ^ (j * 0xC2B2AE3)) & _M32)
    return x >= int(p * 2**32)
