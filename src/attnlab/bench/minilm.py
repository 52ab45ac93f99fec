"""``attnlab bench --minilm``: the real all-MiniLM-L6-v2 forward pass, attnlab vs transformers.

The same weights (both load the ``pretrained`` extra's files), the same padded batch of token
ids, inference mode, fp32: ``attnlab.models.Encoder`` once per attention backend ("auto" and
every exact one) against ``transformers.BertModel(attn_implementation="sdpa")``. All contestants
of a case run round-robin, so the machine's drifts hit them alike; the speed ratio vs
transformers is given both as a ratio of medians and as the median of per-round ratios. The
hidden states are compared once (largest absolute difference to transformers).

Batches: ``batch`` texts of random WordPiece ids, [CLS] ... [SEP], real lengths drawn from
[seq_len / 2, seq_len] (the first at seq_len), the rest padding -- the mask matters, as in use.

Example::

    rep = run_minilm(MiniLMBenchConfig(**MINILM_QUICK))
    text = format_minilm(rep)
    write_json(rep, "bench-results/minilm.json")
"""
from __future__ import annotations

import logging
import os
import statistics
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import torch

from ..functional import available_backends
from ..functional.registry import get_backend
from ..measure.machine import LoadMonitor, cpu_label, machine_info, run_warnings
from ..measure.timing import time_interleaved
from ..models.encoder import Encoder
from ..models.minilm import minilm_path

__all__ = ["MiniLMBenchConfig", "MINILM_QUICK", "run_minilm", "format_minilm", "HF", "encoder_flops"]

log = logging.getLogger(__name__)

HF = "transformers BertModel (sdpa)"


def _exact_backends() -> list[str]:
    return ["auto"] + [b for b in available_backends() if get_backend(b).exact]


@dataclass
class MiniLMBenchConfig:
    cases: list[tuple[int, int]] = field(default_factory=lambda: [(32, 128), (8, 256)])   # (batch, seq_len)
    backends: list[str] = field(default_factory=_exact_backends)    # attnlab rows: "auto" and exact backends
    padding: bool = True                  # random real lengths in [seq_len / 2, seq_len]; False: all full
    repeats: int = 5                      # round-robin rounds per case
    threads: Optional[int] = None         # torch threads; None = torch's default
    seed: int = 0


# Seconds, not minutes: small batches, two backends, three rounds.
MINILM_QUICK = dict(cases=[(4, 32)], backends=["auto", "sdpa"], repeats=3)


def encoder_flops(model: Encoder, batch: int, seq_len: int) -> int:
    """Forward FLOPs of the padded batch: the six layers' matmuls (2 per MAC) plus QK^T and PV."""
    c = model.cfg
    per_token = 2 * c.n_layers * (4 * c.d_model ** 2 + 2 * c.d_model * c.d_ff)
    attn = 4 * batch * c.n_layers * seq_len * seq_len * c.d_model      # H * D = C
    return batch * seq_len * per_token + attn


def make_batch(batch: int, seq_len: int, padding: bool, seed: int, vocab: int = 30522):
    """(input_ids, attention_mask), each (batch, seq_len) int64: [CLS] random ids [SEP] [PAD]..."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(2, seq_len // 2), seq_len + 1, (batch,), generator=g) if padding \
        else torch.full((batch,), seq_len)
    lengths[0] = seq_len                                             # the batch is as long as asked
    mask = (torch.arange(seq_len)[None, :] < lengths[:, None]).long()                  # (B, L)
    ids = torch.randint(1996, vocab, (batch, seq_len), generator=g) * mask            # word pieces, 0 = [PAD]
    ids[:, 0] = 101                                                  # [CLS]
    ids[torch.arange(batch), lengths - 1] = 102                      # [SEP]
    return ids, mask


def _hf_model():
    """transformers' BertModel with SDPA attention from the same files, or (None, why not)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from transformers import BertModel
    except ImportError:
        return None, "transformers is not installed (pip install 'attnlab[test]'): no peer row"
    return BertModel.from_pretrained(str(minilm_path()), attn_implementation="sdpa").eval(), None


