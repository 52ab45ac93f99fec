"""Generated sequence-to-sequence tasks with a held-out split that training never sees.

- ``reversal``: a random string over ``n_symbols`` letters -> the same string reversed;
- ``sorting``: a random string -> its letters in alphabetical order;
- ``dates``: a date written in words, in one of 9 spellings ("march 5 2021", "5 mar 2021",
  "the 5th of march, 2021", ...) -> ISO "2021-03-05" (translation-like: reorder, look up, pad).

Every example is drawn from a ``random.Random`` seeded by one draw from the caller's
``torch.Generator``, so a ``DrawSampler`` makes the data reproducible and resumable. The split is
a property of the example, not of the draw: ``split_of`` hashes a key (the source string; for
dates the date itself, so a held-out date is never seen in training in any spelling) with
BLAKE2b and puts ``heldout_fraction`` of the key space in "heldout". Drawing for one split rejects
the other's examples, so the two are disjoint by construction (and tested).

Sequences are tokens (single characters) with PAD=0, BOS=1, EOS=2 first in the vocabulary.
A batch is right-padded: src = tokens + EOS, tgt_in = BOS + target, tgt_out = target + EOS.

Example::

    task = make_task("reversal")                       # lengths 5..20 over 16 letters
    g = torch.Generator().manual_seed(0)
    src, tgt_in, tgt_out = task.batch(g, 32)           # (32, S), (32, L), (32, L) int64
    task.vocab.decode(src[0])                          # "kcfamp..."
"""
from __future__ import annotations

import calendar
import datetime
import hashlib
import json
import random
import string
from typing import Iterable, Sequence

import torch
from torch import Tensor

__all__ = ["PAD", "BOS", "EOS", "SPECIALS", "Vocab", "GeneratedTask", "Reversal", "Sorting", "Dates",
           "TASKS", "make_task", "collate", "SPLITS"]

PAD, BOS, EOS = 0, 1, 2
SPECIALS = ("<pad>", "<bos>", "<eos>")
SPLITS = ("train", "heldout")


class Vocab:
    """Specials (PAD, BOS, EOS) then the task's symbols, one token per single-character symbol."""

    def __init__(self, symbols: Sequence[str]):
        symbols = list(symbols)
        if len(set(symbols)) != len(symbols) or set(symbols) & set(SPECIALS):
            raise ValueError(f"vocabulary symbols must be distinct and not specials, got {symbols}")
        self.tokens = list(SPECIALS) + symbols
        self._index = {t: i for i, t in enumerate(self.tokens)}

    @property
    def size(self) -> int:
        return len(self.tokens)

    def encode(self, tokens: Iterable[str]) -> list[int]:
        try:
            return [self._index[t] for t in tokens]
        except KeyError as e:
            raise ValueError(f"token {e.args[0]!r} is not in the vocabulary {self.tokens[3:]}") from None

    def decode(self, ids: Iterable[int]) -> str:
        """Symbols up to the first EOS, PAD and BOS dropped."""
        out = []
        for i in (int(i) for i in ids):
            if i == EOS:
                break
            if i not in (PAD, BOS):
                out.append(self.tokens[i])
        return "".join(out)

    def to_json(self) -> str:
        return json.dumps({"kind": "seq2seq-vocab", "tokens": self.tokens})


def collate(pairs: Sequence[tuple[list[int], list[int]]]) -> tuple[Tensor, Tensor, Tensor]:
    """(src ids, tgt ids) pairs -> right-padded src + EOS (B, S), BOS + tgt (B, L), tgt + EOS (B, L)."""
    S = max(len(s) for s, _ in pairs) + 1
    L = max(len(t) for _, t in pairs) + 1
    src = torch.full((len(pairs), S), PAD, dtype=torch.long)
    tgt_in, tgt_out = torch.full((len(pairs), L), PAD, dtype=torch.long), torch.full((len(pairs), L), PAD,
                                                                                   dtype=torch.long)
    for r, (s, t) in enumerate(pairs):
        src[r, : len(s) + 1] = torch.tensor(s + [EOS])
        tgt_in[r, : len(t) + 1] = torch.tensor([BOS] + t)
        tgt_out[r, : len(t) + 1] = torch.tensor(t + [EOS])
    return src, tgt_in, tgt_out


