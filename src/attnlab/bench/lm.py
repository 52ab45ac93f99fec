"""``attnlab bench --lm``: the GPT as a language model -- training throughput and generation speed.

Training: tokens/s of one optimizer step (forward, cross-entropy, backward, AdamW) on a fixed
(B, T) batch of char-level token ids, for ``attnlab.models.GPT`` (learned positions, one row per
attention backend) against a nanoGPT-equivalent model (``lm_nanogpt.NanoGPT``: fused ``c_attn``,
``F.scaled_dot_product_attention(is_causal=True)``). Every model starts from the same weights
(copied from the attnlab GPT; the parameter counts must match, and the logits are compared), so
the runs do the same arithmetic. Two more nanoGPT rows change one thing each (separate q/k/v
Linears; ``attnlab.attention`` instead of SDPA) to locate any gap. All steps run round-robin; the
speed ratio is given as a ratio of medians, as the median of per-round ratios (robust to drift),
and in process CPU time (not inflated by waiting while other processes hold a shared machine's CPUs).

Generation: greedy decoding of a batch of 1 from a ``prompt``-token prompt up to each total
length in ``gen_to``, with the KV cache and with full recomputation (``generate_tokens(use_cache=
...)``), and nanoGPT's way (recompute, no cache). Then the latency of *one* step at that context
length: a cached step (one new token against N - 1 cached) against a full forward of N tokens.

Overheads (``lm_overheads``): per-call microbenchmarks that size the fixed costs a layer pays.

Example::

    rep = run_lm(LMBenchConfig(**LM_QUICK))
    text = format_lm(rep)
    write_json(rep, "bench-results/lm.json")
"""
from __future__ import annotations

import copy
import logging
import statistics
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from ..measure.machine import LoadMonitor, machine_info
from ..measure.timing import time_interleaved
from ..models.gpt import GPT, GPTConfig
from ..nn.backend import set_backend
from .lm_nanogpt import NanoGPT, copy_from_attnlab
from .lm_overheads import cpu_timed, decode_step_fns, overheads
from .lm_report import NANOGPT, format_lm

__all__ = ["LMBenchConfig", "LM_QUICK", "run_lm", "format_lm", "NANOGPT"]

log = logging.getLogger(__name__)


@dataclass
class LMBenchConfig:
    preset: str = "micro"                 # GPTConfig preset (micro: 4 layers, 4 heads, C = 128)
    vocab_size: int = 96                  # char-level: printable ASCII and a few more
    batch: int = 8                        # B of a training step
    seq_len: int = 256                    # T of a training step
    backends: list[str] = field(default_factory=lambda: ["auto", "tiled"])   # attnlab GPT rows
    diagnose: bool = True                 # the one-change nanoGPT rows and the overhead microbenchmarks
    repeats: int = 10                     # round-robin training rounds
    prompt: int = 16                      # generation: prompt tokens
    gen_to: list[int] = field(default_factory=lambda: [64, 128, 256])   # total tokens after generating
    gen_repeats: int = 3                  # round-robin generation rounds
    step_repeats: int = 20                # round-robin rounds of the one-step latencies and microbenchmarks
    overhead_calls: int = 200             # calls per timed run of a microbenchmark
    threads: Optional[int] = None         # torch threads; None = torch's default
    seed: int = 0

    def __post_init__(self):
        if min(self.gen_to, default=self.prompt + 1) <= self.prompt:
            raise ValueError(f"every gen_to length must exceed the prompt ({self.prompt} tokens), got {self.gen_to}")
        counts = dict(batch=self.batch, seq_len=self.seq_len, prompt=self.prompt, repeats=self.repeats,
                      gen_repeats=self.gen_repeats, step_repeats=self.step_repeats, overhead_calls=self.overhead_calls)
        if min(counts.values()) < 1:
            raise ValueError(f"these must all be >= 1: {counts}")

    def gpt_config(self) -> GPTConfig:
        """The preset, with a context long enough for training and the longest generation."""
        base = GPTConfig.preset(self.preset, vocab_size=self.vocab_size)
        longest = max(base.max_len, self.seq_len, max(self.gen_to, default=0))
        return GPTConfig.preset(self.preset, vocab_size=self.vocab_size, max_len=longest, positional="learned")


