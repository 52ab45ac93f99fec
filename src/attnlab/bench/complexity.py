"""``attnlab bench --complexity``: time and peak memory against n, and the fitted exponent of n.

Five series, forward pass, B=1 H=8 D=64 float32, self-attention of n tokens:

    reference, sdpa, tiled   exact attention, no mask: O(n^2) time (the reference also O(n^2) memory)
    sparse                   the ``window`` case (masks.window(256, 0): 257 keys per query, the
                             same work as masks.window(128, 128)): O(n W)
    linear                   elu + 1 linear attention, no mask: O(n D Dv)

n runs 1k ... 64k, and 128k, 256k for sparse and linear. A point is skipped (and the table says
so) when it would exceed the memory limit (``contestants.memory_skip_reason``) or when one run is
predicted, from the series' last two points, to take longer than ``run_budget_s``. Time is the
median of several runs (``timing.time_median``); peak memory is measured in a fresh subprocess per
point (``memory.measure_peak``). Each series is fitted to time ~ n^alpha by least squares on
log-log over n >= ``fit_min_n`` (small n measure overheads, not growth).

Then the issue's targets: causal fwd+bwd of linear vs the tiled exact kernel at n = 65536, and
the sparse window forward vs torch SDPA given the same dense mask at n = 16384.

Example::

    rep = run_complexity(ComplexityConfig(**COMPLEXITY_QUICK))
    text = format_complexity(rep)
    paths = plot_complexity(rep, "bench-results/complexity")     # -time.png, -memory.png
"""
from __future__ import annotations

import gc
import logging
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

from ..functional import available_backends
from ..measure.machine import LoadMonitor, machine_info, run_warnings
from ..measure.timing import time_interleaved, time_median
from .cases import Case, make_inputs, useful_flops
from .contestants import make_runner, memory_skip_reason
from .memory import fit_power_law, measure_peak
from .plots import line_plot
from .report import fmt_bytes

__all__ = ["ComplexityConfig", "COMPLEXITY_QUICK", "SERIES", "run_complexity", "format_complexity",
           "plot_complexity"]

log = logging.getLogger(__name__)

# series name -> (attnlab backend, mask kind of ``cases``)
SERIES = {"reference": ("reference", "none"), "sdpa": ("sdpa", "none"), "tiled": ("tiled", "none"),
          "sparse": ("sparse", "window"), "linear": ("linear", "none"), "favor": ("favor", "none")}
LONG = ("sparse", "linear", "favor")     # the series that also run at ``long_n``
EXACT = ("reference", "sdpa", "tiled")
# A deliberately optimistic speed for deciding whether a target run is long (then: one timed run).
ASSUMED_GFLOPS = 100.0


@dataclass
class ComplexityConfig:
    n: list[int] = field(default_factory=lambda: [1024, 2048, 4096, 8192, 16384, 32768, 65536])
    long_n: list[int] = field(default_factory=lambda: [131072, 262144])   # sparse and linear only
    series: list[str] = field(default_factory=lambda: ["reference", "sdpa", "tiled", "sparse", "linear"])
    batch: int = 1
    heads: int = 8
    head_dim: int = 64
    dtype: str = "float32"
    window: int = 256                     # W of the sparse series' window mask
    fit_min_n: int = 4096                 # the alpha fit uses n >= this
    run_budget_s: float = 30.0            # skip a point whose single run is predicted to take longer
    repeats: Optional[int] = None         # timed runs per point; None = adaptive (3-10 runs, ~0.5 s)
    memory: bool = True                   # peak memory, fresh subprocess per point
    memory_n: Optional[list[int]] = None  # the n at which memory is measured; None = every timed point
    memory_limit_gb: float = 16.0
    targets: bool = True
    causal_n: int = 65536                 # linear vs tiled, causal fwd+bwd
    mask: Optional[str] = None            # every series on this mask kind (None = each series' own)
    mode: str = "fwd"                     # fwd or fwdbwd for the series
    sparse_n: int = 16384                 # sparse vs torch SDPA with the dense mask, fwd


# Well under a minute: small n, memory at one n, targets at n = 2048 (the code paths, not the claims).
COMPLEXITY_QUICK = dict(n=[256, 512, 1024], long_n=[2048], fit_min_n=256, memory_n=[1024], causal_n=2048,
                        sparse_n=2048, repeats=3)


