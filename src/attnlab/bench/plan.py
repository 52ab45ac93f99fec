"""``attnlab bench --plan``: what planning a mask once saves (issue #29), both sides in the same run.

Each workload runs per backend twice, round-robin: with plans kept (``functional.mask_plan``, the
default) and with every plan built afresh (``mask_plan.caching(False)``: what every call did before
plans were kept). The ratio is fresh / kept, so > 1 means keeping plans is faster.

    encoder   a 12-layer encoder stack forward (C = 256, H = 4, GELU MLP) on B rows of n tokens packed
              as documents, inference mode. The document mask is built once per forward, as a data
              loader hands one over per batch, and every layer gets it: the first layer plans, the
              other eleven read the plan.
    gpt       a GPT training step's forward and backward (the optimizer's step reads no mask), causal,
              4 layers, C = 128, T = 256, B = 8 (2 with --quick): the causal mask is one shared object, so
              its plans outlive the step.
    decide    auto's choice alone, DECISIONS times for each of the request kinds of ``_decide_requests``
              (plain, causal, decode, window, padding, dense mask; fp32 and bf16): kept,
              ``choose_backend(req, "auto")``, a look-up (``functional.auto_memo``); fresh, the whole rule
              (``auto_rule.pick``) on every call, as before decisions were kept, with the masks' plans kept on
              both sides (with none kept, each masked decision classifies the mask's tiles again).

The two sides' outputs must be identical (a plan is a pure function of the mask and the sizes); the
report says whether they were.

Example::

    rep = run_plan(PlanBenchConfig(**PLAN_QUICK))
    text = format_plan(rep)
"""
from __future__ import annotations

import logging
import statistics
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from ..functional import masks
from ..functional.api import choose_backend
from ..functional.auto_rule import pick
from ..functional.mask_plan import caching
from ..functional.request import AttentionRequest, make_request
from ..functional.scope import use_backend
from ..measure.machine import LoadMonitor, cpu_label, machine_info, run_warnings
from ..measure.timing import time_interleaved
from ..models.gpt import GPT, GPTConfig
from ..nn.blocks import BlockConfig, EncoderStack
from .lm_report import _table

__all__ = ["PlanBenchConfig", "PLAN_QUICK", "run_plan", "format_plan"]

log = logging.getLogger(__name__)


@dataclass
class PlanBenchConfig:
    n: int = 256                          # tokens per row (encoder); the GPT's context is its max_len
    batch: int = 4                        # encoder rows
    docs: int = 4                         # documents packed per encoder row
    layers: int = 12                      # encoder layers
    backends: list[str] = field(default_factory=lambda: ["auto", "native", "tiled", "sparse"])
    gpt_backends: list[str] = field(default_factory=lambda: ["auto", "native", "tiled"])
    gpt_batch: int = 8
    repeats: int = 7                      # round-robin rounds per row
    seed: int = 0

    def __post_init__(self):
        if not 1 <= self.docs <= self.n:
            raise ValueError(f"--docs ({self.docs}) must be between 1 and --n ({self.n}): documents of one token "
                             "or more per row")


# Seconds: a short sequence, two backends each, three rounds.
PLAN_QUICK = dict(n=64, batch=2, backends=["auto", "native"], gpt_backends=["native"], gpt_batch=2, repeats=3)


def _document_ids(batch: int, n: int, docs: int, g: torch.Generator) -> torch.Tensor:
    """(batch, n) int64 document ids: ``docs`` documents per row at random cut points."""
    rows = []
    for _ in range(batch):
        cuts = torch.randperm(n - 1, generator=g)[:docs - 1].sort().values + 1          # (docs - 1,)
        rows.append(torch.bucketize(torch.arange(n), cuts, right=True))                 # (n,)
    return torch.stack(rows)


def _encoder_fns(cfg: PlanBenchConfig, backend: str, g: torch.Generator) -> dict[str, Callable]:
    stack = EncoderStack(BlockConfig(d_model=256, n_heads=4), cfg.layers).eval()
    x = torch.randn(cfg.batch, cfg.n, 256, generator=g)                                 # (B, n, C)
    ids = _document_ids(cfg.batch, cfg.n, cfg.docs, g)                                   # (B, n)

    def forward(kept: bool):
        def run():
            with caching(kept), use_backend(backend), torch.inference_mode():
                return stack(x, key_mask=masks.documents(ids))                           # one mask per batch
        return run
    return {"kept": forward(True), "fresh": forward(False)}


def _gpt_fns(cfg: PlanBenchConfig, backend: str, g: torch.Generator) -> dict[str, Callable]:
    torch.manual_seed(cfg.seed)
    gpt = GPT(GPTConfig(vocab_size=256, max_len=256, n_layers=4, n_heads=4, d_model=128))
    idx = torch.randint(0, 256, (cfg.gpt_batch, 257), generator=g)                       # (B, T + 1)

    def step(kept: bool):
        def run():
            with caching(kept), use_backend(backend):
                logits = gpt(idx[:, :-1])                                                # (B, T, V)
                loss = F.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())
                gpt.zero_grad(set_to_none=True)
                loss.backward()
            return torch.cat([loss.detach()[None]] + [p.grad.flatten() for p in gpt.parameters() if p.grad is not None])
        return run
    return {"kept": step(True), "fresh": step(False)}


