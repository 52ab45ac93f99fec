"""What a real trained model's attention does: the pretrained all-MiniLM-L6-v2 (6 layers x 12 heads).

Two claims, both read from ``lab.inspect.attention_maps("minilm", text)`` (the web lab's own path:
the installed checkpoint, its WordPiece tokenizer, weights (layers, heads, L, L)):

    minilm-sat-award            in "The award, which was given for lifetime achievement, sat proudly
                                on the shelf", a head links the verb "sat" to its subject "award",
                                eight words back across a relative clause: specifically (more than
                                other words look at "award", more than "sat" looks at other words)
    heads-attend-differently    per-head entropy and mean attention distance over a few sentences:
                                the middle 80% of trained heads differ (sharp/local vs broad), while
                                the same architecture with random weights has 72 near-identical heads

Example::

    maps = attention_maps("minilm", SAT_AWARD_SENTENCE, backend="reference")
    link = sat_award_link(maps.tokens, maps.weights)
    link["best"]            # {"layer": 5, "head": 4, "weight": 0.27, "rank": 1, ...}
    judge_sat_award(link)   # [Check(...), ...]: top and strong, specific against queries, against keys
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from .claims import Check, Claim, VerifyContext
from .exp_sequential import threads
from .report import new_figure, png_bytes

__all__ = ["CLAIMS", "SAT_AWARD_SENTENCE", "HEAD_SENTENCES", "SPECIAL_TOKENS", "token_index", "sat_award_link",
           "linking_heads", "control_pairs", "judge_sat_award", "head_statistics", "quantile_spread",
           "judge_head_diversity", "claim_minilm_sat_award", "claim_heads_attend_differently"]

SAT_AWARD_SENTENCE = "The award, which was given for lifetime achievement, sat proudly on the shelf"
SPECIAL_TOKENS = ("[CLS]", "[SEP]")
MIN_LINK_WEIGHT = 0.2          # 3.4x the uniform 1/17 over this sentence's 17 tokens
# A link, not salience: "sat" gives "award" MIN_SPECIFICITY x what the other words give it in that head
# (against other queries), and MIN_SPECIFICITY x the most it gives any other content word (against other keys).
MIN_SPECIFICITY = 2.0
# Heads differ: the middle 80% of the 72 heads (10th to 90th percentile) span these factors, so at least
# 8 heads on each side must differ (one odd head cannot carry it); random weights must stay below MAX_CONTROL_SPREAD.
MIN_DISTANCE_SPREAD, MIN_ENTROPY_SPREAD, MAX_CONTROL_SPREAD = 1.25, 1.5, 1.05
SPREAD_QUANTILES = (0.1, 0.9)

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


def _content(tokens: Sequence[str]) -> list[int]:
    return [i for i, t in enumerate(tokens) if t not in SPECIAL_TOKENS]


def _link_arrays(tokens: Sequence[str], weights: Tensor, qi: int, ki: int) -> dict[str, Tensor]:
    """Per head (layers, heads): weight q -> k, its rank in q's row, and its two specificities."""
    row = weights[:, :, qi, :].double()                                  # (layers, heads, L)
    w = row[..., ki]                                                     # (layers, heads)
    others = [i for i in _content(tokens) if i not in (qi, ki)]          # content words but these two
    if not others:
        raise ValueError(f"specificity needs content words besides {tokens[qi]!r} and {tokens[ki]!r}: {list(tokens)}")
    from_others = weights[:, :, others, ki].double().mean(-1)            # (layers, heads): others -> key
    to_others = row[..., others].amax(-1)                                # (layers, heads): query -> others
    return {"weight": w, "rank": (row > w[..., None]).sum(-1) + 1,
            "query_specificity": w / from_others.clamp(min=1e-12), "key_specificity": w / to_others.clamp(min=1e-12)}


def linking_heads(tokens: Sequence[str], weights: Tensor, qi: int, ki: int, min_weight: float = MIN_LINK_WEIGHT,
                  min_specificity: float = MIN_SPECIFICITY) -> list[tuple[int, int]]:
    """The (layer, head)s where token qi links to token ki by ``judge_sat_award``'s three requirements.

    Example:
        linking_heads(tokens, weights, tokens.index("sat"), tokens.index("award"))     # [(0, 0)]
    """
    a = _link_arrays(tokens, weights, qi, ki)
    ok = ((a["rank"] == 1) & (a["weight"] >= min_weight) & (a["query_specificity"] >= min_specificity)
          & (a["key_specificity"] >= min_specificity))
    return [tuple(x) for x in ok.nonzero().tolist()]


