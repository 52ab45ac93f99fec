"""A small MSA Transformer (Rao et al. 2021): tied row attention and column attention over an MSA.

The input is a multiple sequence alignment of symbols (B, R, C): R sequences (rows) of C aligned
residues (columns), each in [0, q); the symbol q is the mask token of masked-residue training. Each
pre-LayerNorm layer updates the grid x (B, R, C, d)::

    x += RowAttention(LN(x))        tied: one (C x C) map per head per MSA, shared by every row
    x += ColumnAttention(LN(x))     ordinary attention along the R rows of each column
    x += FFN(LN(x))
    logits = Linear(LN(x))          (B, R, C, q): the residue at every position

**Tied row attention** sums the query-key products of every row before one softmax::

    logits[h, i, j] = sum_r q[r, h, i] . k[r, h, j] / sqrt(R * head_dim)   (Rao et al.'s sqrt(R))
    A[h] = softmax_j(logits[h]);   out[r, h, i] = sum_j A[h, i, j] v[r, h, j]

The sum over rows makes A[h, i, j] large where columns i and j co-vary across the alignment: the
statistic that reveals contacts, and what ``row_maps`` returns for the contact readout. (It equals
ordinary attention with every row's q, k, v concatenated into one head of width R * head_dim.)
Rows have no position embedding, so the model is equivariant to permuting the rows.

**The ablation** ``row="mean"``: row attention is replaced by mean pooling over each row's columns,
``out[r, i] = W_o(mean_j W_v x[r, j])`` (no q, k: no map). Its FFNs are widened by the parameters
the dropped q and k projections held (``MSAConfig.ffn_width``), so the two models have the same size
within 0.1% (tests/test_msa.py): what the ablation lacks is the attention, not capacity.

No dropout: the training data (``attnlab.tasks.msa``) are fresh masks over fresh row subsets every step.

Shape legend: B batch (MSAs), R rows (sequences), C columns (positions), H heads, q symbols.

Example::

    model = MSATransformer(MSAConfig(symbols=8))
    logits = model(msa)                        # msa (B, R, C) int64 in [0, 8] -> (B, R, C, 8)
    loss = model.loss(msa_in, targets)         # targets: true symbols at masked positions, IGNORE elsewhere
    maps = model.row_maps(msa[0])              # (layers, H, C, C) numpy: the tied row-attention maps
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Optional, Union

import numpy as np
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from ..nn.axial import AxialAttention, AxialAttentionConfig
from ..presets import from_known_fields
from .grid import check_symbol_grid

__all__ = ["MSAConfig", "MSATransformer", "TiedRowAttention", "RowMeanPool", "param_count", "ROWS", "IGNORE"]

ROWS = ("attention", "mean")       # MSAConfig.row: tied row attention, or the mean-pooling ablation
IGNORE = -100                      # a target that is not scored (F.cross_entropy's ignore_index)


@dataclass
class MSAConfig:
    symbols: int = 8                  # q: residue alphabet; token q is the mask token (q + 1 embeddings)
    max_len: int = 64                 # C at most: the learned column-position embedding
    dim: int = 64                     # d: width of x
    n_layers: int = 4
    n_heads: int = 4                  # of the row and the column attention
    head_dim: int = 16
    ffn: int = 4                      # FFN hidden width factor (x dim; the ablation adds ffn_width's extra)
    row: str = "attention"            # "attention": tied row attention; "mean": the mean-pooling ablation
    backend: str = "auto"             # the column attention's kernel (attnlab.available_backends())

    def __post_init__(self):
        if self.row not in ROWS:
            raise ValueError(f"row={self.row!r}; choose one of {ROWS}")
        for f in fields(self):
            if f.type == "int" and getattr(self, f.name) < 1:
                raise ValueError(f"{f.name}={getattr(self, f.name)} must be >= 1")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "MSAConfig":
        return from_known_fields(cls, d)

    def ffn_width(self) -> int:
        """The FFN's hidden width: ffn * dim; for row="mean" plus the units that hold the 2 * dim * inner
        parameters of the q and k projections it lacks (a hidden unit costs 2 * dim + 1)."""
        extra = 0
        if self.row == "mean":
            extra = round(2 * self.dim * self.n_heads * self.head_dim / (2 * self.dim + 1))
        return self.ffn * self.dim + extra


def param_count(cfg: MSAConfig) -> int:
    """The exact parameter count of ``MSATransformer(cfg)``, from the numbers alone (nothing is built).

    >>> param_count(MSAConfig())
    270792
    """
    d, inner, h = cfg.dim, cfg.n_heads * cfg.head_dim, cfg.ffn_width()
    row = (4 if cfg.row == "attention" else 2) * d * inner + d + 2 * d     # projections, out bias, its norm
    col = 4 * d * inner + d + 2 * d                                         # q, k, v, out; out bias; its norm
    ffn = 2 * d * h + h + d + 2 * d
    head = 2 * d + d * cfg.symbols + cfg.symbols
    return (cfg.symbols + 1 + cfg.max_len) * d + cfg.n_layers * (row + col + ffn) + head


class TiedRowAttention(nn.Module):
    """Row attention with one (C, C) map per head, tied across the R rows (MSA Transformer).

    Example:
        attn = TiedRowAttention(dim=64, n_heads=4, head_dim=16)
        out, maps = attn(torch.randn(2, 32, 48, 64))       # (2, 32, 48, 64), (2, 4, 48, 48)
    """

    def __init__(self, dim: int, n_heads: int, head_dim: int):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, head_dim
        inner = n_heads * head_dim
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_k = nn.Linear(dim, inner, bias=False)
        self.to_v = nn.Linear(dim, inner, bias=False)
        self.to_out = nn.Linear(inner, dim)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x (B, R, C, dim), already normalized -> (out (B, R, C, dim), maps (B, H, C, C))."""
        R = x.shape[1]
        q, k, v = (rearrange(f(x), "b r c (h d) -> b r h c d", h=self.n_heads)
                   for f in (self.to_q, self.to_k, self.to_v))                  # (B, R, H, C, d) each
        # one sum over rows, not R softmaxes: the map is the alignment's, not any one sequence's
        logits = torch.einsum("brhid,brhjd->bhij", q, k) / math.sqrt(R * self.head_dim)   # (B, H, C, C)
        # softmax in fp32 at least (bf16 autocast), never below the input's precision (fp64 stays fp64)
        maps = logits.to(torch.promote_types(logits.dtype, torch.float32)).softmax(dim=-1).to(x.dtype)  # (B, H, C, C)
        out = torch.einsum("bhij,brhjd->brhid", maps, v)                        # (B, R, H, C, d)
        return self.to_out(rearrange(out, "b r h c d -> b r c (h d)")), maps


