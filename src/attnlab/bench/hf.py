"""``attnlab bench --hf``: a Hugging Face model's forward with attnlab vs transformers' own ``sdpa``.

A tiny random Llama (GQA, built from a config: nothing downloaded) runs one row of ``n`` tokens
holding ``docs`` packed documents (``position_ids`` restart at every document, no cache: the way
HF trains on packed data). transformers then builds a packed causal mask: a dense (1, 1, n, n)
bool tensor for ``sdpa``, which computes every pair; through ``attn_implementation="attnlab"``
(``attnlab.integrations.transformers``) the same request arrives as ``documents & causal`` and
the tiled kernel skips the tiles between documents. Same weights, same input, inference mode;
contestants run round-robin (``time_interleaved``) and the logits are compared once.

Example::

    rep = run_hf(HFBenchConfig(**HF_QUICK))
    text = format_hf(rep)
    write_json(rep, "bench-results/hf.json")
"""
from __future__ import annotations

import logging
import statistics
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import torch

from ..measure.machine import LoadMonitor, cpu_label, machine_info, run_warnings
from ..measure.timing import time_interleaved
from .lm_report import _table

__all__ = ["HFBenchConfig", "HF_QUICK", "run_hf", "format_hf", "packed_batch", "SDPA"]

log = logging.getLogger(__name__)

SDPA = "transformers Llama (sdpa)"


@dataclass
class HFBenchConfig:
    n: list[int] = field(default_factory=lambda: [8192])   # tokens in the packed row
    docs: int = 8                         # documents per row (equal lengths, the last takes the rest)
    batch: int = 1                        # rows, each packed the same way
    backends: list[str] = field(default_factory=lambda: ["auto"])   # attnlab backends, one row each
    layers: int = 2                       # the tiny Llama: layers, width, heads (GQA: kv_heads < heads)
    hidden: int = 256
    heads: int = 4
    kv_heads: int = 2
    repeats: int = 3                      # round-robin rounds per n
    threads: Optional[int] = None         # torch threads; None = torch's default
    seed: int = 0


# A smoke run: seconds, not minutes.
HF_QUICK = dict(n=[1024], repeats=2)


def packed_batch(batch: int, n: int, docs: int, vocab: int, seed: int = 0):
    """(input_ids, position_ids), each (batch, n) int64: ``docs`` documents per row, positions restarting."""
    if not 1 <= docs <= n:
        raise ValueError(f"--docs {docs} must be between 1 and n = {n}")
    g = torch.Generator().manual_seed(seed)
    size = n // docs
    lengths = [size] * (docs - 1) + [n - size * (docs - 1)]
    pos = torch.cat([torch.arange(k) for k in lengths])                          # (n,)
    return torch.randint(0, vocab, (batch, n), generator=g), pos.expand(batch, n).contiguous()


def _models(cfg: HFBenchConfig, n: int) -> dict[str, torch.nn.Module]:
    """SDPA's model and one attnlab model per backend, all with the same random weights."""
    try:
        import transformers
    except ImportError as e:
        raise ValueError("bench --hf needs transformers: pip install 'attnlab[test]'") from e
    from ..integrations.transformers import implementation_name, register
    conf = dict(vocab_size=1024, hidden_size=cfg.hidden, intermediate_size=2 * cfg.hidden,
                num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads,
                max_position_embeddings=max(n, 128))
    torch.manual_seed(cfg.seed)
    base = transformers.LlamaForCausalLM._from_config(transformers.LlamaConfig(**conf),
                                                      attn_implementation="sdpa").eval()
    models = {SDPA: base}
    for b in cfg.backends:
        name = register(implementation_name(b), backend=b)
        m = transformers.LlamaForCausalLM._from_config(transformers.LlamaConfig(**conf),
                                                       attn_implementation=name).eval()
        m.load_state_dict(base.state_dict())
        models[f"attnlab ({b})"] = m
    return models


def _case(cfg: HFBenchConfig, n: int) -> dict:
    models = _models(cfg, n)
    ids, pos = packed_batch(cfg.batch, n, cfg.docs, 1024, cfg.seed)
    steps: dict[str, Callable] = {name: (lambda m=m: m(ids, position_ids=pos, use_cache=False).logits)
                                  for name, m in models.items()}
    with torch.inference_mode():
        outs = {name: s() for name, s in steps.items()}             # warm-up, and the logits to compare
        names = list(steps)
        log.info("  n=%d: %d contestants x %d rounds", n, len(names), cfg.repeats)
        times = time_interleaved([steps[k] for k in names], repeats=cfg.repeats)
    base = names.index(SDPA)
    rows = []
    for name, ts in zip(names, times):
        med = statistics.median(ts)
        paired = sorted(times[base][i] / t for i, t in enumerate(ts))              # > 1: faster than sdpa
        rows.append({"name": name, "median_ms": 1e3 * med, "times_ms": [1e3 * t for t in ts],
                     "tokens_per_s": cfg.batch * n / med, "x_sdpa": statistics.median(times[base]) / med,
                     "paired_x_sdpa": statistics.median(paired),
                     "max_abs_logit_diff_vs_sdpa": (outs[name] - outs[SDPA]).abs().max().item()})
    return {"n": n, "docs": cfg.docs, "batch": cfg.batch, "rows": rows}


def run_hf(cfg: HFBenchConfig, argv: Optional[list[str]] = None) -> dict:
    """Time SDPA's and attnlab's forward of the packed tiny Llama at every n."""
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    meta = machine_info(argv)
    meta["config"] = asdict(cfg)
    monitor = LoadMonitor()
    cases = [_case(cfg, n) for n in cfg.n]
    meta["load"] = monitor.stop()
    return {"meta": meta, "cases": cases}


def format_hf(report: dict) -> str:
    """One block per n: median ms, tokens/s, speed vs transformers' sdpa (x > 1: attnlab faster), logit diff."""
    cols = ["contestant", "median ms", "tokens/s", "x sdpa", "paired x sdpa", "max |logit diff|"]
    c = report["meta"]["config"]
    out = []
    for case in report["cases"]:
        out.append(f"tiny Llama ({c['layers']} layers, width {c['hidden']}, {c['heads']} heads / {c['kv_heads']} kv), "
                   f"B={case['batch']} n={case['n']}, {case['docs']} packed documents")
        cells = [[r["name"], f"{r['median_ms']:.1f}", f"{r['tokens_per_s']:.0f}", f"{r['x_sdpa']:.2f}",
                  f"{r['paired_x_sdpa']:.2f}", "" if r["name"] == SDPA else f"{r['max_abs_logit_diff_vs_sdpa']:.1e}"]
                 for r in case["rows"]]
        out += _table(cols, cells) + [""]
    meta = report["meta"]
    out.append(f"forward, fp32, inference mode, no cache; {meta['torch_threads']} threads on {cpu_label(meta)}, "
               f"torch {meta['torch']}; medians of {c['repeats']} round-robin rounds")
    out.append("x sdpa = sdpa's median / this median (> 1: faster than transformers' sdpa); paired = median of "
               "per-round ratios")
    out += run_warnings(meta)
    return "\n".join(out) + "\n"
