"""Transformer blocks and stacks: attention + MLP with residuals, pre- or post-norm.

    pre-norm  (GPT-2, LLaMA):          x = x + drop(attn(norm(x)));  x = x + drop(mlp(norm(x)))
    post-norm (Vaswani 2017, BERT):    x = norm(x + drop(attn(x)));  x = norm(x + drop(mlp(x)))

``EncoderStack`` stacks bidirectional self-attention blocks; ``DecoderStack`` stacks causal self-attention
+ cross-attention to an encoder's output (the "memory"). T5-style relative bias tables are shared
by all layers of a stack, as in T5.

Example::

    cfg = BlockConfig(d_model=64, n_heads=4, norm="rms", mlp="swiglu", positional="rope")
    enc = EncoderStack(cfg, n_layers=2)
    dec = DecoderStack(cfg, n_layers=2)
    memory = enc(src)                       # src: (B, S, 64)
    y = dec(tgt, memory)                    # tgt: (B, L, 64) -> (B, L, 64)
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

import torch.nn.functional as F
from torch import Tensor, nn

from ..deprecation import renamed
from .attention import AttentionConfig, AttentionLayer, key_padding
from .kv_cache import KVCache

__all__ = ["BlockConfig", "MLP", "TransformerBlock", "EncoderStack", "DecoderStack", "make_norm"]


@dataclass
class BlockConfig:
    d_model: int                              # model width C
    n_heads: int
    n_kv_heads: Optional[int] = None          # GQA/MQA in self-attention
    d_ff: Optional[int] = None                # MLP hidden width; None = 4 C (GELU) or 8/3 C rounded to 8 (SwiGLU)
    norm: str = "layer"                       # layer | rms
    norm_first: bool = True                   # pre-norm trains without warm-up; post-norm is the 2017 original
    mlp: str = "gelu"                         # gelu | swiglu
    dropout: float = 0.0                      # residual dropout, after attention and after the MLP
    attn_dropout: float = 0.0                 # on the attention weights
    causal: bool = False
    cross_attention: bool = False             # add a cross-attention sublayer (decoder blocks)
    d_context: Optional[int] = None           # the memory's width; None = d_model
    positional: Optional[str] = None          # scheme of the self-attention (see attnlab.positional)
    positional_options: dict = field(default_factory=dict)
    bias: bool = True
    norm_eps: float = 1e-5
    backend: str = "auto"

    def __post_init__(self):
        if self.norm not in ("layer", "rms"):
            raise ValueError(f"norm must be 'layer' or 'rms', got {self.norm!r}")
        if self.mlp not in ("gelu", "swiglu"):
            raise ValueError(f"mlp must be 'gelu' or 'swiglu', got {self.mlp!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    def attention(self, *, cross: bool = False) -> AttentionConfig:
        return AttentionConfig(
            d_model=self.d_model, n_heads=self.n_heads, n_kv_heads=None if cross else self.n_kv_heads,
            causal=self.causal and not cross, cross=cross, d_context=self.d_context if cross else None,
            positional=None if cross else self.positional,
            positional_options=self.positional_options, dropout=self.attn_dropout, bias=self.bias,
            backend=self.backend)


def make_norm(cfg: BlockConfig) -> nn.Module:
    if cfg.norm == "rms":
        return nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.bias)


class MLP(nn.Module):
    """Position-wise feed-forward: GELU (exact erf form) or SwiGLU (Shazeer 2020, arXiv:2002.05202)."""

    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.kind = cfg.mlp
        C = cfg.d_model
        if cfg.mlp == "gelu":
            hidden = cfg.d_ff or 4 * C
            self.up = nn.Linear(C, hidden, bias=cfg.bias)
        else:
            # 8/3 C keeps SwiGLU's three matrices at the parameter count of a 4 C GELU MLP
            hidden = cfg.d_ff or 8 * ((8 * C // 3 + 7) // 8)
            self.up = nn.Linear(C, 2 * hidden, bias=cfg.bias)               # value and gate in one matmul
        self.down = nn.Linear(hidden, C, bias=cfg.bias)

    def forward(self, x: Tensor) -> Tensor:
        h = self.up(x)                                                      # (B, L, hidden or 2 hidden)
        if self.kind == "gelu":
            return self.down(F.gelu(h))
        value, gate = h.chunk(2, dim=-1)
        return self.down(value * F.silu(gate))


class TransformerBlock(nn.Module):
    """Self-attention (+ cross-attention) + MLP, each a residual sublayer with its own norm."""

    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.cfg = cfg
        self.self_attn = AttentionLayer(cfg.attention())
        self.cross_attn = AttentionLayer(cfg.attention(cross=True)) if cfg.cross_attention else None
        n_norms = 3 if cfg.cross_attention else 2
        self.norms = nn.ModuleList(make_norm(cfg) for _ in range(n_norms))
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def _residual(self, x: Tensor, norm: nn.Module, fn) -> Tensor:
        if self.cfg.norm_first:
            return x + self.drop(fn(norm(x)))
        return norm(x + self.drop(fn(x)))

    def forward(self, x: Tensor, memory: Optional[Tensor] = None, *, key_mask: Optional[Tensor] = None,
                memory_mask: Optional[Tensor] = None, cache: Optional[tuple[KVCache, ...]] = None,
                capture: Optional[list] = None) -> Tensor:
        """x (B, L, C); memory (B, S, d_context) for cross-attention; masks (B, ·) bool, True = real token.

        ``capture``: a list to which the self-attention's (then the cross-attention's)
        ``Intermediates`` are appended, for inspection (attention maps).
        """
        if self.cross_attn is not None and memory is None and (cache is None or cache[1].length == 0):
            raise ValueError("this block has cross-attention: pass the encoder output as memory (B, S, d_context)")
        self_cache = cache[0] if cache is not None else None
        x = self._residual(x, self.norms[0], lambda h: _run(self.self_attn, capture, h, key_mask=key_mask,
                                                              cache=self_cache))
        if self.cross_attn is not None:
            cross_cache = cache[1] if cache is not None else None
            x = self._residual(x, self.norms[1], lambda h: _run(self.cross_attn, capture, h, memory,
                                                                  key_mask=memory_mask, cache=cross_cache))
        return self._residual(x, self.norms[-1], self.mlp)


def _run(attn: AttentionLayer, capture: Optional[list], *args, **kwargs) -> Tensor:
    """Call ``attn``; with a capture list, also record its Intermediates there."""
    if capture is None:
        return attn(*args, **kwargs)
    y, inter = attn(*args, return_intermediates=True, **kwargs)
    capture.append(inter)
    return y


class _Stack(nn.Module):
    def __init__(self, cfg: BlockConfig, n_layers: int):
        super().__init__()
        if n_layers < 1:
            raise ValueError(f"a stack needs n_layers >= 1, got {n_layers}")
        self.cfg = cfg
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(n_layers))
        if cfg.positional == "t5":                       # T5: one bias table for the whole stack
            for layer in self.layers[1:]:
                layer.self_attn.positional = self.layers[0].self_attn.positional
        # pre-norm leaves the residual stream un-normalized: one final norm, as GPT-2 and T5 do
        self.final_norm = make_norm(cfg) if cfg.norm_first else nn.Identity()


class EncoderStack(_Stack):
    """Bidirectional self-attention blocks: (B, L, C) -> (B, L, C)."""

    def __init__(self, cfg: BlockConfig, n_layers: int):
        super().__init__(replace(cfg, causal=False, cross_attention=False), n_layers)

    def forward(self, x: Tensor, *, key_mask: Optional[Tensor] = None, capture: Optional[list] = None) -> Tensor:
        key_mask = key_padding(key_mask, x.shape[0], x.shape[1])      # read once, shared by every layer
        for layer in self.layers:
            x = layer(x, key_mask=key_mask, capture=capture)
        return self.final_norm(x)


class DecoderStack(_Stack):
    """Causal self-attention + cross-attention blocks; ``new_cache`` for token-by-token decoding."""

    def __init__(self, cfg: BlockConfig, n_layers: int):
        super().__init__(replace(cfg, causal=True, cross_attention=True), n_layers)

    def new_cache(self, batch: int, capacity: int, memory_len: int) -> list[tuple[KVCache, KVCache]]:
        return [(layer.self_attn.new_cache(batch, capacity), layer.cross_attn.new_cache(batch, memory_len))
                for layer in self.layers]

    def forward(self, x: Tensor, memory: Optional[Tensor], *, key_mask: Optional[Tensor] = None,
                memory_mask: Optional[Tensor] = None, cache: Optional[list] = None,
                capture: Optional[list] = None) -> Tensor:
        """``capture`` receives, per layer, the self- then the cross-attention Intermediates."""
        B = x.shape[0]
        if isinstance(key_mask, Tensor):                               # read once, shared by every layer
            key_mask = key_padding(key_mask, B, key_mask.shape[-1])
        if isinstance(memory_mask, Tensor):
            memory_mask = key_padding(memory_mask, B, memory_mask.shape[-1])
        for n, layer in enumerate(self.layers):
            x = layer(x, memory, key_mask=key_mask, memory_mask=memory_mask,
                      cache=None if cache is None else cache[n], capture=capture)
        return self.final_norm(x)


# The stacks were Encoder and Decoder until issue #29: models/encoder.py's Encoder (BERT) is another idea.
__getattr__ = renamed(globals(), {"Encoder": "EncoderStack", "Decoder": "DecoderStack"}, __name__)