def sat_award_link(tokens: Sequence[str], weights: Tensor, query: str = "sat", key: str = "award") -> dict:
    """Per layer and head, the weight from ``query`` to ``key``, its rank among the keys, its specificities.

    Args:
        tokens: L token strings; weights: (layers, heads, L, L) attention probabilities.
    Returns:
        {"query_index", "key_index", "weight" (layers x heads lists), "rank" (1 = the largest weight of
         the row, all keys), "rank_content" (rank among keys other than [CLS], [SEP] and the query itself),
         "query_specificity" (the weight over the mean weight the other content words give ``key``: 1 when
         ``key`` is merely salient), "key_specificity" (the weight over the largest weight ``query`` gives
         another content word), "best": the head with the largest weight, with its rank and specificities,
         "top1_heads": heads whose largest weight goes to ``key`` (with their specificities)}
    """
    if weights.dim() != 4 or weights.shape[-1] != len(tokens) or weights.shape[-2] != len(tokens):
        raise ValueError(f"weights must be (layers, heads, L, L) with L = {len(tokens)} tokens, "
                         f"got {tuple(weights.shape)}")
    qi, ki = token_index(tokens, query), token_index(tokens, key)
    a = _link_arrays(tokens, weights, qi, ki)
    w, rank, qs, ks = a["weight"], a["rank"], a["query_specificity"], a["key_specificity"]
    content = [i for i in _content(tokens) if i != qi]
    rank_content = (weights[:, :, qi, content].double() > w[..., None]).sum(-1) + 1

    def head(l: int, h: int) -> dict:
        return {"layer": l, "head": h, "weight": round(float(w[l, h]), 4), "rank": int(rank[l, h]),
                "query_specificity": round(float(qs[l, h]), 3), "key_specificity": round(float(ks[l, h]), 3)}
    layer, h_best = divmod(int(w.argmax()), w.shape[1])
    best = {**head(layer, h_best), "rank_content": int(rank_content[layer, h_best]),
            "row": [round(float(x), 4) for x in weights[layer, h_best, qi]]}
    return {"query_index": qi, "key_index": ki, "weight": _rounded(w), "rank": rank.tolist(),
            "rank_content": rank_content.tolist(), "query_specificity": _rounded(qs, 3),
            "key_specificity": _rounded(ks, 3), "best": best,
            "top1_heads": [head(l, h) for l, h in (rank == 1).nonzero().tolist()],
            "top1_content_heads": int((rank_content == 1).sum())}


def judge_sat_award(link: dict, min_weight: float = MIN_LINK_WEIGHT,
                    min_specificity: float = MIN_SPECIFICITY) -> list[Check]:
    """Some head links "sat" to "award": on top of the row, strong, and specific against other queries and keys.

    Each check narrows the heads of the one before it, so the last one holds only when a single head
    meets every requirement at once.
    """
    def names(hs):
        return ", ".join(f"L{h['layer']}H{h['head']}" for h in hs) or "none"
    top = [h for h in link.get("top1_heads", []) if h["weight"] >= min_weight]
    q_spec = [h for h in top if h["query_specificity"] >= min_specificity]
    both = [h for h in q_spec if h["key_specificity"] >= min_specificity]
    return [Check(f'some head gives "award" the largest weight of the "sat" row over ALL keys ([CLS], [SEP] and '
                  f'"sat" included), and that weight is >= {min_weight}', bool(top), names(top)),
            Check(f'against other queries, in such a head: "sat" gives "award" >= {min_specificity}x the mean '
                  'weight the other content words give it (a merely salient "award" gives ~1x)', bool(q_spec),
                  names(q_spec) + "; " + ", ".join(f"{h['query_specificity']:.2f}x" for h in top)),
            Check(f'against other keys, in such a head: "award" gets >= {min_specificity}x the largest weight "sat" '
                  'gives any other content word', bool(both),
                  names(both) + "; " + ", ".join(f"{h['key_specificity']:.2f}x" for h in q_spec))]


def control_pairs(tokens: Sequence[str], weights: Tensor, query: str = "sat", key: str = "award") -> dict:
    """The same per-head test on the control pairs: ``query`` -> every other content word, every other
    content word -> ``key``. Returns {"keys": {word: [(layer, head), ...]}, "queries": {...}}, passing pairs only."""
    qi, ki = token_index(tokens, query), token_index(tokens, key)
    others = [i for i in _content(tokens) if i not in (qi, ki)]
    keys = {f"{tokens[i]}@{i}": linking_heads(tokens, weights, qi, i) for i in others}
    queries = {f"{tokens[i]}@{i}": linking_heads(tokens, weights, i, ki) for i in others}
    return {"tested": len(others), "keys": {k: v for k, v in keys.items() if v},
            "queries": {q: v for q, v in queries.items() if v}}


