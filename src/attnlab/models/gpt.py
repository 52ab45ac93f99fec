"""GPT: a decoder-only transformer (causal self-attention blocks) and KV-cache generation.

    idx (B, L) --tok_emb (+ absolute PE)--> (B, L, C) --n_layers pre-norm blocks--> norm --lm_head--> (B, L, V)

The positional scheme is a config field: ``learned`` / ``sinusoidal`` are added once to the
embeddings (GPT-2); ``rope`` / ``alibi`` act inside every attention layer. The LM head shares the
token embedding's weight (weight tying, Press & Wolf 2017) unless ``tie_weights=False``.

Example::

    model = GPT(GPTConfig.preset("nano", vocab_size=65))
    logits = model(idx)                                   # idx: (B, L) int64 -> (B, L, 65)
    out = model.generate(idx, max_new_tokens=50, top_k=10, seed=0)   # (B, L + 50)
"""
from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from typing import Iterator, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..nn import BlockConfig, TransformerBlock
from ..nn.backend import deprecated_backend_alias
from ..nn.blocks import make_norm
from ..positional import LearnedEncoding, SinusoidalEncoding
from ..presets import from_preset, upgrade_keys
from .sampling import check_sampling, sample_next

__all__ = ["GPTConfig", "GPT", "PRESETS"]

log = logging.getLogger(__name__)

# nanoGPT-style presets: dict overrides of GPTConfig's defaults.
PRESETS: dict[str, dict] = {
    "nano": dict(n_layers=2, n_heads=4, d_model=64, max_len=128),
    "micro": dict(n_layers=4, n_heads=4, d_model=128, max_len=256),
    "mini": dict(n_layers=6, n_heads=6, d_model=384, max_len=256),
}


@dataclass
class GPTConfig:
    vocab_size: int                            # tokens the tokenizer can produce
    max_len: int = 256                         # the context: most tokens one forward pass sees
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: Optional[int] = None           # GQA/MQA: fewer kv heads shrink the KV cache
    d_model: int = 128
    positional: str = "learned"                # learned | sinusoidal | rope | alibi
    dropout: float = 0.0                       # residual and attention dropout (training only)
    bias: bool = True                          # biases in linears and LayerNorms (GPT-2 has them)
    norm: str = "layer"                        # layer | rms
    mlp: str = "gelu"                          # gelu | swiglu
    tie_weights: bool = True                   # lm_head.weight is tok_emb.weight
    backend: str = "auto"                      # attention backend by name
    extra: dict = field(default_factory=dict)  # positional options, e.g. {"base": 10000.0} for RoPE

    def __post_init__(self):
        if self.positional not in ("learned", "sinusoidal", "rope", "alibi"):
            raise ValueError(f"GPT positional must be learned, sinusoidal, rope or alibi, got {self.positional!r}")
        if self.vocab_size <= 0 or self.max_len <= 0 or self.n_layers <= 0:
            raise ValueError(f"vocab_size, max_len and n_layers must be positive, got {self.vocab_size}, "
                             f"{self.max_len}, {self.n_layers}")

    @classmethod
    def preset(cls, name: str, **overrides) -> "GPTConfig":
        return from_preset(cls, PRESETS, name, overrides, what="GPT")

    @classmethod
    def from_dict(cls, d: dict) -> "GPTConfig":
        """From ``to_dict()``'s output, or an older checkpoint's (``n_layer``, ``n_head``, ``block_size``)."""
        return cls(**upgrade_keys(d))

    def to_dict(self) -> dict:
        return asdict(self)

    def block(self) -> BlockConfig:
        in_layer = self.positional in ("rope", "alibi")
        return BlockConfig(d_model=self.d_model, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, norm=self.norm,
                           norm_first=True, mlp=self.mlp, dropout=self.dropout, attn_dropout=self.dropout,
                           causal=True, positional=self.positional if in_layer else None,
                           positional_options=self.extra, bias=self.bias, backend=self.backend)


