"""The variable-scope claim (``code-scope``): does a use of a name attend to the binding it reads, rather
than to the same name bound in a scope it cannot see?

Pairs come from ``data.code_scope.scope_pairs``: a use, b_in (the latest earlier binding in the scope
Python's rules say it reads) and b_out (the latest earlier binding of the same name in a scope the use
cannot see). For each pair the query q is the token holding the use's last character and the window
is the ``seq_len`` tokens ending at q (shorter only near a file's start); a pair is kept when both
bindings' tokens lie in it and no two of use, b_in, b_out share a token. For every head at once:

- w_in, w_out = the head's total weight from q on b_in's tokens, on b_out's tokens;
- control: the same window with the tokens of b_in and of b_out each replaced, token for token (so
  no position moves), by identifier tokens drawn with a seeded generator (never one of the name's
  own tokens; a token that starts with a space gets one that does too), the use left as it is —
  w_in_ctrl, w_out_ctrl measured alike. With no name linking the use to either binding, a head that
  still prefers b_in does so by position or context, not by the name.

The head with the largest share of pairs with w_in > w_out on the "select" half of the held-out
files (ties: the larger mean(w_in) / mean(w_out)) is judged once on the "test" half (``judge_scope``).

Example::

    stats = scope_stats(gpt, tokenizer, files, seq_len=256, seed=0)
    stats["w_in"][layer, head]                     # (pairs,): weight from the use on its in-scope binding
    scope_summary(stats, layer, head)["in_beats_out"]
"""
from __future__ import annotations

import bisect
import keyword
import tokenize
from typing import Optional

import numpy as np

from ..data.code_analysis import python_tokens
from ..data.code_scope import scope_pairs
from ..tasks.code import encode_with_offsets
from .claims import Check
from .code_measure import attention_weights

__all__ = ["identifier_tokens", "scope_windows", "scramble_names", "scope_stats", "scope_summary", "scope_head",
           "judge_scope", "scope_verdict", "held_out_scope_stats"]


def identifier_tokens(tokenizer) -> np.ndarray:
    """Ids of the vocabulary's tokens whose text, leading spaces stripped, is a Python identifier (not a keyword).

    Example::

        identifier_tokens(CharTokenizer.train("x = 1"))      # array([3]): "x" (" ", "1", "=" are not)
    """
    bare = [tokenizer.decode([i]).lstrip(" ") for i in range(tokenizer.vocab_size)]
    return np.array([i for i, t in enumerate(bare) if t.isidentifier() and not keyword.iskeyword(t)], dtype=np.int64)


def _file_windows(tokenizer, text: str, seq_len: int) -> list[dict]:
    try:
        pairs = scope_pairs(text)
    except (SyntaxError, ValueError, RecursionError):
        return []
    ids, where = encode_with_offsets(tokenizer, text)
    seen: dict[str, list[int]] = {}                          # name -> starts of its NAME tokens (any occurrence)
    for ttype, tok, start, _ in python_tokens(text):
        if ttype == tokenize.NAME:
            seen.setdefault(tok, []).append(start)
    span = lambda a, b: np.arange(int(where[a]), int(where[b - 1]) + 1)     # tokens holding characters a..b-1
    out = []
    for p in pairs:
        use, b_in, b_out = span(p.use_start, p.use_end), span(p.in_start, p.in_end), span(p.out_start, p.out_end)
        q = int(use[-1])
        w0 = max(0, q - seq_len + 1)
        if min(b_in[0], b_out[0]) < w0 or b_in[-1] >= use[0] or b_out[-1] >= use[0] or np.intersect1d(b_in, b_out).size:
            continue
        starts = seen.get(p.name, [])
        before = starts[bisect.bisect_left(starts, p.use_start) - 1] if starts and starts[0] < p.use_start else None
        out.append({"ids": ids[w0:q + 1], "in_pos": b_in - w0, "out_pos": b_out - w0, "use_pos": use - w0,
                    "d_in": q - int(b_in[-1]), "d_out": q - int(b_out[-1]), "name": p.name,
                    "out_nearer": p.out_nearer, "in_is_nearest": before == p.in_start})
    return out


