"""The code model's baselines: a token-level LSTM language model and a bigram model.

Both have the GPT's language-model interface — ``forward(idx) -> logits``, ``loss(idx, targets)``
and ``generate_tokens(...)`` yielding one (B,) token step at a time — so the syntax measurement
samples all three models with the same code and the same sampling settings.

- ``CodeLSTM``: embedding -> ``torch.nn.LSTM`` (``n_layers`` layers) -> linear head (not tied).
  ``matched_lstm_config(target, ...)`` picks the hidden width whose parameter count is nearest
  ``target`` (the GPT's), so the comparison is at equal size.
- ``BigramLM``: the next token depends on the current one only; log-probabilities from counts of
  the training stream with add-``alpha`` smoothing (no training loop).

Example::

    lstm = CodeLSTM(matched_lstm_config(gpt.num_params(), vocab_size=1024, d_embed=128))
    bigram = BigramLM.from_ids(train_ids, vocab_size=1024)
    next(bigram.generate_tokens(torch.tensor([[5, 7]]), 10, seed=0))       # (1,)
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterator, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..models.sampling import sample_next
from ..presets import upgrade_keys

__all__ = ["CodeLSTMConfig", "CodeLSTM", "matched_lstm_config", "BigramLM", "load_language_model"]


@dataclass
class CodeLSTMConfig:
    vocab_size: int
    d_embed: int = 128
    hidden: int = 256
    n_layers: int = 2
    arch: str = "lstm"                 # tells a checkpoint's model_config from a GPTConfig

    def __post_init__(self):
        if min(self.vocab_size, self.d_embed, self.hidden, self.n_layers) < 1:
            raise ValueError(f"CodeLSTMConfig sizes must be >= 1, got {self}")

    @classmethod
    def from_dict(cls, d: dict) -> "CodeLSTMConfig":
        """From ``to_dict()``'s output, or an older checkpoint's (``n_layer``)."""
        return cls(**upgrade_keys(d))

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def max_len(self) -> int:
        """No context limit: the state carries everything (``attnlab generate`` crops prompts to this)."""
        return 1 << 30


def _lstm_params(vocab: int, d_embed: int, hidden: int, n_layers: int) -> int:
    """Embedding + LSTM layers (4 gates: W_ih, W_hh, two biases) + head."""
    first = 4 * hidden * (d_embed + hidden + 2)
    rest = (n_layers - 1) * 4 * hidden * (2 * hidden + 2)
    return vocab * d_embed + first + rest + hidden * vocab + vocab


def matched_lstm_config(target: int, vocab_size: int, d_embed: int = 128, n_layers: int = 2) -> CodeLSTMConfig:
    """The CodeLSTMConfig whose parameter count is nearest ``target`` (searching the hidden width)."""
    hidden = min(range(1, 4096), key=lambda h: abs(_lstm_params(vocab_size, d_embed, h, n_layers) - target))
    return CodeLSTMConfig(vocab_size=vocab_size, d_embed=d_embed, hidden=hidden, n_layers=n_layers)


class _Sampling(nn.Module):
    """``generate_tokens`` for models that step with a recurrent state: ``step(idx, state) -> (logits, state)``."""

    def step(self, idx: Tensor, state):                  # (B, L) -> (B, L, V), new state
        raise NotImplementedError

    @torch.no_grad()
    def generate_tokens(self, idx: Tensor, max_new_tokens: int, *, temperature: float = 1.0,
                        top_k: Optional[int] = None, top_p: Optional[float] = None, seed: Optional[int] = None,
                        use_cache: bool = True) -> Iterator[Tensor]:
        """Yield the next token ids (B,) one step at a time (``use_cache`` is accepted and has no effect)."""
        was_training = self.training
        self.eval()
        gen = torch.Generator(device=idx.device)
        gen.manual_seed(seed if seed is not None else torch.seed())
        try:
            logits, state = self.step(idx, None)
            for _ in range(max_new_tokens):
                nxt = sample_next(logits[:, -1], temperature=temperature, top_k=top_k, top_p=top_p, generator=gen)
                yield nxt
                logits, state = self.step(nxt[:, None], state)
        finally:
            self.train(was_training)

    def loss(self, idx: Tensor, targets: Tensor) -> Tensor:
        """Mean next-token cross-entropy (nats per token); targets (B, L)."""
        return F.cross_entropy(self(idx).flatten(0, 1).float(), targets.flatten(), ignore_index=-100)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


class CodeLSTM(_Sampling):
    """Token LSTM language model: (B, L) ids -> (B, L, V) logits, causal by construction."""

    def __init__(self, cfg: CodeLSTMConfig):
        super().__init__()
        self.cfg = cfg
        self.emb = nn.Embedding(cfg.vocab_size, cfg.d_embed)
        self.rnn = nn.LSTM(cfg.d_embed, cfg.hidden, num_layers=cfg.n_layers, batch_first=True)
        self.head = nn.Linear(cfg.hidden, cfg.vocab_size)

    def step(self, idx: Tensor, state):
        out, state = self.rnn(self.emb(idx), state)          # (B, L, hidden)
        return self.head(out), state                         # (B, L, V)

    def forward(self, idx: Tensor) -> Tensor:
        return self.step(idx, None)[0]


class BigramLM(_Sampling):
    """p(next | current) from counts: ``log_probs`` (V, V), row = current token."""

    def __init__(self, log_probs: Tensor):
        super().__init__()
        self.register_buffer("log_probs", log_probs)

    @classmethod
    def from_ids(cls, ids: Tensor, vocab_size: int, alpha: float = 0.01) -> "BigramLM":
        """Counts of (ids[t], ids[t+1]) in the stream ids (N,), plus ``alpha`` for every pair."""
        counts = torch.full((vocab_size * vocab_size,), alpha, dtype=torch.float64)
        counts.index_add_(0, ids[:-1] * vocab_size + ids[1:], torch.ones(len(ids) - 1, dtype=torch.float64))
        counts = counts.view(vocab_size, vocab_size)                                 # (V, V)
        return cls((counts / counts.sum(1, keepdim=True)).log().float())

    def step(self, idx: Tensor, state):
        return self.log_probs[idx], None                     # (B, L, V)

    def forward(self, idx: Tensor) -> Tensor:
        return self.log_probs[idx]


def load_language_model(path):
    """(model in eval mode, tokenizer) of a checkpoint: a GPT (any task), or a ``train code --arch lstm`` LSTM."""
    from ..data.tokenization import tokenizer_from_json
    from ..train.checkpoint import load_checkpoint, load_gpt
    ckpt = load_checkpoint(path, train_state=False)          # generation needs the weights only
    if ckpt.model_config.get("arch") != "lstm":
        return load_gpt(path)
    model = CodeLSTM(CodeLSTMConfig.from_dict(ckpt.model_config))
    model.load_state_dict(ckpt.model_state)
    return model.eval(), tokenizer_from_json(ckpt.tokenizer_json)
