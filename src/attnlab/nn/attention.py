"""``AttentionLayer``: self- or cross-attention over (B, L, C), with any positional scheme.

    x (B, L, C) --Wq--> q (B, H, L, D)            D = C / H
    x or context --Wk, Wv--> k, v (B, Hkv, S, D)  Hkv = n_kv_heads (GQA/MQA when < H)
    attention(q, k, v) (B, H, L, D) --concat heads--> (B, L, C) --Wo--> (B, L, C)

Positional schemes (``attnlab.positional``) enter by their kind: absolute vectors are added to
the input at positions past_len + t; RoPE rotates q and k; ALiBi, T5 and Shaw are structured
biases. All of them use absolute positions, so a ``KVCache`` decodes token by token with
exactly the full forward's result.

Example::

    cfg = AttentionConfig(d_model=64, n_heads=4, causal=True, positional="rope")
    mha = AttentionLayer(cfg)
    y = mha(x)                                            # x: (B, L, 64) -> (B, L, 64)
    cache = mha.new_cache(batch=2, capacity=128)
    y_t = mha(x_t, cache=cache)                           # one token at a time, x_t: (B, 1, 64)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..functional import attention, masks
from ..functional.backends.reference import accum_dtype, dense_bias
from ..deprecation import renamed
from ..functional.registry import get_backend
from ..positional import POSITIONAL, make_positional
from .kv_cache import KVCache

__all__ = ["AttentionConfig", "AttentionLayer", "Intermediates", "key_padding"]


@dataclass
class AttentionConfig:
    d_model: int                              # model width C
    n_heads: int                              # query heads H; each of width C / H
    n_kv_heads: Optional[int] = None          # None = n_heads (MHA); 1 = MQA; else GQA (shrinks the KV cache)
    causal: bool = False                      # decoder self-attention: position p sees keys <= p
    cross: bool = False                       # K, V from a context sequence instead of x
    d_context: Optional[int] = None           # context width for cross-attention; None = d_model
    positional: Optional[str] = None          # sinusoidal | learned | rope | alibi | t5 | shaw | None
    positional_options: dict = field(default_factory=dict)   # e.g. {"max_len": 512}, {"max_distance": 16}
    dropout: float = 0.0                      # on the attention weights, in training only
    bias: bool = True                         # biases in the four projections
    scale: Optional[float] = None             # None = 1/sqrt(D); T5 checkpoints use 1.0
    backend: str = "auto"                     # any name of attnlab.available_backends()

    def __post_init__(self):
        for name in ("d_model", "n_heads", "n_kv_heads", "d_context"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.positional is not None and self.positional not in POSITIONAL:
            raise ValueError(f"unknown positional scheme {self.positional!r}; choose from {sorted(POSITIONAL)} or None")
        if self.backend != "auto":
            get_backend(self.backend)                      # ValueError naming the known backends
        if self.scale is not None and not 0 < self.scale < float("inf"):
            raise ValueError(f"scale must be a positive number or None (1/sqrt(head_dim)), got {self.scale!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}: each head "
                             f"gets d_model / n_heads channels; pick n_heads dividing {self.d_model}")
        kv = self.n_heads if self.n_kv_heads is None else self.n_kv_heads
        if kv <= 0 or self.n_heads % kv:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}: "
                             "each group of query heads shares one kv head; pick a divisor of n_heads")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.cross and self.positional is not None:
            raise ValueError(f"cross-attention takes no positional scheme (got {self.positional!r}): query and "
                             "context positions live in different sequences; encode them before attending")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads


@dataclass
class Intermediates:
    """What one call computed, per head: scores (B, H, L, S) are the logits (scaled, biased, masked
    to -inf) and weights (B, H, L, S) the softmax probabilities before dropout."""
    scores: Tensor
    weights: Tensor


class AttentionLayer(nn.Module):
    """Multi-head attention with GQA, positional schemes, masks, dropout and a KV cache."""

    def __init__(self, cfg: AttentionConfig):
        super().__init__()
        self.cfg = cfg
        C, D, Hkv = cfg.d_model, cfg.head_dim, cfg.kv_heads
        d_kv_in = (cfg.d_context or C) if cfg.cross else C
        self.q_proj = nn.Linear(C, C, bias=cfg.bias)
        self.k_proj = nn.Linear(d_kv_in, Hkv * D, bias=cfg.bias)
        self.v_proj = nn.Linear(d_kv_in, Hkv * D, bias=cfg.bias)
        self.out_proj = nn.Linear(C, C, bias=cfg.bias)
        self.positional = None if cfg.positional is None else make_positional(
            cfg.positional, d_model=C, n_heads=cfg.n_heads, head_dim=D, causal=cfg.causal,
            options=cfg.positional_options)

    @property
    def scale(self) -> float:
        return self.cfg.scale if self.cfg.scale is not None else self.cfg.head_dim ** -0.5

    def new_cache(self, batch: int, capacity: int, *, dtype: torch.dtype | None = None) -> KVCache:
        """An empty cache for ``batch`` sequences of up to ``capacity`` keys."""
        w = self.k_proj.weight
        return KVCache(batch, self.cfg.kv_heads, self.cfg.head_dim, capacity,
                       dtype=dtype or w.dtype, device=w.device)

    def forward(self, x: Tensor, context: Optional[Tensor] = None, *, key_mask: Optional[Tensor] = None,
                mask=None, cache: Optional[KVCache] = None, return_intermediates: bool = False):
        """Attend from x to itself (or to ``context`` when cfg.cross).

        Args:
            x: (B, L, C) queries' sequence.
            context: (B, S, d_context) for cross-attention; with a filled cache it may be None.
            key_mask: (B, S) bool, True = a real key (False = padding), over all S keys (cached ones too), or
                an attnlab mask such as ``masks.padding(lengths)`` (read as is: no look at values, and the
                kernels skip the padded keys); the stacks convert a tensor once and pass the mask.
            mask: anything ``attention(mask=...)`` takes (bool (B|1, H|1, L, S), True = may attend, or a
                structured mask); combined with cfg.causal and key_mask.
            cache: a ``KVCache`` from ``new_cache``: new keys are appended (self) or the context's keys
                are stored once and reused (cross); new queries sit at positions past_len + t.
            return_intermediates: also return an ``Intermediates`` with scores and weights per head.
        Returns:
            (B, L, C), and the Intermediates if asked.
        """
        cfg = self.cfg
        self._check_input(x, context, cache)
        B, L, _ = x.shape
        past = cache.length if (cache is not None and not cfg.cross) else 0
        kind = getattr(self.positional, "kind", None)
        if kind == "absolute":
            x = self.positional(x, past)                                     # adds PE(past .. past+L-1)
        q, k, v = self._project(x, context, cache)          # q (B, H, L, D); k, v (B, Hkv, S, D)
        if kind == "rotary":
            q = self.positional(q, torch.arange(past, past + L, device=x.device))
        if cache is not None and not cfg.cross:
            k, v = cache.append(k, v)                                        # (B, Hkv, past + L, D)
        S = k.shape[2]
        bias = self._bias(q, L, S)
        full_mask = self._mask(mask, key_mask, B, S)
        p = cfg.dropout if self.training else 0.0
        shaw_values = kind == "relative" and self.positional.values
        if shaw_values or return_intermediates:
            # Shaw's value term needs differentiable weights: the reference backend keeps their graph.
            out, weights = attention(q, k, v, mask=full_mask, causal=cfg.causal, bias=bias, scale=self.scale,
                                     dropout_p=p, backend="reference" if shaw_values else cfg.backend,
                                     return_weights=True)
            if shaw_values:
                out = out + self.positional.value_term(weights, L, S).to(out.dtype)
        else:
            out = attention(q, k, v, mask=full_mask, causal=cfg.causal, bias=bias, scale=self.scale,
                            dropout_p=p, backend=cfg.backend)                # (B, H, L, D)
        y = self.out_proj(out.transpose(1, 2).flatten(2))                    # (B, L, C)
        if not return_intermediates:
            return y
        return y, Intermediates(self._scores(q, k, bias, full_mask, L, S), weights.detach())

    # -- pieces of forward -------------------------------------------------------------------------
    def _check_input(self, x: Tensor, context: Optional[Tensor], cache: Optional[KVCache]) -> None:
        cfg = self.cfg
        if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[-1] != cfg.d_model:
            raise ValueError(f"x must be (B, L, {cfg.d_model}), got {tuple(getattr(x, 'shape', ()))}")
        w = self.q_proj.weight
        for name, t in (("x", x), ("context", context)):
            if t is None:
                continue
            if not t.is_floating_point():
                raise TypeError(f"{name} must be a floating-point tensor (B, L, C), got {t.dtype}: token ids go "
                                "through an embedding (nn.Embedding) first")
            if t.dtype != w.dtype and not torch.is_autocast_enabled(t.device.type):
                raise TypeError(f"{name} is {t.dtype} but the layer's weights are {w.dtype}: convert one "
                                f"(x.to({w.dtype}) or layer.to({t.dtype})), or run under torch.autocast")
        if not cfg.cross:
            if context is not None:
                raise ValueError("this layer is self-attention (cfg.cross=False) but a context was given; "
                                 "build it with AttentionConfig(cross=True) for cross-attention")
            return
        d_ctx = cfg.d_context or cfg.d_model
        if context is None:
            if cache is None or cache.length == 0:
                raise ValueError("cross-attention needs a context (B, S, d_context) (or a cache already filled "
                                 "with the context's keys)")
            return
        if context.dim() != 3 or context.shape[-1] != d_ctx or context.shape[0] != x.shape[0]:
            raise ValueError(f"context must be (B={x.shape[0]}, S, d_context={d_ctx}), got {tuple(context.shape)}; "
                             "set AttentionConfig.d_context to the context's width")

    def _project(self, x: Tensor, context: Optional[Tensor], cache: Optional[KVCache]):
        cfg = self.cfg
        heads = lambda t, h: t.unflatten(-1, (h, cfg.head_dim)).transpose(1, 2)   # (B, n, h*D) -> (B, h, n, D)
        if not cfg.cross:
            # One matmul for q, k and v: three separate projections cost ~2.5% of a micro GPT's
            # training step (bench --lm). The weights stay three parameters, so checkpoints keep
            # their q/k/v names; concatenating (3C x C) per call is cheap next to the (B*L, C) matmul.
            w = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
            b = None if self.q_proj.bias is None else torch.cat([self.q_proj.bias, self.k_proj.bias,
                                                                 self.v_proj.bias])
            kv_width = cfg.kv_heads * cfg.head_dim
            q, k, v = F.linear(x, w, b).split([cfg.d_model, kv_width, kv_width], dim=-1)
            k, v = heads(k, cfg.kv_heads), heads(v, cfg.kv_heads)
        else:
            q = self.q_proj(x)
            if context is None:                                              # reuse the cached context keys
                k, v = cache.keys, cache.values
            else:
                k, v = heads(self.k_proj(context), cfg.kv_heads), heads(self.v_proj(context), cfg.kv_heads)
                if cache is not None:                                        # store the context once
                    cache.reset()
                    k, v = cache.append(k, v)
        q = heads(q, cfg.n_heads)
        if getattr(self.positional, "kind", None) == "rotary":
            past = cache.length if cache is not None else 0
            k = self.positional(k, torch.arange(past, past + k.shape[2], device=k.device))
        return q, k, v

    def _bias(self, q: Tensor, L: int, S: int):
        kind = getattr(self.positional, "kind", None)
        if kind == "bias":
            return self.positional.bias()
        if kind == "relative":
            return self.positional.bias(q, L, S, scale=self.scale)
        return None

    def _mask(self, mask, key_mask, B: int, S: int):
        km = key_padding(key_mask, B, S)
        if km is None:
            return mask          # no padding: keeps the request plain, so "auto" can take SDPA's mask-free path
        if mask is None:
            return km
        return km & (masks.dense(mask) if isinstance(mask, Tensor) else mask)

    def _scores(self, q: Tensor, k: Tensor, bias, mask, L: int, S: int) -> Tensor:
        """The logits the softmax saw, (B, H, L, S), in the accumulation dtype (for inspection)."""
        with torch.no_grad():
            kk = k.repeat_interleave(self.cfg.n_heads // k.shape[1], dim=1)   # (B, H, S, D)
            s = (q @ kk.transpose(-2, -1)).to(accum_dtype(q.dtype)) * self.scale
            b = dense_bias(bias, L, S)
            if b is not None:
                s = s + b.to(s.dtype)
            parts = [] if mask is None else [masks.dense(mask) if isinstance(mask, Tensor) else mask]
            parts += [masks.causal()] if self.cfg.causal else []
            for m in parts:
                s = s.masked_fill(~m.dense(L, S).to(s.device), float("-inf"))
            return s


def key_padding(key_mask, B: int, S: int) -> Optional[masks.Mask]:
    """A layer's ``key_mask`` as a structured mask: a (B, S) bool tensor (True = real key) becomes
    ``masks.from_key_mask``'s padding (or dense) mask, None when nothing is padded; a mask (e.g.
    ``masks.padding(lengths)``, what the stacks pass each layer) is used as it is, with no look at values.

    >>> key_padding(torch.tensor([[True, False]]), 1, 2)
    padding([1])
    """
    if key_mask is None or isinstance(key_mask, masks.Mask):
        return key_mask
    if not isinstance(key_mask, Tensor) or key_mask.dtype != torch.bool or tuple(key_mask.shape) != (B, S):
        raise ValueError(f"key_mask must be bool (B={B}, S={S}) with True = real key, or an attnlab mask "
                         f"(masks.padding(lengths)); got {getattr(key_mask, 'dtype', type(key_mask).__name__)} "
                         f"{tuple(getattr(key_mask, 'shape', ()))}")
    return masks.from_key_mask(key_mask)


# AttentionLayer was MultiHeadAttention until issue #29: one letter from torch's MultiheadAttention (nn.torch_mha).
__getattr__ = renamed(globals(), {"MultiHeadAttention": "AttentionLayer"}, __name__)