def scope_windows(tokenizer, files, seq_len: int, max_pairs: Optional[int] = None) -> list[dict]:
    """The kept pairs of ``files`` ((path, text) pairs), each with its window (see the module doc).

    Returns dicts: ids (the window's token ids, ending at the query), in_pos / out_pos / use_pos (window
    positions of b_in's, b_out's and the use's tokens), d_in / d_out (q minus each binding's last token),
    name, out_nearer, in_is_nearest (the nearest preceding same-named token, any occurrence found by
    ``tokenize``, is b_in itself). With ``max_pairs``, that many spread evenly over all kept pairs in file order.
    """
    found = [w for _, text in files for w in _file_windows(tokenizer, text, seq_len)]
    if max_pairs is not None and len(found) > max_pairs:
        found = [found[int(i)] for i in np.linspace(0, len(found) - 1, max_pairs).round()]
    return found


def scramble_names(win: dict, pool: np.ndarray, lead: np.ndarray, rng: np.random.Generator) -> list[int]:
    """The control's window: ``win["ids"]`` with b_in's and b_out's tokens each replaced by a token drawn from
    ``pool`` (``identifier_tokens``) that is none of the name's own (the tokens of b_in, b_out and the use).

    Args:
        win: a ``scope_windows`` dict.
        lead: (vocab,) bool, whether a token's text starts with a space; a replacement keeps it where it can.
    Returns:
        the token ids, as long as ``win["ids"]``: every position but b_in's and b_out's is unchanged.

    Example::

        scramble_names(win, identifier_tokens(tok), lead, np.random.default_rng(0))
    """
    ids = np.array(win["ids"])
    allowed = pool[~np.isin(pool, ids[np.concatenate([win["in_pos"], win["out_pos"], win["use_pos"]])])]
    if not allowed.size:
        raise ValueError("the vocabulary has no identifier token other than the name's own to scramble with")
    for pos in np.concatenate([win["in_pos"], win["out_pos"]]):
        alike = allowed[lead[allowed] == lead[ids[pos]]]
        ids[pos] = rng.choice(alike if alike.size else allowed)
    return ids.tolist()


def scope_stats(model, tokenizer, files, seq_len: int, *, seed: int = 0, max_pairs: Optional[int] = None,
                batch: int = 8) -> dict:
    """Every head's weight from each use on its two bindings, and the same with both names scrambled.

    Args:
        model: a GPT (``attention_weights`` reads its heads from the reference backend).
        files: ((path, text), ...) of Python source.
        seq_len: the window (the model's context).
        seed: the control's token draws.
        max_pairs: at most this many pairs, spread evenly (None: all).
    Returns:
        "w_in", "w_out", "w_in_ctrl", "w_out_ctrl": arrays (layers, H, pairs); per pair "d_in", "d_out",
        "out_nearer", "in_is_nearest", "name"; "windows" (one per pair) and "shape" (layers, H).
    """
    wins = scope_windows(tokenizer, files, seq_len, max_pairs)
    pool = identifier_tokens(tokenizer)
    lead = np.array([tokenizer.decode([i]).startswith(" ") for i in range(tokenizer.vocab_size)])
    rng = np.random.default_rng(seed)
    jobs = [(i, False, w["ids"]) for i, w in enumerate(wins)] + \
           [(i, True, scramble_names(w, pool, lead, rng)) for i, w in enumerate(wins)]
    shape = (len(model.blocks), model.cfg.n_heads)
    out = {k: np.zeros(shape + (len(wins),)) for k in ("w_in", "w_out", "w_in_ctrl", "w_out_ctrl")}
    by_len: dict[int, list] = {}
    for job in jobs:
        by_len.setdefault(len(job[2]), []).append(job)             # equal lengths batch without padding
    for group in by_len.values():
        for k in range(0, len(group), batch):
            chunk = group[k:k + batch]
            rows = attention_weights(model, [ids for _, _, ids in chunk])[..., -1, :]     # (B, layers, H, L): from q
            for (i, ctrl, _), row in zip(chunk, rows):
                suffix = "_ctrl" if ctrl else ""
                out["w_in" + suffix][..., i] = row[..., wins[i]["in_pos"]].sum(-1)
                out["w_out" + suffix][..., i] = row[..., wins[i]["out_pos"]].sum(-1)
    per_pair = {k: [w[k] for w in wins] for k in ("d_in", "d_out", "out_nearer", "in_is_nearest", "name")}
    return {**out, **per_pair, "windows": len(wins), "shape": shape}