def _plot_link(tokens: list[str], link: dict, shown: dict) -> bytes:
    w = torch.tensor(link["weight"])                                     # (layers, heads)
    fig, (ax, ax2) = new_figure(2, width=5.0, height=3.8)
    im = ax.imshow(w.numpy(), cmap="viridis", vmin=0)
    ax.set(xlabel="head", ylabel="layer", title='weight "sat" -> "award" (red: its top key)', xticks=range(w.shape[1]),
           yticks=range(w.shape[0]))
    for h in link["top1_heads"]:
        ax.add_patch(_box(h["head"], h["layer"]))
    fig.colorbar(im, ax=ax, shrink=0.7)
    b = shown                                    # the head whose "sat" row is drawn
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
    checks = judge_sat_award(link)
    controls = control_pairs(maps.tokens, maps.weights)
    linked = linking_heads(maps.tokens, maps.weights, link["query_index"], link["key_index"])
    b, L = link["best"], len(maps.tokens)
    (sl, sh) = linked[0] if linked else (b["layer"], b["head"])
    shown = {"layer": sl, "head": sh, "row": maps.weights[sl, sh, link["query_index"]].tolist()}
    specs = ", ".join(f'L{h["layer"]}H{h["head"]} (weight {h["weight"]:.2f}: {h["query_specificity"]:.1f}x other '
                      f'queries, {h["key_specificity"]:.1f}x other keys)' for h in link["top1_heads"])

    def words(d: dict) -> str:
        return ", ".join(f'"{k.split("@")[0]}"' for k in d) or "none"
    return Claim(
        "minilm-sat-award", 'Pretrained MiniLM links "sat" to "award"',
        statement='In "The award, which was given for lifetime achievement, sat proudly on the shelf" the subject '
                  'of "sat" is "award", eight words back; attention can link them directly, and a trained model '
                  'has a head that singles "award" out from "sat": more than "sat" attends to other words, and '
                  'more than other words attend to "award".',
        criterion=f"all-MiniLM-L6-v2 (6 layers x 12 heads), {L} WordPiece tokens, reference backend; uniform "
                  f"attention would be 1/{L} = {1 / L:.3f}; content words = all but [CLS] and [SEP]",
        checks=checks,
        measurement={"tokens": maps.tokens, **link, "linking_heads": linked, "control_pairs": controls},
        summary=f'{len(link["top1_heads"])} head(s) with "award" on top of the "sat" row, '
                f'{len(linked)} also specific both ways ({", ".join(f"L{l}H{h}" for l, h in linked) or "none"}); '
                f'largest weight {b["weight"]:.2f} (L{b["layer"]}H{b["head"]})',
        figure=_plot_link(maps.tokens, link, shown),
        notes=f'Heads with "award" on top of the "sat" row: {specs}. '
              + ("" if (b["layer"], b["head"]) in linked else
                 f'The largest weight is not a specific link: in L{b["layer"]}H{b["head"]} the other words give '
                 '"award" much of it too, or "sat" gives another word nearly as much. ')
              + "Layer 0 heads see token and position embeddings only (no context yet), so a layer-0 link is "
              "lexical/positional rather than syntactic; the last layer's heads act on contextual vectors. "
              f'Controls, reported and not judged: the same per-head test (top, >= {MIN_LINK_WEIGHT}, both '
              f'specificities >= {MIN_SPECIFICITY}x) passes from "sat" to {len(controls["keys"])} of the '
              f'{controls["tested"]} other content words ({words(controls["keys"])}) and to "award" from '
              f'{len(controls["queries"])} of them ({words(controls["queries"])}), mostly in heads that look at a '
              "neighbour. So a 72-head model has specific links between many pairs; what this claim shows is that "
              '"sat" -> "award", eight words apart, is one of them, not that the model singles out the '
              "subject relation. A sentence embedding model (trained for similarity, not parsing) need not keep "
              "syntax in single heads; Clark et al. 2019 found subject-verb heads in BERT-base, 12 layers deep.")


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
    """max / min over the heads (reported only: one odd head sets it)."""
    flat = torch.tensor(values, dtype=torch.float64).flatten()
    return float(flat.max() / flat.min().clamp(min=1e-12))


