"""Captioner: a ViT image encoder and a transformer text decoder that cross-attends to its patches.

    images (B, C, H, W) --ViT.features--> memory (B, S, d_img)          S patches, row-major
    tgt_in (B, L) --tok_emb + learned positions--> (B, L, d)
        --n_layers decoder blocks: causal self-attention, cross-attention (queries: text tokens,
          keys/values: patch features), MLP; final norm--> lm_head --> logits (B, L, V)

Training is teacher forcing: ``loss(images, tgt_in, tgt_out)`` with tgt_in = BOS + caption and
tgt_out = caption + EOS (-100 = ignored). ``caption(images)`` decodes greedily with a KV cache
per layer: the text keys grow by one per step, the patch keys are projected once and reused.

Interpretability: ``cross_attention(images, tgt_in)`` gives, per layer and head, each text
token's distribution over the image patches (B, layers, heads, L, S); reshaped to the patch
grid it shows which part of the image each word looked at. ``caption(..., return_cross_attention=True)``
returns the same for the words it generated.

Example::

    model = Captioner(CaptionerConfig(vocab_size=17, vit=ViTConfig(image_size=16, patch_size=4, n_classes=None)))
    loss = model.loss(images, tgt_in, tgt_out)       # images (B, 1, 16, 16), tgt_* (B, 8)
    ids = model.caption(images)                      # (B, <= max_len), EOS then PAD after each caption
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..nn import BlockConfig, DecoderStack
from ..positional import LearnedEncoding
from .vit import ViT, ViTConfig

__all__ = ["CaptionerConfig", "Captioner"]


@dataclass
class CaptionerConfig:
    vocab_size: int                           # text tokens, specials included
    vit: ViTConfig = field(default_factory=lambda: ViTConfig(image_size=16, patch_size=4, n_classes=None,
                                                             pooling="mean"))
    max_len: int = 8                          # text positions: BOS + the longest caption (targets add EOS)
    d_model: int = 64                         # decoder width (the ViT has its own, cross-attention maps it)
    n_layers: int = 2
    n_heads: int = 4
    d_ff: Optional[int] = None                # None = 4 d_model
    dropout: float = 0.0                      # residual and attention dropout in the decoder (training only)
    norm: str = "layer"
    mlp: str = "gelu"
    bias: bool = True
    tie_weights: bool = True                  # lm_head.weight is tok_emb.weight
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    backend: str = "auto"

    def __post_init__(self):
        if isinstance(self.vit, dict):                                       # from a JSON checkpoint
            self.vit = ViTConfig(**self.vit)
        if self.vit.n_classes is not None:
            raise ValueError(f"the captioner's ViT is a feature extractor: build it with n_classes=None "
                             f"(got n_classes={self.vit.n_classes})")
        ids = {"pad_id": self.pad_id, "bos_id": self.bos_id, "eos_id": self.eos_id}
        bad = {k: v for k, v in ids.items() if not 0 <= v < self.vocab_size}
        if bad or len(set(ids.values())) != 3:
            raise ValueError(f"pad, bos and eos must be 3 distinct ids in [0, {self.vocab_size}), got {ids}")
        if self.max_len < 1 or self.n_layers < 1:
            raise ValueError(f"max_len and n_layers must be >= 1, got {self.max_len}, {self.n_layers}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["vit"] = self.vit.to_dict()
        return d

    def block(self) -> BlockConfig:
        return BlockConfig(d_model=self.d_model, n_heads=self.n_heads, d_ff=self.d_ff, norm=self.norm,
                           norm_first=True, mlp=self.mlp, dropout=self.dropout, attn_dropout=self.dropout,
                           d_context=self.vit.d_model, bias=self.bias, backend=self.backend)


class Captioner(nn.Module):
    """ViT encoder + cross-attending text decoder; ``loss`` (teacher forcing), greedy ``caption``."""

    def __init__(self, cfg: CaptionerConfig):
        super().__init__()
        self.cfg = cfg
        self.vit = ViT(cfg.vit)
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_enc = LearnedEncoding(cfg.max_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.decoder = DecoderStack(cfg.block(), cfg.n_layers)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        # PyTorch's default Linear init, as in the ViT (see there); embeddings N(0, 0.02) as in GPT-2
        nn.init.normal_(self.tok_emb.weight, std=0.02)
        if cfg.tie_weights:
            self.lm_head.weight = self.tok_emb.weight

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def _check_text(self, ids: Tensor, offset: int = 0) -> None:
        if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.dtype != torch.int64:
            raise TypeError(f"text ids must be an int64 tensor (B, L), got {getattr(ids, 'dtype', type(ids))} "
                            f"{tuple(getattr(ids, 'shape', ()))}")
        if offset + ids.shape[1] > self.cfg.max_len:
            raise ValueError(f"{offset + ids.shape[1]} text positions exceed max_len={self.cfg.max_len}; "
                             "shorten the caption or build CaptionerConfig(max_len=...) larger")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.cfg.vocab_size):
            raise ValueError(f"token ids must be in [0, {self.cfg.vocab_size}), got [{int(ids.min())}, "
                             f"{int(ids.max())}] (targets' -100 belongs in tgt_out, not tgt_in)")

    def _decode(self, ids: Tensor, memory: Optional[Tensor], *, offset: int = 0, cache=None,
                capture: Optional[list] = None) -> Tensor:
        """Logits (B, L, V) for text ids (B, L) at positions offset .. offset + L - 1."""
        self._check_text(ids, offset)
        x = self.drop(self.pos_enc(self.tok_emb(ids), offset))                 # (B, L, d)
        return self.lm_head(self.decoder(x, memory, cache=cache, capture=capture))   # (B, L, V)

    def forward(self, images: Tensor, tgt_in: Tensor, *, capture: Optional[list] = None) -> Tensor:
        """Next-token logits (B, L, V) for images (B, C, H, W) and text tgt_in (B, L) starting with BOS.

        capture: receives, per decoder layer, the self-attention's then the cross-attention's
        ``Intermediates`` (weights (B, H, L, L) and (B, H, L, S)).
        """
        if images.shape[0] != tgt_in.shape[0]:
            raise ValueError(f"{images.shape[0]} images but {tgt_in.shape[0]} captions; pass one caption per image")
        return self._decode(tgt_in, self.vit.features(images), capture=capture)

    def loss(self, images: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> Tensor:
        """Mean next-token cross-entropy over the non-ignored (!= -100) targets tgt_out (B, L)."""
        logits = self(images, tgt_in)
        return F.cross_entropy(logits.flatten(0, 1).float(), tgt_out.flatten(), ignore_index=-100)

    @torch.no_grad()
    def cross_attention(self, images: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced cross-attention weights (B, layers, heads, L, S); each row sums to 1 over patches."""
        cap: list = []
        self(images, tgt_in, capture=cap)
        return torch.stack([c.weights for c in cap[1::2]], dim=1)          # odd entries: cross-attention

    @torch.no_grad()
    def caption(self, images: Tensor, *, max_new_tokens: Optional[int] = None, use_cache: bool = True,
                return_cross_attention: bool = False):
        """Greedy captions (B, T): the argmax token at each step, EOS included, PAD after it.

        Stops when every caption has ended or after ``max_new_tokens`` (default max_len) tokens.
        With ``use_cache=False`` each step re-runs the decoder on the whole prefix (same result).
        return_cross_attention: also return the generated words' cross-attention (B, layers, heads, T, S).
        """
        cfg = self.cfg
        T = cfg.max_len if max_new_tokens is None else max_new_tokens
        if not 1 <= T <= cfg.max_len:
            raise ValueError(f"max_new_tokens must be in [1, max_len={cfg.max_len}], got {T}")
        was_training = self.training
        self.eval()
        try:
            memory = self.vit.features(images)                                 # (B, S, d_img)
            B, S = memory.shape[:2]
            cache = self.decoder.new_cache(B, cfg.max_len, S) if use_cache else None
            prefix = torch.full((B, 1), cfg.bos_id, dtype=torch.int64, device=images.device)
            done = torch.zeros(B, dtype=torch.bool, device=images.device)
            out, cross = [], []
            for t in range(T):
                cap: Optional[list] = [] if return_cross_attention else None
                if use_cache:     # the new token only; the patch keys are in the cache after step 0
                    logits = self._decode(prefix[:, -1:], memory if t == 0 else None, offset=t, cache=cache,
                                          capture=cap)
                else:
                    logits = self._decode(prefix, memory, capture=cap)
                nxt = logits[:, -1].argmax(-1)                                 # (B,)
                nxt = torch.where(done, torch.full_like(nxt, cfg.pad_id), nxt)
                out.append(nxt)
                if cap is not None:
                    cross.append(torch.stack([c.weights[:, :, -1:] for c in cap[1::2]], dim=1))  # (B, layers, H, 1, S)
                done |= nxt == cfg.eos_id
                if bool(done.all()):
                    break
                prefix = torch.cat([prefix, nxt[:, None]], dim=1)
        finally:
            self.train(was_training)
        ids = torch.stack(out, dim=1)                                          # (B, T')
        return (ids, torch.cat(cross, dim=3)) if return_cross_attention else ids

    def patch_grid(self, weights: Tensor) -> Tensor:
        """(..., S) cross-attention weights -> (..., H/p, W/p) maps over the ViT's patch grid."""
        return weights.unflatten(-1, self.cfg.vit.grid)