def scope_summary(stats: dict, layer: int, head: int, control: bool = False) -> dict:
    """One head's numbers (on the scrambled windows if ``control``): pairs, the share of pairs with w_in > w_out
    (strictly: a tie is a loss), mean w_in, mean w_out and their ratio."""
    suffix = "_ctrl" if control else ""
    w_in, w_out = stats["w_in" + suffix][layer, head], stats["w_out" + suffix][layer, head]
    n = int(w_in.size)
    m_in, m_out = (float(w_in.mean()), float(w_out.mean())) if n else (0.0, 0.0)
    return {"layer": layer, "head": head, "control": control, "pairs": n,
            "in_beats_out": float((w_in > w_out).mean()) if n else 0.0, "w_in": m_in, "w_out": m_out,
            "ratio": m_in / max(m_out, 1e-12)}


def scope_head(stats: dict) -> tuple[int, int]:
    """(layer, head) with the largest share of w_in > w_out; ties go to the larger mean(w_in) / mean(w_out)."""
    n_layers, n_heads = stats["shape"]

    def score(lh):
        s = scope_summary(stats, *lh)
        return s["in_beats_out"], s["ratio"]
    return max(((l, h) for l in range(n_layers) for h in range(n_heads)), key=score)


def _meets(s: dict, beats: float, ratio: float) -> tuple[bool, bool]:
    n = s["pairs"]
    return n > 0 and s["in_beats_out"] >= beats, n > 0 and s["w_in"] > 0 and s["w_in"] >= ratio * s["w_out"]


def judge_scope(s: dict, s_ctrl: dict, beats: float, ratio: float, min_pairs: int) -> list[Check]:
    """Enough pairs; w_in > w_out in >= ``beats`` of them; mean w_in >= ``ratio`` x mean w_out; and the
    name-scrambled control does not meet both of the last two (``scope_summary`` dicts)."""
    share_ok, ratio_ok = _meets(s, beats, ratio)
    ctrl_share, ctrl_ratio = _meets(s_ctrl, beats, ratio)
    return [Check(f"at least {min_pairs} uses with both bindings in the window", s["pairs"] >= min_pairs,
                  str(s["pairs"])),
            Check(f"the use attends more to the binding it reads than to the same name bound in another scope "
                  f"(w_in > w_out) in >= {beats:.0%} of uses", share_ok, f"{s['in_beats_out']:.0%}"),
            Check(f"mean weight on the binding it reads >= {ratio} x mean weight on the other scope's binding",
                  ratio_ok, f"{s['w_in']:.3f} vs {s['w_out']:.3f} ({s['ratio']:.1f}x)"),
            Check(f"with both bindings' names scrambled (same positions), the head no longer meets both: "
                  f"w_in > w_out in < {beats:.0%} of uses or mean w_in < {ratio} x mean w_out",
                  not (ctrl_share and ctrl_ratio),
                  f"{s_ctrl['in_beats_out']:.0%}, {s_ctrl['w_in']:.3f} vs {s_ctrl['w_out']:.3f} "
                  f"({s_ctrl['ratio']:.1f}x)")]


def scope_verdict(stats_by_half: dict, cfg) -> tuple[int, int, dict, dict, list[Check]]:
    """The head chosen on ``stats_by_half["select"]``, summarised and judged on ``["test"]``:
    (layer, head, summary, control summary, checks); ``cfg`` a ``CodeClaimConfig``."""
    layer, head = scope_head(stats_by_half["select"])
    s = scope_summary(stats_by_half["test"], layer, head)
    c = scope_summary(stats_by_half["test"], layer, head, control=True)
    return layer, head, s, c, judge_scope(s, c, cfg.scope_beats, cfg.scope_ratio, cfg.min_scope_pairs)


def held_out_scope_stats(gpt, data, cfg) -> dict:
    """``scope_stats`` on each half of the held-out files with the model's context: {"select": ..., "test": ...}
    (``cfg.windows``, when set, caps the pairs per half)."""
    return {half: scope_stats(gpt, data.tokenizer, data.heldout_half(half), gpt.cfg.max_len, seed=cfg.train.seed,
                              max_pairs=cfg.windows)
            for half in ("select", "test")}
