"""PNG line plots for the benchmark reports (matplotlib, Agg backend: no display needed).

Example::

    line_plot("bench-results/t.png", {"tiled": ([1024, 2048], [0.01, 0.04])},
              xlabel="n", ylabel="seconds", title="time vs n", logx=True, logy=True)
"""
from __future__ import annotations

import os
from typing import Optional, Sequence

__all__ = ["line_plot"]


def line_plot(path: str, series: dict[str, tuple[Sequence[float], Sequence[float]]], *, xlabel: str,
              ylabel: str, title: str, logx: bool = True, logy: bool = True,
              bands: Optional[dict[str, tuple[Sequence[float], Sequence[float]]]] = None,
              refs: Optional[dict[str, tuple[str, float]]] = None) -> str:
    """Draw one marked line per series (and optional shaded bands, horizontal reference lines).

    Args:
        path: the PNG to write (its directory is created).
        series: label -> (xs, ys); series with no points are left out.
        bands: label -> (lows, highs) at the same xs as ``series[label]`` (e.g. the spread over seeds).
        refs: series label -> (label, y) of a dashed horizontal line in that series' colour.
    Returns:
        path.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for label, (xs, ys) in series.items():
        if not xs:
            continue
        line, = ax.plot(xs, ys, marker="o", label=label)
        if bands and label in bands:
            lo, hi = bands[label]
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2)
        if refs and label in refs:
            ref_label, y = refs[label]
            ax.axhline(y, linestyle="--", color=line.get_color(), label=ref_label)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