DECISIONS = 100                          # per request kind and round (the decide workload)


def _decide_requests(g: torch.Generator) -> list[AttentionRequest]:
    """Request kinds a model's layers send: B=1 H=8 D=64 at n = 1024 unless said (the decode step: 1 <- 256)."""
    q, k, v = (torch.randn(1, 8, 1024, 64, generator=g) for _ in range(3))             # (1, 8, 1024, 64)
    band = torch.ones(1024, 1024, dtype=torch.bool).tril().triu(-127)                    # (L, S)
    pad = masks.padding(torch.tensor([768]))
    reqs = [make_request(q, k, v), make_request(q, k, v, causal=True), make_request(q[:, :, :1], k[:, :, :256],
            v[:, :, :256], causal=True), make_request(q, k, v, mask=masks.window(128)),
            make_request(q, k, v, mask=pad), make_request(q, k, v, mask=band)]
    bf = [t.bfloat16() for t in (q, k, v)]
    return reqs + [make_request(*bf), make_request(*bf, causal=True), make_request(*bf, mask=pad)]


def _decide_fns(reqs: list[AttentionRequest]) -> dict[str, Callable]:
    def decide(choose: Callable[[AttentionRequest], str]):
        def run():
            for req in reqs:
                for _ in range(DECISIONS):
                    choose(req)
            return [choose(req) for req in reqs]
        return run
    return {"kept": decide(lambda req: choose_backend(req, "auto").name), "fresh": decide(lambda req: pick(req)[0])}


def _same(a, b) -> bool:
    return bool(torch.equal(a, b)) if isinstance(a, torch.Tensor) else a == b


def _row(workload: str, backend: str, fns: dict[str, Callable], repeats: int) -> dict:
    outs = {name: fn() for name, fn in fns.items()}                  # warm-up, and the outputs to compare
    times = dict(zip(fns, time_interleaved(list(fns.values()), repeats=repeats)))
    paired = sorted(f / k for f, k in zip(times["fresh"], times["kept"]))            # > 1: kept is faster
    return {"workload": workload, "backend": backend,
            "kept_ms": 1e3 * statistics.median(times["kept"]), "fresh_ms": 1e3 * statistics.median(times["fresh"]),
            "times_ms": {k: [1e3 * t for t in ts] for k, ts in times.items()},
            "saving": statistics.median(times["fresh"]) / statistics.median(times["kept"]),
            "paired_saving": statistics.median(paired), "identical": _same(outs["kept"], outs["fresh"])}


def run_plan(cfg: PlanBenchConfig, argv: Optional[list[str]] = None) -> dict:
    """Time both workloads with plans kept and built afresh, per backend (module docstring)."""
    meta = machine_info(argv)
    meta["config"] = asdict(cfg)
    monitor = LoadMonitor()
    g = torch.Generator().manual_seed(cfg.seed)
    rows = []
    for b in cfg.backends:
        log.info("  encoder, %s: %d rounds", b, cfg.repeats)
        rows.append(_row(f"encoder {cfg.layers} layers, B={cfg.batch} n={cfg.n}, {cfg.docs} documents per row", b,
                         _encoder_fns(cfg, b, g), cfg.repeats))
    for b in cfg.gpt_backends:
        log.info("  gpt step, %s: %d rounds", b, cfg.repeats)
        rows.append(_row(f"GPT forward+backward, 4 layers, B={cfg.gpt_batch} T=256, causal", b, _gpt_fns(cfg, b, g),
                         cfg.repeats))
    log.info("  auto's decision: %d rounds", cfg.repeats)
    reqs = _decide_requests(g)
    rows.append(_row(f"auto's decision, {len(reqs)} request kinds x {DECISIONS}", "auto", _decide_fns(reqs),
                     cfg.repeats))
    meta["load"] = monitor.stop()
    return {"meta": meta, "rows": rows}


def format_plan(report: dict) -> str:
    """One line per (workload, backend): median ms with plans kept and built afresh, the saving."""
    cols = ["workload", "backend", "kept ms", "fresh ms", "fresh / kept", "paired", "same output"]
    cells = [[r["workload"], r["backend"], f"{r['kept_ms']:.2f}", f"{r['fresh_ms']:.2f}", f"{r['saving']:.3f}",
              f"{r['paired_saving']:.3f}", "yes" if r["identical"] else "NO"] for r in report["rows"]]
    out = _table(cols, cells)
    meta = report["meta"]
    out.append("")
    out.append(f"fp32; {meta['torch_threads']} threads on {cpu_label(meta)}, torch {meta['torch']}; medians of "
               f"{meta['config']['repeats']} round-robin rounds")
    out.append("kept: plans kept with the mask (the default); fresh: every plan built per call "
               "(mask_plan.caching(False)); fresh / kept > 1: keeping plans is faster; paired = median of "
               "per-round ratios")
    out.append("auto's decision: kept = a look-up (functional.auto_memo); fresh = the whole rule on every call, "
               "the masks' plans kept on both sides")
    out += run_warnings(meta)
    return "\n".join(out) + "\n"
