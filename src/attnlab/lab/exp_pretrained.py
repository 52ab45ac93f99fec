"""What a real trained model's attention does: the pretrained all-MiniLM-L6-v2 (6 layers x 12 heads).

Two claims, both read from ``lab.inspect.attention_maps("minilm", text)`` (the web lab's own path:
the installed checkpoint, its WordPiece tokenizer, weights (layers, heads, L, L)):

    minilm-sat-award            in "The award, which was given for lifetime achievement, sat proudly
                                on the shelf", heads link the verb "sat" to its subject "award",
                                eight words back across a relative clause
    heads-attend-differently    per-head entropy and mean attention distance over a few sentences:
                                trained heads specialise (sharp/local vs broad), while the same
                                architecture with random weights has 72 near-identical heads

Example::

    maps = attention_maps("minilm", SAT_AWARD_SENTENCE, backend="reference")
    link = sat_award_link(maps.tokens, maps.weights)
    link["best"]            # {"layer": 5, "head": 4, "weight": 0.27, "rank": 1, ...}
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from .claims import Claim, VerifyContext
from .exp_sequential import threads
from .report import new_figure, png_bytes

__all__ = ["CLAIMS", "SAT_AWARD_SENTENCE", "HEAD_SENTENCES", "SPECIAL_TOKENS", "token_index", "sat_award_link",
           "judge_sat_award", "head_statistics", "judge_head_diversity", "claim_minilm_sat_award",
           "claim_heads_attend_differently"]

SAT_AWARD_SENTENCE = "The award, which was given for lifetime achievement, sat proudly on the shelf"
SPECIAL_TOKENS = ("[CLS]", "[SEP]")
MIN_LINK_WEIGHT = 0.2          # 3.4x the uniform 1/17 over this sentence's 17 tokens
MIN_SPREAD, MAX_CONTROL_SPREAD = 2.0, 1.5

# Varied sentences for the per-head statistics (word order, clauses; 15 - 20 WordPiece tokens).
HEAD_SENTENCES = [
    SAT_AWARD_SENTENCE,
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "After the storm had passed, the children ran outside to look at the fallen trees.",
    "She said that the report, which nobody had read, would be published on Monday.",
    "Attention lets every word in a sentence look directly at every other word.",
    "The keys to the old cabinet in the hallway are missing again.",
    "If you heat water to one hundred degrees at sea level, it boils.",
    "My grandmother, who lived in a small village by the sea, baked bread every morning.",
]


def _rounded(t: Tensor, digits: int = 5) -> list:
    """A tensor as nested lists of floats rounded for the JSON report."""
    return torch.round(t.double(), decimals=digits).tolist()


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


def sat_award_link(tokens: Sequence[str], weights: Tensor, query: str = "sat", key: str = "award") -> dict:
    """Per layer and head, the weight from ``query`` to ``key`` and its rank among the keys.

    Args:
        tokens: L token strings; weights: (layers, heads, L, L) attention probabilities.
    Returns:
        {"query_index", "key_index", "weight" (layers x heads lists), "rank" (1 = the largest weight of
         the row, all keys), "rank_content" (rank among keys other than [CLS], [SEP] and the query itself),
         "best": the head with the largest weight, with its rank and its "specificity" (the weight from
         ``query`` over the mean weight the other non-special queries give ``key``), "top1_heads": heads
         whose largest weight goes to ``key`` (with their specificity)}
    """
    if weights.dim() != 4 or weights.shape[-1] != len(tokens) or weights.shape[-2] != len(tokens):
        raise ValueError(f"weights must be (layers, heads, L, L) with L = {len(tokens)} tokens, "
                         f"got {tuple(weights.shape)}")
    qi, ki = token_index(tokens, query), token_index(tokens, key)
    row = weights[:, :, qi, :].double()                                  # (layers, heads, L)
    w = row[..., ki]                                                     # (layers, heads)
    rank = (row > w[..., None]).sum(-1) + 1
    content = [i for i, t in enumerate(tokens) if t not in SPECIAL_TOKENS and i != qi]
    rank_content = (row[..., content] > w[..., None]).sum(-1) + 1
    others = [i for i in content if i != ki]                             # the other content queries

    def specificity(l: int, h: int) -> float:   # weight from query / mean weight from the other words
        return round(float(w[l, h] / weights[l, h, others, ki].double().mean().clamp(min=1e-12)), 3)
    layer, head = divmod(int(w.argmax()), w.shape[1])
    best = {"layer": layer, "head": head, "weight": float(w[layer, head]), "rank": int(rank[layer, head]),
            "rank_content": int(rank_content[layer, head]), "specificity": specificity(layer, head),
            "row": [round(float(x), 4) for x in weights[layer, head, qi]]}
    top1 = [{"layer": l, "head": h, "weight": round(float(w[l, h]), 4), "specificity": specificity(l, h)}
            for l, h in (rank == 1).nonzero().tolist()]
    return {"query_index": qi, "key_index": ki, "weight": _rounded(w), "rank": rank.tolist(),
            "rank_content": rank_content.tolist(), "best": best, "top1_heads": top1,
            "top1_content_heads": int((rank_content == 1).sum())}


def judge_sat_award(link: dict, min_weight: float = MIN_LINK_WEIGHT) -> bool:
    """Some head's largest weight from "sat" (over all keys) goes to "award", and it is >= min_weight."""
    return any(h["weight"] >= min_weight for h in link.get("top1_heads", []))