class GeneratedTask:
    """Base: ``example(rng)`` makes one (source, target) pair of symbol lists; the rest is shared."""

    name = "?"

    def __init__(self, symbols: Sequence[str], heldout_fraction: float):
        if not 0.0 < heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
        self.vocab = Vocab(symbols)
        self.heldout_fraction = heldout_fraction

    # subclasses define these
    def example(self, rng: random.Random) -> tuple[list[str], list[str]]:
        raise NotImplementedError

    def options(self) -> dict:
        raise NotImplementedError

    @property
    def max_source_len(self) -> int:      # longest source in tokens, EOS included
        raise NotImplementedError

    @property
    def max_target_len(self) -> int:      # longest target in tokens, EOS included
        raise NotImplementedError

    # shared
    def split_key(self, src: list[str], tgt: list[str]) -> str:
        return "".join(src)

    def split_of(self, src: list[str], tgt: list[str]) -> str:
        """"heldout" for a fixed heldout_fraction of keys (BLAKE2b of the key), else "train"."""
        digest = hashlib.blake2b(self.split_key(src, tgt).encode(), digest_size=8).digest()
        return "heldout" if int.from_bytes(digest, "big") < self.heldout_fraction * 2 ** 64 else "train"

    def draw(self, g: torch.Generator, n: int, split: str = "train") -> list[tuple[list[int], list[int]]]:
        """n examples of ``split`` as (source ids, target ids), no specials; reproducible from g's state."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        keep = self.heldout_fraction if split == "heldout" else 1 - self.heldout_fraction
        out: list[tuple[list[int], list[int]]] = []
        while len(out) < n:
            want = int((n - len(out)) / keep * 1.2) + 4       # rejection sampling: enough for one round, usually
            for seed in torch.randint(0, 2 ** 62, (want,), generator=g).tolist():
                src, tgt = self.example(random.Random(seed))
                if self.split_of(src, tgt) == split and len(out) < n:
                    out.append((self.vocab.encode(src), self.vocab.encode(tgt)))
        return out

    def batch(self, g: torch.Generator, n: int, split: str = "train") -> tuple[Tensor, Tensor, Tensor]:
        """(src (n, S), tgt_in (n, L), tgt_out (n, L)) int64, right-padded with PAD."""
        return collate(self.draw(g, n, split))

    def info(self) -> dict:
        """JSON-ready; ``make_task(**info)`` rebuilds the same task."""
        return {"name": self.name, **self.options(), "heldout_fraction": self.heldout_fraction}


class _LetterTask(GeneratedTask):
    """Strings of min_len..max_len letters drawn uniformly from the first n_symbols letters."""

    def __init__(self, n_symbols: int = 16, min_len: int = 5, max_len: int = 20, heldout_fraction: float = 0.1):
        if not 2 <= n_symbols <= 26:
            raise ValueError(f"n_symbols must be in [2, 26] (letters a..z), got {n_symbols}")
        if not 1 <= min_len <= max_len:
            raise ValueError(f"need 1 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}")
        super().__init__(string.ascii_lowercase[:n_symbols], heldout_fraction)
        self.n_symbols, self.min_len, self.max_len = n_symbols, min_len, max_len

    def options(self) -> dict:
        return {"n_symbols": self.n_symbols, "min_len": self.min_len, "max_len": self.max_len}

    def _letters(self, rng: random.Random) -> list[str]:
        return rng.choices(self.vocab.tokens[3:], k=rng.randint(self.min_len, self.max_len))

    @property
    def max_source_len(self) -> int:
        return self.max_len + 1

    @property
    def max_target_len(self) -> int:
        return self.max_len + 1


class Reversal(_LetterTask):
    name = "reversal"

    def example(self, rng: random.Random) -> tuple[list[str], list[str]]:
        src = self._letters(rng)
        return src, src[::-1]


class Sorting(_LetterTask):
    name = "sorting"

    def example(self, rng: random.Random) -> tuple[list[str], list[str]]:
        src = self._letters(rng)
        return src, sorted(src)


MONTHS = [calendar.month_name[m].lower() for m in range(1, 13)]
DATE_FORMATS = (
    "{month} {d} {y}", "{month} {d}, {y}", "{d} {month} {y}", "{mon} {d} {y}", "{d} {mon} {y}",
    "{dd} {mon} {y}", "{month} {nth}, {y}", "{nth} of {month} {y}", "the {nth} of {month}, {y}",
)


def ordinal(d: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, 21st, ..."""
    suffix = "th" if 10 <= d % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(d % 10, "th")
    return f"{d}{suffix}"


class Dates(GeneratedTask):
    """A date in words (one of DATE_FORMATS, month names full or 3-letter) -> "YYYY-MM-DD".

    Dates are uniform over [min_year-01-01, max_year-12-31]; the split key is the date, so held-out
    dates test composition (day, month and year each seen in training, never together).
    """

    name = "dates"

    def __init__(self, min_year: int = 1900, max_year: int = 2099, heldout_fraction: float = 0.1):
        if not 1 <= min_year <= max_year <= 9999:
            raise ValueError(f"need 1 <= min_year <= max_year <= 9999, got {min_year}, {max_year}")
        super().__init__(string.ascii_lowercase + string.digits + " ,-", heldout_fraction)
        self.min_year, self.max_year = min_year, max_year
        self._first = datetime.date(min_year, 1, 1).toordinal()
        self._last = datetime.date(max_year, 12, 31).toordinal()

    def options(self) -> dict:
        return {"min_year": self.min_year, "max_year": self.max_year}

    @staticmethod
    def spell(date: datetime.date, fmt: str) -> str:
        month = MONTHS[date.month - 1]
        return fmt.format(month=month, mon=month[:3], d=date.day, dd=f"{date.day:02d}", nth=ordinal(date.day),
                          y=date.year)

    def example(self, rng: random.Random) -> tuple[list[str], list[str]]:
        date = datetime.date.fromordinal(rng.randint(self._first, self._last))
        return list(self.spell(date, rng.choice(DATE_FORMATS))), list(date.isoformat())

    def split_key(self, src: list[str], tgt: list[str]) -> str:
        return "".join(tgt)

    @property
    def max_source_len(self) -> int:      # "the 23rd of september, 2021": the longest spelling, + EOS
        longest = max(len(self.spell(datetime.date(self.max_year, m, 23), f)) for m in range(1, 13)
                      for f in DATE_FORMATS)
        return longest + 1

    @property
    def max_target_len(self) -> int:
        return len(datetime.date(self.max_year, 1, 1).isoformat()) + 1


TASKS: dict[str, type[GeneratedTask]] = {"reversal": Reversal, "sorting": Sorting, "dates": Dates}


def make_task(name: str, **options) -> GeneratedTask:
    """The task ``name`` (one of TASKS) with its options (e.g. n_symbols, min_len, max_len)."""
    if not isinstance(name, str) or name not in TASKS:
        raise ValueError(f"unknown seq2seq task {name!r}; known tasks: {sorted(TASKS)}")
    try:
        return TASKS[name](**options)
    except TypeError as e:
        raise ValueError(f"bad options for task {name!r}: {e}") from None