def quantile_spread(values: list, quantiles: tuple[float, float] = SPREAD_QUANTILES) -> float:
    """The 90th over the 10th percentile of a per-head statistic: how far apart the middle 80% of heads are.

    Moving either percentile takes about a tenth of the heads (8 of 72), so no single head can carry it.
    Example:
        quantile_spread([[1.0] * 71 + [9.0]])         # 1.0: one special head among identical ones
    """
    flat = torch.tensor(values, dtype=torch.float64).flatten()
    lo, hi = torch.quantile(flat, torch.tensor(quantiles, dtype=torch.float64))
    return float(hi / lo.clamp(min=1e-12))


def _range(values: list) -> list[float]:
    flat = torch.tensor(values, dtype=torch.float64).flatten()
    return [round(float(flat.min()), 4), round(float(flat.max()), 4)]


def judge_head_diversity(trained: dict, control: dict) -> list[Check]:
    """The middle 80% of trained heads differ in mean distance and entropy; random weights' heads do not."""
    lo, hi = (round(q * 100) for q in SPREAD_QUANTILES)
    s = {(name, key): quantile_spread(st[key]) for name, st in (("trained", trained), ("control", control))
         for key in ("distance", "entropy")}
    return [Check(f"trained: the {hi}th / {lo}th percentile over the heads of mean attention distance is "
                  f">= {MIN_DISTANCE_SPREAD}", s["trained", "distance"] >= MIN_DISTANCE_SPREAD,
                  f"{s['trained', 'distance']:.3f}"),
            Check(f"trained: the {hi}th / {lo}th percentile of mean entropy is >= {MIN_ENTROPY_SPREAD}",
                  s["trained", "entropy"] >= MIN_ENTROPY_SPREAD, f"{s['trained', 'entropy']:.3f}"),
            Check(f"the same architecture with random weights: both ratios < {MAX_CONTROL_SPREAD} (the spread is "
                  "learned, not built in)", max(s["control", "distance"], s["control", "entropy"]) < MAX_CONTROL_SPREAD,
                  f"{s['control', 'distance']:.3f} and {s['control', 'entropy']:.3f}")]


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
    spreads = {name: {"distance_p90_over_p10": round(quantile_spread(st["distance"]), 3),
                      "entropy_p90_over_p10": round(quantile_spread(st["entropy"]), 3),
                      "distance_max_over_min": round(_spread(st["distance"]), 3),
                      "distance_range": _range(st["distance"]),
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
        criterion=f"per head of all-MiniLM-L6-v2 (72), mean attention distance and mean row entropy over "
                  f"{len(sentences)} sentences ({min(lengths)}-{max(lengths)} tokens); a percentile ratio moves only "
                  "when about a tenth of the heads (8 of 72) differ, so no single head can carry it",
        checks=judge_head_diversity(trained, control),
        measurement={"sentences": sentences, "tokens": lengths, "trained": trained, "random_init": control,
                     "spread": spreads, "most_local_head": nearest},
        summary="p90/p10 over heads: distance {:.2f}x, entropy {:.2f}x (random weights {:.3f}x, {:.3f}x); "
                "entropy {} vs {} nats".format(
            spreads["trained"]["distance_p90_over_p10"], spreads["trained"]["entropy_p90_over_p10"],
            spreads["random_init"]["distance_p90_over_p10"], spreads["random_init"]["entropy_p90_over_p10"],
            "-".join(f"{v:.2f}" for v in spreads["trained"]["entropy_range"]),
            "-".join(f"{v:.2f}" for v in spreads["random_init"]["entropy_range"])),
        figure=png_bytes(fig),
        notes=f"The most local head, layer {lo_l} head {lo_h}, is a sharp positional head (entropy "
              f"{nearest['entropy']:.3f} nats, mean offset {nearest['offset']:+.2f}: it looks at a neighbour); "
              f"it alone makes the max/min distance ratio {spreads['trained']['distance_max_over_min']:.1f}x (without "
              f"it {nearest['ratio_without_it']:.1f}x), which is why the criterion uses percentiles instead. "
              "Entropy is over each query's row (log L = uniform); distance is the expected |i - j| under the row. "
              "Rows of [CLS] and [SEP] are included, as are weights on them (many BERT heads park attention on "
              "[CLS]/[SEP], Clark et al. 2019, which raises those heads' distance). The control is Encoder("
              "minilm-l6) at its initialisation (N(0, 0.02) weights): scores are near zero, so every head is "
              "near-uniform and the heads are interchangeable; the spread of the trained model is learned.")


CLAIMS = [claim_minilm_sat_award, claim_heads_attend_differently]
