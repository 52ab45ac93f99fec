"""From a corpus name to what a language-model trainer eats: tokenizer, train and validation ids.

The tokenizer is trained on the whole corpus (for characters this only fixes the alphabet; for BPE
the merges also see the validation text, a small leak we accept so that every validation
character is encodable). The token stream is then split by ``split_tokens``. ``info`` records the
corpus (name, size, SHA-256 of the text) so a resumed run can check it reads the same data.

Example::

    data = prepare_lm_data("docs", tokenizer="char")
    data.train_ids.shape, data.val_ids.shape, data.tokenizer.vocab_size      # (418613,), (46513,), 103
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Optional, Union

import torch
from torch import Tensor

from .batches import split_tokens
from .corpora import load_corpus
from .tokenization import Tokenizer, train_tokenizer

__all__ = ["LMData", "prepare_lm_data"]


@dataclass
class LMData:
    tokenizer: Tokenizer
    train_ids: Tensor          # (N_train,) int64
    val_ids: Tensor            # (N_val,) int64
    info: dict                 # corpus info + text_sha256, tokens, val_chars

    @property
    def val_chars_per_token(self) -> float:
        return self.info["val_chars"] / max(1, len(self.val_ids))


def prepare_lm_data(data: str, tokenizer: Union[str, Tokenizer] = "char", *, vocab_size: int = 512,
                    val_fraction: float = 0.1, expect_sha256: Optional[str] = None) -> LMData:
    """Load ``data`` (docs | stdlib | a path), tokenize it, split it.

    tokenizer: "char" / "bpe" to train one, or a trained tokenizer (e.g. from a checkpoint).
    expect_sha256: the corpus text's hash from a checkpoint; a different text is a ValueError.
    """
    corpus = load_corpus(data)
    digest = hashlib.sha256(corpus.text.encode("utf-8")).hexdigest()
    if expect_sha256 is not None and digest != expect_sha256:
        raise ValueError(f"the corpus {data!r} is not the text this run was trained on (SHA-256 {digest[:12]}... "
                         f"!= {expect_sha256[:12]}...); resume with the same data, or start a new run with --out")
    tok = train_tokenizer(tokenizer, corpus.text, vocab_size) if isinstance(tokenizer, str) else tokenizer
    ids = torch.tensor(tok.encode(corpus.text), dtype=torch.int64)                   # (N,)
    train_ids, val_ids = split_tokens(ids, val_fraction)
    info = {**corpus.info, "text_sha256": digest, "tokens": len(ids), "val_chars": len(tok.decode(val_ids.tolist()))}
    return LMData(tok, train_ids, val_ids, info)
