"""The ``attnlab verify`` report: one self-contained HTML page, a JSON file and the PNGs beside it.

The HTML needs nothing but a browser: inline CSS, figures inlined as ``data:image/png;base64``
URIs, no script, no CDN, no network. Every piece of text that came from an experiment is escaped.
The JSON holds everything the page shows except the PNG bytes; each figure is also written as
``<claim id>.png`` next to it and named in the claim's ``figure_file``. Claims of kind "accounting"
(counts that hold by construction) and "refuted" (claims of the theory found not borne out, as
docs/results.md records) get their own sections and JSON lists and are never counted in the pass/fail
summary; the headline and the JSON's ``verdict`` say whether the run is as recorded (``claims.as_recorded``).

Example::

    paths = write_report(claims, "runs/verify", meta={"quick": True})
    paths["html"], paths["json"]          # runs/verify/report.html, runs/verify/report.json
    fig, ax = new_figure()                # an experiment's plot ...
    claim.figure = png_bytes(fig)         # ... as PNG bytes (the figure is closed)
"""
from __future__ import annotations

import base64
import html
import io
import json
import math
import os
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from .claims import Claim, as_recorded, departures
from .long_experiments import LONG_EXPERIMENTS, LongResult

__all__ = ["write_report", "render_html", "report_dict", "summary_text", "headline", "png_bytes", "new_figure",
           "jsonable", "PNG_SIGNATURE"]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HTML_NAME, JSON_NAME = "report.html", "report.json"

_CSS = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 1100px; margin: 2em auto;
       padding: 0 1em; color: #1d1d1f; }
