"""Measurements of a code model on held-out files: syntax of sampled bodies, bracket heads, def → use heads.

Attention (``attention_stats``): each held-out file is tokenized and cut into non-overlapping
windows of the model's context; every window is one forward pass capturing every head's weights
(B, H, L, L). Only pairs with both ends in one window count. For each head:

- brackets: for a closing bracket's token c and its opening bracket's token o (``bracket_pairs``;
  pairs whose open or close token holds another bracket character, or that share a token, are
  left out), ``hit`` = the head's strongest weight from c lands on o; ``w`` = A[c, o]. Controls
  at the same distance d = c - o: A[c', c' - d] for every other closing-bracket token c' whose
  token c' - d holds an opening bracket that is not its match. Positional baseline: the nearest
  opening bracket before the closing one (right exactly when nothing is nested in between).
- def → use: for a use whose last token is q and the definition's tokens o..o+n-1 (``def_use_pairs``),
  ``w`` = the head's total weight from q on them; control = the same sum at the same offsets from
  every other query position of the window (the head's mean weight at that distance).

Syntax (``syntax_samples``): the model continues a held-out function's ``def`` line and docstring,
given at their indentation in the file (a method's ``def`` is indented, as every method the model
read in training was); the sample is cut where the function ends (``cut_body``), moved to column 0
with the prompt and judged by ``body_parses``.

Example::

    stats = attention_stats(gpt, tokenizer, files, seq_len=256)
    stats["hit"][layer, head]                       # (pairs,): 1.0 where the strongest weight is on the match
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..data.code_analysis import (bracket_pairs, body_parses, cut_body, def_use_pairs, function_prompts,
                                  shift_left)
from ..nn.backend import set_backend
from ..tasks.code import encode_with_offsets

__all__ = ["DISTANCE_BINS", "distance_bin", "file_windows", "attention_weights", "attention_stats", "head_summary",
           "pick_prompts", "syntax_samples"]

DISTANCE_BINS = [(1, 2), (3, 4), (5, 8), (9, 16), (17, 32), (33, 64), (65, 128), (129, 256), (257, 1 << 30)]
_BRACKETS = set("()[]{}")


def distance_bin(d: int) -> str:
    """"5-8" style label of the bin holding token distance d."""
    for lo, hi in DISTANCE_BINS:
        if lo <= d <= hi:
            return f"{lo}-{hi}" if hi < 1 << 30 else f">{lo - 1}"
    raise ValueError(f"distance {d} must be >= 1")


def file_windows(tokenizer, files, seq_len: int, max_windows: Optional[int] = None) -> list[dict]:
    """Non-overlapping windows of ``seq_len`` tokens over each file, with the file's pairs mapped to tokens.

    Returns dicts: ids (list of seq_len ints), brackets [(o, c, nested)], defuse [(first, last, q, kind)],
    opens (set of window positions holding an opening bracket), nearest {c: token of the nearest
    opening bracket before c's character} — all in window positions.
    """
    out = []
    for _, text in files:
        ids, where = encode_with_offsets(tokenizer, text)
        brackets_in = np.zeros(len(ids), dtype=np.int64)             # bracket characters per token
        np.add.at(brackets_in, where[[i for i, ch in enumerate(text) if ch in _BRACKETS]], 1)
        pairs = bracket_pairs(text)
        open_chars = sorted(p.open for p in pairs)
        try:
            uses = def_use_pairs(text)
        except (SyntaxError, ValueError):
            uses = []
        for w0 in range(0, len(ids) - seq_len + 1, seq_len):
            inside = lambda t: w0 <= t < w0 + seq_len
            win = {"ids": ids[w0:w0 + seq_len], "brackets": [], "defuse": [], "nearest": {},
                   "opens": {int(where[c]) - w0 for c in open_chars if inside(where[c])}}
            for p in pairs:
                o, c = int(where[p.open]), int(where[p.close])
                if not (inside(o) and inside(c)) or o == c or brackets_in[o] > 1 or brackets_in[c] > 1:
                    continue
                win["brackets"].append((o - w0, c - w0, p.nested))
                before = open_chars[np.searchsorted(open_chars, p.close) - 1]      # nearest opening char before
                win["nearest"][c - w0] = int(where[before]) - w0
            for u in uses:
                first, last, q = int(where[u.def_start]), int(where[u.def_end - 1]), int(where[u.use_end - 1])
                if inside(first) and inside(q) and last < q:
                    win["defuse"].append((first - w0, last - w0, q - w0, u.kind))
            out.append(win)
            if max_windows is not None and len(out) >= max_windows:
                return out
    return out


@torch.no_grad()
def attention_weights(model, ids: list) -> np.ndarray:
    """Every head's weights for a batch of equal-length token lists, from the reference backend (exact):
    (B, layers, H, L, L)."""
    model.eval()
    backend = model.cfg.backend
    set_backend(model, "reference")
    try:
        capture: list = []
        model(torch.tensor(ids), capture=capture)
    finally:
        set_backend(model, backend)
    return torch.stack([c.weights for c in capture], 1).float().numpy()


def _weights(model, windows: list[dict], batch: int = 8):
    """Yield (window, weights (layers, H, L, L)) for each window."""
    for i in range(0, len(windows), batch):
        chunk = windows[i:i + batch]
        yield from zip(chunk, attention_weights(model, [w["ids"] for w in chunk]))


def _cat(parts: list, shape: tuple) -> np.ndarray:
    return np.concatenate(parts, axis=-1) if parts else np.zeros(shape + (0,))


def attention_stats(model, tokenizer, files, seq_len: int, max_windows: Optional[int] = None) -> dict:
    """Every head's bracket and def → use measurements over ``files`` (see the module doc), all heads at once.

    Returns arrays over (layers, H, pairs): "hit", "w" (brackets), "du_w", "du_control", "du_hit"
    (def → use); per pair: "pair_d", "pair_nested", "nearest_hit", "du_d", "du_kind"; same-distance
    controls as {distance: (sum of weights (layers, H), count)} in "ctrl"; and "windows".
    """
    windows = file_windows(tokenizer, files, seq_len, max_windows)
    shape = (len(model.blocks), model.cfg.n_heads)
    hit, w, du_w, du_c, du_hit = [], [], [], [], []
    ctrl: dict = {}
    out = {"pair_d": [], "pair_nested": [], "nearest_hit": [], "du_d": [], "du_kind": []}
    for win, W in _weights(model, windows):                                    # W (layers, H, L, L), row = query
        if win["brackets"]:
            o, c, nested = (np.array(v) for v in zip(*win["brackets"]))
            hit.append(W[:, :, c, :].argmax(-1) == o)                          # (layers, H, n): causal rows
            w.append(W[:, :, c, o])
            out["pair_d"] += (c - o).tolist()
            out["pair_nested"] += nested.astype(bool).tolist()
            out["nearest_hit"] += [int(win["nearest"][ci] == oi) for oi, ci in zip(o, c)]
            opens = np.array(sorted(win["opens"]))
            dist = c[:, None] - opens[None, :]                                  # (n, opens)
            ok = (dist > 0) & (opens[None, :] != o[:, None])                    # earlier, not the match
            vals = W[:, :, c[:, None], opens[None, :]]                          # (layers, H, n, opens)
            for i, j in zip(*np.nonzero(ok)):
                s, n = ctrl.get(int(dist[i, j]), (0.0, 0))
                ctrl[int(dist[i, j])] = (s + vals[:, :, i, j], n + 1)
        for first, last, q, kind in win["defuse"]:
            span = np.arange(q - last, q - first + 1)                           # distances of the def tokens
            rows = np.arange(q - first, W.shape[-1])                            # queries with the span behind them
            control = W[:, :, rows[:, None], rows[:, None] - span[None]].sum(-1)   # (layers, H, rows)
            others = control[:, :, rows != q]
            du_w.append(W[:, :, q, first:last + 1].sum(-1)[..., None])
            du_c.append((others.mean(-1) if others.shape[-1] else np.full(shape, np.nan))[..., None])
            top = W[:, :, q, :].argmax(-1)
            du_hit.append(((top >= first) & (top <= last))[..., None])
            out["du_d"].append(q - first)
            out["du_kind"].append(kind)
    return {**out, "hit": _cat(hit, shape).astype(float), "w": _cat(w, shape), "du_w": _cat(du_w, shape),
            "du_control": _cat(du_c, shape), "du_hit": _cat(du_hit, shape).astype(float), "ctrl": ctrl,
            "windows": len(windows), "shape": shape}


def head_summary(stats: dict, layer: int, head: int) -> dict:
    """One head's headline numbers: bracket accuracy (all, nested, by distance) with controls, def → use ratio."""
    hit, w = stats["hit"][layer, head], stats["w"][layer, head]
    d, nested = np.array(stats["pair_d"], dtype=int), np.array(stats["pair_nested"], dtype=bool)
    near = np.array(stats["nearest_hit"], dtype=float)
    ctrl_mean = {k: float(s[layer, head]) / n for k, (s, n) in stats["ctrl"].items()}
    mean = lambda x: float(x.mean()) if len(x) else 0.0
    by_bin = {}
    for lo, hi in DISTANCE_BINS:
        sel = (d >= lo) & (d <= hi)
        if not sel.any():
            continue
        paired = [i for i in np.flatnonzero(sel) if d[i] in ctrl_mean]
        by_bin[distance_bin(lo)] = {
            "pairs": int(sel.sum()), "head_accuracy": mean(hit[sel]), "nearest_open_accuracy": mean(near[sel]),
            "nested_pairs": int((sel & nested).sum()),
            "head_accuracy_nested": mean(hit[sel & nested]) if (sel & nested).any() else None,
            "weight_match": float(w[paired].mean()) if paired else None,
            "weight_control": float(np.mean([ctrl_mean[d[i]] for i in paired])) if paired else None,
            "controlled_pairs": len(paired)}
    uw, uc = stats["du_w"][layer, head], stats["du_control"][layer, head]
    ok = ~np.isnan(uc)
    return {"layer": layer, "head": head, "bracket_pairs": len(hit), "bracket_accuracy": mean(hit),
            "bracket_accuracy_nested": mean(hit[nested]), "nearest_open_accuracy": mean(near),
            "nearest_open_accuracy_nested": mean(near[nested]), "nested_pairs": int(nested.sum()),
            "by_distance": by_bin, "defuse_pairs": int(ok.sum()), "defuse_weight": mean(uw[ok]),
            "defuse_control": mean(uc[ok]), "defuse_beats_control": mean((uw > uc)[ok]),
            "defuse_argmax_on_def": mean(stats["du_hit"][layer, head][ok]),
            "defuse_mean_distance": mean(np.array(stats["du_d"], dtype=float)[ok])}


def pick_prompts(tokenizer, files, n: int, max_prompt_tokens: int) -> list:
    """Up to ``n`` function prompts from ``files``, spread evenly over all candidates (deterministic)."""
    found = []
    for _, text in files:
        try:
            found += [p for p in function_prompts(text) if len(tokenizer.encode(p.in_file)) <= max_prompt_tokens]
        except (SyntaxError, ValueError):
            continue
    if len(found) <= n:
        return found
    return [found[int(i)] for i in np.linspace(0, len(found) - 1, n).round()]


@torch.no_grad()
def syntax_samples(model, tokenizer, prompts, *, max_new_tokens: int, temperature: float, top_k: Optional[int],
                   seed: int) -> list[dict]:
    """Sample a body for each prompt; {"name", "ok" (parses with a statement), "finished", "body"} per prompt."""
    out = []
    for i, p in enumerate(prompts):
        ids: list[int] = []
        text, finished = "", False
        for nxt in model.generate_tokens(torch.tensor([tokenizer.encode(p.in_file)]), max_new_tokens,
                                         temperature=temperature, top_k=top_k, seed=seed + i):
            ids.append(int(nxt[0]))
            text = tokenizer.decode(ids)
            if "\n" in text and cut_body(text, len(p.indent))[1]:
                break
        body, finished = cut_body(text, len(p.indent))
        body = shift_left(body, p.indent)                                  # at column 0, as p.prompt is
        out.append({"name": p.name, "ok": body_parses(p.prompt, body), "finished": finished, "body": body})
    return out
