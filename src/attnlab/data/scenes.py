"""Captioned scenes: two scikit-learn digits on a 16x16 canvas, "a 3 left of a 7" / "a 3 above a 7".

The canvas is a 2x2 grid of 8x8 cells. A scene puts digit ``a`` and digit ``b`` in two adjacent
cells, in one of four layouts; the caption names the left (or upper) digit first::

    layout 0: top row       [a b]      "a {a} left of a {b}"
              bottom row    [. .]
    layout 1: bottom row    [. .]      "a {a} left of a {b}"
                            [a b]
    layout 2: left column   [a .]      "a {a} above a {b}"
                            [b .]
    layout 3: right column  [. a]      "a {a} above a {b}"
                            [. b]

A scene's *combination* is (a, b, layout): 10 x 10 x 4 = 400. For every digit pair (a, b) one of
the four layouts is held out (seeded), so 300 combinations are trained on and 100 are never
seen in training: the held-out split tests whether the captioner composes a pair it has seen
in three layouts with the fourth. Held-out scenes are also drawn from different digit images:
``train`` uses the digits' train split, ``val`` and ``test`` use the held-out combinations with
the digits' validation and test images.

Example::

    scenes = Scenes(load_digits_data(0), seed=0)
    batch = scenes.sample(torch.Generator().manual_seed(0), 32, "train")
    batch.images.shape, batch.tgt_in.shape          # (32, 1, 16, 16), (32, 8)
    decode(batch.tgt_out[0])                        # "a 3 left of a 7"
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor

from .digits import DigitsData, random_shift

__all__ = ["VOCAB", "PAD", "BOS", "EOS", "MAX_LEN", "LAYOUTS", "Scenes", "SceneBatch", "encode", "decode",
           "caption_words"]

VOCAB = ["<pad>", "<bos>", "<eos>", "a", "left", "of", "above"] + [str(d) for d in range(10)]
PAD, BOS, EOS = 0, 1, 2
IGNORE = -100                                  # the target of padded positions (cross_entropy's ignore_index)
_ID = {w: i for i, w in enumerate(VOCAB)}
# (relation, first cell, second cell); cells are numbered row-major in the 2x2 grid
LAYOUTS = [("left of", 0, 1), ("left of", 2, 3), ("above", 0, 2), ("above", 1, 3)]
MAX_LEN = 8                                    # BOS + the longest caption (7 words); targets: 7 words + EOS
CELL, GRID = 8, 2
SPLITS = ("train", "val", "test")


def caption_words(a: int, b: int, layout: int) -> list[str]:
    """["a", "3", "left", "of", "a", "7"] for a=3, b=7 in a "left of" layout."""
    return ["a", str(a), *LAYOUTS[layout][0].split(), "a", str(b)]


def encode_words(words: list[str], index: dict[str, int], name: str) -> list[int]:
    """Words -> ids by ``index`` (word -> id; ids 0-2 are PAD, BOS, EOS); unknown words are an error."""
    unknown = [w for w in words if w not in index]
    if unknown:
        raise ValueError(f"words {unknown} are not in the {name} vocabulary {list(index)}")
    return [index[w] for w in words]


def decode_words(ids, vocab: list[str]) -> str:
    """Token ids -> text, stopping at EOS and skipping PAD, BOS and ignored (-100) positions."""
    words = []
    for i in (ids.tolist() if isinstance(ids, Tensor) else ids):
        if i == EOS:
            break
        if i not in (PAD, BOS, IGNORE):
            words.append(vocab[i])
    return " ".join(words)


def encode(words: list[str]) -> list[int]:
    return encode_words(words, _ID, "scene")


def decode(ids) -> str:
    """Token ids -> caption text (see ``decode_words``)."""
    return decode_words(ids, VOCAB)


@dataclass
class SceneBatch:
    images: Tensor        # (B, 1, 16, 16) in [0, 1]
    tgt_in: Tensor        # (B, MAX_LEN) int64: BOS, caption, PAD...
    tgt_out: Tensor       # (B, MAX_LEN) int64: caption, EOS, -100...
    combos: Tensor        # (B, 3) int64: (a, b, layout)
    digit_idx: Tensor     # (B, 2) int64: the two digits' positions in load_digits() order


class Scenes:
    """The scene generator; ``held_out`` (100, 3) lists the (a, b, layout) combinations never trained on."""

    def __init__(self, digits: DigitsData, *, seed: int = 0, shift: int = 0):
        self.digits, self.seed, self.shift = digits, seed, shift
        g = torch.Generator().manual_seed(seed)
        pairs = torch.cartesian_prod(torch.arange(10), torch.arange(10))           # (100, 2)
        held = torch.randint(0, len(LAYOUTS), (len(pairs),), generator=g)         # one layout per pair
        every = torch.cat([pairs.repeat_interleave(len(LAYOUTS), 0),
                           torch.arange(len(LAYOUTS)).repeat(len(pairs))[:, None]], 1)   # (400, 3)
        is_held = every[:, 2] == held.repeat_interleave(len(LAYOUTS))
        self.held_out, self.trained = every[is_held], every[~is_held]               # (100, 3), (300, 3)
        self._images = {"train": digits.train_x, "val": digits.val_x, "test": digits.test_x}
        self._index = {"train": digits.train_idx, "val": digits.val_idx, "test": digits.test_idx}
        labels = {"train": digits.train_y, "val": digits.val_y, "test": digits.test_y}
        # per split and class: the rows of that split's images showing the class
        self._by_class = {s: [(labels[s] == c).nonzero().squeeze(1) for c in range(10)] for s in SPLITS}
        ids = [encode(caption_words(0, 0, k)) for k in range(len(LAYOUTS))]
        self._tokens = torch.full((len(LAYOUTS), MAX_LEN + 1), PAD)                # BOS words EOS PAD...
        for k, w in enumerate(ids):
            self._tokens[k, : len(w) + 2] = torch.tensor([BOS, *w, EOS])

    def combos(self, split: str) -> Tensor:
        """The (a, b, layout) combinations a split draws from: trained for train, held-out otherwise."""
        if split not in SPLITS:
            raise ValueError(f"unknown scene split {split!r}; choose from {SPLITS}")
        return self.trained if split == "train" else self.held_out

    def sample(self, g: torch.Generator, n: int, split: str) -> SceneBatch:
        """n random scenes of a split (combinations uniform, images uniform within their class)."""
        combos = self.combos(split)[torch.randint(0, len(self.combos(split)), (n,), generator=g)]   # (n, 3)
        rows = torch.stack([self._pick(g, combos[:, i], split) for i in (0, 1)], 1)              # (n, 2)
        digits = self._images[split][rows.flatten()]                                             # (2n, 1, 8, 8)
        if split == "train":
            digits = random_shift(digits, self.shift, g)              # inside its own cell, zero fill
        digits = digits.view(n, 2, CELL, CELL)
        cells = torch.zeros(n, GRID * GRID, CELL, CELL)
        first = torch.tensor([LAYOUTS[k][1] for k in range(len(LAYOUTS))])[combos[:, 2]]
        second = torch.tensor([LAYOUTS[k][2] for k in range(len(LAYOUTS))])[combos[:, 2]]
        cells[torch.arange(n), first] = digits[:, 0]
        cells[torch.arange(n), second] = digits[:, 1]
        images = rearrange(cells, "n (r c) h w -> n 1 (r h) (c w)", r=GRID)                      # (n, 1, 16, 16)
        tokens = self._tokens[combos[:, 2]].clone()                                              # (n, MAX_LEN + 1)
        tokens[:, 2] = combos[:, 0] + _ID["0"]                                                   # "a {a} ..."
        last = (tokens != PAD).sum(1) - 2                                                        # "... a {b}"
        tokens[torch.arange(n), last] = combos[:, 1] + _ID["0"]
        tgt_out = tokens[:, 1:].clone()
        tgt_out[tgt_out == PAD] = IGNORE
        return SceneBatch(images, tokens[:, :-1], tgt_out, combos, self._index[split][rows])

    def _pick(self, g: torch.Generator, classes: Tensor, split: str) -> Tensor:
        """For each class in ``classes`` (n,), a random row of the split's images of that class."""
        out = torch.empty(len(classes), dtype=torch.int64)
        for c in classes.unique().tolist():
            where = (classes == c).nonzero().squeeze(1)
            pool = self._by_class[split][c]
            out[where] = pool[torch.randint(0, len(pool), (len(where),), generator=g)]
        return out

    def info(self) -> dict:
        return {"name": "digit-scenes", "seed": self.seed, "shift": self.shift, "canvas": [16, 16],
                "held_out": len(self.held_out), "trained": len(self.trained), "digits": self.digits.info()}