# Under 30 s on a busy 2-core machine: the nano preset, a small batch, short generations.
LM_QUICK = dict(preset="nano", batch=4, seq_len=64, repeats=3, gen_to=[32, 64], gen_repeats=2, step_repeats=3,
                overhead_calls=20)


def _train_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[Callable[[], None], list]:
    """A zero-argument training step (the same optimizer for every model) and a list holding its last loss."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    last: list[float] = []

    def step():
        opt.zero_grad(set_to_none=True)
        logits = model(x)                                              # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        last[:] = [loss.detach()]
    return step, last


def _training_models(cfg: LMBenchConfig, gpt: GPT) -> dict[str, torch.nn.Module]:
    """Every training contestant, all holding ``gpt``'s initial weights."""
    models: dict[str, torch.nn.Module] = {NANOGPT: copy_from_attnlab(NanoGPT.like(gpt.cfg), gpt)}
    for b in cfg.backends:
        models[f"attnlab GPT ({b})"] = set_backend(copy.deepcopy(gpt), b)
    if cfg.diagnose:
        models["nanoGPT, separate q/k/v"] = copy_from_attnlab(NanoGPT.like(gpt.cfg, qkv="separate"), gpt)
        models["nanoGPT, attnlab.attention()"] = copy_from_attnlab(NanoGPT.like(gpt.cfg, attend="attnlab"), gpt)
    return models


def _check_same_model(models: dict[str, torch.nn.Module], x: torch.Tensor) -> dict:
    """Same parameter count everywhere (a hard error otherwise) and the largest logit difference to nanoGPT."""
    counts = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    if len(set(counts.values())) != 1:
        raise RuntimeError(f"the LM benchmark compares models of different sizes: {counts}; "
                           "NanoGPT.like must mirror GPTConfig")
    with torch.no_grad():
        ref = models[NANOGPT](x)
        diffs = {name: (m(x) - ref).abs().max().item() for name, m in models.items() if name != NANOGPT}
    return {"params": counts[NANOGPT], "max_abs_logit_diff_vs_nanogpt": diffs}


