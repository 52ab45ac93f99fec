"""Parallel vs sequential: an RNN layer needs n dependent steps, an attention layer a constant few.

Two claims (Vaswani et al. 2017, Table 1: sequential operations O(n) for a recurrent layer, O(1)
for self-attention; total work O(n d^2) vs O(n^2 d)):

    sequential-critical-path   the longest chain of dependent matrix products in one forward,
                               counted by ``critical_path`` (a torch dispatch mode): n for
                               ``ElmanRNN`` and torch's LSTM, a constant for ``AttentionLayer``
    sequential-wall-time       forward time of the three layers as n grows, batch 1 and 32

``critical_path`` follows data dependencies through every aten op: an output's depth is the
largest depth among its inputs, plus one if the op is a matrix product (elementwise ops count as
free, the usual PRAM idealisation). The depth of the layer's output is the critical path.

Example::

    cp = critical_path(ElmanRNN(RNNConfig(dim=32)), torch.randn(1, 10, 32))
    cp.depth, cp.matmuls          # (10, 11): 10 dependent steps (+ the input projection, in parallel)
"""
from __future__ import annotations

import statistics
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakTensorKeyDictionary

from ..deprecation import moved
from ..measure import threads as _threads_module
from ..measure.threads import threads as _threads
from ..measure.timing import time_interleaved
from .claims import Check, Claim, VerifyContext
from .report import new_figure, png_bytes

__all__ = ["CLAIMS", "PathCount", "critical_path", "native_rnn", "judge_critical_path", "judge_wall_time",
           "n_axis", "layers_for_timing", "layer_flops", "claim_sequential_critical_path", "claim_sequential_wall_time"]

_aten = torch.ops.aten
# One matrix product each (matmul/linear decompose into these before dispatch reaches the mode).
_PRODUCTS = {_aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default}
# Fused attention: two dependent products inside (scores = q k^T, then weights @ v).
_FUSED_ATTENTION = {getattr(_aten, name).default for name in (
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_attention_math",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention") if hasattr(_aten, name)}
# Fused recurrences whose inner loop the mode cannot see (run under ``native_rnn`` to count them).
_OPAQUE = {"mkldnn_rnn_layer", "lstm", "gru", "rnn_tanh", "_thnn_fused_lstm_cell"}
# Batch 32 is judged where attention does clearly more matrix-product work than the LSTM. Near a ratio
# of 1 the outcome is not the theory's but the BLAS library's: at 1.25-1.5x (n = 3d-4d) how well each
# CPU runs attention's per-head products against the LSTM's (32 x d)(d x 4d) steps decides, and the LSTM
# won from n = 128 on the Zen 4, from n = 512 on a Zen 3 (AVX2), and a CI run on another machine failed
# the claim (4 Dec 2026; its log did not say which check, this check at n = 512 the likelier). At 2.5x
# (n = 1024) the LSTM was 2.4x faster than attention on the Zen 3.
WORK_MARGIN = 2.0


@dataclass
class PathCount:
    depth: int          # longest chain of dependent matrix products ending at the output
    matmuls: int        # matrix products in total (independent ones too)
    flops: int          # 2 M K N per product (4 B H L S D per fused attention call)
    opaque: list        # fused ops the count could not look inside (empty for an exact count)


def _flops(func, args, out) -> int:
    if func in _FUSED_ATTENTION:
        q, k = args[0], args[1]                                          # (B, H, L, D), (B, H, S, D)
        return 4 * q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] * q.shape[3]
    a = args[1] if func in (_aten.addmm.default, _aten.baddbmm.default) else args[0]
    return 2 * out.numel() * a.shape[-1]                                 # (.., M, N) out, K = a's last dim


class _DepthMode(TorchDispatchMode):
    """Tags every tensor produced under it with the depth of matrix products it depends on."""

    def __init__(self):
        super().__init__()
        self.depth = WeakTensorKeyDictionary()
        self.matmuls = 0
        self.flops = 0
        self.opaque: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, Tensor)]
        # a fresh tensor shaped like another (new_zeros, zeros_like) reads only its metadata
        fresh = func.__name__.startswith("new_") or func.__name__.split(".")[0].endswith("_like")
        d = 0 if fresh else max((self.depth.get(t, 0) for t in inputs), default=0)
        steps = 1 if func in _PRODUCTS else 2 if func in _FUSED_ATTENTION else 0
        if steps:
            d += steps
            self.matmuls += steps
            self.flops += _flops(func, args, out)
        if func.__name__.split(".")[0] in _OPAQUE:
            self.opaque.add(func.__name__)
        for t in tree_flatten(out)[0]:
            if isinstance(t, Tensor):
                self.depth[t] = d
        if func._schema.is_mutable:                                      # in-place/out=: the written tensor
            for t in inputs:                                             # now depends on this op
                self.depth[t] = max(self.depth.get(t, 0), d)
        return out


