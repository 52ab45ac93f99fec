"""The run's metrics log (JSON lines) and its loss-curve picture.

Each line of ``metrics.jsonl`` is one record: ``{"step", "loss", "lr", "tokens_per_s", "elapsed_s"}``
after a training step ("examples_per_s" for tasks counted in examples), or ``{"step", "val_loss",
...}`` after an evaluation, with the task's ``val_metrics`` (a language model's "val_nats_per_char").
On resume from step k the records after k (written by the interrupted run after its last
checkpoint) are dropped, so the log reads like one uninterrupted run.

Example::

    log = MetricsLog("runs/a/metrics.jsonl", resume_step=None)    # None: a fresh run, an empty log
    log.write({"step": 1, "loss": 4.6})
    plot_loss_curve(log.records(), "runs/a/loss.png")
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional, Union

__all__ = ["MetricsLog", "read_records", "plot_loss_curve", "format_metrics"]


class MetricsLog:
    def __init__(self, path: Union[str, Path], resume_step: Optional[int] = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = [r for r in self.records() if r.get("step", 0) <= resume_step] if resume_step is not None else []
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
        os.replace(tmp, self.path)

    def write(self, record: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def records(self) -> list[dict]:
        return read_records(self.path)


def read_records(path: Union[str, Path]) -> list[dict]:
    """The records of a ``metrics.jsonl`` (none if it is missing), without opening it for writing
    as ``MetricsLog`` does."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:            # a line cut short by a crash: skip it
            continue
    return out


def plot_loss_curve(records: list[dict], path: Union[str, Path], title: str = "",
                    ylabel: str = "cross-entropy (nats / token)") -> Path:
    """Training loss (raw and smoothed) and validation loss against step, as a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    if train:
        steps, losses = zip(*train)
        ax.plot(steps, losses, color="tab:blue", alpha=0.25, lw=0.8, label="train (per step)")
        smooth, ema = [], 0.0
        for t, x in enumerate(losses, 1):
            ema = 0.95 * ema + 0.05 * x
            smooth.append(ema / (1 - 0.95 ** t))              # bias-corrected: no lag from a zero start
        ax.plot(steps, smooth, color="tab:blue", lw=1.5, label="train (EMA 0.95)")
    if val:
        steps, losses = zip(*val)
        ax.plot(steps, losses, "o-", color="tab:orange", ms=3, label="validation")
        ax.annotate(f"{losses[-1]:.3f}", (steps[-1], losses[-1]), textcoords="offset points", xytext=(4, 6))
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(ylabel)
    ax.set_title(title or "loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def format_metrics(metrics: dict) -> str:
    """``{"val_nats_per_char": 1.5, "exact_match": 0.99}`` -> ``"nats/char 1.5000, exact_match 0.9900"``."""
    def label(k: str) -> str:
        return k.removeprefix("val_").replace("_per_", "/")
    return ", ".join(f"{label(k)} {v:.4f}" if isinstance(v, float) else f"{label(k)} {v}" for k, v in metrics.items())
