"""Where a GPT layer's time goes besides the matmuls: microbenchmarks for ``bench --lm``.

Each measurement pits the way attnlab does a thing against the cheaper alternative, round-robin,
in microseconds per call, so a gap in the model-level numbers can be traced to a line of code:

    attention dispatch    attnlab.attention(auto / sdpa) vs F.scaled_dot_product_attention, 8 and 128 tokens
    decode step           a one-token causal call (causal is dropped at L = 1) vs no mask vs raw SDPA
    head split            einops.rearrange vs view + transpose
    q/k/v projections     three Linears vs one fused Linear (nanoGPT), forward + backward

These found the two fixes now in the code: ``AttentionLayer`` projects q, k, v with one
matmul, and ``attention`` drops bottom-right causal masking for a single query row.

Example::

    rows = overheads(gpt.cfg, batch=8, seq_len=256)      # [{"what": ..., "us_per_call": {...}}, ...]
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from ..functional import attention
from ..measure.timing import time_interleaved

__all__ = ["cpu_timed", "overheads", "decode_step_fns"]


def cpu_timed(fn: Callable, sink: list[float]) -> Callable:
    """``fn`` that also appends the process CPU seconds of each call to ``sink``.

    On a shared machine wall time includes the time other processes held the CPU; CPU time does
    not (with one thread it is the work done; with more it also counts OpenMP spin-waiting).
    """
    def run():
        t0 = time.process_time()
        out = fn()
        sink.append(time.process_time() - t0)
        return out
    return run


def decode_step_fns(gpt, ctx: torch.Tensor) -> tuple[Callable, Callable]:
    """(cached step: one token after N - 1 cached ones, full forward of the N tokens), N = ctx.shape[1]."""
    cache = gpt.new_cache(ctx.shape[0])
    with torch.no_grad():
        gpt(ctx[:, :-1], cache=cache)
    last = ctx[:, -1:]                                                 # (B, 1)

    def cached():
        for c in cache:
            c.length = ctx.shape[1] - 1                                # rewind: the same step every call
        with torch.no_grad():
            return gpt(last, cache=cache)

    def full():
        with torch.no_grad():
            return gpt(ctx)
    return cached, full


def _per_call(fns: dict[str, Callable], calls: int, repeats: int) -> dict[str, float]:
    """Microseconds per call of each function: ``calls`` calls per timed run, runs round-robin."""
    def loop(fn):
        def run():
            for _ in range(calls):
                fn()
        return run
    runs = [loop(f) for f in fns.values()]
    for r in runs:
        r()
    times = time_interleaved(runs, repeats=repeats)
    return {name: 1e6 * statistics.median(t) / calls for name, t in zip(fns, times)}


def overheads(cfg, batch: int, seq_len: int, *, calls: int = 200, repeats: int = 7) -> list[dict]:
    """The microbenchmarks listed in the module docstring, for a GPTConfig's sizes."""
    g = torch.Generator().manual_seed(0)
    H, C = cfg.n_heads, cfg.d_model
    D = C // H
    rows = []
    # Dispatch: a tiny request, so the fixed Python cost per call is what gets measured.
    q, k, v = (torch.randn(1, H, 8, D, generator=g) for _ in range(3))           # (1, H, 8, D)
    rows.append({"what": f"attention call, fixed cost (1, {H}, 8, {D}), causal, no grad",
                 "calls_per_step": cfg.n_layers,
                 "us_per_call": _per_call({
                     "F.scaled_dot_product_attention(is_causal=True)":
                         lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                     "attnlab.attention(causal=True)": lambda: attention(q, k, v, causal=True),
                     "attnlab.attention(causal=True, backend='sdpa')":
                         lambda: attention(q, k, v, causal=True, backend="sdpa")}, calls, repeats)})
    # A short sequence, L = S = 128: above SDPA's short-row path, inside attention()'s shortcut.
    q, k, v = (torch.randn(1, H, 128, D, generator=g) for _ in range(3))         # (1, H, 128, D)
    rows.append({"what": f"attention call (1, {H}, 128, {D}), causal, no grad", "calls_per_step": cfg.n_layers,
                 "us_per_call": _per_call({
                     "F.scaled_dot_product_attention(is_causal=True)":
                         lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                     "attnlab.attention(causal=True)": lambda: attention(q, k, v, causal=True)}, calls, repeats)})
    # Decode: one query against S cached keys; bottom-right causal allows every key.
    S = min(cfg.max_len, 256)
    q1 = torch.randn(1, H, 1, D, generator=g)                                      # (1, H, 1, D)
    ks, vs = (torch.randn(1, H, S, D, generator=g) for _ in range(2))             # (1, H, S, D)
    rows.append({"what": f"decode attention (1, {H}, 1 <- {S}, {D}), no grad", "calls_per_step": cfg.n_layers,
                 "us_per_call": _per_call({
                     "attnlab.attention(causal=True) [L = 1: causal dropped, plain SDPA]":
                         lambda: attention(q1, ks, vs, causal=True),
                     "attnlab.attention() [same result at L = 1]": lambda: attention(q1, ks, vs),
                     "F.scaled_dot_product_attention()": lambda: F.scaled_dot_product_attention(q1, ks, vs)},
                     calls, repeats)})
    x = torch.randn(batch, seq_len, C, generator=g)                                # (B, T, C)
    rows.append({"what": f"head split of (B={batch}, T={seq_len}, C={C})", "calls_per_step": 4 * cfg.n_layers,
                 "us_per_call": _per_call({
                     "einops.rearrange('b l (h d) -> b h l d')": lambda: rearrange(x, "b l (h d) -> b h l d", h=H),
                     "view + transpose": lambda: x.view(batch, seq_len, H, D).transpose(1, 2)}, calls, repeats)})
    rows.append(_projections(C, batch, seq_len, cfg.n_layers, max(1, calls // 40), repeats, g))
    return rows


def _projections(C: int, batch: int, seq_len: int, n_layers: int, calls: int, repeats: int,
                 g: torch.Generator) -> dict:
    """q/k/v from three Linears vs one fused (C, 3C) Linear, forward + backward at the training shape."""
    sep = [nn.Linear(C, C) for _ in range(3)]
    fused = nn.Linear(C, 3 * C)
    x = torch.randn(batch, seq_len, C, generator=g, requires_grad=True)           # (B, T, C)
    dy = torch.randn(batch, seq_len, C, generator=g)                              # upstream gradient
    dy3 = dy.repeat(1, 1, 3)                                                       # (B, T, 3C)

    def three():
        torch.autograd.backward([lin(x) for lin in sep], [dy, dy, dy])

    def one():
        torch.autograd.backward(fused(x), dy3)
    return {"what": f"q/k/v projections, forward + backward, (B={batch}, T={seq_len}, C={C})",
            "calls_per_step": n_layers,
            "us_per_call": _per_call({"three Linear(C, C) [attnlab]": three, "one Linear(C, 3C) [nanoGPT]": one},
                                     calls, repeats)}
