"""Judge auto again in stored `attnlab bench` JSON with the bench's verdict as it is now, and count right picks.

A run's timings are kept as they were (``times_ms``, one per interleaved round); only the verdict is computed
again, by ``bench.kernels._add_auto_verdict`` (since issue #27: the median of the per-round ratios). "Right
pick": the backend auto ran is within 5% of the fastest exact backend by their medians, whatever auto's own
row measured.

Usage: python scripts/bench_rejudge.py docs/bench-results-amx-noisy-grid-builtin-fwd.json [...]
"""
import json
import sys

from attnlab.bench.kernels import AUTO_WITHIN, _add_auto_verdict
from attnlab.bench.report import format_auto


def rejudge(path: str) -> list[str]:
    with open(path) as f:
        report = json.load(f)
    cases: dict[str, list[dict]] = {}
    for row in report["results"]:
        cases.setdefault(json.dumps(row["case"], sort_keys=True), []).append(row)
    right = judged = 0
    for rows in cases.values():
        _add_auto_verdict(rows)
        auto = next((r for r in rows if "auto_vs_best" in r), None)
        if auto is None:
            continue
        medians = {r["contestant"]: r["median_ms"] for r in rows if r["contestant"] == auto["picked"]
                   or r["contestant"] == auto["best_exact"]}
        judged += 1
        right += medians[auto["picked"]] <= AUTO_WITHIN * medians[auto["best_exact"]]
    return [f"{path}: right pick on {right} of {judged} cases", *format_auto(report)]


if __name__ == "__main__":
    for p in sys.argv[1:]:
        sys.stdout.write("\n".join(rejudge(p)) + "\n\n")