def _case(cfg: ComplexityConfig, mask: str, n: int, mode: str = "fwd") -> Case:
    return Case(mask, n, cfg.dtype, mode, cfg.batch, cfg.heads, cfg.head_dim, cfg.window)


def _predicted_s(points: list[dict], n: int) -> Optional[float]:
    """One run's time at n, extrapolated from the last two timed points (exponent clipped to [1, 2.5])."""
    timed = [(p["n"], p["median_s"]) for p in points if "median_s" in p]
    if not timed:
        return None
    n1, t1 = timed[-1]
    p = 2.0
    if len(timed) >= 2:
        n0, t0 = timed[-2]
        p = min(2.5, max(1.0, fit_power_law([n0, n1], [t0, t1])[1]))
    return t1 * (n / n1) ** p


def _time_point(backend: str, case: Case, repeats: Optional[int]) -> dict:
    q, k, v = make_inputs(case)
    t = time_median(make_runner(backend, case, q, k, v).step, repeats)
    return {"median_s": t.median_s, "times_s": t.times_s, "first_s": t.first_s}


def _run_series(name: str, cfg: ComplexityConfig) -> dict:
    backend, mask = SERIES[name]
    mask = cfg.mask or mask
    out = {"backend": backend, "mask": mask, "points": []}
    if backend not in available_backends():
        out["note"] = f"skipped: backend {backend!r} is not registered"
        return out
    ns = sorted(set(cfg.n) | (set(cfg.long_n) if name in LONG else set()))
    for n in ns:
        case = _case(cfg, mask, n, cfg.mode)
        point = {"n": n}
        out["points"].append(point)
        why = memory_skip_reason(backend, case, cfg.memory_limit_gb)
        pred = _predicted_s(out["points"][:-1], n)
        if why is None and pred is not None and pred > cfg.run_budget_s:
            why = f"skipped: one run predicted ~{pred:.0f} s (budget {cfg.run_budget_s:g} s)"
        if why:
            point["note"] = why
            log.info("  %-9s n=%-7d %s", name, n, why)
            continue
        point.update(_time_point(backend, case, cfg.repeats))
        gc.collect()
        if cfg.memory and (cfg.memory_n is None or n in cfg.memory_n):
            rep = measure_peak(backend, case)
            point.update({"peak_extra_bytes": rep["peak_extra_bytes"]} if "error" not in rep
                         else {"note": f"memory: {rep['error']}"})
        log.info("  %-9s n=%-7d %10.2f ms%s", name, n, point["median_s"] * 1e3,
                 f"  peak {point['peak_extra_bytes'] / 1e6:.1f} MB" if "peak_extra_bytes" in point else "")
    out["fit"] = _fit(out["points"], "median_s", cfg.fit_min_n)
    out["memory_fit"] = _fit(out["points"], "peak_extra_bytes", cfg.fit_min_n)
    return out


def _fit(points: list[dict], key: str, min_n: int) -> Optional[dict]:
    """{"alpha", "fit_n"}: y ~ n^alpha over the points with n >= min_n (least squares on log-log);
    with fewer than two such points, over the largest three (None with fewer than two in all)."""
    measured = [(p["n"], p[key]) for p in points if key in p]
    pts = [(n, y) for n, y in measured if n >= min_n]
    if len(pts) < 2:
        pts = measured[-3:]
    if len(pts) < 2:
        return None
    _, alpha = fit_power_law([n for n, _ in pts], [y for _, y in pts])
    return {"alpha": alpha, "fit_n": [n for n, _ in pts]}


def _time_target(backend: str, case: Case, budget_s: float) -> dict:
    """Median time of ``backend`` on ``case``; a run expected to be long is timed once, unwarmed."""
    q, k, v = make_inputs(case)
    step = make_runner(backend, case, q, k, v).step
    if backend in EXACT and useful_flops(case) / (ASSUMED_GFLOPS * 1e9) > budget_s:
        t0 = time.perf_counter()
        step()
        s = time.perf_counter() - t0
        return {"median_s": s, "times_s": [s], "note": "1 run, no warm-up (minutes per run; warm-up costs ms)"}
    t = time_median(step)
    return {"median_s": t.median_s, "times_s": t.times_s}