def critical_path(module: Callable[[Tensor], Tensor], x: Tensor) -> PathCount:
    """Count the dependent matrix products of ``module(x)`` (no grad).

    Args:
        module: any callable on tensors, e.g. an ``nn.Module`` (B, L, C) -> (B, L, C).
        x: its input; parameters and x start at depth 0.
    Returns:
        a PathCount; ``opaque`` lists fused kernels (e.g. oneDNN's LSTM) whose steps were not seen:
        wrap the call in ``native_rnn()`` to make torch run its recurrences step by step.
    Example:
        critical_path(AttentionLayer(AttentionConfig(d_model=32, n_heads=4, backend="reference")),
                      torch.randn(1, 100, 32)).depth          # 4: qkv, q k^T, weights @ v, output
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"critical_path takes a tensor input, got {type(x).__name__}")
    mode = _DepthMode()
    with torch.no_grad(), mode:
        y = module(x)
    out = [t for t in tree_flatten(y)[0] if isinstance(t, Tensor)]
    depth = max((mode.depth.get(t, 0) for t in out), default=0)
    return PathCount(depth, mode.matmuls, mode.flops, sorted(mode.opaque))


@contextmanager
def native_rnn():
    """Run torch's LSTM/GRU as aten ops step by step (oneDNN off), so ``critical_path`` sees each step."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)          # oneDNN's TF32 notice, irrelevant on CPU
        with torch.backends.mkldnn.flags(enabled=False):
            yield


def judge_critical_path(ns: list[int], depths: dict[str, list[int]], attention: str = "attention",
                        opaque: Sequence[str] = ()) -> list[Check]:
    """Every recurrent layer's depth equals n at each n; the attention layer's depth is one constant.

    Args:
        ns: the sequence lengths; depths: layer name -> depth at each n (same order);
        opaque: fused ops the counter could not look inside (any fails the count).
    """
    rnns = {name: list(d) for name, d in depths.items() if name != attention}
    att = list(depths.get(attention, []))
    return [Check("at least two lengths n and a recurrent layer to compare", len(ns) >= 2 and bool(rnns),
                  f"n in {list(ns)}, recurrent: {', '.join(rnns) or 'none'}"),
            Check("every recurrent layer's depth is exactly n at every n",
                  bool(rnns) and all(d == list(ns) for d in rnns.values()),
                  "; ".join(f"{name} {d}" for name, d in rnns.items())),
            Check("the attention layer's depth is one constant > 0 at every n",
                  len(att) == len(ns) and len(set(att)) == 1 and att[0] > 0, str(att)),
            Check("no fused op hid its steps from the count", not opaque, ", ".join(opaque) or "none")]


def _wins(ns: list[int], att: list[float], other: list[float]) -> tuple[list[int], list[int]]:
    """(n where attention is faster, n where it is slower)."""
    return [n for n, a, t in zip(ns, att, other) if a < t], [n for n, a, t in zip(ns, att, other) if a >= t]


