"""Visual questions about the two-digit scenes: "what is left of the 3 ?", "is there a 7 ?", "where is the 5 ?".

The scenes are ``attnlab.data.scenes`` (two digits in adjacent cells of a 2x2 grid, one of four
layouts; cells row-major: 0 top left, 1 top right, 2 bottom left, 3 bottom right), with the same
held-out split: 100 of the 400 (a, b, layout) combinations never appear in training, and held-out
scenes use other digit images. Each scene gets one question, of three kinds (drawn uniformly):

    relation  "what is left of the {b} ?" -> a   (or "what is right of the {a} ?" -> b; in the vertical
              layouts "what is above the {b} ?" -> a, "what is below the {a} ?" -> b): find one digit,
              read its neighbour
    exists    "is there a {d} ?" -> yes / no     (d is in the scene with probability 1/2)
    where     "where is the {d} ?" -> "top left" / "top right" / "bottom left" / "bottom right"
              (a scene showing the same digit twice gets an exists question instead: no single answer)

Every answer is a function of the scene, ``answer_words(a, b, layout, question)``; chance is the
uniform guess among a kind's answers: 1/10, 1/2 and 1/4.

A sample is one token sequence, the question then the answer, teacher-forced like a caption::

    tokens   <bos> what is left of the 3 ? 5 <eos>
    tgt_in   <bos> what is left of the 3 ?  5           (BOS + question + answer, padded to MAX_LEN)
    tgt_out   -    -   -  -   -   -  -   5 <eos>         (-100 = not scored: the question is given)

so a causal decoder that cross-attends to the image patches (``models.vqa``) learns to answer, and
its answer is right exactly when every answer token and the EOS are its argmax (the greedy answer).

Example::

    vqa = SceneQuestions(Scenes(load_digits_data(0), seed=0))
    b = vqa.sample(torch.Generator().manual_seed(0), 32, "train")
    b.images.shape, b.tgt_in.shape                  # (32, 1, 16, 16), (32, 9)
    question_text(b.tgt_in[0]), decode(b.tgt_out[0])   # "what is left of the 3 ?", "5"
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .scenes import LAYOUTS, SceneBatch, Scenes, decode_words, encode_words

__all__ = ["VOCAB", "PAD", "BOS", "EOS", "IGNORE", "MAX_LEN", "KINDS", "CHANCE", "CELL_NAMES", "SceneQuestions",
           "QuestionBatch", "answer_words", "encode", "decode", "question_text"]

VOCAB = ["<pad>", "<bos>", "<eos>", "what", "is", "left", "right", "above", "below", "of", "the", "there", "a",
         "where", "?", "yes", "no", "top", "bottom"] + [str(d) for d in range(10)]
PAD, BOS, EOS = 0, 1, 2
IGNORE = -100
_ID = {w: i for i, w in enumerate(VOCAB)}
QMARK = _ID["?"]
KINDS = ("relation", "exists", "where")
CHANCE = {"relation": 1 / 10, "exists": 1 / 2, "where": 1 / 4}     # uniform guess among a kind's answers
CELL_NAMES = ("top left", "top right", "bottom left", "bottom right")
MAX_LEN = 9        # BOS + the longest question and answer: "what is left of the 3 ?" + 1 word, or "where" + 2


def encode(words: list[str]) -> list[int]:
    return encode_words(words, _ID, "VQA")


def decode(ids) -> str:
    """Token ids -> question/answer text (see ``scenes.decode_words``)."""
    return decode_words(ids, VOCAB)


def question_text(tgt_in) -> str:
    """The question (up to and including "?") of a tgt_in row."""
    ids = tgt_in.tolist() if isinstance(tgt_in, Tensor) else list(tgt_in)
    return decode(ids[: ids.index(QMARK) + 1] if QMARK in ids else ids)


def answer_words(a: int, b: int, layout: int, question: list[str]) -> list[str]:
    """The answer to ``question`` (its words) about the scene (a, b, layout): the rules of the module docstring."""
    relation, first, second = LAYOUTS[layout]
    cell = {a: first, b: second} if a != b else {a: None}
    if question[:2] == ["is", "there"]:
        return ["yes" if int(question[3]) in (a, b) else "no"]
    if question[:2] == ["where", "is"]:
        d = int(question[3])
        if d not in (a, b) or a == b:
            raise ValueError(f"{' '.join(question)!r} has no single answer in scene {(a, b, layout)}")
        return CELL_NAMES[cell[d]].split()
    if question[:2] == ["what", "is"]:
        rel, d = question[2], int(question[-1])
        want = {"left": ("left of", b, a), "right": ("left of", a, b), "above": ("above", b, a),
                "below": ("above", a, b)}[rel]
        if want[0] != relation or d != want[1]:
            raise ValueError(f"{' '.join(question)!r} has no answer in scene {(a, b, layout)}")
        return [str(want[2])]
    raise ValueError(f"not a scene question: {' '.join(question)!r}")


def _question(kind: str, a: int, b: int, layout: int, g: torch.Generator) -> list[str]:
    """A random question of ``kind`` about scene (a, b, layout), answerable from it."""
    coin = int(torch.randint(0, 2, (1,), generator=g))
    if kind == "relation":
        horizontal = LAYOUTS[layout][0] == "left of"
        rel, d = [("right" if horizontal else "below", a), ("left" if horizontal else "above", b)][coin]
        return ["what", "is", rel, *(["of"] if rel in ("left", "right") else []), "the", str(d)]
    if kind == "where" and a != b:
        return ["where", "is", "the", str((a, b)[coin])]
    # exists (and "where" when the scene shows one digit twice): present with probability 1/2
    absent = [d for d in range(10) if d not in (a, b)]
    d = (a, b)[int(torch.randint(0, 2, (1,), generator=g))] if coin else \
        absent[int(torch.randint(0, len(absent), (1,), generator=g))]
    return ["is", "there", "a", str(d)]


@dataclass
class QuestionBatch:
    images: Tensor        # (B, 1, 16, 16) in [0, 1]
    tgt_in: Tensor        # (B, MAX_LEN) int64: BOS, question, answer, PAD...
    tgt_out: Tensor       # (B, MAX_LEN) int64: -100 over the question, then answer, EOS, -100...
    kinds: Tensor         # (B,) int64 index into KINDS
    scenes: SceneBatch    # the scenes asked about (combos, digit_idx)


class SceneQuestions:
    """One question per scene of a ``Scenes`` generator, with the same splits (see the module docstring)."""

    def __init__(self, scenes: Scenes):
        self.scenes = scenes

    def sample(self, g: torch.Generator, n: int, split: str) -> QuestionBatch:
        s = self.scenes.sample(g, n, split)
        kinds = torch.randint(0, len(KINDS), (n,), generator=g)                          # (n,)
        tgt_in = torch.full((n, MAX_LEN), PAD)
        tgt_out = torch.full((n, MAX_LEN), IGNORE)
        for r, ((a, b, layout), k) in enumerate(zip(s.combos.tolist(), kinds.tolist())):
            q = _question(KINDS[k], a, b, layout, g) + ["?"]
            if KINDS[k] == "where" and q[0] != "where":
                kinds[r] = KINDS.index("exists")                                          # a == b: asked exists
            ans = encode(answer_words(a, b, layout, q[:-1]))
            seq = [BOS, *encode(q), *ans, EOS]                                            # L + 1 tokens
            tgt_in[r, : len(seq) - 1] = torch.tensor(seq[:-1])
            tgt_out[r, len(q): len(seq) - 1] = torch.tensor(seq[len(q) + 1:])             # answer + EOS
        return QuestionBatch(s.images, tgt_in, tgt_out, kinds, s)

    def info(self) -> dict:
        return {**self.scenes.info(), "name": "digit-scene-questions", "kinds": list(KINDS)}
