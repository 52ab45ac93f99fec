"""``attnlab bench --memory-scaling``: how peak memory grows with n, tiled vs reference.

Causal fwd+bwd, peak extra memory measured in a fresh subprocess per point: the reference over
n = 1024 ... 8192, the tiled kernel also at 16384 and 32768. Each is fitted to c * n^p (log-log
least squares over its largest three points), and the reference -- which would need ~34 GB per
fp32 score copy at n = 32768 with 8 heads -- is extrapolated there and compared with the
tiled kernel's measured peak.

Example::

    rep = run_memory_scaling(ScalingConfig(tiled_n=[512, 1024], reference_n=[512, 1024], target_n=1024))
    rep["ratio_at_target"]                # reference / tiled peak extra memory at target_n
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Optional

from ..measure.machine import machine_info
from .cases import Case
from .contestants import memory_skip_reason
from .memory import extrapolate, measure_peak
from ..functional.memory import human_bytes
from .report import fmt_bytes

__all__ = ["ScalingConfig", "run_memory_scaling", "format_scaling"]

log = logging.getLogger(__name__)


@dataclass
class ScalingConfig:
    tiled_n: list[int] = field(default_factory=lambda: [1024, 2048, 4096, 8192, 16384, 32768])
    reference_n: list[int] = field(default_factory=lambda: [1024, 2048, 4096, 8192])
    target_n: int = 32768                 # where the two are compared
    mask: str = "causal"
    mode: str = "fwdbwd"
    dtype: str = "float32"
    batch: int = 1
    heads: int = 8
    head_dim: int = 64
    memory_limit_gb: float = 16.0


def _fit(points: list[dict], target_n: int) -> Optional[dict]:
    measured = [(p["n"], p["peak_extra_bytes"]) for p in points if p.get("peak_extra_bytes")]
    if len(measured) < 2:
        return None
    return extrapolate([n for n, _ in measured], [b for _, b in measured], target_n)


def _at_target(points: list[dict], fit: Optional[dict], target_n: int) -> Optional[dict]:
    """The peak at target_n: measured if that point ran, else extrapolated from the fit."""
    for p in points:
        if p["n"] == target_n and p.get("peak_extra_bytes"):
            return {"bytes": p["peak_extra_bytes"], "source": "measured"}
    if fit is not None:
        return {"bytes": fit["value"], "source": "extrapolated"}
    return None


def run_memory_scaling(cfg: ScalingConfig, argv: Optional[list[str]] = None) -> dict:
    """Measure, fit and compare; returns the report that ``format_scaling`` prints and the JSON holds."""
    meta = machine_info(argv)
    series = {}
    for name, ns in (("tiled", cfg.tiled_n), ("reference", cfg.reference_n)):
        points = []
        for n in ns:
            case = Case(cfg.mask, n, cfg.dtype, cfg.mode, cfg.batch, cfg.heads, cfg.head_dim)
            point = {"n": n}
            skip = memory_skip_reason(name, case, cfg.memory_limit_gb)
            if skip:
                point["note"] = skip
            else:
                rep = measure_peak(name, case)
                if "error" in rep:
                    point["note"] = f"failed: {rep['error']}"
                else:
                    point["peak_extra_bytes"] = rep["peak_extra_bytes"]
            log.info("  %-9s n=%-6d %s", name, n,
                     f"{point['peak_extra_bytes'] / 1e6:.1f} MB" if "peak_extra_bytes" in point else point["note"])
            points.append(point)
        fit = _fit(points, cfg.target_n)
        series[name] = {"points": points, "fit": fit, "at_target": _at_target(points, fit, cfg.target_n)}
    t, r = series["tiled"]["at_target"], series["reference"]["at_target"]
    ratio = r["bytes"] / t["bytes"] if t and r else None
    meta["config"] = asdict(cfg)
    meta["memory"] = "peak extra = VmHWM during one step minus VmRSS before it, fresh subprocess per point"
    return {"meta": meta, "series": series, "ratio_at_target": ratio}


def format_scaling(report: dict) -> str:
    """A plain-text table of the measured points, the fitted exponents and the ratio at target_n."""
    c, s = report["meta"]["config"], report["series"]
    ns = sorted({p["n"] for v in s.values() for p in v["points"]} | {c["target_n"]})
    lines = [f"peak extra memory, {c['mask']} {c['mode']}, B={c['batch']} H={c['heads']} D={c['head_dim']} "
             f"{c['dtype']} (MB, fresh subprocess per point)",
             f"{'n':>7}  {'tiled MB':>16}  {'reference MB':>16}"]
    for n in ns:
        cells = []
        for name in ("tiled", "reference"):
            p = next((p for p in s[name]["points"] if p["n"] == n), None)
            at = s[name]["at_target"]
            if p is not None and "peak_extra_bytes" in p:
                cells.append(fmt_bytes(p["peak_extra_bytes"]))
            elif n == c["target_n"] and at is not None:
                cells.append(f"~{fmt_bytes(at['bytes'])} extrap.")
            else:
                cells.append("skipped" if p is not None else "")
        lines.append(f"{n:>7}  {cells[0]:>16}  {cells[1]:>16}")
    lines.append("")
    for name in ("tiled", "reference"):
        fit = s[name]["fit"]
        if fit is not None:
            lines.append(f"{name}: peak ~ n^{fit['exponent']:.2f} (log-log least squares over n={fit['fit_n']})")
    t, r = s["tiled"]["at_target"], s["reference"]["at_target"]
    if report["ratio_at_target"] is not None:
        lines.append(f"at n={c['target_n']}: reference ~{human_bytes(r['bytes'])} ({r['source']}) vs tiled "
                     f"{human_bytes(t['bytes'])} ({t['source']}): the reference needs "
                     f"{report['ratio_at_target']:.0f}x the memory")
    for name in ("tiled", "reference"):
        for p in s[name]["points"]:
            if "note" in p:
                lines.append(f"{name} n={p['n']}: {p['note']}")
    return "\n".join(lines) + "\n"