h1 { margin-bottom: .2em; } h2 { margin-top: 2em; border-bottom: 1px solid #ddd; padding-bottom: .2em; }
table { border-collapse: collapse; width: 100%; margin: 1em 0; }
th, td { border: 1px solid #ddd; padding: .35em .6em; text-align: left; vertical-align: top; }
th { background: #f4f4f6; } th:first-child { width: 22%; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.badge { display: inline-block; padding: .05em .55em; border-radius: .8em; font-size: .8em; font-weight: 600;
         color: #fff; vertical-align: middle; }
.pass .badge, .badge.pass { background: #1a7f37; } .fail .badge, .badge.fail { background: #cf222e; }
tr.fail td:first-child { border-left: 4px solid #cf222e; } tr.pass td:first-child { border-left: 4px solid #1a7f37; }
.verdict { font-size: 1.15em; } code, pre { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: .9em; }
pre { background: #f6f8fa; padding: .8em; overflow-x: auto; white-space: pre-wrap; }
pre.error { background: #fff0f0; border: 1px solid #f3b9b9; }
figure { margin: 1em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
.notes { color: #444; } ul.checks { list-style: none; padding-left: .5em; } ul.checks li { margin: .25em 0; }
.measured { color: #555; } .meta td:first-child { width: 14em; color: #555; }
.badge.acct { background: #6e7781; } tr.acct td:first-child { border-left: 4px solid #6e7781; }
.badge.refuted { background: #8250df; } tr.refuted td:first-child { border-left: 4px solid #8250df; }
.departures { color: #cf222e; font-weight: 600; }
"""


def png_bytes(fig: Any, dpi: int = 110) -> bytes:
    """The matplotlib figure ``fig`` as PNG bytes; the figure is closed afterwards."""
    import matplotlib.pyplot as plt
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=dpi)
    finally:
        plt.close(fig)
    return buf.getvalue()


def new_figure(ncols: int = 1, *, width: float = 5.2, height: float = 3.6):
    """(fig, axes) from matplotlib's Agg backend (no display needed): ``ncols`` panels side by side.

    The layout is "constrained" (labels fit at draw time, in one pass: cheaper than bbox_inches="tight").
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt.subplots(1, ncols, figsize=(width * ncols, height), layout="constrained")


def jsonable(x: Any) -> Any:
    """``x`` as plain JSON values: tensors/arrays to lists, scalars to numbers, NaN/inf to strings, paths to str."""
    if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else str(x)                 # strict JSON has no NaN/Infinity
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in x]
    if hasattr(x, "tolist"):                                     # torch tensors, numpy arrays and scalars
        return jsonable(x.tolist())
    if isinstance(x, os.PathLike):
        return os.fspath(x)
    return str(x)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def summary_text(claim: Claim, max_items: int = 4) -> str:
    """The report table's "measured" cell: the claim's summary, or its scalar measurements."""
    if claim.summary:
        return claim.summary
    if claim.error:
        return "error: " + claim.error.strip().splitlines()[-1][:160]
    items = [f"{k} = {_fmt(v)}" for k, v in claim.measurement.items()
             if isinstance(v, (int, float, str, bool)) and len(_fmt(v)) <= 40][:max_items]
    return "; ".join(items)


def _file_stem(claim_id: str, taken: set[str]) -> str:
    """A file name and HTML anchor for ``claim_id``: only [A-Za-z0-9._-], unique within the report."""
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", claim_id).strip("._") or "claim"
    name, i = stem, 2
    while name in taken:
        name, i = f"{stem}-{i}", i + 1
    taken.add(name)
    return name


def _is_png(data: Optional[bytes]) -> bool:
    return isinstance(data, (bytes, bytearray)) and bytes(data[:8]) == PNG_SIGNATURE


def _verified(claims: Sequence[Claim]) -> list[Claim]:
    return [c for c in claims if c.kind == "claim"]


def headline(claims: Sequence[Claim]) -> str:
    """The run in one line, as the report's title and the CLIs' last line say it.

    Example::

        headline(claims)        # "10 of 10 claims pass; 1 refuted as recorded; 2 accounting"
    """
    verified = _verified(claims)
    refuted = [c for c in claims if c.kind == "refuted"]
    n_acct = sum(c.kind == "accounting" for c in claims)
    parts = [f"{sum(bool(c.passed) for c in verified)} of {len(verified)} claims pass"]
    if refuted:
        held = sum(not c.passed and not c.error for c in refuted)
        parts.append(f"{held} refuted as recorded" if held == len(refuted) else
                     f"{held} of {len(refuted)} refuted as recorded")
    if n_acct:
        parts.append(f"{n_acct} accounting")
    return "; ".join(parts)


def report_dict(claims: Sequence[Claim], meta: Optional[dict] = None, stems: Optional[list[str]] = None) -> dict:
    """What report.json holds: meta, the pass/fail counts of the verified claims (``summary``), the whole
    verdict (``verdict``: as recorded or not, what departs from the record), each claim without its PNG
    bytes, and the accounting and refuted entries (shown, not counted) in lists of their own."""
    stems = stems or _stems(claims)
    rows: dict[str, list] = {"claim": [], "accounting": [], "refuted": []}
    for c, stem in zip(claims, stems):
        d = asdict(c)
        d.pop("figure")
        d["figure_file"] = f"{stem}.png" if _is_png(c.figure) else None
        d["summary"] = summary_text(c)
        d["criterion_text"] = c.criterion_text
        rows[c.kind].append(jsonable(d))
    verified = _verified(claims)
    passed = sum(bool(c.passed) for c in verified)
    return {"meta": jsonable(meta or {}),
            "summary": {"total": len(verified), "passed": passed, "failed": len(verified) - passed,
                        "all_passed": passed == len(verified)},
            "verdict": {"as_recorded": as_recorded(claims), "headline": headline(claims),
                        "departures": departures(claims)},
            "claims": rows["claim"], "accounting": rows["accounting"], "refuted": rows["refuted"],
            "long_experiments": [asdict(r) for r in LONG_EXPERIMENTS]}


def _stems(claims: Sequence[Claim]) -> list[str]:
    taken: set[str] = set()
    return [_file_stem(c.id, taken) for c in claims]


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _badge(passed: bool) -> str:
    return f'<span class="badge {"pass" if passed else "fail"}">{"PASS" if passed else "FAIL"}</span>'


def _paragraphs(text: str) -> str:
    return "".join(f"<p>{_e(p)}</p>" for p in text.split("\n\n") if p.strip())


def _kind_badge(c: Claim) -> str:
    """An accounting entry is not a verdict: grey, and only an error is flagged. A refuted claim that fails
    cleanly is as recorded (REFUTED); one that passes or raised departs from the record (red)."""
    if c.kind == "accounting":
        return _badge(False) if c.error else '<span class="badge acct">ACCOUNTING</span>'
    if c.kind == "refuted":
        if c.error:
            return _badge(False)
        if c.passed:
            return '<span class="badge fail">NOW PASSES</span>'
        return '<span class="badge refuted">REFUTED</span>'
    return _badge(c.passed)


def _css_class(c: Claim) -> str:
    if c.kind == "accounting":
        return "acct"
    if c.kind == "refuted" and not c.passed and not c.error:
        return "refuted"
    return "pass" if c.passed and c.kind == "claim" else "fail"


def _section(c: Claim, stem: str) -> str:
    parts = [f'<section id="claim-{_e(stem)}" class="{_css_class(c)}">',
             f"<h2>{_e(c.title)} {_kind_badge(c)}</h2>",
             f"<p><code>{_e(c.id)}</code> &middot; {c.seconds:.1f} s</p>",
             f"<p><b>Claim.</b> {_e(c.statement)}</p>",
             f"<p><b>Criterion.</b> {_e(c.criterion or '(the checks below)')}</p>"]
    if c.checks:
        items = "".join(f'<li class="{"pass" if k.passed else "fail"}">{_badge(k.passed)} {_e(k.label)}'
                        + (f' <span class="measured">(measured: {_e(k.measured)})</span>' if k.measured else "")
                        + "</li>" for k in c.checks)
        parts.append(f'<ul class="checks">{items}</ul>')
    measured = summary_text(c)
    if measured:
        parts.append(f"<p><b>Measured.</b> {_e(measured)}</p>")
    if c.figure is not None:
        if _is_png(c.figure):
            data = base64.b64encode(bytes(c.figure)).decode("ascii")
            parts.append(f'<figure><img alt="{_e(c.title)}" src="data:image/png;base64,{data}"></figure>')
        else:
            parts.append("<p class=\"notes\">(the experiment's figure was not a PNG and is left out)</p>")
    if c.notes:
        parts.append(f'<div class="notes"><b>Notes.</b>{_paragraphs(c.notes)}</div>')
    if c.error:
        parts.append(f'<p><b>The experiment raised:</b></p><pre class="error">{_e(c.error)}</pre>')
    if c.measurement:
        body = json.dumps(jsonable(c.measurement), indent=1)
        parts.append(f"<details><summary>all measurements (JSON)</summary><pre>{_e(body)}</pre></details>")
    parts.append("</section>")
    return "\n".join(parts)


def _meta_table(meta: dict) -> str:
    rows = []
    for k, v in meta.items():
        val = json.dumps(jsonable(v)) if isinstance(v, (dict, list, tuple)) else _fmt(v)
        rows.append(f"<tr><td>{_e(k)}</td><td>{_e(val)}</td></tr>")
    return f'<table class="meta">{"".join(rows)}</table>'


def _row(c: Claim, stem: str) -> str:
    return (f'<tr class="{_css_class(c)}"><td><a href="#claim-{_e(stem)}">{_e(c.title)}</a><br><code>{_e(c.id)}'
            f"</code></td><td>{_e(c.criterion_text)}</td><td>{_e(summary_text(c))}</td>"
            f'<td>{_kind_badge(c)}</td><td class="num">{c.seconds:.1f}</td></tr>')


def _aside(entries: Sequence[tuple[Claim, str]], heading: str, intro: str, columns: Sequence[str]) -> list[str]:
    """A part of the report outside the count: its heading, what it holds, a table of its entries (its
    four ``columns`` named, then seconds) and a section per entry; nothing when it has no entries."""
    if not entries:
        return []
    head = "".join(f"<th>{col}</th>" for col in columns)
    return [f"<h2>{heading}</h2>", f"<p>{intro}</p>",
            f"<table><thead><tr>{head}<th>seconds</th></tr></thead><tbody>", *[_row(c, s) for c, s in entries],
            "</tbody></table>", *[_section(c, s) for c, s in entries]]


def _refuted(entries: Sequence[tuple[Claim, str]]) -> list[str]:
    return _aside(entries, "Refuted here (claims of the theory not borne out by this measurement)",
                  "Claims the theory makes that this lab measures and finds not borne out, as docs/results.md "
                  "records. Each keeps its judge, and its section lists the checks it fails. They are not part of "
                  "the count above; the run is as recorded only while each of them fails without an error, so one "
                  "that starts to pass (or raises) fails the run until it is re-examined.",
                  ("claim", "criterion", "measured", "result"))


def _accounting(entries: Sequence[tuple[Claim, str]]) -> list[str]:
    return _aside(entries, "Accounting (shown, not counted as verified claims)",
                  "Counts that hold by construction: a FLOP count is read off the operands' shapes, so it cannot "
                  "come out otherwise for the shapes the theory names. They are shown for what they count and what "
                  "they leave out, and are not part of the verdict above.",
                  ("entry", "how it is counted", "counted", ""))


def _long(records: Sequence[LongResult]) -> list[str]:
    if not records:
        return []
    rows = [f"<tr><td>{_e(r.title)}<br><code>{_e(r.claim)}</code></td><td>{_e(r.result)}</td>"
            f"<td>{'' if r.passed is None else _badge(r.passed)}</td><td>{_e(r.date)}<br>{_e(r.machine)}</td>"
            f"<td><code>{_e(r.command)}</code><br>{_e(r.where)}</td></tr>" for r in records]
    return ["<h2>Long experiments (last recorded result; not run here)</h2>",
            "<p>Claims whose experiments take longer than this run may spend (tens of minutes of an idle machine "
            "per model). They are run by their scripts and their last result is recorded by hand "
            "(lab/long_experiments.py, with the figures in docs/results.md). Nothing in this table was measured "
            "by this run, and none of it is in the count above.</p>",
            "<table><thead><tr><th>claim</th><th>recorded result</th><th>verdict</th><th>when, where</th>"
            "<th>command</th></tr></thead><tbody>", *rows, "</tbody></table>"]


def render_html(claims: Sequence[Claim], meta: Optional[dict] = None, stems: Optional[list[str]] = None) -> str:
    """The whole report page as a string (summary table, a section per claim, the refuted claims, the
    accounting, machine metadata)."""
    meta = meta or {}
    stems = stems or _stems(claims)
    verified = [(c, s) for c, s in zip(claims, stems) if c.kind == "claim"]
    refuted = [(c, s) for c, s in zip(claims, stems) if c.kind == "refuted"]
    accounting = [(c, s) for c, s in zip(claims, stems) if c.kind == "accounting"]
    passed = sum(bool(c.passed) for c, _ in verified)
    title = f"attnlab verify: {headline(claims)}"
    rows = [_row(c, s) for c, s in verified]
    verdict = ("every claim passed" if passed == len(verified) else
               f"{len(verified) - passed} claim{'s' if len(verified) - passed != 1 else ''} failed")
    changed = departures(claims)
    if changed:
        verdict += "; not as recorded"
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        f'<p class="verdict">{_badge(passed == len(verified) and not changed)} {_e(verdict)}'
        + (f" &middot; {_e(_fmt(meta['total_seconds']))} s in all" if "total_seconds" in meta else "")
        + (" &middot; quick mode (small sizes)" if meta.get("quick") else "") + "</p>",
        *[f'<p class="departures">{_e(d)}</p>' for d in changed],
        "<p>Each claim of the theory of self-attention, checked on this machine: what was measured, the pass "
        "criterion stated before measuring (the set-up, then each labelled check the judge applied), and the "
        "result.</p>",
        "<table><thead><tr><th>claim</th><th>criterion</th><th>measured</th><th>result</th><th>seconds</th>"
        "</tr></thead><tbody>", *rows, "</tbody></table>",
        *[_section(c, s) for c, s in verified], *_refuted(refuted), *_accounting(accounting),
        *_long(LONG_EXPERIMENTS),
        "<h2>Machine and versions</h2>", _meta_table(meta),
        "</body></html>", ""])


def _write_atomic(path: Path, data: Union[str, bytes]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    if isinstance(data, str):
        tmp.write_text(data, encoding="utf-8")
    else:
        tmp.write_bytes(data)
    os.replace(tmp, path)                      # a reader never sees half a report


def write_report(claims: Sequence[Claim], out_dir: Union[str, os.PathLike], meta: Optional[dict] = None) -> dict:
    """Write report.html, report.json and one ``<id>.png`` per figure into ``out_dir`` (created).

    Args:
        claims: the experiments' results, in report order.
        out_dir: the directory to write to.
        meta: machine, versions, options; shown at the end of the page and stored in the JSON.
    Returns:
        {"html": Path, "json": Path, "figures": [Path, ...]}.
    """
    if not all(isinstance(c, Claim) for c in claims):
        bad = [type(c).__name__ for c in claims if not isinstance(c, Claim)]
        raise TypeError(f"write_report takes Claim objects, got {bad}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stems = _stems(claims)
    figures = []
    for c, stem in zip(claims, stems):
        if _is_png(c.figure):
            figures.append(out / f"{stem}.png")
            _write_atomic(figures[-1], bytes(c.figure))
    _write_atomic(out / JSON_NAME, json.dumps(report_dict(claims, meta, stems), indent=1) + "\n")
    _write_atomic(out / HTML_NAME, render_html(claims, meta, stems))
    return {"html": out / HTML_NAME, "json": out / JSON_NAME, "figures": figures}
