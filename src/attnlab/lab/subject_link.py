"""Does one attention head link a verb to its subject? The head is chosen on some sentences, judged on others.

The ``minilm-sat-award`` claim (``lab/exp_pretrained.py``) rests on this module. Every sentence has
the same relation: a subject, a relative clause, then its verb ("The award, which was given for
lifetime achievement, sat proudly on the shelf"). Per sentence and head, the verb's query row gives:

    weight             w(verb -> subject)
    rank               its rank in the verb's row over ALL keys ([CLS], [SEP], the verb itself included)
    key_specificity    w / the largest weight the verb gives any other content word (the verb singles
                       the subject out, not a neighbour or a clause word)
    query_specificity  w / the mean weight the other content words give the subject (a merely salient
                       subject, looked at from everywhere, gives ~1x)

A head *links* the pair in a sentence when rank == 1, w >= MIN_LINK_WEIGHT and both specificities
are >= MIN_SPECIFICITY. One head is chosen on ``SELECTION_SENTENCES`` alone, outside layer 0 (a
layer-0 head sees token and position embeddings only: a link there is lexical or positional, not
syntax), and ``judge_subject_link`` judges it on ``HELD_OUT_SENTENCES``, which it never saw; so the
pass cannot come from picking the one lucky head among 72 on the sentence it is judged on.

Example::

    def read(s):
        maps = attention_maps("minilm", s.text, backend="reference")       # lab.inspect
        return measure_link(s, maps.tokens, maps.weights)
    sel = [read(s) for s in SELECTION_SENTENCES]
    layer, head = select_head(sel)                                          # chosen on these only
    held = [read(s) for s in HELD_OUT_SENTENCES]
    judge_subject_link({"layer": layer, "head": head}, head_rows(sel, layer, head), head_rows(held, layer, head))
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from .claims import Check

__all__ = ["LinkSentence", "SELECTION_SENTENCES", "HELD_OUT_SENTENCES", "TARGET", "MIN_LINK_WEIGHT",
           "MIN_SPECIFICITY", "SPECIAL_TOKENS", "token_index", "link_arrays", "links", "closeness", "measure_link",
           "select_head", "head_rows", "judge_subject_link"]

SPECIAL_TOKENS = ("[CLS]", "[SEP]")
MIN_LINK_WEIGHT = 0.2          # 3.4x the uniform 1/17 over the award sentence's 17 tokens
MIN_SPECIFICITY = 2.0          # a link, not salience: 2x against other keys and against other queries
FIRST_LAYER = 1                # heads are chosen from layer 1 up: layer 0 has no context yet


@dataclass(frozen=True)
class LinkSentence:
    text: str
    verb: str                  # the query word (a whole WordPiece token)
    subject: str               # the key word: the verb's subject, before the relative clause
    clause_noun: str           # a noun inside the clause: the control relation (verb -> a word that is not its subject)


# Written before any attention map was looked at; every word above is one WordPiece token of MiniLM's
# vocabulary (tests/test_claims_subject_link.py checks it). The two sets share no sentence.
SELECTION_SENTENCES = [
    LinkSentence("The trophy, which was won in a close final, stood proudly on the mantel", "stood", "trophy", "final"),
    LinkSentence("The painting, which was bought at an auction last year, hung crookedly in the hall", "hung",
                 "painting", "auction"),
    LinkSentence("The letter, which was written by her grandfather, arrived late on Tuesday", "arrived", "letter",
                 "grandfather"),
    LinkSentence("The clock, which was repaired by a local craftsman, ticked loudly in the kitchen", "ticked", "clock",
                 "craftsman"),
    LinkSentence("The dog, which was found near the station, slept quietly by the fire", "slept", "dog", "station"),
    LinkSentence("The statue, which was carved from white marble, stood alone in the square", "stood", "statue",
                 "marble"),
]
TARGET = LinkSentence("The award, which was given for lifetime achievement, sat proudly on the shelf", "sat", "award",
                      "achievement")
HELD_OUT_SENTENCES = [
    TARGET,
    LinkSentence("The book, which was signed by the author, lay open on the table", "lay", "book", "author"),
    LinkSentence("The car, which was parked outside the bank, rolled slowly down the hill", "rolled", "car", "bank"),
    LinkSentence("The vase, which was given to us as a wedding present, broke into pieces", "broke", "vase", "present"),
    LinkSentence("The bird, which was caught in the storm, sang again the next morning", "sang", "bird", "storm"),
]


def token_index(tokens: Sequence[str], word: str, occurrence: int = 0) -> int:
    """Index of ``word`` among WordPiece ``tokens`` (lower-cased, whole-word tokens only).

    Raises ValueError naming the tokens when the word is absent or was split into pieces.
    Example:
        token_index(["[CLS]", "the", "award", ",", "sat", "[SEP]"], "award")     # 2
    """
    hits = [i for i, t in enumerate(tokens) if t == word.lower()]
    if len(hits) <= occurrence:
        raise ValueError(f"{word!r} is not a whole token (occurrence {occurrence}) of {list(tokens)}; "
                         "pick a word the WordPiece vocabulary keeps whole")
    return hits[occurrence]


def link_arrays(tokens: Sequence[str], weights: Tensor, qi: int, ki: int) -> dict[str, Tensor]:
    """Per head, (layers, heads) tensors: weight qi -> ki, its rank in qi's row, its two specificities.

    Args:
        tokens: L token strings; weights: (layers, heads, L, L) attention probabilities.
    Example:
        link_arrays(tokens, weights, tokens.index("sat"), tokens.index("award"))["key_specificity"]
    """
    if weights.dim() != 4 or weights.shape[-1] != len(tokens) or weights.shape[-2] != len(tokens):
        raise ValueError(f"weights must be (layers, heads, L, L) with L = {len(tokens)} tokens, "
                         f"got {tuple(weights.shape)}")
    others = [i for i, t in enumerate(tokens) if t not in SPECIAL_TOKENS and i not in (qi, ki)]
    if not others:
        raise ValueError(f"specificity needs content words besides {tokens[qi]!r} and {tokens[ki]!r}: {list(tokens)}")
    row = weights[:, :, qi, :].double()                                  # (layers, heads, L)
    w = row[..., ki]                                                     # (layers, heads)
    from_others = weights[:, :, others, ki].double().mean(-1)            # (layers, heads): others -> key
    to_others = row[..., others].amax(-1)                                # (layers, heads): query -> others
    return {"weight": w, "rank": (row > w[..., None]).sum(-1) + 1,
            "query_specificity": w / from_others.clamp(min=1e-12), "key_specificity": w / to_others.clamp(min=1e-12)}


def links(a: dict, min_weight: float = MIN_LINK_WEIGHT, min_specificity: float = MIN_SPECIFICITY):
    """(layers, heads) bool: the heads that link the pair by all four requirements (works on tensors or floats)."""
    return ((a["rank"] == 1) & (a["weight"] >= min_weight) & (a["query_specificity"] >= min_specificity)
            & (a["key_specificity"] >= min_specificity))


def closeness(a: dict, min_weight: float = MIN_LINK_WEIGHT, min_specificity: float = MIN_SPECIFICITY) -> Tensor:
    """(layers, heads): how near each head comes to the thresholds, min(weight / min_weight, each specificity /
    min_specificity); >= 1 when all three are met (rank aside). What ranks heads that link nowhere."""
    return torch.minimum(torch.minimum(a["key_specificity"], a["query_specificity"]) / min_specificity,
                         a["weight"] / min_weight)


def measure_link(sentence: LinkSentence, tokens: Sequence[str], weights: Tensor, key: str = "subject") -> dict:
    """The link arrays of ``sentence``'s verb -> its ``key`` word ("subject" or, the control, "clause_noun")."""
    qi, ki = token_index(tokens, sentence.verb), token_index(tokens, getattr(sentence, key))
    return {"sentence": sentence.text, "verb": sentence.verb, "key": getattr(sentence, key), "tokens": list(tokens),
            **link_arrays(tokens, weights, qi, ki)}