def judge_wall_time(ns: list[int], times_b1: dict[str, list[float]], width: int,
                    times_b32: Optional[dict[str, list[float]]] = None, flops: Optional[dict[str, list[int]]] = None,
                    attention: str = "attention", lstm: str = "lstm", more_work: float = WORK_MARGIN) -> list[Check]:
    """Attention wins at batch 1 for n <= d; at batch 32 it loses to the LSTM wherever it does more work.

    Args:
        ns: sequence lengths; times_b1 / times_b32: layer name -> seconds at each n, batch 1 / 32.
        width: the model width d; batch 1 is judged at n <= d (at least one must be there).
        flops: layer name -> matrix-product FLOPs of one forward at each n (any batch: the ratio is
            what counts); batch 32 is judged where attention's exceed the LSTM's by ``more_work``
            (at least one such n must be there).
    """
    idx = [i for i, n in enumerate(ns) if n <= width]
    att1 = times_b1.get(attention, [])
    slow1 = {name: [ns[i] for i in idx if i < len(att1) and not att1[i] < t[i]]
             for name, t in times_b1.items() if name != attention}
    checks = [Check(f"batch 1, every n <= d = {width}: attention is faster than every recurrent layer (the regime "
                    "where a recurrent step is a tiny matrix-vector product and only attention fills the core)",
                    bool(idx) and bool(slow1) and len(att1) == len(ns) and not any(slow1.values()),
                    "; ".join(f"{name} faster or equal at n in {v}" for name, v in slow1.items() if v)
                    or f"attention fastest at every n in {[ns[i] for i in idx]}")]
    if times_b32 is None or flops is None:
        return checks + [Check("batch 32 measured and judged", False, "not measured")]
    att32, lstm32 = times_b32.get(attention, []), times_b32.get(lstm, [])
    ratio = [a / l for a, l in zip(flops.get(attention, []), flops.get(lstm, []))]
    judged = [i for i, r in enumerate(ratio) if r >= more_work and i < min(len(att32), len(lstm32))]
    wrong = [ns[i] for i in judged if att32[i] < lstm32[i]]
    faster, slower = _wins(ns, att32, lstm32)
    checks.append(Check(f"batch 32, every n where attention's matrix-product FLOPs are >= {more_work:g}x the LSTM's "
                        f"(8nd^2 + 4n^2d vs 16nd^2: n >= {4 * more_work - 2:g}d): attention is slower than the "
                        "LSTM (a batch gives each "
                        "recurrent step matmul-sized work, so time follows work)",
                        bool(judged) and not wrong,
                        (f"attention faster at n in {wrong}" if wrong else
                         f"judged at n in {[ns[i] for i in judged]}") +
                        f"; as measured, attention beats the LSTM at n in {faster} and loses at n in {slower}"))
    return checks