def _case(cfg: MiniLMBenchConfig, models: dict[str, Callable], B: int, L: int, flops: int) -> dict:
    ids, mask = make_batch(B, L, cfg.padding, cfg.seed)
    steps = {name: (lambda f=f: f(ids, mask)) for name, f in models.items()}
    with torch.inference_mode():
        outs = {name: s() for name, s in steps.items()}              # warm-up, and the outputs to compare
        names = list(steps)
        log.info("  B=%d L=%d: %d contestants x %d rounds", B, L, len(names), cfg.repeats)
        times = time_interleaved([steps[n] for n in names], repeats=cfg.repeats)
    base = names.index(HF) if HF in names else None
    rows = []
    for name, ts in zip(names, times):
        med = statistics.median(ts)
        row = {"name": name, "median_ms": 1e3 * med, "times_ms": [1e3 * t for t in ts],
               "real_tokens_per_s": int(mask.sum()) / med, "gflops": flops / med / 1e9}
        if base is not None:
            paired = sorted(times[base][i] / t for i, t in enumerate(ts))    # > 1: faster than transformers
            row.update(x_hf=statistics.median(times[base]) / med, paired_x_hf=statistics.median(paired),
                       paired_iqr=[paired[len(paired) // 4], paired[(3 * len(paired)) // 4]],
                       max_abs_diff_vs_hf=(outs[name] - outs[HF]).abs().max().item())
        rows.append(row)
    return {"batch": B, "seq_len": L, "real_tokens": int(mask.sum()), "flops": flops, "rows": rows}


def run_minilm(cfg: MiniLMBenchConfig, argv: Optional[list[str]] = None) -> dict:
    """Time every contestant on every case; ratios against transformers where it is installed."""
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    meta = machine_info(argv)
    meta["config"] = asdict(cfg)
    monitor = LoadMonitor()
    base = Encoder.from_minilm()
    models: dict[str, Callable] = {}
    hf, why = _hf_model()
    if hf is not None:
        models[HF] = lambda ids, mask: hf(input_ids=ids, attention_mask=mask).last_hidden_state
    else:
        meta["notes"] = [why]
    for b in cfg.backends:
        m = Encoder.from_minilm(backend=b) if b != "auto" else base
        models[f"attnlab Encoder ({b})"] = m
    cases = [_case(cfg, models, B, L, encoder_flops(base, B, L)) for B, L in cfg.cases]
    meta["load"] = monitor.stop()
    return {"meta": meta, "cases": cases}


def format_minilm(report: dict) -> str:
    """One block per case: median ms, real tokens/s, GFLOP/s, speed vs transformers (x > 1: attnlab faster)."""
    cols = ["contestant", "median ms", "tokens/s", "GFLOP/s", "x HF", "paired x HF [IQR]", "max |diff|"]
    out = []
    for case in report["cases"]:
        out.append(f"B={case['batch']} L={case['seq_len']} ({case['real_tokens']} real tokens, "
                   f"{case['flops'] / 1e9:.1f} GFLOP per padded forward)")
        cells = [[r["name"], f"{r['median_ms']:.1f}", f"{r['real_tokens_per_s']:.0f}", f"{r['gflops']:.1f}",
                  f"{r['x_hf']:.2f}" if "x_hf" in r else "",
                  f"{r['paired_x_hf']:.2f} [{r['paired_iqr'][0]:.2f}, {r['paired_iqr'][1]:.2f}]" if "x_hf" in r else "",
                  f"{r['max_abs_diff_vs_hf']:.1e}" if "x_hf" in r and r["name"] != HF else ""]
                 for r in case["rows"]]
        widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
        for row in [cols] + cells:
            out.append("  ".join(x.ljust(w) if i == 0 else x.rjust(w) for i, (x, w) in enumerate(zip(row, widths))))
        out.append("")
    meta = report["meta"]
    out.append(f"all-MiniLM-L6-v2 forward, fp32, inference mode; {meta['torch_threads']} threads on "
               f"{cpu_label(meta)}, torch {meta['torch']}; medians of {meta['config']['repeats']} round-robin rounds")
    out.append("x HF = transformers' median / this median (> 1: faster than transformers); paired = median of "
               "per-round ratios; max |diff| = largest hidden-state difference to transformers")
    out += meta.get("notes", [])
    out += run_warnings(meta)
    return "\n".join(out) + "\n"
