"""Absolute position encodings: added to the token embeddings, one vector per position.

- ``sinusoidal(n, d)``: Vaswani et al. 2017, section 3.5, sin and cos interleaved as the paper
  writes them: PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(p / 10000^(2i/d)).
- ``sinusoidal_2d(h, w, d)``: the MAE/ViT layout for a patch grid (He et al. 2021).
- ``LearnedEncoding`` / ``LearnedEncoding2D``: a trained table; positions past it are an error.

Why the sinusoid: for each frequency, [sin((p+k)w), cos((p+k)w)] is a rotation by k*w of
[sin(pw), cos(pw)], so PE(p + k) = M_k PE(p) with M_k independent of p (tested).

Example::

    pe = sinusoidal(3, 4)            # (3, 4); pe[1] = (0.841, 0.540, 0.010, 1.000)
    x = x + pe[: x.shape[1]]         # x: (B, L, 4)
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["sinusoidal", "sinusoidal_2d", "SinusoidalEncoding", "LearnedEncoding", "LearnedEncoding2D",
           "positions_for", "max_abs_rotation_error"]


def _check_width(d: int, multiple: int, what: str) -> None:
    if not isinstance(d, int) or d <= 0 or d % multiple:
        raise ValueError(f"{what} needs a width divisible by {multiple}, got d={d}; pick d = {multiple}·k")


def _angles(pos: Tensor, n_freq: int, denom: float, base: float) -> Tensor:
    """pos * w_i for w_i = base^(-i/denom), i < n_freq, in float64: (..., n_freq)."""
    freqs = base ** (-torch.arange(n_freq, dtype=torch.float64) / denom)   # (n_freq,)
    return pos.to(torch.float64)[..., None] * freqs


def sinusoidal(n: int, d: int, *, base: float = 10000.0, offset: int = 0,
               dtype: torch.dtype = torch.float32) -> Tensor:
    """The paper's table for positions offset .. offset + n - 1: (n, d), sin/cos interleaved.

    Example::

        sinusoidal(2, 4)   # [[0, 1, 0, 1], [0.841, 0.540, 0.010, 1.000]]
    """
    _check_width(d, 2, "the sinusoidal encoding")
    pos = torch.arange(offset, offset + n)
    ang = _angles(pos, d // 2, d / 2, base)                                # (n, d/2): angle of pair i
    pe = torch.stack([ang.sin(), ang.cos()], dim=-1).reshape(n, d)         # (n, d): sin, cos, sin, cos, ...
    return pe.to(dtype)


def sinusoidal_2d(h: int, w: int, d: int, *, base: float = 10000.0, dtype: torch.dtype = torch.float32) -> Tensor:
    """2-D sin-cos for an h x w patch grid, tokens in row-major order (r * w + c): (h * w, d).

    The first d/2 channels encode the row, the last d/2 the column; each half is
    [sin(p w_k) | cos(p w_k)] with w_k = base^(-k / (d/4)) (the MAE layout, which concatenates
    rather than interleaves). Unlike MAE's code, the first half really is the row index.
    """
    _check_width(d, 4, "the 2-D sinusoidal encoding")
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")

    def half(p: Tensor) -> Tensor:
        ang = _angles(p.reshape(-1), d // 4, d / 4, base)                  # (h*w, d/4)
        return torch.cat([ang.sin(), ang.cos()], dim=-1)                   # (h*w, d/2)

    return torch.cat([half(rows), half(cols)], dim=-1).to(dtype)           # (h*w, d)


def positions_for(x: Tensor, offset: int | Tensor = 0) -> Tensor:
    """Positions of the L tokens of x (B, L, C), starting at ``offset`` (an int, or (B,) per example)."""
    L = x.shape[1]
    if isinstance(offset, Tensor):
        return offset.to(x.device).long()[:, None] + torch.arange(L, device=x.device)   # (B, L)
    return torch.arange(offset, offset + L, device=x.device)                              # (L,)


class SinusoidalEncoding(nn.Module):
    """Adds the sinusoidal table to x (B, L, C) at positions offset .. offset + L - 1 (no parameters)."""

    def __init__(self, d_model: int, *, base: float = 10000.0):
        super().__init__()
        _check_width(d_model, 2, "the sinusoidal encoding")
        self.d_model, self.base = d_model, base

    def forward(self, x: Tensor, offset: int | Tensor = 0) -> Tensor:
        pos = positions_for(x, offset)                                     # (L,) or (B, L)
        ang = _angles(pos, self.d_model // 2, self.d_model / 2, self.base)
        pe = torch.stack([ang.sin(), ang.cos()], dim=-1).flatten(-2)       # (L, C) or (B, L, C)
        return x + pe.to(x.dtype)


class LearnedEncoding(nn.Module):
    """A trained position table (max_len, C), as in BERT and GPT-2; positions >= max_len are an error."""

    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.table.weight, std=0.02)

    def forward(self, x: Tensor, offset: int | Tensor = 0) -> Tensor:
        pos = positions_for(x, offset)
        last = int(pos.max()) if pos.numel() else -1
        if last >= self.max_len:
            raise ValueError(f"position {last} is past the learned encoding's max length {self.max_len} "
                             f"(x has {x.shape[1]} tokens from offset {offset}); use a larger max_len "
                             "or a relative scheme (rope, alibi, t5, shaw)")
        return x + self.table(pos)


class LearnedEncoding2D(nn.Module):
    """A trained table for an h x w patch grid (row-major tokens), initialised from sinusoidal_2d."""

    def __init__(self, h: int, w: int, d_model: int):
        super().__init__()
        self.grid = (h, w)
        self.table = nn.Parameter(sinusoidal_2d(h, w, d_model))            # (h*w, C)

    def forward(self, x: Tensor) -> Tensor:
        n = self.table.shape[0]
        if x.shape[1] != n:
            raise ValueError(f"x has {x.shape[1]} tokens but the {self.grid[0]}x{self.grid[1]} grid has {n}; "
                             "patchify to the grid the encoding was built for")
        return x + self.table


def max_abs_rotation_error(pe: Tensor, k: int, *, base: float = 10000.0) -> float:
    """How far PE(p + k) is from M_k PE(p) over all p (the linear-map property; 0 up to rounding).

    M_k rotates each (sin, cos) pair by k * w_i; it depends on k, never on p.
    """
    n, d = pe.shape
    w = base ** (-torch.arange(d // 2, dtype=torch.float64) / (d / 2))
    c, s = torch.cos(k * w), torch.sin(k * w)
    sin_p, cos_p = pe[: n - k, 0::2].double(), pe[: n - k, 1::2].double()
    pred = torch.stack([sin_p * c + cos_p * s, cos_p * c - sin_p * s], dim=-1).reshape(n - k, d)
    return float((pred - pe[k:].double()).abs().max()) if n > k else 0.0

