"""Tokenizers: characters, or a byte-level BPE trained with the ``tokenizers`` library.

Both map text to int ids and back, and serialize to a JSON string so a checkpoint carries its
own tokenizer (``tokenizer_from_json`` rebuilds either kind).

- ``CharTokenizer``: the vocabulary is the sorted set of characters of the training text. A
  character it has not seen cannot be encoded (ValueError naming it): there is no "unknown" id,
  so decode(encode(s)) == s always holds.
- ``BPETokenizer``: byte-level BPE (GPT-2's scheme: ByteLevel pre-tokenizer and decoder, no
  normalizer), so any text encodes and round-trips exactly. Training is deterministic for the same
  text and vocab size (checked by a test).

Example::

    tok = train_tokenizer("char", text)                 # or "bpe", vocab_size=512
    ids = tok.encode("def f():")                        # list[int]
    assert tok.decode(ids) == "def f():"
    same = tokenizer_from_json(tok.to_json())
"""
from __future__ import annotations

import json
from typing import Iterable, Protocol

__all__ = ["Tokenizer", "CharTokenizer", "BPETokenizer", "tokenizer_from_json", "train_tokenizer",
           "IncrementalDecoder", "TOKENIZER_KINDS"]

TOKENIZER_KINDS = ("char", "bpe")


class Tokenizer(Protocol):
    kind: str

    @property
    def vocab_size(self) -> int: ...
    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: Iterable[int]) -> str: ...
    def to_json(self) -> str: ...


class CharTokenizer:
    """One id per character; ids follow the sorted order of the training text's characters."""

    kind = "char"

    def __init__(self, chars: Iterable[str]):
        chars = list(chars)
        if not chars or any(not isinstance(c, str) or len(c) != 1 for c in chars) or len(set(chars)) != len(chars):
            raise ValueError("CharTokenizer needs a non-empty list of distinct single characters")
        self.chars = chars
        self._index = {c: i for i, c in enumerate(chars)}

    @classmethod
    def train(cls, text: str) -> "CharTokenizer":
        if not text:
            raise ValueError("cannot build a character vocabulary from empty text")
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        index = self._index
        try:
            return [index[c] for c in text]
        except KeyError:
            unknown = sorted({c for c in text if c not in index})
            shown = ", ".join(repr(c) for c in unknown[:10])
            shown += f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
            raise ValueError(f"the character tokenizer does not know {shown} (its {self.vocab_size} characters come "
                             "from the training text); remove them from the prompt, or train with --tokenizer bpe, "
                             "which encodes any text") from None

    def decode(self, ids: Iterable[int]) -> str:
        try:
            return "".join(self.chars[int(i)] for i in ids)
        except IndexError:
            raise ValueError(f"token ids must be in [0, {self.vocab_size})") from None

    def to_json(self) -> str:
        return json.dumps({"kind": "char", "chars": self.chars}, ensure_ascii=False)


class BPETokenizer:
    """Byte-level BPE (``tokenizers`` library): any UTF-8 text in, exact round trip."""

    kind = "bpe"

    def __init__(self, hf_tokenizer):
        self._tok = hf_tokenizer

    @classmethod
    def train(cls, text: str, vocab_size: int = 512) -> "BPETokenizer":
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        if vocab_size < len(alphabet):
            raise ValueError(f"a byte-level BPE needs vocab_size >= {len(alphabet)} (the byte alphabet), "
                             f"got {vocab_size}")
        if not text:
            raise ValueError("cannot train a BPE tokenizer on empty text")
        tok = HFTokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=alphabet, special_tokens=[],
                                      show_progress=False)
        # lines as the training "sentences": the pre-tokenizer never merges across them anyway
        tok.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
        return cls(tok)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def decode(self, ids: Iterable[int]) -> str:
        ids = [int(i) for i in ids]
        if any(not 0 <= i < self.vocab_size for i in ids):
            raise ValueError(f"token ids must be in [0, {self.vocab_size})")
        return self._tok.decode(ids)

    def to_json(self) -> str:
        return json.dumps({"kind": "bpe", "tokenizer": json.loads(self._tok.to_str())}, ensure_ascii=False)


def train_tokenizer(kind: str, text: str, vocab_size: int = 512) -> Tokenizer:
    """A ``"char"`` or ``"bpe"`` tokenizer trained on text (vocab_size: BPE only)."""
    if kind == "char":
        return CharTokenizer.train(text)
    if kind == "bpe":
        return BPETokenizer.train(text, vocab_size)
    raise ValueError(f"unknown tokenizer {kind!r}; choose from {list(TOKENIZER_KINDS)}")


def tokenizer_from_json(s: str) -> Tokenizer:
    """Rebuild a tokenizer saved with ``to_json()`` (either kind)."""
    try:
        obj = json.loads(s)
        kind = obj["kind"]
    except (json.JSONDecodeError, TypeError, KeyError) as e:
        raise ValueError(f"not a saved attnlab tokenizer ({e}); expected JSON with a 'kind' of "
                         f"{list(TOKENIZER_KINDS)}") from None
    if kind == "char":
        return CharTokenizer(obj["chars"])
    if kind == "bpe":
        from tokenizers import Tokenizer as HFTokenizer
        return BPETokenizer(HFTokenizer.from_str(json.dumps(obj["tokenizer"])))
    raise ValueError(f"unknown saved tokenizer kind {kind!r}; expected one of {list(TOKENIZER_KINDS)}")


class IncrementalDecoder:
    """Turns a stream of token ids into a stream of text pieces (for printing as tokens arrive).

    A byte-level BPE token can end inside a multi-byte character; such a tail decodes to U+FFFD
    and is held back until the next token completes it.

    Example::

        dec = IncrementalDecoder(tok)
        for t in ids:
            sys.stdout.write(dec.push(t))
    """

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""                      # everything emitted so far

    def push(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        if self.tokenizer.kind == "char":
            piece = self.tokenizer.decode([token_id])
        else:
            full = self.tokenizer.decode(self.ids)
            if full.endswith("\ufffd"):
                return ""
            piece = full[len(self.text):]
        self.text += piece
        return piece

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character decodes to U+FFFD)."""
        full = self.tokenizer.decode(self.ids)
        piece = full[len(self.text):]
        self.text = full
        return piece
