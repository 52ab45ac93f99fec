"""An Evoformer-style contact predictor (AlphaFold 2, Jumper et al. 2021) and its non-axial baseline.

Both read an MSA-like grid of symbols (B, R, C) and return per-pair logits (B, C, C): how likely
columns i and j are in contact (see ``attnlab.data.pairs``). ``EvoformerConfig(kind=...)`` picks:

``kind="axial"`` — the Evoformer: an MSA track m (B, R, C, d_m) and a pair track z (B, C, C, d_z)::

    m = Embed(x)                                 z = RelPos(j - i)        (clipped to +-max_relpos)
    per block (AF2 supplement Alg. 6, without dropout; the outer product mean first, as AF-Multimer):
        z += OuterProductMean(m)                 z_ij += Linear(mean_s a_si (x) b_sj)  (Alg. 10)
        m += RowAttention(m, pair bias from z)   attends along C within each row   (Alg. 7)
        m += ColumnAttention(m)                  attends along R within each column (Alg. 8)
        m += Transition(m)
        z += TriangleMultiplication(z)           outgoing then incoming (Alg. 11, 12), if ``triangle``
        z += Transition(z)
    logits_ij = Linear(LayerNorm(z_ij)), symmetrised

``kind="flat"`` — the non-axial baseline: the same R·C grid tokens (symbol + row + column
embeddings) through a plain pre-norm transformer with full attention over all R·C tokens, then a
standard contact head on per-column features pooled over rows (``h_i * h_j``, ``h_i + h_j`` and
the same relative-position embedding, through an MLP). Its width ``flat_dim`` is chosen so that
its parameter count matches the axial model's (within 1%; see ``matched_flat_size``).

Ablations (``EvoformerConfig(ablate=...)``, ``attnlab train evoformer --ablate NAME ...``) remove one
part of every block, its parameters included: ``row-attention``, ``column-attention``, ``pair-bias``
(row attention without the bias from z) and ``outer-product-mean`` (then nothing carries the MSA into
the pair track, which is all the head reads: the logits no longer depend on the MSA). Which part
finds the contacts depends on the data: see ``attnlab.data.pairs`` (``coupling``) and docs/results.md.

The axial model's row (column) attention is exactly full attention over the flattened grid with a
mask that keeps each token's own row (column) — tested in tests/test_evoformer.py — so the flat
baseline sees strictly more token pairs per layer; what it lacks is the factorised attention
and the pair track (outer-product mean) that the Evoformer builds from co-variation.

Shape legend: B batch, R rows (sequences), C columns (positions), A symbols.

Example::

    cfg = EvoformerConfig(vocab=4, n_blocks=2)
    model = Evoformer(cfg)
    logits = model(msa)                                  # msa (B, R, C) int64 -> (B, C, C)
    loss = model.loss(msa, contacts)                     # contacts (B, C, C) bool
    flat = Evoformer(cfg.with_kind("flat"))              # same size, no axial structure
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..nn.axial import AxialAttention, AxialAttentionConfig
from ..nn.blocks import BlockConfig, EncoderStack
from .grid import check_symbol_grid

__all__ = ["EvoformerConfig", "Evoformer", "EvoformerBlock", "OuterProductMean", "TriangleMultiplication",
           "matched_flat_size", "KINDS", "ABLATIONS"]

KINDS = ("axial", "flat")
# the parts of an Evoformer block an ablation can remove (from every block)
ABLATIONS = ("row-attention", "column-attention", "pair-bias", "outer-product-mean")


@dataclass
class EvoformerConfig:
    kind: str = "axial"              # "axial": Evoformer blocks; "flat": plain transformer over R·C tokens
    vocab: int = 4                   # A: symbols of the grid
    max_rows: int = 32               # R at most (the flat model's row embeddings)
    max_cols: int = 64               # C at most (the flat model's column embeddings)
    n_blocks: int = 2                # Evoformer blocks, or flat transformer layers
    msa_dim: int = 32                # d_m (AF2: 256)
    pair_dim: int = 16               # d_z (AF2: 128)
    n_heads: int = 4                 # heads of every attention (AF2: 8)
    head_dim: int = 8                # per-head width of the axial attentions (AF2: 32)
    opm_dim: int = 8                 # outer-product-mean projection c (AF2: 32); z gains c*c features
    transition: int = 4              # hidden width factor of the transitions (AF2: 4)
    max_relpos: int = 16             # relative positions clipped to +-max_relpos (AF2: 32)
    triangle: bool = False           # add the triangle multiplicative updates to the pair track
    opm_first: bool = True           # outer product mean at the start of the block (AF-Multimer's order);
                                     # False: after the MSA updates (AF2). First, block 1's pair track reads
                                     # the raw symbols: on the contact task the model then leaves the base
                                     # rate within ~200 steps; AF2's order stayed there past 300 (measured)
    flat_dim: Optional[int] = None   # the flat model's width; None = matched to the axial model's size
    flat_ff: Optional[int] = None    # the flat MLPs' hidden width; None = matched with flat_dim, else 4 flat_dim
    backend: str = "auto"            # attention backend by name
    ablate: tuple = ()               # names from ABLATIONS: parts removed from every axial block

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind={self.kind!r}; choose one of {KINDS}")
        if isinstance(self.ablate, str):
            self.ablate = (self.ablate,)
        unknown = [a for a in self.ablate if a not in ABLATIONS]
        if unknown:
            raise ValueError(f"unknown ablation(s) {unknown}; choose from {ABLATIONS}")
        self.ablate = tuple(a for a in ABLATIONS if a in self.ablate)   # canonical order (a JSON list comes back)
        if self.ablate and self.kind != "axial":
            raise ValueError(f"ablate={self.ablate} removes parts of the axial Evoformer; the {self.kind!r} "
                             "model has none of them")
        for name in ("vocab", "max_rows", "max_cols", "n_blocks", "msa_dim", "pair_dim", "n_heads", "head_dim",
                     "opm_dim", "transition", "max_relpos"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.flat_dim is not None and (self.flat_dim < 1 or self.flat_dim % self.n_heads):
            raise ValueError(f"flat_dim={self.flat_dim} must be a positive multiple of n_heads={self.n_heads} "
                             "(or None to match the axial model's parameter count)")
        if self.flat_ff is not None and (self.flat_ff < 1 or self.flat_dim is None):
            raise ValueError(f"flat_ff={self.flat_ff} needs a flat_dim and must be >= 1 (or leave both None to "
                             "match the axial model's parameter count)")

    def to_dict(self) -> dict:
        return asdict(self)

    def with_kind(self, kind: str) -> "EvoformerConfig":
        return replace(self, kind=kind, ablate=())


class Transition(nn.Module):
    """LayerNorm -> Linear(d, n d) -> ReLU -> Linear(n d, d) (AF2 Alg. 9, 15), for m or z."""

    def __init__(self, dim: int, factor: int):
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, factor * dim), nn.ReLU(),
                                 nn.Linear(factor * dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class OuterProductMean(nn.Module):
    """``z_ij += Linear(mean_s a_si (x) b_sj)``, a, b = Linear(LN(m)) (AF2 Alg. 10): m (B, R, C, d_m) -> (B, C, C, d_z).

    The mean over rows of the outer product is a (learned) joint histogram of what columns i and
    j hold in the same row: co-variation, the signal of a contact, in one step.
    """

    def __init__(self, msa_dim: int, pair_dim: int, c: int):
        super().__init__()
        self.norm = nn.LayerNorm(msa_dim)
        self.to_a, self.to_b = nn.Linear(msa_dim, c), nn.Linear(msa_dim, c)
        self.out = nn.Linear(c * c, pair_dim)

    def forward(self, m: Tensor) -> Tensor:
        m = self.norm(m)
        a, b = self.to_a(m), self.to_b(m)                                     # (B, R, C, c) each
        o = torch.einsum("bsic,bsjd->bijcd", a, b) / m.shape[1]               # (B, C, C, c, c)
        return self.out(o.flatten(-2))                                        # (B, C, C, d_z)


class TriangleMultiplication(nn.Module):
    """Outgoing (``sum_k a_ik b_jk``) or incoming (``sum_k a_ki b_kj``) triangle update (AF2 Alg. 11, 12)."""

    def __init__(self, pair_dim: int, outgoing: bool = True):
        super().__init__()
        self.outgoing = outgoing
        self.norm_in, self.norm_out = nn.LayerNorm(pair_dim), nn.LayerNorm(pair_dim)
        self.proj = nn.Linear(pair_dim, 2 * pair_dim)            # a and b
        self.gate_ab = nn.Linear(pair_dim, 2 * pair_dim)
        self.gate = nn.Linear(pair_dim, pair_dim)
        self.out = nn.Linear(pair_dim, pair_dim)

    def forward(self, z: Tensor) -> Tensor:
        z = self.norm_in(z)
        a, b = (self.proj(z) * torch.sigmoid(self.gate_ab(z))).chunk(2, dim=-1)   # (B, C, C, d_z) each
        eq = "bikd,bjkd->bijd" if self.outgoing else "bkid,bkjd->bijd"
        t = torch.einsum(eq, a, b)                                                # (B, C, C, d_z)
        return torch.sigmoid(self.gate(z)) * self.out(self.norm_out(t))


class EvoformerBlock(nn.Module):
    """One Evoformer block: (m (B, R, C, d_m), z (B, C, C, d_z)) -> (m, z), residual updates."""

    def __init__(self, cfg: EvoformerConfig):
        super().__init__()
        self.opm_first = cfg.opm_first
        attn = dict(dim=cfg.msa_dim, n_heads=cfg.n_heads, head_dim=cfg.head_dim, backend=cfg.backend)
        gone = set(cfg.ablate)              # ablated parts are not built: no parameters, no computation
        bias_dim = None if "pair-bias" in gone else cfg.pair_dim
        self.row_attn = (None if "row-attention" in gone
                         else AxialAttention(AxialAttentionConfig(axis="row", pair_dim=bias_dim, **attn)))
        self.col_attn = None if "column-attention" in gone else AxialAttention(AxialAttentionConfig(axis="col", **attn))
        self.msa_transition = Transition(cfg.msa_dim, cfg.transition)
        self.opm = None if "outer-product-mean" in gone else OuterProductMean(cfg.msa_dim, cfg.pair_dim, cfg.opm_dim)
        self.triangles = nn.ModuleList()
        if cfg.triangle:
            self.triangles.extend([TriangleMultiplication(cfg.pair_dim, outgoing=True),
                                   TriangleMultiplication(cfg.pair_dim, outgoing=False)])
        self.pair_transition = Transition(cfg.pair_dim, cfg.transition)
        # AF2's "final" init (supplement 1.11.4): the last linear of every residual update starts at
        # zero, so each block starts as the identity and the symbols reach the outer product intact.
        parts = (self.row_attn, self.col_attn, self.opm)
        for last in (*(p.to_out if isinstance(p, AxialAttention) else p.out for p in parts if p is not None),
                     self.msa_transition.net[-1], self.pair_transition.net[-1], *(t.out for t in self.triangles)):
            nn.init.zeros_(last.weight)
            nn.init.zeros_(last.bias)

    def forward(self, m: Tensor, z: Tensor, capture: Optional[list] = None) -> tuple[Tensor, Tensor]:
        """capture: receives the row then the column attention's AxialIntermediates (those not ablated)."""
        if self.opm_first and self.opm is not None:
            z = z + self.opm(m)
        if self.row_attn is not None:
            m = m + _attend(self.row_attn, capture, m, *(() if self.row_attn.cfg.pair_dim is None else (z,)))
        if self.col_attn is not None:
            m = m + _attend(self.col_attn, capture, m)
        m = m + self.msa_transition(m)
        if not self.opm_first and self.opm is not None:
            z = z + self.opm(m)
        for tri in self.triangles:
            z = z + tri(z)
        return m, z + self.pair_transition(z)