def _plot_link(tokens: list[str], link: dict) -> bytes:
    w = torch.tensor(link["weight"])                                     # (layers, heads)
    fig, (ax, ax2) = new_figure(2, width=5.0, height=3.8)
    im = ax.imshow(w.numpy(), cmap="viridis", vmin=0)
    ax.set(xlabel="head", ylabel="layer", title='weight "sat" -> "award" (red: its top key)', xticks=range(w.shape[1]),
           yticks=range(w.shape[0]))
    for h in link["top1_heads"]:
        ax.add_patch(_box(h["head"], h["layer"]))
    fig.colorbar(im, ax=ax, shrink=0.7)
    b = link["best"]
    colors = ["#c44e52" if i == link["key_index"] else "#4c72b0" for i in range(len(tokens))]
    ax2.bar(range(len(tokens)), b["row"], color=colors)
    ax2.set_xticks(range(len(tokens)), tokens, rotation=70, fontsize=7)
    ax2.axhline(1 / len(tokens), ls=":", c="k", lw=1, label="uniform")
    ax2.set(ylabel="attention weight", title=f'"sat" row, layer {b["layer"]} head {b["head"]}')
    ax2.legend(fontsize=8)
    return png_bytes(fig)


def _box(x: int, y: int):
    from matplotlib.patches import Rectangle
    return Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.5)


def claim_minilm_sat_award(ctx: VerifyContext) -> Claim:
    """The pretrained MiniLM links "sat" to its subject "award" across a relative clause."""
    from .inspect import attention_maps
    with threads(1):                             # 17 tokens: a second thread only waits on a busy machine
        maps = attention_maps("minilm", SAT_AWARD_SENTENCE, backend="reference")
    link = sat_award_link(maps.tokens, maps.weights)
    b, L = link["best"], len(maps.tokens)
    return Claim(
        "minilm-sat-award", 'Pretrained MiniLM links "sat" to "award"',
        statement='In "The award, which was given for lifetime achievement, sat proudly on the shelf" the subject '
                  'of "sat" is "award", eight words back; attention can link them directly, and a trained model '
                  "has heads that do.",
        criterion=f'in all-MiniLM-L6-v2 (6 layers x 12 heads, {L} WordPiece tokens), at least one head gives "award" '
                  f'the largest weight of the "sat" row over ALL keys ([CLS], [SEP] and "sat" itself included), and '
                  f"that weight is >= {MIN_LINK_WEIGHT} ({MIN_LINK_WEIGHT * L:.1f}x uniform 1/{L})",
        passed=judge_sat_award(link),
        measurement={"tokens": maps.tokens, **link},
        summary=f'best: layer {b["layer"]} head {b["head"]}, weight {b["weight"]:.2f} (rank {b["rank"]} of {L}); '
                f'{len(link["top1_heads"])} head(s) with "award" on top, {link["top1_content_heads"]} among content '
                "words",
        figure=_plot_link(maps.tokens, link),
        notes='The link is real but soft and spread out: no head points at "award" with most of its weight; '
              f'the best puts {b["weight"]:.2f} on it, and [CLS] and content words such as "proudly" or '
              '"achievement" take much of the rest. Specificity (the weight from "sat" over the mean weight the '
              'other words give "award" in the same head) separates a link from "everyone looks at the subject '
              'noun": ' + ", ".join(f'layer {h["layer"]} head {h["head"]} {h["specificity"]:.1f}x'
                                    for h in link["top1_heads"]) + ". Layer 0 heads "
              "see token and position embeddings only (no context yet), so a layer-0 link is lexical/positional; "
              "the last layer's heads act on contextual vectors. A sentence embedding model (trained for "
              "similarity, not parsing) need not keep syntax in single heads; Clark et al. 2019 found such "
              "subject-verb heads in BERT-base, which is 12 layers deep.")