def _memory_note(names: tuple[str, ...], case: Case, cfg: ComplexityConfig) -> Optional[str]:
    """The first of ``names`` whose run on ``case`` is over the memory limit, and why (None: all fit)."""
    for name in names:
        why = memory_skip_reason(name, case, cfg.memory_limit_gb)
        if why:
            return f"{name} {why}"
    return None


def _target_causal(cfg: ComplexityConfig) -> dict:
    case = _case(cfg, "causal", cfg.causal_n, "fwdbwd")
    res = {"n": cfg.causal_n, "mode": "fwdbwd", "mask": "causal"}
    note = _memory_note(("linear", "tiled"), case, cfg)
    if note:
        return {**res, "note": note}
    for name in ("linear", "tiled"):
        log.info("  target: causal fwd+bwd n=%d %s", cfg.causal_n, name)
        res[name] = _time_target(name, case, cfg.run_budget_s)
        gc.collect()
    res["ratio"] = res["linear"]["median_s"] / res["tiled"]["median_s"]
    return res


def _target_sparse(cfg: ComplexityConfig) -> dict:
    res = {"n": cfg.sparse_n, "mode": "fwd", "mask": f"window({cfg.window}, 0)"}
    if "sparse" not in available_backends():
        res["note"] = "skipped: the sparse backend is not registered"
        return res
    case = _case(cfg, "window", cfg.sparse_n)
    note = _memory_note(("torch-sdpa", "sparse"), case, cfg)
    if note:
        return {**res, "note": note}
    q, k, v = make_inputs(case)
    steps = [make_runner(name, case, q, k, v).step for name in ("torch-sdpa", "sparse")]
    for s in steps:
        s()                                                   # warm-up
    log.info("  target: window fwd n=%d sparse vs torch SDPA with the dense mask", cfg.sparse_n)
    t_sdpa, t_sparse = time_interleaved(steps, cfg.repeats)
    res["torch-sdpa"] = {"median_s": statistics.median(t_sdpa), "times_s": t_sdpa}
    res["sparse"] = {"median_s": statistics.median(t_sparse), "times_s": t_sparse}
    res["speedup"] = res["torch-sdpa"]["median_s"] / res["sparse"]["median_s"]
    return res


def run_complexity(cfg: ComplexityConfig, argv: Optional[list[str]] = None) -> dict:
    """Run every series and the targets; returns the report (what the JSON file holds)."""
    unknown = [s for s in cfg.series if s not in SERIES]
    if unknown:
        raise ValueError(f"unknown complexity series {unknown}; choose from {list(SERIES)}")
    meta = machine_info(argv)
    monitor = LoadMonitor()
    series = {}
    for name in cfg.series:
        log.info("series %s", name)
        series[name] = _run_series(name, cfg)
    targets = {}
    if cfg.targets:
        targets["causal_fwdbwd"] = _target_causal(cfg)
        targets["sparse_vs_sdpa_dense"] = _target_sparse(cfg)
    meta.update(config=asdict(cfg), load=monitor.stop(),
                memory="peak extra = VmHWM during one step minus VmRSS before it, fresh subprocess per point",
                time="median of the timed runs after one warm-up call (timing.time_median)")
    return {"meta": meta, "series": series, "targets": targets}


def _cell(p: Optional[dict], key: str) -> str:
    if p is None:
        return ""
    if key in p:
        return f"{p[key] * 1e3:.1f}" if key == "median_s" else fmt_bytes(p[key])
    return "skipped" if "median_s" not in p and "note" in p else ""


def _grid(report: dict, key: str, title: str) -> list[str]:
    s = report["series"]
    names = list(s)
    ns = sorted({p["n"] for v in s.values() for p in v["points"]})
    lines = [title, f"{'n':>7}  " + "  ".join(f"{nm:>10}" for nm in names)]
    for n in ns:
        cells = [_cell(next((p for p in s[nm]["points"] if p["n"] == n), None), key) for nm in names]
        lines.append(f"{n:>7}  " + "  ".join(f"{c:>10}" for c in cells))
    return lines


