"""Seq2Seq: the encoder-decoder Transformer (Vaswani et al. 2017), greedy and beam decoding.

    src (B, S) --emb * sqrt(C) + PE--> encoder (self-attention, source padding masked) --> memory (B, S, C)
    tgt_in (B, L) --emb * sqrt(C) + PE--> decoder (causal self-attention + cross-attention to memory,
                                            source padding masked) --> (B, L, C) --out (tied)--> (B, L, V)

Padding is right-padding with ``pad_id`` and enters attention only as key masks: source pads are
never attended to (encoder self-attention and cross-attention), target pads sit after the real
tokens, where the causal mask already hides them, and are ignored by the loss. A row's result is
therefore independent of how much padding its batch added (tested).

Decoding uses the decoder's KV caches: the self-attention cache grows by one key per step; the
cross-attention keys and values are computed once per source (beam search computes them for the
B sources and copies them to the B * beam rows). Greedy and beam search never emit PAD or BOS.

Example::

    model = Seq2Seq(Seq2SeqConfig.preset("small", vocab_size=19))
    loss = model.loss(src, tgt_in, tgt_out)          # (B, S), (B, L), (B, L) int64 -> scalar
    out = model.greedy(src, max_len=24)              # (B, T): tokens after BOS, EOS included, then PAD
    out = model.beam_search(src, beam=4, max_len=24)
    maps = model.cross_attention(src, tgt_in)        # (B, layers, heads, L, S)
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Iterator, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..nn import BlockConfig, DecoderStack, EncoderStack
from ..positional import LearnedEncoding, SinusoidalEncoding
from ..presets import from_preset

__all__ = ["Seq2SeqConfig", "Seq2Seq", "SEQ2SEQ_PRESETS", "POSITIONAL_CHOICES"]

# absolute schemes are added to the embeddings; the others act inside every self-attention layer
ABSOLUTE, IN_LAYER = ("sinusoidal", "learned"), ("rope", "alibi", "t5")
POSITIONAL_CHOICES = ABSOLUTE + IN_LAYER + ("none",)

SEQ2SEQ_PRESETS: dict[str, dict] = {
    "tiny": dict(d_model=32, n_heads=4, n_encoder_layers=1, n_decoder_layers=1),     # tests
    "small": dict(d_model=128, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, dropout=0.0),  # tasks
    # the paper's base model (Table 3): post-norm, dropout 0.1
    "base": dict(d_model=512, n_heads=8, n_encoder_layers=6, n_decoder_layers=6, d_ff=2048, norm_first=False),
}


@dataclass
class Seq2SeqConfig:
    vocab_size: int                            # source vocabulary (and target's when tgt_vocab_size is None)
    tgt_vocab_size: Optional[int] = None       # None: one vocabulary for both sides
    d_model: int = 128
    n_heads: int = 4
    n_encoder_layers: int = 2
    n_decoder_layers: int = 2
    d_ff: Optional[int] = None                 # MLP width; None = 4 d_model
    dropout: float = 0.1                       # residual, embedding and attention dropout (the paper's 0.1)
    norm_first: bool = True                    # pre-norm trains without a long warm-up; False = the 2017 post-norm
    positional: str = "sinusoidal"             # one of POSITIONAL_CHOICES (the paper's sinusoid by default)
    max_len: int = 256                         # longest source or target (learned table; default decoding cap)
    share_embeddings: bool = True              # one table for source and target tokens (needs one vocabulary)
    tie_output: bool = True                    # output projection = target embedding (Press & Wolf 2017)
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    backend: str = "auto"                      # attention backend by name
    extra: dict = field(default_factory=dict)  # positional options, e.g. {"max_distance": 32} for T5

    def __post_init__(self):
        if self.positional not in POSITIONAL_CHOICES:
            raise ValueError(f"positional must be one of {POSITIONAL_CHOICES}, got {self.positional!r}")
        for name in ("vocab_size", "d_model", "n_heads", "n_encoder_layers", "n_decoder_layers", "max_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"Seq2SeqConfig.{name} must be positive, got {getattr(self, name)}")
        if self.share_embeddings and self.tgt_vocab_size not in (None, self.vocab_size):
            raise ValueError(f"share_embeddings needs one vocabulary, but vocab_size={self.vocab_size} and "
                             f"tgt_vocab_size={self.tgt_vocab_size}; set share_embeddings=False")
        specials = {"pad_id": self.pad_id, "bos_id": self.bos_id, "eos_id": self.eos_id}
        if len(set(specials.values())) != 3 or not all(0 <= i < self.target_vocab for i in specials.values()):
            raise ValueError(f"pad, bos and eos ids must be distinct and < the target vocabulary "
                             f"({self.target_vocab}), got {specials}")

    @property
    def target_vocab(self) -> int:
        return self.tgt_vocab_size or self.vocab_size

    @classmethod
    def preset(cls, name: str, **overrides) -> "Seq2SeqConfig":
        return from_preset(cls, SEQ2SEQ_PRESETS, name, overrides, what="seq2seq")

    def to_dict(self) -> dict:
        return asdict(self)

    def block(self) -> BlockConfig:
        return BlockConfig(d_model=self.d_model, n_heads=self.n_heads, d_ff=self.d_ff, norm="layer",
                           norm_first=self.norm_first, mlp="gelu", dropout=self.dropout,
                           attn_dropout=self.dropout, positional=self.positional if self.positional in IN_LAYER
                           else None, positional_options=self.extra, backend=self.backend)


class Seq2Seq(nn.Module):
    """Encoder-decoder Transformer; ``loss`` (teacher forcing), ``greedy``, ``beam_search``."""

    def __init__(self, cfg: Seq2SeqConfig):
        super().__init__()
        self.cfg = cfg
        C = cfg.d_model
        self.src_emb = nn.Embedding(cfg.vocab_size, C)
        self.tgt_emb = self.src_emb if cfg.share_embeddings else nn.Embedding(cfg.target_vocab, C)
        if cfg.positional == "learned":                 # source and target positions are separate sequences
            self.src_pos, self.tgt_pos = LearnedEncoding(cfg.max_len, C), LearnedEncoding(cfg.max_len, C)
        elif cfg.positional == "sinusoidal":
            self.src_pos = self.tgt_pos = SinusoidalEncoding(C)
        else:
            self.src_pos = self.tgt_pos = None
        self.drop = nn.Dropout(cfg.dropout)
        self.encoder = EncoderStack(cfg.block(), cfg.n_encoder_layers)
        self.decoder = DecoderStack(cfg.block(), cfg.n_decoder_layers)
        self.out = None if cfg.tie_output else nn.Linear(C, cfg.target_vocab, bias=False)
        for emb in {self.src_emb, self.tgt_emb}:
            # N(0, 1/C) times sqrt(C) in forward: unit-variance token vectors, on the scale of the sinusoid,
            # and tied output logits of unit scale (the paper's scaling, section 3.4)
            nn.init.normal_(emb.weight, std=C ** -0.5)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # -- the two halves -----------------------------------------------------------------------------
    def encode(self, src: Tensor, *, capture: Optional[list] = None) -> tuple[Tensor, Tensor]:
        """Memory (B, S, C) and the source key mask (B, S) (True = real token) for src (B, S) int64."""
        mask = self._check_source(src)                                     # (B, S)
        x = self.src_emb(src) * math.sqrt(self.cfg.d_model)                # (B, S, C)
        if self.src_pos is not None:
            x = self.src_pos(x)
        return self.encoder(self.drop(x), key_mask=mask, capture=capture), mask

    def decode(self, tgt_in: Tensor, memory: Optional[Tensor], src_mask: Tensor, *, cache: Optional[list] = None,
               capture: Optional[list] = None) -> Tensor:
        """Logits (B, L, V) for target inputs tgt_in (B, L) given the encoder's memory (B, S, C).

        cache: from ``decoder.new_cache``; the new tokens follow the cached ones. Once the cross-attention
        caches hold the memory's keys (after the first cached call), memory may be None.
        """
        self._check_ids(tgt_in, "tgt_in", self.cfg.target_vocab)
        past = cache[0][0].length if cache else 0
        x = self.tgt_emb(tgt_in) * math.sqrt(self.cfg.d_model)             # (B, L, C)
        if self.tgt_pos is not None:
            x = self.tgt_pos(x, past)
        h = self.decoder(self.drop(x), memory, memory_mask=src_mask, cache=cache, capture=capture)
        return self.out(h) if self.out is not None else F.linear(h, self.tgt_emb.weight)   # (B, L, V)

    def forward(self, src: Tensor, tgt_in: Tensor, *, capture: Optional[list] = None) -> Tensor:
        """Logits (B, L, V) for src (B, S) and teacher-forced target inputs tgt_in (B, L) (BOS first).

        capture: a list receiving each encoder layer's ``Intermediates``, then per decoder layer
        those of its self-attention and of its cross-attention (weights (B, H, L, S)).
        """
        memory, mask = self.encode(src, capture=capture)
        return self.decode(tgt_in, memory, mask, capture=capture)

    def loss(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> Tensor:
        """Mean cross-entropy (nats per target token) over the non-pad tokens of tgt_out (B, L)."""
        if tgt_out.shape != tgt_in.shape:
            raise ValueError(f"tgt_out {tuple(tgt_out.shape)} must have tgt_in's shape {tuple(tgt_in.shape)} "
                             "(tgt_out is tgt_in shifted left by one, ending with EOS)")
        logits = self(src, tgt_in)                                         # (B, L, V)
        return F.cross_entropy(logits.flatten(0, 1).float(), tgt_out.flatten(), ignore_index=self.cfg.pad_id)

    @torch.no_grad()
    def cross_attention(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Cross-attention weights (B, decoder layers, heads, L, S); each row sums to 1 over real sources."""
        with _eval_mode(self):
            memory, mask = self.encode(src)
            captured: list = []
            self.decode(tgt_in, memory, mask, capture=captured)
        return torch.stack([c.weights for c in captured[1::2]], dim=1)     # (B, layers, H, L, S)

    # -- decoding -----------------------------------------------------------------------------------
    def _next_log_probs(self, logits: Tensor) -> Tensor:
        """log p (rows, V) of the next token; PAD and BOS are never generated."""
        logits = logits.float().clone()
        logits[:, [self.cfg.pad_id, self.cfg.bos_id]] = float("-inf")
        return logits.log_softmax(-1)

    def _decode_len(self, max_len: Optional[int]) -> int:
        T = self.cfg.max_len if max_len is None else max_len
        if not 1 <= T <= self.cfg.max_len:       # the decoder sees up to T inputs: BOS + T - 1 tokens
            raise ValueError(f"max_len must be in [1, {self.cfg.max_len}] (Seq2SeqConfig.max_len), got {max_len}")
        return T

    @torch.no_grad()
    def greedy(self, src: Tensor, *, max_len: Optional[int] = None, use_cache: bool = True) -> Tensor:
        """Greedy decoding: (B, T) generated ids (no BOS), each row ending at its EOS then PAD; T <= max_len.

        use_cache=False recomputes the whole prefix at every step (for testing the cache).
        """
        with _eval_mode(self):
            memory, mask = self.encode(src)
            B, T = src.shape[0], self._decode_len(max_len)
            cache = self.decoder.new_cache(B, T, memory.shape[1]) if use_cache else None
            seq = torch.full((B, 1), self.cfg.bos_id, dtype=torch.long, device=src.device)   # (B, 1 + t)
            done = torch.zeros(B, dtype=torch.bool, device=src.device)
            for t in range(T):
                if use_cache:       # after step 0 the cross-attention caches hold the memory's keys
                    logits = self.decode(seq[:, -1:], memory if t == 0 else None, mask, cache=cache)[:, -1]
                else:
                    logits = self.decode(seq, memory, mask)[:, -1]                 # (B, V)
                nxt = self._next_log_probs(logits).argmax(-1)                      # (B,)
                nxt = nxt.masked_fill(done, self.cfg.pad_id)
                seq = torch.cat([seq, nxt[:, None]], dim=1)
                done |= nxt == self.cfg.eos_id
                if bool(done.all()):
                    break
            return seq[:, 1:]

    @torch.no_grad()
    def beam_search(self, src: Tensor, *, beam: int = 4, length_penalty: float = 1.0,
                    max_len: Optional[int] = None, return_scores: bool = False):
        """Beam search: (B, T) best hypothesis per source (no BOS, EOS included, then PAD).

        Each step extends every live beam by every token and keeps, per source, the best 2 * beam
        candidates by summed log-probability: in that order, those ending in EOS become finished
        hypotheses until ``beam`` others are kept alive. A source is done when it has ``beam``
        finished hypotheses (fairseq's rule) or at max_len (its live beams then count as finished).
        The answer is the finished hypothesis with the best score / length ** length_penalty
        (length counts EOS; 0 = pure log-probability, > 0 favours longer outputs). beam=1 is greedy.
        return_scores: also return that score per source (B,).
        """
        self.check_beam(beam, self.cfg.target_vocab)
        with _eval_mode(self):
            out, scores = self._beam_search(src, beam, length_penalty, self._decode_len(max_len))
        return (out, scores) if return_scores else out

    @staticmethod
    def check_beam(beam: int, vocab: int) -> None:
        """A beam needs that many distinct non-EOS tokens to extend: 1 <= beam <= vocab - 3."""
        if not isinstance(beam, int) or not 1 <= beam <= vocab - 3:
            raise ValueError(f"beam must be an int in [1, {vocab - 3}] (the target vocabulary less PAD, BOS and "
                             f"EOS), got {beam!r}")

    def _beam_search(self, src: Tensor, K: int, alpha: float, T: int) -> tuple[Tensor, Tensor]:
        cfg, dev, V = self.cfg, src.device, self.cfg.target_vocab
        memory, mask = self.encode(src)
        B, S = mask.shape
        cache = self.decoder.new_cache(B, T, S)
        bos = torch.full((B, 1), cfg.bos_id, dtype=torch.long, device=dev)
        logp = self._next_log_probs(self.decode(bos, memory, mask, cache=cache)[:, -1])   # (B * n, V), n = 1
        scores = torch.zeros(B, 1, device=dev)                                 # (B, n) summed log p per beam
        hist = torch.zeros(B, 0, dtype=torch.long, device=dev)                 # (B * n, t) tokens so far
        finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]
        done = [False] * B
        for t in range(T):
            n = scores.shape[1]
            cand = (scores[:, :, None] + logp.view(B, n, V)).view(B, n * V)    # (B, n V)
            top_s, top_i = cand.topk(min(2 * K, n * V), dim=1)                  # (B, 2K)
            rows, toks, new_scores = [], [], []
            for b, (ss, ii) in enumerate(zip(top_s.tolist(), top_i.tolist())):
                kept = 0
                for s, i in zip(ss, ii):
                    parent, tok = b * n + i // V, i % V
                    if tok == cfg.eos_id:
                        if not done[b]:
                            finished[b].append((s / (t + 1) ** alpha, hist[parent].tolist() + [tok]))
                        continue
                    rows.append(parent), toks.append(tok), new_scores.append(s)
                    kept += 1
                    if kept == K:
                        break
                done[b] = done[b] or len(finished[b]) >= K
            rows_t = torch.tensor(rows, device=dev)                              # (B K,) parent row per beam
            hist = torch.cat([hist[rows_t], torch.tensor(toks, device=dev)[:, None]], dim=1)   # (B K, t + 1)
            scores = torch.tensor(new_scores, device=dev).view(B, K)
            if all(done) or t == T - 1:
                break
            for self_cache, cross_cache in cache:
                self_cache.select(rows_t)
                if t == 0:          # beams of one source share its memory keys: copied once, never reordered
                    cross_cache.select(rows_t)
            if t == 0:
                mask = mask[rows_t]                                              # (B K, S)
            logp = self._next_log_probs(self.decode(hist[:, -1:], None, mask, cache=cache)[:, -1])  # (B K, V)
        for b in range(B):                  # out of length: live beams compete with the finished ones
            if not done[b]:
                finished[b] += [(s / T ** alpha, hist[b * K + k].tolist()) for k, s in enumerate(scores[b].tolist())]
        best = [max(f, key=lambda h: h[0]) for f in finished]
        out = torch.full((B, max(len(h) for _, h in best)), cfg.pad_id, dtype=torch.long, device=dev)
        for b, (_, h) in enumerate(best):
            out[b, : len(h)] = torch.tensor(h, device=dev)
        return out, torch.tensor([s for s, _ in best], device=dev)

    def generate(self, src: Tensor, *, beam: int = 1, **kwargs) -> Tensor:
        """Greedy decoding when beam == 1, else beam search (kwargs: max_len, length_penalty)."""
        if beam == 1:
            kwargs.pop("length_penalty", None)
            return self.greedy(src, **kwargs)
        return self.beam_search(src, beam=beam, **kwargs)

    # -- checks -------------------------------------------------------------------------------------
    def _check_ids(self, ids: Tensor, name: str, vocab: int) -> None:
        if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"{name} must be an int64 tensor (B, length), got {getattr(ids, 'dtype', type(ids))} "
                            f"{tuple(getattr(ids, 'shape', ()))}")
        if ids.shape[1] > self.cfg.max_len:
            raise ValueError(f"{name} has {ids.shape[1]} tokens, more than max_len={self.cfg.max_len}; "
                             "truncate it or build the model with a larger Seq2SeqConfig.max_len")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            raise ValueError(f"{name} ids must be in [0, {vocab}), got [{int(ids.min())}, {int(ids.max())}]")

    def _check_source(self, src: Tensor) -> Tensor:
        """The key mask (B, S) of src; an empty source (length 0 or all padding) is an error."""
        self._check_ids(src, "src", self.cfg.vocab_size)
        if src.shape[1] == 0:
            raise ValueError(f"the source sequences are empty (src has shape {tuple(src.shape)}): give every "
                             "example at least one token, e.g. end each source with EOS")
        mask = src != self.cfg.pad_id                                      # (B, S)
        empty = (~mask.any(dim=1)).nonzero().flatten().tolist()
        if empty:
            raise ValueError(f"source rows {empty[:10]} are all padding (pad_id={self.cfg.pad_id}): nothing to "
                             "attend to; drop empty examples or give each source at least one token (e.g. EOS)")
        return mask


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """Dropout off inside; the caller's train/eval mode restored after."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