def select_head(measured: Sequence[dict], first_layer: int = FIRST_LAYER) -> tuple[int, int]:
    """The (layer, head) from ``first_layer`` up that links the pair in the most ``measured`` sentences.

    Ties (and the case where no head links anywhere) go to the head whose median ``closeness`` over the
    sentences is largest.
    Example:
        select_head([measure_link(s, tokens, weights) for s, (tokens, weights) in read])      # (layer, head)
    """
    if not measured:
        raise ValueError("select_head needs at least one measured sentence")
    n_pass = torch.stack([links(m).double() for m in measured]).sum(0)                      # (layers, heads)
    near = torch.stack([closeness(m) for m in measured]).median(0).values                   # (layers, heads)
    score = n_pass * 1e6 + near.clamp(max=1e5)                                              # count first, then near
    score[:first_layer] = float("-inf")
    layer, head = divmod(int(score.argmax()), score.shape[1])
    return layer, head


def head_rows(measured: Sequence[dict], layer: int, head: int) -> list[dict]:
    """One JSON-ready row per sentence for head (layer, head): what ``judge_subject_link`` reads."""
    def one(m: dict) -> dict:
        return {"sentence": m["sentence"], "verb": m["verb"], "key": m["key"],
                "weight": round(float(m["weight"][layer, head]), 4), "rank": int(m["rank"][layer, head]),
                "key_specificity": round(float(m["key_specificity"][layer, head]), 3),
                "query_specificity": round(float(m["query_specificity"][layer, head]), 3)}
    return [one(m) for m in measured]