# -- heads attend differently ----------------------------------------------------------------------
def head_statistics(weights: Sequence[Tensor]) -> dict:
    """Per head, mean row entropy (nats) and mean attention distance (tokens), averaged over sentences.

    Args:
        weights: one (layers, heads, L, L) tensor per sentence (L may differ).
    Returns:
        {"entropy", "distance", "offset"}: (layers, heads) lists; distance of a row i is
        sum_j w_ij |i - j|, offset sum_j w_ij (j - i) (negative: looks back), each averaged over the
        rows of a sentence, then over sentences.
    """
    from .inspect import attention_entropy
    if not weights:
        raise ValueError("head_statistics needs at least one (layers, heads, L, L) weights tensor")
    ent, dist, off = [], [], []
    for w in weights:
        L = w.shape[-1]
        pos = torch.arange(L, dtype=torch.float64)
        rel = pos[None, :] - pos[:, None]                                # (L, L): j - i
        ent.append(attention_entropy(w).mean(-1))                        # (layers, heads)
        dist.append((w.double() * rel.abs()).sum(-1).mean(-1))           # (layers, heads)
        off.append((w.double() * rel).sum(-1).mean(-1))                  # (layers, heads)
    return {name: _rounded(torch.stack(v).mean(0)) for name, v in
            (("entropy", ent), ("distance", dist), ("offset", off))}


def _spread(values: list) -> float:
    """max / min over the heads (a ratio: for distances, which stay well away from 0)."""
    flat = torch.tensor(values, dtype=torch.float64).flatten()
    return float(flat.max() / flat.min().clamp(min=1e-12))


def _range(values: list) -> list[float]:
    flat = torch.tensor(values, dtype=torch.float64).flatten()
    return [round(float(flat.min()), 4), round(float(flat.max()), 4)]


def judge_head_diversity(trained: dict, control: dict, min_spread: float = MIN_SPREAD,
                         max_control: float = MAX_CONTROL_SPREAD) -> bool:
    """Trained heads' mean distances span >= min_spread (max/min); the random-weight control's < max_control."""
    return _spread(trained["distance"]) >= min_spread and _spread(control["distance"]) < max_control


def _random_minilm(seed: int):
    from ..models import Encoder, EncoderConfig
    torch.manual_seed(seed)
    return Encoder(EncoderConfig.preset("minilm-l6", dropout=0.0, attn_dropout=0.0, mlm_head=False)).eval()


def _control_weights(model, ids: list[int]) -> Tensor:
    capture: list = []
    with torch.no_grad():
        model(torch.tensor([ids]), capture=capture)
    return torch.cat([c.weights for c in capture]).float()               # (layers, heads, L, L)


