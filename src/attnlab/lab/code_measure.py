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

Syntax (``syntax_samples``): the model continues a held-out function's ``def`` line and docstring;
the sample is cut where the function ends (``cut_body``) and judged by ``body_parses``.

Example::

    stats = attention_stats(gpt, tokenizer, files, block_size=256)
    stats["brackets"][layer][head]["hit"]           # list of 0/1, one per bracket pair
"""
from __future__ import annotations

from collections import defaultdict
from typing import Optional

import numpy as np
import torch

from ..data.code_analysis import (bracket_pairs, body_parses, cut_body, def_use_pairs, function_prompts)
from ..tasks.code import encode_with_offsets

__all__ = ["DISTANCE_BINS", "distance_bin", "file_windows", "attention_stats", "head_summary", "pick_prompts",
           "syntax_samples"]

DISTANCE_BINS = [(1, 2), (3, 4), (5, 8), (9, 16), (17, 32), (33, 64), (65, 128), (129, 256), (257, 1 << 30)]
_BRACKETS = set("()[]{}")


def distance_bin(d: int) -> str:
    """"5-8" style label of the bin holding token distance d."""
    for lo, hi in DISTANCE_BINS:
        if lo <= d <= hi:
            return f"{lo}-{hi}" if hi < 1 << 30 else f">{lo - 1}"
    raise ValueError(f"distance {d} must be >= 1")


def file_windows(tokenizer, files, block_size: int, max_windows: Optional[int] = None) -> list[dict]:
    """Non-overlapping windows of ``block_size`` tokens over each file, with the file's pairs mapped to tokens.

    Returns dicts: ids (list of block_size ints), brackets [(o, c, nested)], defuse [(first, last, q, kind)],
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
        for w0 in range(0, len(ids) - block_size + 1, block_size):
            inside = lambda t: w0 <= t < w0 + block_size            # noqa: E731
            win = {"ids": ids[w0:w0 + block_size], "brackets": [], "defuse": [], "nearest": {},
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
def _weights(model, windows: list[dict], batch: int = 8):
    """Yield (window, weights (layers, H, L, L) as numpy) for each window (reference backend: exact weights)."""
    model.eval()
    backend = model.cfg.backend
    model.with_backend("reference")
    try:
        for i in range(0, len(windows), batch):
            chunk = windows[i:i + batch]
            capture: list = []
            model(torch.tensor([w["ids"] for w in chunk]), capture=capture)
            w = torch.stack([c.weights for c in capture], 1).float().numpy()   # (B, layers, H, L, L)
            yield from zip(chunk, w)
    finally:
        model.with_backend(backend)


def attention_stats(model, tokenizer, files, block_size: int, max_windows: Optional[int] = None) -> dict:
    """Per layer and head, the bracket and def → use measurements over ``files`` (see the module doc).

    Returns {"brackets": [[{hit, w, d, nested} lists per head] per layer], "bracket_controls":
    [[{distance: [weights]}]], "nearest_hit": [...], "defuse": [[{w, control, d, hit, kind}]],
    "windows": n}.
    """
    windows = file_windows(tokenizer, files, block_size, max_windows)
    n_layer, n_head = len(model.blocks), model.cfg.n_head
    grid = lambda make: [[make() for _ in range(n_head)] for _ in range(n_layer)]  # noqa: E731
    br = grid(lambda: defaultdict(list))
    ctrl = grid(lambda: defaultdict(list))
    du = grid(lambda: defaultdict(list))
    nearest_hit, pair_d, pair_nested = [], [], []
    for win, W in _weights(model, windows):
        match = {c: o for o, c, _ in win["brackets"]}
        for o, c, nested in win["brackets"]:
            nearest_hit.append(int(win["nearest"][c] == o))
            pair_d.append(c - o)
            pair_nested.append(bool(nested))
        closes = sorted(match)
        for l in range(n_layer):
            for h in range(n_head):
                A = W[l, h]                                                   # (L, L), row = query
                s = br[l][h]
                for o, c, _ in win["brackets"]:
                    s["hit"].append(int(A[c, :c + 1].argmax() == o))
                    s["w"].append(float(A[c, o]))
                for c in closes:                                             # same-distance controls
                    for o2 in win["opens"]:
                        if o2 < c and o2 != match[c]:
                            ctrl[l][h][c - o2].append(float(A[c, o2]))
                d = du[l][h]
                for first, last, q, kind in win["defuse"]:
                    span = np.arange(q - last, q - first + 1)                 # distances of the def tokens
                    rows = np.arange(q - first, A.shape[0])                   # queries with the whole span behind
                    control = A[rows[:, None], rows[:, None] - span[None]].sum(1)   # (rows,)
                    others = control[rows != q]
                    d["w"].append(float(A[q, first:last + 1].sum()))
                    d["control"].append(float(others.mean()) if len(others) else float("nan"))
                    d["d"].append(q - first)
                    d["hit"].append(int(first <= A[q, :q + 1].argmax() <= last))
                    d["kind"].append(kind)
    return {"brackets": [[dict(br[l][h], d=pair_d, nested=pair_nested) for h in range(n_head)]
                         for l in range(n_layer)],
            "bracket_controls": ctrl, "nearest_hit": nearest_hit, "pair_d": pair_d, "pair_nested": pair_nested,
            "defuse": du, "windows": len(windows)}


def head_summary(stats: dict, layer: int, head: int) -> dict:
    """One head's headline numbers: bracket accuracy (all, nested, by distance) with controls, def → use ratio."""
    b = stats["brackets"][layer][head]
    hit, w = np.array(b.get("hit", []), dtype=float), np.array(b.get("w", []), dtype=float)
    d, nested = np.array(stats["pair_d"], dtype=int), np.array(stats["pair_nested"], dtype=bool)
    near = np.array(stats["nearest_hit"], dtype=float)
    ctrl = stats["bracket_controls"][layer][head]
    ctrl_mean = {k: float(np.mean(v)) for k, v in ctrl.items()}
    by_bin = {}
    for lo, hi in DISTANCE_BINS:
        sel = (d >= lo) & (d <= hi)
        if not sel.any():
            continue
        paired = [i for i in np.flatnonzero(sel) if d[i] in ctrl_mean]
        by_bin[distance_bin(lo)] = {
            "pairs": int(sel.sum()), "head_accuracy": float(hit[sel].mean()), "nearest_open_accuracy":
            float(near[sel].mean()), "nested_pairs": int((sel & nested).sum()),
            "head_accuracy_nested": float(hit[sel & nested].mean()) if (sel & nested).any() else None,
            "weight_match": float(w[paired].mean()) if paired else None,
            "weight_control": float(np.mean([ctrl_mean[d[i]] for i in paired])) if paired else None,
            "controlled_pairs": len(paired)}
    u = stats["defuse"][layer][head]
    uw, uc = np.array(u.get("w", []), dtype=float), np.array(u.get("control", []), dtype=float)
    ok = ~np.isnan(uc)
    return {"layer": layer, "head": head, "bracket_pairs": len(hit),
            "bracket_accuracy": float(hit.mean()) if len(hit) else 0.0,
            "bracket_accuracy_nested": float(hit[nested].mean()) if nested.any() else 0.0,
            "nearest_open_accuracy": float(near.mean()) if len(near) else 0.0,
            "nearest_open_accuracy_nested": float(near[nested].mean()) if nested.any() else 0.0,
            "nested_pairs": int(nested.sum()), "by_distance": by_bin,
            "defuse_pairs": int(ok.sum()), "defuse_weight": float(uw[ok].mean()) if ok.any() else 0.0,
            "defuse_control": float(uc[ok].mean()) if ok.any() else 0.0,
            "defuse_beats_control": float((uw[ok] > uc[ok]).mean()) if ok.any() else 0.0,
            "defuse_argmax_on_def": float(np.array(u.get("hit", []), dtype=float)[ok].mean()) if ok.any() else 0.0,
            "defuse_mean_distance": float(np.mean(np.array(u.get("d", []))[ok])) if ok.any() else 0.0}


def pick_prompts(tokenizer, files, n: int, max_prompt_tokens: int) -> list:
    """Up to ``n`` function prompts from ``files``, spread evenly over all candidates (deterministic)."""
    found = []
    for _, text in files:
        try:
            found += [p for p in function_prompts(text) if len(tokenizer.encode(p.prompt)) <= max_prompt_tokens]
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
        for nxt in model.generate_tokens(torch.tensor([tokenizer.encode(p.prompt)]), max_new_tokens,
                                         temperature=temperature, top_k=top_k, seed=seed + i):
            ids.append(int(nxt[0]))
            text = tokenizer.decode(ids)
            if "\n" in text and cut_body(text)[1]:
                break
        body, finished = cut_body(text)
        out.append({"name": p.name, "ok": body_parses(p.prompt, body), "finished": finished, "body": body})
    return out