def _pairs(rows: Sequence[dict], field: str, fmt: str) -> str:
    return ", ".join(f'{r["verb"]}->{r["key"]} {format(r[field], fmt)}' for r in rows) or "no sentences"


def judge_subject_link(head: dict, selection: Sequence[dict], held_out: Sequence[dict], target: LinkSentence = TARGET,
                       min_weight: float = MIN_LINK_WEIGHT, min_specificity: float = MIN_SPECIFICITY) -> list[Check]:
    """The head chosen on ``selection`` (rows of ``head_rows``) links verb to subject in every held-out sentence.

    Args:
        head: {"layer", "head"} chosen by ``select_head`` on the selection sentences.
        selection, held_out: that head's rows on each set (dicts with sentence, verb, key, weight, rank,
            key_specificity, query_specificity).
    Example:
        judge_subject_link({"layer": 4, "head": 1}, sel_rows, held_rows)     # [Check(...), ...]
    """
    layer = head.get("layer")
    shared = sorted({r["sentence"] for r in selection} & {r["sentence"] for r in held_out})
    has_target = any(r["verb"] == target.verb and r["key"] == target.subject for r in held_out)
    sel_ok = [r for r in selection if links(r, min_weight, min_specificity)]

    def every(pred) -> bool:
        return bool(held_out) and all(pred(r) for r in held_out)
    return [
        Check("the head is outside layer 0 (layer-0 heads see token and position embeddings only, so a link there "
              "is lexical or positional, not syntax)", isinstance(layer, int) and layer >= 1,
              f"L{layer}H{head.get('head')}"),
        Check(f'it was chosen on {len(selection)} selection sentences that share none with the {len(held_out)} '
              f'judged ones, and "{target.verb}" -> "{target.subject}" is among the judged',
              bool(selection) and bool(held_out) and not shared and has_target,
              f"{len(shared)} shared" + ("" if has_target else f'; "{target.verb}" -> "{target.subject}" not judged')),
        Check(f"on the selection sentences it links verb to subject in every one (rank 1, weight >= {min_weight}, "
              f"both specificities >= {min_specificity}x)", bool(selection) and len(sel_ok) == len(selection),
              f"{len(sel_ok)} of {len(selection)}"),
        Check(f"held out, in every sentence: the verb gives its subject >= {min_specificity}x the largest weight it "
              "gives any other content word", every(lambda r: r["key_specificity"] >= min_specificity),
              _pairs(held_out, "key_specificity", ".2f")),
        Check(f"held out, in every sentence: >= {min_specificity}x the mean weight the other content words give "
              "the subject (a merely salient subject gives ~1x)",
              every(lambda r: r["query_specificity"] >= min_specificity),
              _pairs(held_out, "query_specificity", ".2f")),
        Check(f"held out, in every sentence: that weight is >= {min_weight} and the largest of the verb's row over ALL "
              "keys ([CLS], [SEP] and the verb itself included)",
              every(lambda r: r["weight"] >= min_weight and r["rank"] == 1), _pairs(held_out, "weight", ".2f")),
    ]
