"""``attnlab show`` for code models: the bracket head and the definition → use head on a piece of code.

The two heads are chosen as the verify claims choose them (``exp_code``): on the "select" half of
the held-out stdlib files (at most ``windows`` windows), the head whose strongest attention from a
closing bracket most often lands on its opening bracket, and the head giving a use the most weight
on its definition beyond the same-distance control. Each is drawn on the code (``--text``, or a
built-in example) twice: closing brackets (rows) against opening brackets (columns) with the true
matches outlined; uses against the definitions' tokens, matches outlined.

Example::

    paths = show_code("runs/verify/work/code-code-5000000-1024-gpt", out="runs/show")
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from ..data.code_analysis import bracket_pairs, def_use_pairs
from ..tasks.code import code_files, encode_with_offsets
from .code_measure import attention_stats, attention_weights, head_summary
from .exp_code import _bracket_score, _defuse_score, best_head

__all__ = ["EXAMPLE", "show_code"]

EXAMPLE = '''def area(box, scale=1):
    """Area of a (w, h) box."""
    return box[0] * box[1] * scale


sizes = [(1, 2), (3, max(4, len(names)))]
total = sum(area(b, scale=(b[0] + 1)) for b in sizes)
'''


def _label(tok, ids: list[int], i: int) -> str:
    return f"{tok.decode([ids[i]]).replace(chr(10), '⏎')!s}@{i}"


def show_code(checkpoint, text: Optional[str] = None, *, out: str = "runs/show", fmt: str = "png",
              windows: int = 40, stem: str = "code") -> list[Path]:
    """Draw the bracket head and the def → use head of a code GPT checkpoint on ``text`` (default ``EXAMPLE``)."""
    from ..train.checkpoint import load_checkpoint
    from .heatmaps import plot_head, save
    from ..tasks.code_models import load_language_model
    model, tok = load_language_model(checkpoint)
    if not hasattr(model, "blocks"):
        raise ValueError(f"{checkpoint} holds the LSTM baseline: it has no attention to draw; show the GPT")
    text = EXAMPLE if text is None else text
    ids, where = encode_with_offsets(tok, text)
    if len(ids) > model.cfg.max_len:
        raise ValueError(f"--text is {len(ids)} tokens, over the model's context of {model.cfg.max_len}")
    info = load_checkpoint(checkpoint).extra.get("data", {})
    held = code_files(info.get("max_bytes", 5_000_000))[1]
    stats = attention_stats(model, tok, held[0::2], model.cfg.max_len, windows)
    W = attention_weights(model, [ids])[0]                                  # (layers, H, L, L)
    written = []
    pairs = [(int(where[p.open]), int(where[p.close])) for p in bracket_pairs(text)]
    pairs = [(o, c) for o, c in pairs if o != c]
    try:
        uses = [(int(where[u.def_start]), int(where[u.def_end - 1]), int(where[u.use_end - 1]))
                for u in def_use_pairs(text, min_lines=1)]
    except SyntaxError:
        uses = []
    for what, score, rows, cols, marks in (
            ("brackets", _bracket_score, sorted({c for _, c in pairs}), sorted({o for o, _ in pairs}), pairs),
            ("def-use", _defuse_score, sorted({q for *_, q in uses}),
             sorted({t for a, b, _ in uses for t in range(a, b + 1)}), [(a, q) for a, _, q in uses])):
        if not rows or not cols:
            noun = "bracket pairs" if what == "brackets" else "definition -> use pairs"
            raise ValueError(f"the code has no {noun} to draw; give --text code that has some")
        layer, head = best_head(stats, score)
        s = head_summary(stats, layer, head)
        result = (f"select-half bracket accuracy {s['bracket_accuracy']:.2f}" if what == "brackets" else
                  f"select-half weight on the definition {s['defuse_weight']:.2f} vs {s['defuse_control']:.2f}")
        sub = W[layer, head][np.ix_(rows, cols)]                                   # (rows, cols)
        mark = [(rows.index(q), cols.index(k)) for k, q in marks if q in rows and k in cols]
        fig = plot_head(sub, [_label(tok, ids, r) for r in rows], [_label(tok, ids, c) for c in cols], mark=mark,
                        title=f"{what} head: layer {layer} head {head}\n{result}\nred: the true match")
        written.append(save(fig, Path(out) / f"{stem}-{what}-L{layer}H{head}.{fmt}"))
    return written