class GPT(nn.Module):
    """Decoder-only language model; ``forward(idx) -> logits``, ``generate`` with a KV cache."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if cfg.positional == "learned":
            self.pos_enc = LearnedEncoding(cfg.max_len, cfg.d_model)
        elif cfg.positional == "sinusoidal":
            self.pos_enc = SinusoidalEncoding(cfg.d_model)
        else:
            self.pos_enc = None                                        # rope / alibi live in the layers
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(TransformerBlock(cfg.block()) for _ in range(cfg.n_layers))
        self.norm = make_norm(cfg.block())
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init)
        if cfg.tie_weights:
            self.lm_head.weight = self.tok_emb.weight
        # GPT-2: residual projections scaled by 1/sqrt(2 n_layers) so the stream's variance stays put
        for name, p in self.named_parameters():
            if name.endswith(("out_proj.weight", "mlp.down.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: Tensor, *, cache: Optional[list] = None, capture: Optional[list] = None) -> Tensor:
        """Logits (B, L, V) for token ids idx (B, L).

        cache: per-layer ``KVCache`` list from ``new_cache`` (the new tokens follow the cached ones).
        capture: a list that receives each layer's ``Intermediates`` (scores, weights (B, H, L, S)).
        """
        if not isinstance(idx, Tensor) or idx.dim() != 2 or idx.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"idx must be an int64 tensor (B, L), got {getattr(idx, 'dtype', type(idx))} "
                            f"{tuple(getattr(idx, 'shape', ()))}")
        past = cache[0].length if cache else 0
        L = idx.shape[1]
        if past + L > self.cfg.max_len:
            raise ValueError(f"{past} cached + {L} new tokens exceed max_len={self.cfg.max_len}; "
                             "crop the context to the last max_len tokens")
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.cfg.vocab_size):
            raise ValueError(f"token ids must be in [0, {self.cfg.vocab_size}), "
                             f"got [{int(idx.min())}, {int(idx.max())}]")
        x = self.tok_emb(idx)                                          # (B, L, C)
        if self.pos_enc is not None:
            x = self.pos_enc(x, past)
        x = self.drop(x)
        for n, block in enumerate(self.blocks):
            x = block(x, cache=None if cache is None else (cache[n],), capture=capture)
        return self.lm_head(self.norm(x))                              # (B, L, V)

    def loss(self, idx: Tensor, targets: Tensor) -> Tensor:
        """Mean next-token cross-entropy (nats per token); targets (B, L), -100 = ignore."""
        logits = self(idx)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)

    def new_cache(self, batch: int, capacity: Optional[int] = None) -> list:
        capacity = capacity or self.cfg.max_len
        return [b.self_attn.new_cache(batch, capacity) for b in self.blocks]

    def generate_tokens(self, idx: Tensor, max_new_tokens: int, *, temperature: float = 1.0,
                        top_k: Optional[int] = None, top_p: Optional[float] = None, seed: Optional[int] = None,
                        use_cache: bool = True) -> Iterator[Tensor]:
        """Yield the next token ids (B,) one step at a time (for streaming).

        Arguments are checked here, before the first token (a ValueError, not a failure mid-stream).
        ``seed=None`` samples from a private copy of torch's global RNG state: ``torch.manual_seed``
        makes it reproducible, and the global RNG is neither advanced nor reseeded (so two unseeded
        calls in a row give the same sample; pass ``seed=`` to vary it). A prompt longer than
        max_len is cropped from the left (with a warning). When the context fills up, the model
        continues on the last max_len // 2 tokens (re-encoded), with a warning the first time.
        """
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        check_sampling(temperature=temperature, top_k=top_k, top_p=top_p)
        gen = torch.Generator(device=idx.device)
        if seed is not None:
            gen.manual_seed(seed)
        elif idx.device.type == "cuda":
            gen.set_state(torch.cuda.get_rng_state(idx.device))
        else:
            gen.set_state(torch.get_rng_state())           # a copy: the global generator is left as it was
        T = self.cfg.max_len
        if idx.shape[1] > T:
            log.warning("prompt of %d tokens is longer than the context (%d): keeping the last %d",
                        idx.shape[1], T, T)
            idx = idx[:, -T:]
        return self._sample(idx, max_new_tokens, gen, dict(temperature=temperature, top_k=top_k, top_p=top_p),
                            use_cache)

    @torch.no_grad()
    def _sample(self, idx: Tensor, max_new_tokens: int, gen: torch.Generator, knobs: dict,
                use_cache: bool) -> Iterator[Tensor]:
        """generate_tokens' loop (a generator: it runs as tokens are taken)."""
        was_training = self.training
        self.eval()
        T, warned = self.cfg.max_len, False
        try:
            context, cache = idx, (self.new_cache(idx.shape[0]) if use_cache else None)
            logits = self(context, cache=cache)[:, -1]                  # (B, V)
            for _ in range(max_new_tokens):
                nxt = sample_next(logits, **knobs, generator=gen)
                yield nxt
                context = torch.cat([context, nxt[:, None]], dim=1)
                if context.shape[1] > T:                               # full: restart on the recent half
                    if not warned:
                        log.warning("the context (%d tokens) is full: generation continues on the last %d "
                                    "tokens, so later text no longer sees the start", T, T // 2)
                        warned = True
                    context = context[:, -(T // 2):]
                    cache = self.new_cache(idx.shape[0]) if use_cache else None
                    logits = self(context, cache=cache)[:, -1]
                elif use_cache:
                    logits = self(nxt[:, None], cache=cache)[:, -1]
                else:
                    logits = self(context)[:, -1]
        finally:
            self.train(was_training)

    def generate(self, idx: Tensor, max_new_tokens: int, **kwargs) -> Tensor:
        """idx (B, L) followed by max_new_tokens sampled tokens: (B, L + max_new_tokens)."""
        new = list(self.generate_tokens(idx, max_new_tokens, **kwargs))
        return torch.cat([idx, torch.stack(new, 1)], 1) if new else idx

    def with_backend(self, backend: str) -> "GPT":
        """Deprecated: ``attnlab.nn.set_backend(model, backend)`` (validated, every layer)."""
        return deprecated_backend_alias(self, backend, "GPT.with_backend")
