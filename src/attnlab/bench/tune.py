"""``attnlab tune``'s measurements: the compiled kernel against SDPA on this machine, for ``auto`` to read.

Two sweeps, each pair of contestants warmed up then timed round-robin (``time_interleaved``), medians:

* plain: dtype x (no mask, causal) x (forward, forward+backward) x n, at B = 1, H = 8, head dim D;
* masked: dtype x mode at n = ``masked_n``, key padding that leaves a growing fraction of the tiles
  empty (``PADDED``): where the kernel's skipping starts to beat SDPA's dense mask.

The contestants are attnlab's ``sdpa`` and ``native`` backends as ``auto`` would run them, wrapper included.
``functional/profile.py`` stores the rows and turns them into choices.

Example::

    cfg = TuneConfig(n=[1024], dtypes=["float32"], modes=["fwd"])
    plain, masked = run_tune(cfg, progress=lambda label: None)
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..functional import attention, masks
from ..functional.api import skippable
from ..functional.request import make_request
from ..measure.timing import paired, time_interleaved
from .cases import Case, make_inputs
from .contestants import timed_step

__all__ = ["TuneConfig", "run_tune", "PADDED", "CONTESTANTS"]

CONTESTANTS = ("sdpa", "native")
# Fractions of the keys cut off by padding: enough points to find where skipping starts to pay (the
# class rules put it between 10% and 60% of the tiles, issue #27), few enough for a tune of minutes.
PADDED = (0.05, 0.1, 0.2, 0.35, 0.5)


@dataclass
class TuneConfig:
    n: list[int] = field(default_factory=lambda: [1024, 4096])
    dtypes: list[str] = field(default_factory=lambda: ["float32", "bfloat16"])
    modes: list[str] = field(default_factory=lambda: ["fwd", "fwdbwd"])
    head_dim: int = 64
    heads: int = 8
    masked_n: int = 2048
    padded: tuple[float, ...] = PADDED
    repeats: int | None = None            # None: adaptive (3-10 runs, ~0.5 s per contestant)

    def steps(self) -> int:
        """How many timed pairs the tune makes (its progress bar's total)."""
        per = len(self.dtypes) * len(self.modes)
        return per * (2 * len(self.n) + len(self.padded))


def _time_pair(case: Case, mask, repeats) -> dict[str, float]:
    """Median ms of each contestant on one case (same inputs, warmed up once, timed round-robin)."""
    q, k, v = make_inputs(case)                                      # (1, H, n, D) each
    steps = [timed_step(case, q, k, v, lambda b=b: attention(q, k, v, mask=mask, backend=b)) for b in CONTESTANTS]
    for step in steps:
        step()
    times = time_interleaved(steps, paired(repeats))        # each order as often: native first, sdpa first
    return {b: statistics.median(ts) * 1e3 for b, ts in zip(CONTESTANTS, times)}


def run_tune(cfg: TuneConfig, progress: Callable[[str], None]) -> tuple[list[dict], list[dict]]:
    """(plain rows, masked rows) as ``save_profile`` takes them; ``progress(label)`` after each pair."""
    plain, masked = [], []
    for dtype in cfg.dtypes:
        for mode in cfg.modes:
            for kind in ("none", "causal"):
                for n in cfg.n:
                    case = Case(kind, n, dtype, mode, heads=cfg.heads, head_dim=cfg.head_dim)
                    ms = _time_pair(case, masks.causal() if kind == "causal" else None, cfg.repeats)
                    plain.append(dict(dtype=dtype, mask=kind, mode=mode, n=n, D=cfg.head_dim, ms=ms))
                    progress(case.label())
            for cut in cfg.padded:
                n = cfg.masked_n
                case = Case("padding", n, dtype, mode, heads=cfg.heads, head_dim=cfg.head_dim)
                mask = masks.padding(torch.tensor([n - max(1, round(cut * n))]))   # (B = 1,) keys kept
                meta = torch.empty(1, cfg.heads, n, cfg.head_dim, dtype=case.torch_dtype, device="meta")
                empty = skippable(make_request(meta, meta, meta, mask=mask))
                ms = _time_pair(case, mask, cfg.repeats)
                masked.append(dict(dtype=dtype, mode=mode, n=n, D=cfg.head_dim, padded=cut, skippable=empty, ms=ms))
                progress(f"padding {cut:.0%} n={n} {dtype} {mode}")
    return plain, masked