class RowMeanPool(nn.Module):
    """The ablation of row attention: ``out[r, i] = W_o(mean_j W_v x[r, j])``, the same for every i.

    Example:
        pool = RowMeanPool(dim=64, inner=64)
        out = pool(torch.randn(2, 32, 48, 64))              # (2, 32, 48, 64)
    """

    def __init__(self, dim: int, inner: int):
        super().__init__()
        self.to_v = nn.Linear(dim, inner, bias=False)
        self.to_out = nn.Linear(inner, dim)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, R, C, dim) -> (B, R, C, dim)."""
        pooled = self.to_out(self.to_v(x).mean(dim=2, keepdim=True))           # (B, R, 1, dim)
        return pooled.expand_as(x)


class MSALayer(nn.Module):
    """One pre-LayerNorm layer: row attention (or its ablation), column attention, FFN."""

    def __init__(self, cfg: MSAConfig):
        super().__init__()
        self.row_norm = nn.LayerNorm(cfg.dim)
        inner = cfg.n_heads * cfg.head_dim
        self.row = (TiedRowAttention(cfg.dim, cfg.n_heads, cfg.head_dim) if cfg.row == "attention"
                    else RowMeanPool(cfg.dim, inner))
        # AxialAttention normalizes its input itself: x + col(x) is the pre-LN update. Ungated, as in
        # the MSA Transformer (AF2's gate is an Evoformer addition).
        self.col = AxialAttention(AxialAttentionConfig(dim=cfg.dim, n_heads=cfg.n_heads, head_dim=cfg.head_dim,
                                                       axis="col", gating=False, backend=cfg.backend))
        hidden = cfg.ffn_width()
        self.ffn = nn.Sequential(nn.LayerNorm(cfg.dim), nn.Linear(cfg.dim, hidden), nn.GELU(),
                                 nn.Linear(hidden, cfg.dim))

    def forward(self, x: Tensor, capture: Optional[list] = None) -> Tensor:
        """x (B, R, C, dim) -> (B, R, C, dim); capture receives the tied row map (B, H, C, C), if any."""
        h = self.row_norm(x)
        if isinstance(self.row, TiedRowAttention):
            out, maps = self.row(h)
            if capture is not None:
                capture.append(maps)
        else:
            out = self.row(h)
        x = x + out
        x = x + self.col(x)
        return x + self.ffn(x)


class MSATransformer(nn.Module):
    """Residue logits (B, R, C, q) for an MSA (B, R, C) of symbols in [0, q] (q = mask)."""

    def __init__(self, cfg: MSAConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.symbols + 1, cfg.dim)      # + the mask token
        self.pos = nn.Embedding(cfg.max_len, cfg.dim)             # columns only: rows are exchangeable
        # nn.Embedding's N(0, 1), not GPT-2's 0.02: the residues then dominate the residual stream over the
        # fresh blocks' random outputs; on the tiny test config the training loss fell about twice as far in
        # 60 steps (2.2 -> 1.83 against 1.97)
        self.layers = nn.ModuleList(MSALayer(cfg) for _ in range(cfg.n_layers))
        self.head = nn.Sequential(nn.LayerNorm(cfg.dim), nn.Linear(cfg.dim, cfg.symbols))

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, msa: Tensor, *, capture: Optional[list] = None) -> Tensor:
        """Logits (B, R, C, q) for msa (B, R, C) int64 in [0, q].

        ``capture``: a list that receives every layer's tied row-attention map (B, H, C, C), in
        layer order; nothing for ``row="mean"`` (it has no row attention).
        """
        self._check(msa)
        C = msa.shape[2]
        x = self.embed(msa) + self.pos(torch.arange(C, device=msa.device))    # (B, R, C, d)
        for layer in self.layers:
            x = layer(x, capture)
        return self.head(x)                                                    # (B, R, C, q)

    def loss(self, msa_in: Tensor, targets: Tensor) -> Tensor:
        """Mean cross-entropy over the positions whose target is >= 0 (``IGNORE`` = -100 elsewhere).

        Args:
            msa_in: (B, R, C) the masked input, symbols in [0, q].
            targets: (B, R, C) the true symbol at scored positions, ``IGNORE`` elsewhere.
        Returns:
            a scalar; 0 (with a gradient) when no position is scored.
        """
        if targets.shape != msa_in.shape:
            raise ValueError(f"targets has shape {tuple(targets.shape)}; it must match msa_in "
                             f"{tuple(msa_in.shape)} (B, R, C)")
        logits = self(msa_in)                                                  # (B, R, C, q)
        scored = targets >= 0                                                  # (B, R, C)
        if not scored.any():
            return logits.sum() * 0.0
        return F.cross_entropy(logits[scored].float(), targets[scored])

    @torch.no_grad()
    def row_maps(self, msa: Union[Tensor, np.ndarray]) -> np.ndarray:
        """The tied row-attention maps of one MSA, unmasked, in eval mode.

        Args:
            msa: (R, C) int symbols in [0, q).
        Returns:
            (layers, H, C, C) float32 numpy: maps[l, h, i, j] = how much column i attends to column j.
        Example:
            maps = model.row_maps(family.msa[:64])        # (4, 4, 48, 48)
        """
        if self.cfg.row != "attention":
            raise ValueError(f"this model has no row attention (row={self.cfg.row!r}, the mean-pooling "
                             "ablation): there are no row-attention maps to read")
        msa = torch.as_tensor(msa)
        if msa.dim() != 2:
            raise ValueError(f"msa is {tuple(msa.shape)}; row_maps takes one MSA (R, C)")
        was_training = self.training
        self.eval()
        cap: list = []
        self(msa[None].to(self.head[1].weight.device), capture=cap)
        self.train(was_training)
        return torch.stack([m[0] for m in cap]).float().cpu().numpy()          # (layers, H, C, C)

    @torch.no_grad()
    def predict(self, rows: Union[Tensor, np.ndarray]) -> Union[Tensor, np.ndarray]:
        """Logits (N, R, C, q) of N MSAs (N, R, C), in eval mode; numpy in, numpy out (float32).

        Example:
            logits = model.predict(np.stack([msa, mutated]))      # (2, R, C, q): the categorical Jacobian's input
        """
        as_numpy = isinstance(rows, np.ndarray)
        was_training = self.training
        self.eval()
        out = self(torch.as_tensor(rows).long().to(self.head[1].weight.device)).float()   # (N, R, C, q)
        self.train(was_training)
        return out.cpu().numpy() if as_numpy else out

    def _check(self, msa: Tensor) -> None:
        cfg = self.cfg
        check_symbol_grid(msa)
        if msa.shape[2] > cfg.max_len:
            raise ValueError(f"msa has C={msa.shape[2]} columns but the model embeds at most max_len={cfg.max_len}: "
                             "raise max_len")
        if msa.numel() and (int(msa.min()) < 0 or int(msa.max()) > cfg.symbols):
            raise ValueError(f"msa symbols span [{int(msa.min())}, {int(msa.max())}]; symbols={cfg.symbols} "
                             f"allows [0, {cfg.symbols - 1}] and the mask token {cfg.symbols}")
