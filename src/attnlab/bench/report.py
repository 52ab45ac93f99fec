"""Benchmark output: a plain-text table for people, a JSON file with every number for programs.

Example::

    report = run_kernels(cfg)
    text = format_table(report)                   # the CLI prints this to stdout
    write_json(report, "bench-results/kernels.json")
"""
from __future__ import annotations

import json
import os
from typing import Optional

from ..measure.machine import cpu_label, run_warnings
from ..measure.timing import MAX_CALL_S

__all__ = ["format_table", "write_json", "fmt_bytes"]

COLUMNS = ["case (mask n dtype mode)", "contestant", "median ms", "GFLOP/s", "% peak", "x SDPA",
           "x flex", "peak MB", "notes"]
RIGHT = {"median ms", "GFLOP/s", "% peak", "x SDPA", "x flex", "peak MB", "busy ms", "x busy"}
BUSY_COLUMNS = ["busy ms", "x busy"]    # --contention only: median beside a busy core, and its ratio to quiet


def _num(x: Optional[float], digits: int = 1) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def _ms(x: Optional[float]) -> str:
    if x is None:
        return ""
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 1000 else f"{x:.0f}"


def fmt_bytes(b: Optional[float]) -> str:
    """Bytes as MB, e.g. '12.3' or '34000'."""
    if b is None:
        return ""
    mb = b / 1e6
    return f"{mb:.1f}" if mb < 1000 else f"{mb:.0f}"


def _peak(r: dict) -> str:
    if "peak_extra_bytes" not in r:
        return ""
    s = fmt_bytes(r["peak_extra_bytes"])
    return f"~{s} extrap." if r.get("peak_source") == "extrapolated" else s


def _cells(r: dict, first_of_case: bool, busy: bool = False) -> list[str]:
    c = r["case"]
    label = f"{c['mask']} {c['n']} {c['dtype']} {c['mode']}" if first_of_case else ""
    contended = [_ms(r.get("median_ms_busy")), _num(r.get("slowdown_busy"), 2)] if busy else []
    return [label, r["contestant"], _ms(r.get("median_ms")), _num(r.get("gflops")),
            _num(r.get("pct_peak")), _num(r.get("x_sdpa"), 2), _num(r.get("x_flex"), 2), *contended, _peak(r),
            "; ".join(r.get("notes", []))]


def _footer(report: dict) -> list[str]:
    meta = report["meta"]
    used = {r["case"]["mask"] for r in report["results"]}
    c = meta.get("config", {})
    lines = [f"shape: B={c.get('batch')} H={c.get('heads')} D={c.get('head_dim')}, self-attention L = S = n; "
             f"{meta['torch_threads']} threads on {cpu_label(meta)}, torch {meta['torch']}",
             ("GEMM peak (measured: fastest of 10 2048^3 matmuls, smaller where one call would take over "
              f"{MAX_CALL_S} s; bf16 and fp16 the faster of torch's and MKL's GEMM of that dtype; at start and end): ")
             + ", ".join(f"{dt} {g:.0f} GFLOP/s" for dt, g in meta["gemm_peak_gflops"].items()),
             f"GFLOP/s: {meta['flops']}",
             f"{meta['ratios']}",
             "masks: " + "; ".join(f"{k} = {v}" for k, v in meta["mask_kinds"].items() if k in used)
             + (f" [W={c.get('window')}, docs={c.get('docs')}]" if used & {"window", "documents"} else ""),
             "contestants: attnlab backends get the structured mask"
             + (" (for 'dense', masks.dense of the bool tensor)" if "dense" in used else "")
             + "; torch-sdpa gets the dense mask (built untimed); flex = torch.compile(flex_attention) with an "
             "untimed BlockMask"]
    src = meta.get("attnlab_source") or {}
    if src.get("commit"):
        lines.append(f"attnlab source: {src['commit'][:10]}" + (" + uncommitted changes" if src.get("dirty") else ""))
    if any("peak_extra_bytes" in r for r in report["results"]):
        lines.append(f"peak MB: {meta['memory']}; 'extrap.' = power-law fit over smaller n, not measured")
    drift = {dt: abs(a - meta["gemm_peak_gflops_end"][dt]) / max(a, meta["gemm_peak_gflops_end"][dt])
             for dt, a in meta.get("gemm_peak_gflops_start", {}).items()}
    if drift and max(drift.values()) > 0.1:
        lines.append("WARNING: the GEMM peak changed by "
                     + ", ".join(f"{100 * d:.0f}% ({dt})" for dt, d in drift.items())
                     + " between start and end: this machine's speed drifts; compare rows of one run, "
                       "not across runs")
    lines += run_warnings(meta)
    busy = [r["busy"] for r in report["results"] if "slowdown_busy" in r]
    if busy:
        lines.append(f"busy ms = median while a busy process spun on core {busy[0]['core']} (one per case, started "
                     f"before and killed after the contended runs); x busy = busy ms / median ms (> 1 = slowed)")
    if any(r["contestant"] == "flex" for r in report["results"]):
        lines.append("flex compile = first call minus steady-state median; inductor cache "
                     + ("warm" if meta.get("inductor_cache_warm_at_start") else "cold") + " at start")
    if c.get("fwdbwd_max_n") is not None and "fwdbwd" in c.get("modes", []) \
            and max(c.get("n", [0])) > c["fwdbwd_max_n"]:
        lines.append(f"fwdbwd ran only for n <= {c['fwdbwd_max_n']} (pass --n/--mode explicitly to run larger)")
    fc = c.get("flex_cases")
    if c.get("flex") and fc is not None:
        lines.append(f"flex ran only for (mask, n) in {[tuple(x) for x in fc]} (compiling costs seconds per case)")
    return lines