def _attend(attn: AxialAttention, capture: Optional[list], *args) -> Tensor:
    """Call ``attn``; with a capture list, also record its AxialIntermediates there."""
    if capture is None:
        return attn(*args)
    out, inter = attn(*args, return_weights=True)
    capture.append(inter)
    return out


class _RelPos(nn.Module):
    """(C,) positions -> (C, C, dim): an embedding of j - i clipped to +-max_relpos (AF2 Alg. 4)."""

    def __init__(self, max_relpos: int, dim: int):
        super().__init__()
        self.max_relpos = max_relpos
        self.emb = nn.Embedding(2 * max_relpos + 1, dim)
        # small, as GPT-2's position table: at N(0, 1) the positions drown the outer-product signal in z's
        # LayerNorms and the model stays at the base rate for hundreds of steps (measured)
        nn.init.normal_(self.emb.weight, std=0.02)

    def forward(self, C: int, device) -> Tensor:
        pos = torch.arange(C, device=device)
        d = (pos[None, :] - pos[:, None]).clamp(-self.max_relpos, self.max_relpos)    # (C, C)
        return self.emb(d + self.max_relpos)                                           # (C, C, dim)


class Evoformer(nn.Module):
    """Per-pair contact logits (B, C, C) from a grid of symbols (B, R, C); ``kind`` picks the trunk."""

    def __init__(self, cfg: EvoformerConfig):
        super().__init__()
        if cfg.kind == "flat" and cfg.flat_dim is None:
            cfg = replace(cfg, **dict(zip(("flat_dim", "flat_ff"), matched_flat_size(cfg))))
        self.cfg = cfg
        if cfg.kind == "axial":
            self.embed = nn.Embedding(cfg.vocab, cfg.msa_dim)
            self.relpos = _RelPos(cfg.max_relpos, cfg.pair_dim)
            self.blocks = nn.ModuleList(EvoformerBlock(cfg) for _ in range(cfg.n_blocks))
            self.head = nn.Sequential(nn.LayerNorm(cfg.pair_dim), nn.Linear(cfg.pair_dim, 1))
        else:
            d = cfg.flat_dim
            self.embed = nn.Embedding(cfg.vocab, d)
            self.row_emb, self.col_emb = nn.Embedding(cfg.max_rows, d), nn.Embedding(cfg.max_cols, d)
            block = BlockConfig(d_model=d, n_heads=cfg.n_heads, d_ff=cfg.flat_ff or 4 * d, backend=cfg.backend)
            self.encoder = EncoderStack(block, cfg.n_blocks)
            self.relpos = _RelPos(cfg.max_relpos, d)
            self.pair_in = nn.Linear(2 * d, d)
            self.head = nn.Sequential(nn.GELU(), nn.LayerNorm(d), nn.Linear(d, 1))

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, msa: Tensor, *, capture: Optional[list] = None) -> Tensor:
        """Logits (B, C, C), symmetric, for msa (B, R, C) int64 symbols in [0, vocab).

        ``capture``: a list that receives each attention's weights: per block the row then the
        column ``AxialIntermediates`` (axial; ablated ones are skipped), or each layer's
        ``Intermediates`` (flat; (B, H, RC, RC)).
        """
        self._check(msa)
        if self.cfg.kind == "axial":
            logits = self._axial(msa, capture)
        else:
            logits = self._flat(msa, capture)
        return (logits + logits.transpose(1, 2)) / 2       # contacts are symmetric

    def _axial(self, msa: Tensor, capture: Optional[list]) -> Tensor:
        B, R, C = msa.shape
        m = self.embed(msa)                                                   # (B, R, C, d_m)
        z = self.relpos(C, msa.device).expand(B, C, C, -1)                    # (B, C, C, d_z)
        for block in self.blocks:
            m, z = block(m, z, capture)
        return self.head(z).squeeze(-1)                                       # (B, C, C)

    def _flat(self, msa: Tensor, capture: Optional[list]) -> Tensor:
        B, R, C = msa.shape
        rows, cols = torch.arange(R, device=msa.device), torch.arange(C, device=msa.device)
        h = self.embed(msa) + self.row_emb(rows)[:, None] + self.col_emb(cols)   # (B, R, C, d)
        h = self.encoder(h.reshape(B, R * C, -1), capture=capture)               # (B, R·C, d): all token pairs
        col = h.reshape(B, R, C, -1).mean(dim=1)                                 # (B, C, d) per column
        prod = col[:, :, None] * col[:, None, :]                                 # (B, C, C, d)
        summ = col[:, :, None] + col[:, None, :]                                 # (B, C, C, d)
        pair = self.pair_in(torch.cat([prod, summ], dim=-1)) + self.relpos(C, msa.device)   # (B, C, C, d)
        return self.head(pair).squeeze(-1)                                        # (B, C, C)

    def loss(self, msa: Tensor, contacts: Tensor) -> Tensor:
        """Mean binary cross-entropy over the pairs i < j; contacts (B, C, C) bool."""
        logits = self(msa)                                                        # (B, C, C)
        if contacts.shape != logits.shape:
            raise ValueError(f"contacts has shape {tuple(contacts.shape)}; for msa {tuple(msa.shape)} it must be "
                             f"{tuple(logits.shape)} (B, C, C)")
        i, j = torch.triu_indices(logits.shape[1], logits.shape[2], offset=1, device=logits.device)
        return F.binary_cross_entropy_with_logits(logits[:, i, j], contacts[:, i, j].to(logits.dtype))

    def _check(self, msa: Tensor) -> None:
        cfg = self.cfg
        B, R, C = check_symbol_grid(msa)
        if cfg.kind == "flat" and (R > cfg.max_rows or C > cfg.max_cols):
            raise ValueError(f"msa is (B={B}, R={R}, C={C}) but the flat model embeds at most "
                             f"max_rows={cfg.max_rows} rows and max_cols={cfg.max_cols} columns: raise them")
        if msa.numel() and (int(msa.min()) < 0 or int(msa.max()) >= cfg.vocab):
            raise ValueError(f"msa symbols span [{int(msa.min())}, {int(msa.max())}]; vocab={cfg.vocab} "
                             f"allows [0, {cfg.vocab - 1}]")


def matched_flat_size(cfg: EvoformerConfig) -> tuple[int, int]:
    """(flat_dim, flat_ff) giving the flat model the axial model's parameter count.

    The width is the largest multiple of n_heads whose model (with 4x MLPs) is not larger; then the
    MLP hidden width, which adds ``n_blocks (2 flat_dim + 1)`` parameters per unit, closes the gap.
    """
    target = Evoformer(replace(cfg, kind="axial", flat_dim=None, flat_ff=None, ablate=())).num_params()

    def size(d: int, ff: Optional[int] = None) -> int:
        return Evoformer(replace(cfg, kind="flat", flat_dim=d, flat_ff=ff or 4 * d, ablate=())).num_params()

    h = cfg.n_heads
    if size(h) > target:
        raise ValueError(f"the axial model has {target} parameters, fewer than the narrowest flat model "
                         f"({size(h)}, width n_heads={h}): use fewer heads or a larger axial model")
    lo, hi = 1, 2
    while size(hi * h) <= target:                   # the count grows with the width: bracket, then bisect
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if size(mid * h) <= target else (lo, mid)
    d = lo * h
    ff = 4 * d + round((target - size(d)) / (cfg.n_blocks * (2 * d + 1)))
    return d, ff
