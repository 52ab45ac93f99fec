"""What a real trained model's attention does: the pretrained all-MiniLM-L6-v2 (6 layers x 12 heads).

Two claims, both read from ``lab.inspect.attention_maps("minilm", text)`` (the web lab's own path:
the installed checkpoint, its WordPiece tokenizer, weights (layers, heads, L, L)); the first is listed
in ``REFUTED``: measured, and not borne out by this model (see the note above ``REFUTED``):

    minilm-sat-award            a head outside layer 0, chosen on six sentences of the form "The trophy,
                                which was won in a close final, stood ...", links the verb to its subject
                                across the relative clause in five held-out sentences, "The award, which
                                was given for lifetime achievement, sat proudly on the shelf" among them
                                (``lab/subject_link.py``: the sentences, the selection, the judge)
    heads-attend-differently    per-head entropy and mean attention distance over a few sentences:
                                the middle 80% of trained heads differ (sharp/local vs broad), while
                                the same architecture with random weights has 72 near-identical heads

Example::

    claim = claim_minilm_sat_award(VerifyContext(quick=True, workdir=Path("/tmp")))
    claim.measurement["head"], claim.passed     # the head chosen on the selection set; its held-out verdict
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from ..measure.threads import threads
from .claims import Check, Claim, VerifyContext
from .report import new_figure, png_bytes
from .subject_link import (HELD_OUT_SENTENCES, MIN_LINK_WEIGHT, MIN_SPECIFICITY, SELECTION_SENTENCES, TARGET,
                           closeness, head_rows, judge_subject_link, links, measure_link, select_head)

__all__ = ["CLAIMS", "REFUTED", "SAT_AWARD_SENTENCE", "HEAD_SENTENCES", "judge_subject_link", "head_statistics",
           "quantile_spread", "judge_head_diversity", "claim_minilm_sat_award", "claim_heads_attend_differently"]

SAT_AWARD_SENTENCE = TARGET.text
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


# -- a verb linked to its subject ---------------------------------------------------------------------
def _relation(maps: dict, key: str) -> dict:
    """Choose a head on the selection sentences for verb -> ``key``, then read it on the held-out ones."""
    sel = [measure_link(s, *maps[s.text], key=key) for s in SELECTION_SENTENCES]
    held = [measure_link(s, *maps[s.text], key=key) for s in HELD_OUT_SENTENCES]
    layer, head = select_head(sel)
    l0, h0 = select_head(sel, first_layer=0)                 # the head selection would pick if layer 0 were allowed
    lt, ht = select_head(held[:1])                           # ... if it were picked on the judged sentence itself
    return {"sel": sel, "held": held, "head": {"layer": layer, "head": head},
            "picked_on_judged_sentence": {"layer": lt, "head": ht, **head_rows(held[:1], lt, ht)[0]},
            "selection": head_rows(sel, layer, head), "held_out": head_rows(held, layer, head),
            "any_layer_head": {"layer": l0, "head": h0, "selection_linked": _n_linked(head_rows(sel, l0, h0)),
                               "held_out_linked": _n_linked(head_rows(held, l0, h0))}}


def _n_linked(rows: Sequence[dict]) -> int:
    """In how many of ``rows`` (``head_rows``) the head links the pair by all four requirements."""
    return sum(bool(links(r)) for r in rows)


def _plot_link(subject: dict) -> bytes:
    med = torch.stack([closeness(m) for m in subject["sel"]]).median(0).values          # (layers, heads)
    fig, (ax, ax2) = new_figure(2, width=5.0, height=3.8)
    im = ax.imshow(med.clamp(max=2).numpy(), cmap="viridis", vmin=0, vmax=2)
    ax.set(xlabel="head", ylabel="layer", title="selection set: median closeness to a link",
           xticks=range(med.shape[1]), yticks=range(med.shape[0]))
    from matplotlib.patches import Rectangle
    h = subject["head"]
    ax.add_patch(Rectangle((h["head"] - 0.5, h["layer"] - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.5))
    fig.colorbar(im, ax=ax, shrink=0.7, label="min(weight / 0.2, specificities / 2); a link needs >= 1")
    rows = subject["held_out"]
    x = torch.arange(len(rows), dtype=torch.float64)
    ax2.bar(x - 0.2, [r["key_specificity"] for r in rows], 0.4, label="vs other keys", color="#4c72b0")
    ax2.bar(x + 0.2, [r["query_specificity"] for r in rows], 0.4, label="vs other queries", color="#dd8452")
    ax2.axhline(MIN_SPECIFICITY, ls="--", c="k", lw=1, label=f"{MIN_SPECIFICITY:g}x")
    ax2.set_xticks(x.tolist(), [f'{r["verb"]}->{r["key"]}' for r in rows], rotation=30, fontsize=8)
    ax2.set(ylabel="specificity", title=f'held out, chosen head L{h["layer"]}H{h["head"]}')
    ax2.legend(fontsize=8)
    return png_bytes(fig)


def claim_minilm_sat_award(ctx: VerifyContext) -> Claim:
    """A MiniLM head outside layer 0, chosen on other sentences, links verbs to their subjects ("sat" -> "award")."""
    from .inspect import attention_maps
    maps = {}
    with threads(1):                             # ~17 tokens: a second thread only waits on a busy machine
        for s in SELECTION_SENTENCES + HELD_OUT_SENTENCES:
            m = attention_maps("minilm", s.text, backend="reference")
            maps[s.text] = (m.tokens, m.weights)
    subject, control = _relation(maps, "subject"), _relation(maps, "clause_noun")
    checks = judge_subject_link(subject["head"], subject["selection"], subject["held_out"])
    h, a0, t, c = subject["head"], subject["any_layer_head"], subject["picked_on_judged_sentence"], control["head"]
    target = next(r for r in subject["held_out"] if r["verb"] == TARGET.verb)
    n_sel, n_held = len(SELECTION_SENTENCES), len(HELD_OUT_SENTENCES)
    name = f'L{h["layer"]}H{h["head"]}'
    return Claim(
        "minilm-sat-award", 'Pretrained MiniLM: a head links verbs to their subjects ("sat" -> "award")',
        statement='In "The award, which was given for lifetime achievement, sat proudly on the shelf" the subject '
                  'of "sat" is "award", eight words back across a relative clause. Attention can link them '
                  "directly; a trained model that has learned the relation has a head beyond layer 0 that does it "
                  "in sentences it was not chosen on: the verb singles its subject out from the other words, and "
                  "the subject is not merely a word every other word looks at.",
        criterion=f"all-MiniLM-L6-v2 (6 layers x 12 heads), reference backend; one head chosen among layers 1-5 "
                  f"on {n_sel} selection sentences (the most sentences linked, then the nearest to the thresholds "
                  "in median), judged on {n_held} held-out sentences of the same form; content words "
                  "= all tokens but [CLS] and [SEP]",
        checks=checks,
        measurement={"head": h, "selection": subject["selection"], "held_out": subject["held_out"],
                     "best_head_with_layer_0": a0, "picked_on_judged_sentence": t,
                     "control_clause_noun": {"head": c, "selection": control["selection"],
                                             "held_out": control["held_out"],
                                             "held_out_linked": _n_linked(control["held_out"])}},
        summary=f'chosen on the selection set: {name}, linking {_n_linked(subject["selection"])} of {n_sel} '
                f'selection and {_n_linked(subject["held_out"])} of {n_held} held-out sentences; "sat" -> "award" '
                f'there {target["key_specificity"]:.2f}x other keys, {target["query_specificity"]:.2f}x other '
                f'queries, weight {target["weight"]:.2f}',
        figure=_plot_link(subject),
        notes=f"A link in one sentence is: rank 1 of the verb's row, weight >= {MIN_LINK_WEIGHT}, and >= "
              f"{MIN_SPECIFICITY:g}x against other keys and other queries. The head is chosen on the selection "
              "sentences alone, so it cannot be the one lucky head of 72 on the judged sentence: picked on "
              f'"{TARGET.text}" itself, the best head outside layer 0 would be L{t["layer"]}H{t["head"]} '
              f'({t["key_specificity"]:.2f}x other keys, {t["query_specificity"]:.2f}x other queries, weight '
              f'{t["weight"]:.2f}). '

              f'With layer 0 allowed, selection would pick L{a0["layer"]}H{a0["head"]}, which links '
              f'{a0["selection_linked"]} of {n_sel} selection and {a0["held_out_linked"]} of {n_held} held-out '
              "sentences: layer 0 sees token and position embeddings only, so its links are lexical or positional. "
              f'Control, reported and not judged: the same procedure for verb -> a noun inside the clause (not '
              f'the subject) picks L{c["layer"]}H{c["head"]}, linking {_n_linked(control["held_out"])} of {n_held} '
              "held-out sentences. all-MiniLM-L6-v2 is a 6-layer model distilled and tuned for sentence "
              "similarity, not parsing, and need not keep syntax in single heads; Clark et al. 2019 found "
              "subject-verb heads in BERT-base, 12 layers deep.")


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
    from .inspect import attention_maps, registered_model
    sentences = HEAD_SENTENCES                   # a small fixed set: the same in --quick
    tokenize = registered_model("minilm").tokenize
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


CLAIMS = [claim_heads_attend_differently]
# Refuted here (docs/results.md records it): no MiniLM head outside layer 0 links verb to subject on
# held-out sentences. The head chosen on the selection set, L5H11, links 0 of 6 selection and 0 of 5
# held-out sentences; the README's L5H4 gives "sat" -> "award" 1.94x other keys and 1.56x other queries,
# where 2x is required.
# The judge stays: should a head pass one day, the run fails until the claim is re-examined and moved back.
REFUTED = [claim_minilm_sat_award]
