"""The plain-text report of ``attnlab bench --lm`` (the JSON is the report dict itself, see ``report.write_json``).

Example::

    text = format_lm(run_lm(LMBenchConfig(**LM_QUICK)))
"""
from __future__ import annotations

from ..measure.machine import cpu_label, run_warnings

__all__ = ["format_lm", "training_verdict"]

NANOGPT = "nanoGPT-equivalent"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Left-aligned first column, right-aligned numbers, two spaces between columns."""
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]

    def line(cells):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return [line(header), line(["-" * w for w in widths])] + [line(r) for r in rows]


def training_verdict(row: dict) -> str:
    """The issue #5 target (attnlab >= nanoGPT) judged on the paired ratio and its spread over rounds."""
    lo, hi = row["paired_iqr"]
    r = row["paired_speed_vs_nanogpt"]
    if r >= 1.0:
        return f"met: x{r:.3f} (per-round IQR {lo:.3f}-{hi:.3f})"
    if hi >= 1.0:
        return f"not shown, within noise: x{r:.3f} (per-round IQR {lo:.3f}-{hi:.3f} includes 1)"
    return f"not met: x{r:.3f} (per-round IQR {lo:.3f}-{hi:.3f})"


def _training(report: dict) -> list[str]:
    t, m, c = report["training"], report["meta"]["model"], report["meta"]["config"]
    diffs = t["max_abs_logit_diff_vs_nanogpt"]
    rows = [[r["name"], f"{1e3 * r['median_s']:.1f}", f"{r['tokens_per_s']:.0f}", f"{r['speed_vs_nanogpt']:.3f}",
             f"{r['paired_speed_vs_nanogpt']:.3f} [{r['paired_iqr'][0]:.3f}, {r['paired_iqr'][1]:.3f}]",
             f"{1e3 * r['cpu_median_s']:.1f}", f"{r['cpu_speed_vs_nanogpt']:.3f}", f"{r['last_loss']:.4f}",
             "" if r["name"] == NANOGPT else f"{diffs[r['name']]:.1e}"]
            for r in t["rows"]]
    head = (f"training step (forward, cross-entropy, backward, AdamW): {c['preset']} preset, {m['n_layers']} layers, "
            f"{m['n_heads']} heads, C={m['d_model']}, {t['params']:,} parameters (every model), vocab "
            f"{m['vocab_size']}, B={c['batch']} T={c['seq_len']}, {c['repeats']} round-robin rounds")
    lines = [head] + _table(["model", "median ms", "tokens/s", "x nanoGPT", "x nanoGPT per round [IQR]",
                             "CPU ms", "x nanoGPT (CPU)", "last loss", "|logit diff| at init"], rows)
    for r in t["rows"]:
        if r["name"].startswith("attnlab GPT"):
            lines.append(f"target attnlab >= nanoGPT, {r['name']}: {training_verdict(r)}")
    lines.append("x nanoGPT > 1 = faster than nanoGPT (wall-clock medians; per round: median of the per-round "
                 "ratios; CPU: process CPU time, which time spent waiting for a busy machine does not inflate)")
    lines.append("every model starts from the same weights and trains on the same batch: equal losses = the same "
                 "arithmetic")
    return lines


def _generation(report: dict) -> list[str]:
    gen = report["generation"]
    if not gen:
        return []
    rows = []
    for r in gen:
        ms, s = r["ms_per_token"], r["step_at_context"]
        row = [f"{r['prompt']} -> {r['total']}", f"{ms['kv-cache']:.2f}", f"{ms['recompute']:.2f}",
               f"{ms['nanoGPT recompute']:.2f}", f"{r['speedup_cache_vs_recompute']:.2f}",
               "yes" if r["same_tokens_cache_vs_recompute"] and r["same_tokens_cache_vs_nanogpt"] else "NO",
               f"{s['cached_ms']:.2f} ({s['cached_cpu_ms']:.2f})", f"{s['full_ms']:.2f} ({s['full_cpu_ms']:.2f})",
               f"{s['speedup']:.1f} ({s['full_cpu_ms'] / s['cached_cpu_ms']:.1f})"]
        rows.append(row)
    header = ["tokens", "cache ms/tok", "recompute ms/tok", "nanoGPT ms/tok", "x (gen)", "same",
              "step@N cached ms (CPU)", "step@N full ms (CPU)", "x (step) (CPU)"]
    return (["greedy generation, batch 1 (ms per new token, medians of round-robin runs); step@N = producing "
             "token N alone: one cached step vs a full forward of N tokens"] + _table(header, rows)
            + ["same = the KV-cache tokens equal the recomputed ones and nanoGPT's"])


def _overheads(report: dict) -> list[str]:
    lines = []
    for o in report["overheads"]:
        lines.append(f"{o['what']} ({o['calls_per_step']} calls per forward)")
        lines += [f"    {us:9.1f} us  {name}" for name, us in o["us_per_call"].items()]
    return ["per-call costs (microbenchmarks, round-robin medians)"] + lines if lines else []


def format_lm(report: dict) -> str:
    """Training table with the target verdicts, generation table, overheads, then the machine."""
    meta = report["meta"]
    lines = _training(report) + [""] + _generation(report)
    over = _overheads(report)
    if over:
        lines += [""] + over
    lines += ["", f"{meta['torch_threads']} threads on {cpu_label(meta)}, torch {meta['torch']}"]
    lines += run_warnings(meta)
    return "\n".join(lines) + "\n"
