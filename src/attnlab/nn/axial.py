"""Axial (row / column) gated self-attention over a 2-D grid, as in AlphaFold 2's Evoformer.

x is a grid (B, R, C, d): for an MSA, R aligned sequences of C residues each. Row attention lets
every position attend along its own row (over the C residues of one sequence, AF2 supplement
Alg. 7); column attention along its own column (over the R sequences at one residue, Alg. 8).
Each is ordinary multi-head attention with the grid's other axis folded into the batch, so it
costs O(R·C²) (rows) or O(C·R²) (columns) instead of O((R·C)²) for full attention over the grid.

Row attention can add a *pair bias*: a pair representation z (B, C, C, d_pair) gives one scalar
per head and key/query pair, ``b[h, i, j] = LinearNoBias(LayerNorm(z[i, j]))``, shared by every
row. Here it is allowed on either axis: it always indexes the attended axis (z is (B, R, R, d_pair)
for columns; AF2's column attention has none).

Shape legend (the kernel letters are in ``attnlab.functional``)
    R   rows (sequences)           C   columns (residues)
    N   the grid axis folded into the batch: R for axis="row", C for axis="col"
    L   the attended axis:  C for axis="row", R for axis="col"
    H   heads, c (``head_dim``) the per-head width
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional

import torch
from einops import rearrange
from torch import Tensor, nn

from attnlab.functional import attention

__all__ = ["AxialAttentionConfig", "AxialAttention", "AxialIntermediates"]

AXES = ("row", "col")


@dataclass
class AxialAttentionConfig:
    dim: int = 256                    # d: width of the grid representation x (AF2's c_m)
    n_heads: int = 8                  # AF2 uses 8 for both row and column MSA attention
    head_dim: int = 32                # per-head width c (AF2: 32); independent of dim
    axis: str = "row"                 # "row": attend along C within each row; "col": along R
    pair_dim: Optional[int] = None    # width of the pair representation z; None = no pair bias
    gating: bool = True               # o_h *= sigmoid(Linear(x)) per head and channel (AF2)
    chunk_size: Optional[int] = None  # rows (columns) per attention call, bounds the score memory; None = all
    backend: str = "auto"             # a name from attnlab.available_backends()

    def __post_init__(self):
        if self.axis not in AXES:
            raise ValueError(f"axis={self.axis!r}; choose one of {AXES}")
        for name in ("dim", "n_heads", "head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.pair_dim is not None and self.pair_dim < 1:
            raise ValueError(f"pair_dim={self.pair_dim} must be >= 1, or None for no pair bias")
        if self.chunk_size is not None and self.chunk_size < 1:
            raise ValueError(f"chunk_size={self.chunk_size} must be >= 1, or None to process all rows at once")


@dataclass
class AxialIntermediates:
    """What ``AxialAttention(..., return_weights=True)`` returns next to the output.

    weights: (B, N, H, L, L) softmax probabilities per folded row: for axis="row" ``weights[b, s, h, i, j]``
        is how much residue i of sequence s attends to residue j; for axis="col" ``weights[b, i, h, s, t]``
        is how much sequence s attends to sequence t at residue i.
    pair_bias: (B, H, L, L) the additive bias from z, or None.
    """
    weights: Tensor
    pair_bias: Optional[Tensor]


def _row_chunks(B: int, N: int, chunk_size: Optional[int], per_example: bool) -> Iterator[tuple[slice, Optional[int]]]:
    """Slices of the flattened (B·N) rows, each one attention call, and the example they lie in.

    With a pair bias (per example, shared by its N rows) a chunk stays inside one example, so the
    bias is passed as (1, H, L, L) and broadcast by the kernel: never copied N times.
    """
    if per_example:
        size = N if chunk_size is None else chunk_size
        for b in range(B):
            for s in range(0, N, size):
                yield slice(b * N + s, b * N + min(s + size, N)), b
    else:
        size = B * N if chunk_size is None else chunk_size
        for s in range(0, B * N, size):
            yield slice(s, min(s + size, B * N)), None


class AxialAttention(nn.Module):
    """Gated row- or column-wise self-attention with optional pair bias (AF2 Alg. 7 / Alg. 8).

    ``m <- LayerNorm(m)``; per head h: ``q, k, v = LinearNoBias(m)``,
    ``a_sij = softmax_j(q_si·k_sj / sqrt(c) + b_ij)``, ``o_si = g_si * sum_j a_sij v_sj`` with
    ``g = sigmoid(Linear(m))`` (initialised to weight 0, bias 1, so g = sigmoid(1) at first), and
    ``out = Linear(concat_h o)``. Column attention transposes the grid and runs the same code.

    Example:
        attn = AxialAttention(AxialAttentionConfig(dim=64, n_heads=4, head_dim=16, pair_dim=32))
        x, z = torch.randn(1, 8, 50, 64), torch.randn(1, 50, 50, 32)   # (B, R, C, d), (B, C, C, d_pair)
        out = attn(x, z)                                               # (1, 8, 50, 64)
    """

    def __init__(self, cfg: AxialAttentionConfig):
        super().__init__()
        self.cfg = cfg
        inner = cfg.n_heads * cfg.head_dim
        self.norm = nn.LayerNorm(cfg.dim)
        self.to_q = nn.Linear(cfg.dim, inner, bias=False)
        self.to_k = nn.Linear(cfg.dim, inner, bias=False)
        self.to_v = nn.Linear(cfg.dim, inner, bias=False)
        self.to_out = nn.Linear(inner, cfg.dim)
        self.to_gate = None
        if cfg.gating:
            self.to_gate = nn.Linear(cfg.dim, inner)
            # As in the AF2 supplement and OpenFold: the gate starts the same everywhere, sigmoid(1) ~ 0.73.
            nn.init.zeros_(self.to_gate.weight)
            nn.init.ones_(self.to_gate.bias)
        self.pair_norm = self.to_pair_bias = None
        if cfg.pair_dim is not None:
            self.pair_norm = nn.LayerNorm(cfg.pair_dim)
            self.to_pair_bias = nn.Linear(cfg.pair_dim, cfg.n_heads, bias=False)

    def forward(self, x: Tensor, z: Optional[Tensor] = None, mask: Optional[Tensor] = None,
                return_weights: bool = False):
        """Attend along one axis of the grid.

        Args:
            x: (B, R, C, dim) grid representation.
            z: (B, L, L, pair_dim) pair representation over the attended axis (L = C for rows,
                R for columns); required exactly when the config has ``pair_dim``.
            mask: (B, R, C) bool, True = valid position. Invalid positions are not attended to
                (as keys); their own outputs are computed but meaningless. A row (column) with no
                valid position gets attention output 0.
            return_weights: also return an ``AxialIntermediates`` with the probabilities.
        Returns:
            (B, R, C, dim), or (out, AxialIntermediates).
        """
        self._check(x, z, mask)
        col = self.cfg.axis == "col"
        if col:   # Alg. 8 is Alg. 7 on the transposed grid
            x = x.transpose(1, 2)                                       # (B, C, R, dim)
            mask = None if mask is None else mask.transpose(1, 2)       # (B, C, R)
        out, weights, bias = self._attend_rows(x, z, mask, return_weights)
        if col:
            out = out.transpose(1, 2)                                   # (B, R, C, dim)
        if return_weights:
            return out, AxialIntermediates(weights=weights, pair_bias=bias)
        return out

    def _attend_rows(self, x: Tensor, z: Optional[Tensor], mask: Optional[Tensor], return_weights: bool):
        """Row attention of x (B, N, L, dim): each of the N rows attends along its own L positions."""
        cfg = self.cfg
        B, N, L, _ = x.shape
        x = self.norm(x)
        q, k, v = (rearrange(f(x), "b n l (h c) -> (b n) h l c", h=cfg.n_heads)
                   for f in (self.to_q, self.to_k, self.to_v))          # (B·N, H, L, c)
        bias = None
        if z is not None:
            bias = rearrange(self.to_pair_bias(self.pair_norm(z)), "b i j h -> b h i j")   # (B, H, L, L)
        keep = None if mask is None else rearrange(mask, "b n l -> (b n) 1 1 l")       # (B·N, 1, 1, L)
        outs, probs = [], []
        for rows, b in _row_chunks(B, N, cfg.chunk_size, per_example=bias is not None):
            res = attention(q[rows], k[rows], v[rows],
                            mask=None if keep is None else keep[rows],
                            bias=None if bias is None else bias[b:b + 1],   # (1, H, L, L), broadcast over rows
                            backend=cfg.backend, return_weights=return_weights)
            if return_weights:
                res, w = res
                probs.append(w)                                           # (rows, H, L, L)
            outs.append(res)                                              # (rows, H, L, c)
        o = torch.cat(outs) if outs else v.new_empty(v.shape)             # (B·N, H, L, c)
        o = rearrange(o, "(b n) h l c -> b n l h c", b=B)
        if self.to_gate is not None:
            g = torch.sigmoid(self.to_gate(x))                            # (B, N, L, H·c)
            o = o * rearrange(g, "b n l (h c) -> b n l h c", h=cfg.n_heads)
        out = self.to_out(rearrange(o, "b n l h c -> b n l (h c)"))       # (B, N, L, dim)
        weights = None
        if return_weights:
            w = torch.cat(probs) if probs else x.new_empty(B * N, cfg.n_heads, L, L)
            weights = rearrange(w, "(b n) h i j -> b n h i j", b=B)        # (B, N, H, L, L)
        return out, weights, bias

    def _check(self, x: Tensor, z: Optional[Tensor], mask: Optional[Tensor]) -> None:
        cfg = self.cfg
        if not isinstance(x, Tensor) or x.dim() != 4 or x.shape[-1] != cfg.dim:
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x is {got}; AxialAttention takes a (B, R, C, dim={cfg.dim}) grid")
        B, R, C, _ = x.shape
        L = C if cfg.axis == "row" else R
        if cfg.pair_dim is None and z is not None:
            raise ValueError("z was given but the config has pair_dim=None: set pair_dim to use a pair bias")
        if cfg.pair_dim is not None:
            want = (B, L, L, cfg.pair_dim)
            if z is None:
                raise ValueError(f"the config has pair_dim={cfg.pair_dim}: pass z of shape {want} "
                                 f"(B, L, L, pair_dim) over the attended axis")
            if tuple(z.shape) != want:
                raise ValueError(f"z has shape {tuple(z.shape)}; axis={cfg.axis!r} on x {tuple(x.shape)} needs "
                                 f"{want}: one pair vector per pair of positions along the attended axis")
        if mask is not None:
            if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
                raise TypeError(f"mask must be a bool tensor (True = valid), got "
                                f"{mask.dtype if isinstance(mask, Tensor) else type(mask).__name__}")
            if tuple(mask.shape) != (B, R, C):
                raise ValueError(f"mask has shape {tuple(mask.shape)}; it must be (B, R, C) = {(B, R, C)}, "
                                 f"one flag per grid position")