def n_axis(ax, ns: list[int]) -> None:
    """A log2 x axis labelled with the measured n (matplotlib's default log ticks collide)."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.minorticks_off()


# -- the layers ------------------------------------------------------------------------------------
def layer_flops(n: int, d: int) -> dict[str, int]:
    """Matrix-product FLOPs of one batch-1 forward of each ``layers_for_timing`` layer on n tokens of width d.

    Elman: input and recurrent products (4nd^2); LSTM: the same for 4 gates (16nd^2); attention: 4
    projections and QK^T, PV (8nd^2 + 4n^2d). ``critical_path`` counts exactly these (tested).
    Example:
        layer_flops(512, 128)["attention"] / layer_flops(512, 128)["lstm"]        # 1.5: n = 4d
    """
    return {"elman": 4 * n * d * d, "lstm": 16 * n * d * d, "attention": 8 * n * d * d + 4 * n * n * d}


def layers_for_timing(dim: int, heads: int, seed: int, backend: str = "auto") -> dict[str, nn.Module]:
    """The three layers compared, same width: Elman RNN, torch LSTM, multi-head self-attention."""
    from ..nn import AttentionConfig, AttentionLayer
    from ..nn.rnn import ElmanRNN, LSTMBaseline, RNNConfig
    torch.manual_seed(seed)
    return {"elman": ElmanRNN(RNNConfig(dim=dim)).eval(), "lstm": LSTMBaseline(RNNConfig(dim=dim)).eval(),
            "attention": AttentionLayer(AttentionConfig(d_model=dim, n_heads=heads, backend=backend)).eval()}


def claim_sequential_critical_path(ctx: VerifyContext) -> Claim:
    """A recurrent layer's critical path is n matrix products; attention's is a constant."""
    dim, heads = 64, 4
    ns = [4, 16, 64, 256] if ctx.quick else [4, 16, 64, 256, 1024]
    layers = layers_for_timing(dim, heads, ctx.seed, backend="reference")   # reference: products visible
    counts: dict[str, list[PathCount]] = {name: [] for name in layers}
    with native_rnn():
        for n in ns:
            x = torch.randn(1, n, dim)
            for name, layer in layers.items():
                counts[name].append(critical_path(layer, x))
    depths = {name: [c.depth for c in cs] for name, cs in counts.items()}
    opaque = sorted({o for cs in counts.values() for c in cs for o in c.opaque})
    checks = judge_critical_path(ns, depths, opaque=opaque)
    fig, (ax, ax2) = new_figure(2, width=4.4)
    style = {"elman": dict(marker="o"), "lstm": dict(marker="s", ls="--", mfc="none"), "attention": dict(marker="^")}
    for name, d in depths.items():                       # elman and lstm coincide on the left: lstm dashed
        ax.plot(ns, d, label=name, **style[name])
        ax2.plot(ns, [c.flops / 1e6 for c in counts[name]], label=name, **style[name])
    ax.set(yscale="log", xlabel="sequence length n", ylabel="dependent matrix products", title="critical path")
    ax2.set(yscale="log", xlabel="sequence length n", ylabel="MFLOPs (all products)", title="total work")
    n_axis(ax, ns)
    n_axis(ax2, ns)
    ax.legend(fontsize=8)
    ax2.legend(fontsize=8)
    att = depths["attention"]
    return Claim(
        "sequential-critical-path", "Critical path: n dependent steps for an RNN, a constant for attention",
        statement="A recurrent layer must compute h_t from h_{t-1}: n dependent steps. Self-attention computes "
                  "all n outputs with a fixed chain of matrix products (project, q k^T, weights @ v, output) "
                  "whose sizes grow with n but whose number does not (Vaswani et al. 2017, Table 1).",
        criterion=f"ElmanRNN, torch's LSTM and AttentionLayer (d={dim}, batch 1, n in {ns}), one forward each. "
                  "Counted: the longest chain of matrix products (mm/addmm/bmm/baddbmm, a fused SDPA call as 2) "
                  "each waiting for the previous one, through every aten op. Not counted: elementwise ops and "
                  "reductions (softmax, the gates' sigmoid/tanh) are free, the PRAM idealisation; a softmax's sum "
                  "over n keys takes log n parallel steps, which this depth leaves out. The recurrent depth n "
                  "holds by construction of the loop; what the count shows is that attention's does not grow",
        checks=checks,
        measurement={"n": ns, "depth": depths, "matmuls": {k: [c.matmuls for c in v] for k, v in counts.items()},
                     "flops": {k: [c.flops for c in v] for k, v in counts.items()}, "opaque_ops": opaque},
        summary=f"depth at n={ns[-1]}: elman {depths['elman'][-1]}, lstm {depths['lstm'][-1]}, "
                f"attention {att[-1]} (at every n: {sorted(set(att))})",
        figure=png_bytes(fig),
        notes="Depth = the longest chain of matrix products each waiting for the previous one (elementwise ops "
              "count as free). The attention layer runs on the reference backend so q k^T and weights @ v are "
              "separate products (a fused SDPA call counts as 2). torch's LSTM is one oneDNN kernel on CPU; it "
              "is counted with oneDNN off, where torch runs the same recurrence as aten ops step by step. The "
              "right panel is the other half of Table 1: attention's total work grows as n^2 d, the RNN's as "
              "n d^2, so attention does MORE arithmetic once n > d; it wins on depth, not on work.")


def _time_layers(layers: dict[str, nn.Module], x: Tensor, repeats: int) -> dict[str, tuple[float, float]]:
    """name -> (fastest, median) seconds of ``repeats`` round-robin forwards, after one warm-up each."""
    fns = [(lambda m=m: m(x)) for m in layers.values()]
    with torch.no_grad():
        for f in fns:
            f()
        runs = time_interleaved(fns, repeats=repeats)
    return {name: (min(ts), statistics.median(ts)) for name, ts in zip(layers, runs)}


def claim_sequential_wall_time(ctx: VerifyContext) -> Claim:
    """Wall time of an RNN layer vs an attention layer as n grows, at batch 1 and 32."""
    dim, heads = 128, 4
    ns = [16, 32, 64, 128, 256, 512, 1024] if ctx.quick else [16, 32, 64, 128, 256, 512, 1024, 2048]
    batches, repeats = [1, 32], (8 if ctx.quick else 12)       # even: as many rounds in each order
    layers = layers_for_timing(dim, heads, ctx.seed)
    times: dict[int, dict[str, list[float]]] = {b: {name: [] for name in layers} for b in batches}   # fastest
    medians: dict[int, dict[str, list[float]]] = {b: {name: [] for name in layers} for b in batches}
    with _threads(1):
        for b in batches:
            for n in ns:
                for name, (best, med) in _time_layers(layers, torch.randn(b, n, dim), repeats).items():
                    times[b][name].append(best)
                    medians[b][name].append(med)
    flops = {name: [layer_flops(n, dim)[name] for n in ns] for name in layers}
    checks = judge_wall_time(ns, times[1], dim, times[32], flops)
    fig, axes = new_figure(2, width=4.6)
    for ax, b in zip(axes, batches):
        for name, ts in times[b].items():
            ax.plot(ns, [t * 1e3 for t in ts], marker="o", label=name)
        ax.axvline(dim, ls=":", c="grey", label=f"n = d = {dim}")
        ax.set(yscale="log", xlabel="sequence length n", ylabel="ms per forward (fastest run)", title=f"batch {b}")
        n_axis(ax, ns)
        ax.legend(fontsize=8)
    rnn_wins = {b: {name: [n for n, ta, t in zip(ns, times[b]["attention"], ts) if t < ta]
                    for name, ts in times[b].items() if name != "attention"} for b in batches}
    ratio = {b: {name: [round(t / ta, 2) for t, ta in zip(ts, times[b]["attention"])]
                 for name, ts in times[b].items() if name != "attention"} for b in batches}
    return Claim(
        "sequential-wall-time", "Wall time: RNN vs attention layer as n grows (batch 1 and 32)",
        statement="Because its steps are independent, an attention layer over n tokens is faster than a recurrent "
                  "layer that must take n dependent steps, where the recurrence cannot fill the machine (batch 1, "
                  "n < d: Vaswani et al. 2017, section 4). The advantage is the critical path, not the work: once "
                  "a batch gives each recurrent step matmul-sized work, time follows FLOPs, and attention loses "
                  "once it does clearly more of them (twice the LSTM's from n = 6d).",
        criterion=f"forward time (fastest of {repeats} interleaved runs, one thread, float32, no grad) of "
                  f"AttentionLayer(d={dim}, {heads} heads), ElmanRNN and torch's LSTM at n in {ns}, batch 1 and "
                  "32; FLOPs = the layers' matrix products (layer_flops, the count critical_path makes); medians "
                  "are in the measurement",
        checks=checks,
        measurement={"n": ns, "d": dim, "heads": heads, "threads": 1, "matmul_flops_batch1": flops,
                     "seconds_fastest": {f"batch{b}": times[b] for b in batches},
                     "seconds_median": {f"batch{b}": medians[b] for b in batches},
                     "rnn_over_attention": {f"batch{b}": ratio[b] for b in batches},
                     "rnn_faster_at_n": {f"batch{b}": rnn_wins[b] for b in batches}},
        summary="batch 1, n = d: elman {:.1f}x, lstm {:.1f}x attention's time; batch 32: faster than attention at "
                "n in {} (lstm), {} (elman)".format(ratio[1]["elman"][ns.index(dim)], ratio[1]["lstm"][ns.index(dim)],
                                                    rnn_wins[32]["lstm"], rnn_wins[32]["elman"]),
        figure=png_bytes(fig),
        notes="Forward only, float32, no grad, on ONE torch thread: on a shared 2-core machine a second OpenMP "
              "thread stalls whenever its sibling is descheduled (we measured 10-300x outliers with 2 threads "
              "under load), and the comparison is about the shape of the work, not about core count. The layers "
              "are timed round-robin so the machine's drift hits them alike, and judged on the fastest run (as "
              "timeit does: slower runs are other processes taking the core; under a load of ~10 on 2 cores a "
              "0.6 ms forward was stalled to 9 ms in most of its runs, so even the median flipped). "
              "Why the RNNs win at batch 32: a batch of 32 sequences gives each of the n steps 32 rows, so a "
              "step is a (32 x d) @ (d x d) product (4d wide for the LSTM's gates, inside one fused oneDNN "
              "kernel) that runs near the core's matmul speed: batching across sequences supplies the "
              "parallelism the recurrence lacks. Their work grows as n d^2 (the Elman has one gate, a quarter "
              "of the LSTM's work), attention's as n^2 d: past n ~ d the "
              "score matrices (batch x heads x n x n) "
              "dominate and the quadratic work, not the dependency chain, sets the time. A CPU has little "
              "parallelism to exploit, so the theory's advantage (a critical path independent of n) shows where "
              "the RNN cannot fill the machine: batch 1, where each step is a tiny matrix-vector product paying "
              "per-step overhead (the Elman loop also pays Python dispatch per step, the fused LSTM does not). "
              "On a GPU the parallel layer keeps thousands of lanes busy and wins over a much wider range. "
              f"In this run, faster than attention: at batch 1 the LSTM at n in {rnn_wins[1]['lstm']}, the Elman "
              f"at n in {rnn_wins[1]['elman']}; at batch 32 the LSTM at n in {rnn_wins[32]['lstm']}, the Elman at "
              f"n in {rnn_wins[32]['elman']}.")


CLAIMS = [claim_sequential_critical_path, claim_sequential_wall_time]


# threads() moved to attnlab.measure.threads (issue #29): it is measurement, not this experiment, and four
# other lab modules need it. The old import still works, with a DeprecationWarning.
__getattr__ = moved(__name__, _threads_module, {"threads"})