def _target_lines(report: dict, judge: bool) -> list[str]:
    """The targets' figures; with ``judge`` (the issue's sizes), whether each is met."""
    t, s, lines = report["targets"], report["series"], []

    def _verdict(ok: bool) -> str:
        return ("met" if ok else "NOT met") if judge else "not judged"
    c = t.get("causal_fwdbwd")
    if c and "note" in c:
        lines.append(f"causal fwd+bwd n={c['n']}: {c['note']}")
    elif c:
        lines.append(f"causal fwd+bwd n={c['n']}: linear {c['linear']['median_s']:.2f} s, tiled "
                     f"{c['tiled']['median_s']:.2f} s{' (' + c['tiled']['note'] + ')' if 'note' in c['tiled'] else ''}"
                     f": linear/tiled = {c['ratio']:.3f} (target < 0.1: {_verdict(c['ratio'] < 0.1)})")
    w = t.get("sparse_vs_sdpa_dense")
    if w and "speedup" in w:
        lines.append(f"{w['mask']} fwd n={w['n']}: sparse {w['sparse']['median_s'] * 1e3:.1f} ms, torch SDPA with "
                     f"the dense mask {w['torch-sdpa']['median_s'] * 1e3:.1f} ms: {w['speedup']:.1f}x "
                     f"(target >= 10x: {_verdict(w['speedup'] >= 10)})")
    elif w:
        lines.append(f"sparse vs SDPA: {w.get('note')}")
    for name, v in s.items():
        fit = v.get("fit")
        if fit is None:
            continue
        if name in EXACT:
            lines.append(f"alpha {name} = {fit['alpha']:.2f} (target ~2: {_verdict(1.8 <= fit['alpha'] <= 2.2)})")
        elif name in ("sparse", "linear"):
            lines.append(f"alpha {name} = {fit['alpha']:.2f} (target <= 1.15: {_verdict(fit['alpha'] <= 1.15)})")
    return lines


def format_complexity(report: dict) -> str:
    """Time and memory tables (rows n, one column per series), the alpha fits and the targets."""
    c, s = report["meta"]["config"], report["series"]
    shape = (f"{c.get('mode', 'fwd')}, B={c['batch']} H={c['heads']} D={c['head_dim']} {c['dtype']}, "
             "self-attention L = S = n")
    lines = _grid(report, "median_s", f"time (ms, median), {shape}")
    if c["memory"]:
        lines += [""] + _grid(report, "peak_extra_bytes", "peak extra memory (MB, fresh subprocess per point)")
    lines.append("")
    for name, v in s.items():
        fit, mfit = v.get("fit"), v.get("memory_fit")
        desc = f"{name} ({v['backend']}, mask {v['mask']}{' W=' + str(c['window']) if v['mask'] == 'window' else ''})"
        if "note" in v:
            lines.append(f"{desc}: {v['note']}")
            continue
        lines.append(f"{desc}: time ~ n^{fit['alpha']:.2f} over n={fit['fit_n']}" if fit else
                     f"{desc}: fewer than 2 timed points, no fit")
        if mfit:
            lines[-1] += f"; memory ~ n^{mfit['alpha']:.2f}"
        lines += [f"    n={p['n']}: {p['note']}" for p in v["points"] if "note" in p]
    if report["targets"]:
        judge = c["causal_n"] >= 65536 and c["sparse_n"] >= 16384 and max(c["n"]) >= 65536
        lines += ["", "issue #4 targets" + ("" if judge else " (small n: not the issue's sizes, not judged)")]
        lines += ["  " + x for x in _target_lines(report, judge)]
    lines += run_warnings(report["meta"])
    return "\n".join(lines) + "\n"


def plot_complexity(report: dict, prefix: str) -> list[str]:
    """Log-log PNGs of time and peak memory against n, one line per series: prefix-time.png, -memory.png."""
    s = report["series"]
    paths = []
    for key, unit, scale, suffix in (("median_s", "seconds (median)", 1.0, "time"),
                                     ("peak_extra_bytes", "peak extra memory (MB)", 1e-6, "memory")):
        lines = {}
        for name, v in s.items():
            pts = [(p["n"], p[key] * scale) for p in v["points"] if key in p]
            fit = v.get("fit" if key == "median_s" else "memory_fit")
            label = name + (f" (n^{fit['alpha']:.2f})" if fit else "")
            lines[label] = ([n for n, _ in pts], [y for _, y in pts])
        if any(xs for xs, _ in lines.values()):
            c = report["meta"]["config"]
            paths.append(line_plot(f"{prefix}-{suffix}.png", lines, xlabel="n (tokens)", ylabel=unit,
                                   title=f"attention {suffix} vs n (fwd, B={c['batch']} H={c['heads']} "
                                         f"D={c['head_dim']} {c['dtype']})"))
    return paths
