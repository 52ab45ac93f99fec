"""``attnlab bench --favor-accuracy``: how close FAVOR+ gets to softmax attention as m grows.

FAVOR+ is an unbiased random-feature *estimator* of softmax attention: its error should fall
roughly as 1/sqrt(m) with the number of features m, more slowly the larger |q| and |k| are (the
estimator's variance grows like exp(|x + y|^2)). elu + 1 linear attention is a different *model*,
not an estimator: it has one fixed difference from softmax, shown as a flat reference line.

Inputs: q, k ~ N(0, std^2), v ~ N(0, 1), (B, H, n, D); at the default scale 1/sqrt(D) the
logits have standard deviation std^2. Error = ||out - softmax||_F / ||softmax||_F, with the exact
softmax in float64 and the approximations in float32; FAVOR+ over several seeds (median, min, max).

Example::

    rep = run_favor_accuracy(AccuracyConfig(**ACCURACY_QUICK))
    text = format_accuracy(rep)
    plot_accuracy(rep, "bench-results/favor-accuracy.png")
"""
from __future__ import annotations

import logging
import statistics
from dataclasses import asdict, dataclass, field
from typing import Optional

import torch

from ..functional import masks
from ..functional.backends.favor import FavorFeatures, favor_attention
from ..functional.backends.linear import linear_attention
from ..functional.backends.reference import reference_attention
from ..measure.machine import machine_info
from .plots import line_plot

__all__ = ["AccuracyConfig", "ACCURACY_QUICK", "run_favor_accuracy", "format_accuracy", "plot_accuracy"]

log = logging.getLogger(__name__)


@dataclass
class AccuracyConfig:
    features: list[int] = field(default_factory=lambda: [16, 32, 64, 128, 256, 512, 1024])
    seeds: int = 5                        # FAVOR+ feature seeds per m
    n: int = 1024
    batch: int = 1
    heads: int = 4
    head_dim: int = 64
    stds: list[float] = field(default_factory=lambda: [0.5, 0.75, 1.0])   # std of q and k: input regimes
    causal: bool = False
    data_seed: int = 0


ACCURACY_QUICK = dict(features=[16, 64, 256], seeds=2, n=128, heads=2, stds=[0.5])


def _rel_err(out: torch.Tensor, exact: torch.Tensor) -> float:
    return ((out.double() - exact).norm() / exact.norm()).item()


def _regime(cfg: AccuracyConfig, std: float) -> dict:
    g = torch.Generator().manual_seed(cfg.data_seed)
    shape = (cfg.batch, cfg.heads, cfg.n, cfg.head_dim)
    q, k, v = (torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(3))
    q, k = q * std, k * std
    mask_kw = {"causal": cfg.causal}
    exact = reference_attention(q, k, v, scale=cfg.head_dim ** -0.5, mask=masks.causal() if cfg.causal else None)
    qf, kf, vf = q.float(), k.float(), v.float()
    res = {"std": std, "logit_std": std * std, "elu_error": _rel_err(linear_attention(qf, kf, vf, **mask_kw), exact),
           "favor": []}
    for m in cfg.features:
        errs = [_rel_err(favor_attention(qf, kf, vf, FavorFeatures(cfg.head_dim, m, seed), **mask_kw), exact)
                for seed in range(cfg.seeds)]
        res["favor"].append({"m": m, "errors": errs, "median": statistics.median(errs), "min": min(errs),
                             "max": max(errs)})
        log.info("  std %.2f m=%-5d median relative error %.4f", std, m, res["favor"][-1]["median"])
    return res


def run_favor_accuracy(cfg: AccuracyConfig, argv: Optional[list[str]] = None) -> dict:
    """FAVOR+ error against exact softmax for every m, seed and input regime; elu + 1 for reference."""
    meta = machine_info(argv)
    meta["config"] = asdict(cfg)
    meta["error"] = "||out - softmax||_F / ||softmax||_F; softmax exact in float64, approximations in float32"
    return {"meta": meta, "regimes": [_regime(cfg, std) for std in cfg.stds]}


def format_accuracy(report: dict) -> str:
    """One row per m, one column per input regime: median [min, max] over seeds; then elu + 1."""
    c, regs = report["meta"]["config"], report["regimes"]
    head = (f"relative error vs exact softmax, n={c['n']} B={c['batch']} H={c['heads']} D={c['head_dim']}, "
            f"{'causal' if c['causal'] else 'non-causal'}; FAVOR+: median [min, max] over {c['seeds']} seeds")
    cols = [f"std {r['std']:g} (logit std {r['logit_std']:.2g})" for r in regs]
    w = max([24] + [len(x) for x in cols])
    lines = [head, f"{'features m':>12}  " + "  ".join(f"{x:>{w}}" for x in cols)]
    for i, m in enumerate(c["features"]):
        cells = [f"{r['favor'][i]['median']:.4f} [{r['favor'][i]['min']:.4f}, {r['favor'][i]['max']:.4f}]"
                 for r in regs]
        lines.append(f"{m:>12}  " + "  ".join(f"{x:>{w}}" for x in cells))
    lines.append(f"{'elu + 1':>12}  " + "  ".join(f"{r['elu_error']:>{w}.4f}" for r in regs))
    lines.append("elu + 1 is a different model (not an estimator of softmax): its error does not depend on m")
    return "\n".join(lines) + "\n"


def plot_accuracy(report: dict, path: str) -> str:
    """Log-log PNG: FAVOR+ median error against m (band: min-max over seeds), elu + 1 as dashed lines."""
    series, bands, refs = {}, {}, {}
    for r in report["regimes"]:
        label = f"FAVOR+, q,k std {r['std']:g}"
        series[label] = ([p["m"] for p in r["favor"]], [p["median"] for p in r["favor"]])
        bands[label] = ([p["min"] for p in r["favor"]], [p["max"] for p in r["favor"]])
        refs[label] = (f"elu+1 (fixed model), q,k std {r['std']:g}", r["elu_error"])
    c = report["meta"]["config"]
    return line_plot(path, series, bands=bands, refs=refs, xlabel="random features m",
                     ylabel="relative error vs softmax",
                     title=f"FAVOR+ vs exact softmax (n={c['n']}, D={c['head_dim']}, {c['seeds']} seeds)")
