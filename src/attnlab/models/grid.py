"""The one input check the grid models share: an MSA-like (B, R, C) tensor of integer symbols.

Example::

    B, R, C = check_symbol_grid(msa)          # msa (B, R, C) int64; anything else is a clear error
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["check_symbol_grid"]


def check_symbol_grid(msa) -> tuple[int, int, int]:
    """(B, R, C) of ``msa``; a ValueError for anything but a 3-D tensor, a TypeError for non-integer symbols."""
    if not isinstance(msa, Tensor) or msa.dim() != 3:
        got = tuple(msa.shape) if isinstance(msa, Tensor) else type(msa).__name__
        raise ValueError(f"msa is {got}; the model takes (B, R, C) integer symbols")
    if msa.dtype.is_floating_point or msa.dtype == torch.bool:
        raise TypeError(f"msa must hold integer symbols, got dtype {msa.dtype}")
    B, R, C = msa.shape
    return B, R, C