def _ratio_rows(names: list[str], times: list[list[float]], cpu: list[list[float]], base: int,
                tokens: int) -> list[dict]:
    rows = []
    for name, ts, cs in zip(names, times, cpu):
        med = statistics.median(ts)
        paired = sorted(times[base][i] / t for i, t in enumerate(ts))   # > 1: faster than nanoGPT
        rows.append({"name": name, "median_s": med, "times_s": ts, "tokens_per_s": tokens / med,
                     "speed_vs_nanogpt": statistics.median(times[base]) / med,
                     "paired_speed_vs_nanogpt": statistics.median(paired),
                     "paired_iqr": [paired[len(paired) // 4], paired[(3 * len(paired)) // 4]],
                     "cpu_median_s": statistics.median(cs), "cpu_times_s": cs,
                     "cpu_speed_vs_nanogpt": statistics.median(cpu[base]) / statistics.median(cs)})
    return rows


def run_training(cfg: LMBenchConfig, gpt: GPT) -> dict:
    """Training throughput of every contestant, round-robin; ratios against nanoGPT."""
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randint(0, cfg.vocab_size, (cfg.batch, cfg.seq_len), generator=g)    # (B, T)
    y = torch.randint(0, cfg.vocab_size, (cfg.batch, cfg.seq_len), generator=g)
    models = _training_models(cfg, gpt)
    check = _check_same_model(models, x)
    steps = {name: _train_step(m.train(), x, y) for name, m in models.items()}
    for name, (step, _) in steps.items():
        log.info("  training warm-up: %s", name)
        step()
        step()                                                         # the first step creates AdamW's state
    names = list(steps)
    cpu: list[list[float]] = [[] for _ in names]
    times = time_interleaved([cpu_timed(s, c) for (s, _), c in zip(steps.values(), cpu)], repeats=cfg.repeats)
    rows = _ratio_rows(names, times, cpu, names.index(NANOGPT), cfg.batch * cfg.seq_len)
    for row in rows:                                                   # same weights, data, optimizer:
        row["last_loss"] = steps[row["name"]][1][0].item()             # the losses should agree closely
    return {**check, "rows": rows}


def _greedy_nanogpt(model: NanoGPT, idx: torch.Tensor, n: int) -> list[torch.Tensor]:
    """nanoGPT's generation: recompute the whole context for every new token (greedy)."""
    out = []
    with torch.no_grad():
        for _ in range(n):
            nxt = model(idx)[:, -1].argmax(-1)                         # (B,)
            out.append(nxt)
            idx = torch.cat([idx, nxt[:, None]], dim=1)
    return out


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(bool((x == y).all()) for x, y in zip(a, b))


def run_generation(cfg: LMBenchConfig, gpt: GPT, ref: NanoGPT) -> list[dict]:
    """Greedy generation to each length in gen_to: KV cache vs recomputation, and one-step latencies."""
    gpt.eval()
    g = torch.Generator().manual_seed(cfg.seed + 1)
    prompt = torch.randint(0, cfg.vocab_size, (1, cfg.prompt), generator=g)          # (1, prompt)
    for use_cache in (True, False):                                    # warm-up, once: the timed runs are long
        list(gpt.generate_tokens(prompt, 4, temperature=0, use_cache=use_cache))
    _greedy_nanogpt(ref, prompt, 4)
    rows = []
    for total in cfg.gen_to:
        n = total - cfg.prompt
        got: dict[str, list] = {}

        def run(name, fn):
            return lambda: got.__setitem__(name, fn())
        fns = {"kv-cache": run("kv-cache", lambda: list(gpt.generate_tokens(prompt, n, temperature=0))),
               "recompute": run("recompute", lambda: list(gpt.generate_tokens(prompt, n, temperature=0,
                                                                               use_cache=False))),
               "nanoGPT recompute": run("nanoGPT recompute", lambda: _greedy_nanogpt(ref, prompt, n))}
        log.info("  generation to %d tokens", total)
        times = dict(zip(fns, time_interleaved(list(fns.values()), repeats=cfg.gen_repeats)))
        med = {k: statistics.median(v) for k, v in times.items()}
        ctx = torch.cat([prompt, torch.stack(got["kv-cache"], 1)], 1)                # (1, total)
        cached, full = decode_step_fns(gpt, ctx)
        cached(), full()
        cpu = [[], []]
        st = time_interleaved([cpu_timed(cached, cpu[0]), cpu_timed(full, cpu[1])], repeats=cfg.step_repeats)
        step = {"cached_ms": 1e3 * statistics.median(st[0]), "full_ms": 1e3 * statistics.median(st[1]),
                "cached_cpu_ms": 1e3 * statistics.median(cpu[0]), "full_cpu_ms": 1e3 * statistics.median(cpu[1])}
        step["speedup"] = step["full_ms"] / step["cached_ms"]
        rows.append({
            "total": total, "new_tokens": n, "prompt": cfg.prompt,
            "median_s": med, "times_s": times,
            "tokens_per_s": {k: n / v for k, v in med.items()},
            "ms_per_token": {k: 1e3 * v / n for k, v in med.items()},
            "speedup_cache_vs_recompute": med["recompute"] / med["kv-cache"],
            "same_tokens_cache_vs_recompute": _same(got["kv-cache"], got["recompute"]),
            "same_tokens_cache_vs_nanogpt": _same(got["kv-cache"], got["nanoGPT recompute"]),
            "step_at_context": step})
    return rows


def run_lm(cfg: LMBenchConfig, argv: Optional[list[str]] = None) -> dict:
    """The whole LM benchmark: training throughput, generation, and (with ``diagnose``) overheads."""
    threads = torch.get_num_threads()
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    try:
        meta = machine_info(argv)
        meta["config"] = asdict(cfg)
        torch.manual_seed(cfg.seed)
        gpt = GPT(cfg.gpt_config())
        meta["model"] = gpt.cfg.to_dict()
        ref = copy_from_attnlab(NanoGPT.like(gpt.cfg), gpt).eval()
        mon = LoadMonitor()
        log.info("LM benchmark: training (%s, B=%d, T=%d)", cfg.preset, cfg.batch, cfg.seq_len)
        training = run_training(cfg, gpt)
        log.info("LM benchmark: generation")
        generation = run_generation(cfg, gpt, ref)
        extra = (overheads(gpt.cfg, cfg.batch, cfg.seq_len, calls=cfg.overhead_calls, repeats=cfg.step_repeats)
                 if cfg.diagnose else [])
        meta["load"] = mon.stop()
        meta["torch_threads"] = torch.get_num_threads()
    finally:
        torch.set_num_threads(threads)
    return {"meta": meta, "training": training, "generation": generation, "overheads": extra}