def format_table(report: dict) -> str:
    """The results as an aligned plain-text table, one row per (case, contestant), then a legend."""
    rows, prev = [], None
    busy = any("busy" in r for r in report["results"])
    columns = COLUMNS[:-2] + BUSY_COLUMNS + COLUMNS[-2:] if busy else COLUMNS
    for r in report["results"]:
        key = tuple(sorted(r["case"].items()))
        rows.append(_cells(r, key != prev, busy))
        prev = key
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(columns)]
    widths[-1] = len(columns[-1])           # notes: ragged, last column

    def line(cells):
        return "  ".join(c.rjust(w) if h in RIGHT else c.ljust(w)
                         for c, w, h in zip(cells, widths, columns)).rstrip()
    out = [line(columns), line(["-" * w for w in widths])]
    prev_label = None
    for row in rows:
        if row[0] and prev_label is not None:
            out.append("")                  # a blank line between cases
        prev_label = row[0] or prev_label
        out.append(line(row))
    return "\n".join(out + [""] + _footer(report) + format_auto(report)) + "\n"


def format_auto(report: dict) -> list[str]:
    """One line per case: auto's pick, the fastest exact backend beside it, and whether auto is within
    the bench's AUTO_WITHIN of it (no lines when no case timed auto beside two exact backends)."""
    from .kernels import AUTO_WITHIN
    from .lm_report import _table
    judged = [r for r in report["results"] if "auto_vs_best" in r]
    if not judged:
        return []
    within = f"within {100 * (AUTO_WITHIN - 1):.0f}%"
    cells = [[f"{r['case']['mask']} {r['case']['n']} {r['case']['dtype']} {r['case']['mode']}", r["picked"],
              r["best_exact"], f"{r['auto_vs_best']:.3f}", f"{r.get('auto_vs_best_medians', r['auto_vs_best']):.3f}",
              "yes" if r["auto_within"] else "NO"] for r in judged]
    ok = sum(r["auto_within"] for r in judged)
    return ["", f"auto against the fastest exact backend: {within} on {ok} of {len(judged)} cases "
                "(judged by the median of the per-round ratios: the rounds are interleaved, so each round's "
                "ratio cancels the machine's drift)",
            *_table(["case (mask n dtype mode)", "auto ->", "fastest exact", "time(best) / time(auto) per round",
                     "of the medians", within], cells)]


def write_json(report: dict, path: str) -> str:
    """Write the report to ``path`` (creating its directory); returns the path."""
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    return path