def claim_heads_attend_differently(ctx: VerifyContext) -> Claim:
    """A trained model's heads attend differently: per-head entropy and mean attention distance."""
    from .inspect import attention_maps, load_model
    sentences = HEAD_SENTENCES                   # ~0.1 s each: the same set in --quick
    tokenize = load_model("minilm").tokenize
    trained_w, control_w = [], []
    with threads(1):                             # short sentences: a second thread only waits on a busy machine
        control_model = _random_minilm(ctx.seed)
        for s in sentences:
            trained_w.append(attention_maps("minilm", s, backend="reference").weights)
            control_w.append(_control_weights(control_model, tokenize(s)[1]))
    trained, control = head_statistics(trained_w), head_statistics(control_w)
    spreads = {name: {"distance_ratio": round(_spread(st["distance"]), 3), "distance_range": _range(st["distance"]),
                      "entropy_range": _range(st["entropy"])}
               for name, st in (("trained", trained), ("random_init", control))}
    d = torch.tensor(trained["distance"])                                 # (layers, heads)
    order = d.flatten().argsort()
    lo_l, lo_h = divmod(int(order[0]), d.shape[1])
    nearest = {"layer": lo_l, "head": lo_h, "distance": round(float(d[lo_l, lo_h]), 3),
               "entropy": round(trained["entropy"][lo_l][lo_h], 4), "offset": round(trained["offset"][lo_l][lo_h], 3),
               "ratio_without_it": round(float(d.flatten()[order[-1]] / d.flatten()[order[1]]), 3)}
    fig, ax = new_figure(1, width=5.8, height=4.0)
    ax.scatter(torch.tensor(control["entropy"]).flatten(), torch.tensor(control["distance"]).flatten(),
               c="lightgrey", marker="x", label="same architecture, random weights")
    sc = ax.scatter(torch.tensor(trained["entropy"]).flatten(), torch.tensor(trained["distance"]).flatten(),
                    c=torch.arange(d.shape[0]).repeat_interleave(d.shape[1]), cmap="viridis",
                    label="all-MiniLM-L6-v2 heads")
    fig.colorbar(sc, ax=ax, label="layer")
    ax.set(xlabel="mean attention entropy (nats)", ylabel="mean attention distance (tokens)",
           title=f"72 heads over {len(sentences)} sentences")
    ax.legend(fontsize=8)
    lengths = [w.shape[-1] for w in trained_w]
    return Claim(
        "heads-attend-differently", "The heads of a trained model attend differently",
        statement="Multi-head attention lets each head learn its own pattern: after training some heads look at "
                  "a neighbour, some at a few distant words, some broadly; nothing in the architecture forces "
                  "it, training does.",
        criterion=f"over {len(sentences)} sentences ({min(lengths)}-{max(lengths)} tokens), the 72 heads of "
                  f"all-MiniLM-L6-v2 have mean attention distances spanning a factor >= {MIN_SPREAD} (max/min), "
                  f"while the same architecture with random weights spans < {MAX_CONTROL_SPREAD}",
        passed=judge_head_diversity(trained, control),
        measurement={"sentences": sentences, "tokens": lengths, "trained": trained, "random_init": control,
                     "spread": spreads, "most_local_head": nearest},
        summary="mean distance max/min: trained {:.1f}x, random weights {:.2f}x; entropy {} vs {} nats".format(
            spreads["trained"]["distance_ratio"], spreads["random_init"]["distance_ratio"],
            "-".join(f"{v:.2f}" for v in spreads["trained"]["entropy_range"]),
            "-".join(f"{v:.2f}" for v in spreads["random_init"]["entropy_range"])),
        figure=png_bytes(fig),
        notes=f"The most local head, layer {lo_l} head {lo_h}, is a sharp positional head (entropy "
              f"{nearest['entropy']:.3f} nats, mean offset {nearest['offset']:+.2f}: it looks at a neighbour); "
              f"without it the distances still span {nearest['ratio_without_it']:.1f}x. "
              "Entropy is over each query's row (log L = uniform); distance is the expected |i - j| under the row. "
              "Rows of [CLS] and [SEP] are included, as are weights on them (many BERT heads park attention on "
              "[CLS]/[SEP], Clark et al. 2019, which raises those heads' distance). The control is Encoder("
              "minilm-l6) at its initialisation (N(0, 0.02) weights): scores are near zero, so every head is "
              "near-uniform and the heads are interchangeable; the spread of the trained model is learned.")


CLAIMS = [claim_minilm_sat_award, claim_heads_attend_differently]
