"""Long-range dependencies: a transformer vs an LSTM of the same size on copy-at-distance k.

The task (``copy_batch``): a stream of random tokens x_0 .. x_{T-1} from a vocabulary of V; at
every position t >= k the model must output x_{t-k}, the token exactly k positions back. Both
models are causal (output t sees x_0 .. x_t) and trained from scratch on the same stream, for
the same number of steps, one pair of models per k.

    transformer   token embedding -> 1 pre-norm causal block with RoPE (2 heads) -> norm -> linear
                  (d_model 32 in --quick, 64 in the full run: wider heads resolve larger offsets)
    LSTM          token embedding -> torch LSTM (hidden width matched to the transformer's
                  parameter count, within 10%) -> linear

Attention reaches x_{t-k} in one step whatever k is (a path of length 1, Vaswani et al. 2017
Table 1: maximum path length O(1) vs O(n)); the LSTM must carry the last k tokens, k log2 V bits,
through k updates of its fixed-size state.

Example::

    x, y = copy_batch(4, k=8, extra=16, vocab=8, generator=torch.Generator().manual_seed(0))
    # x (4, 24); y (4, 16) == x[:, :16]: the target at position t = 8 + i is x[:, i]
    result = train_copy(LagTransformer(8, 32), k=8, steps=200, lr=3e-3)   # {"accuracy": ~1.0, ...}
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..measure.threads import threads
from .claims import Check, Claim, VerifyContext
from .exp_sequential import n_axis
from .report import new_figure, png_bytes

__all__ = ["CLAIMS", "LongRangeConfig", "LONGRANGE_QUICK", "LONGRANGE_FULL", "copy_batch", "LagTransformer",
           "LagLSTM", "num_params", "matched_lstm", "train_copy", "evaluate_copy", "judge_longrange", "run_longrange",
           "claim_long_range_dependencies"]


@dataclass
class LongRangeConfig:
    ks: list                       # the distances k, one transformer and one LSTM trained per k
    steps: int                     # optimizer steps per model (the same for both)
    vocab: int = 8                 # V: each token carries log2 V = 3 bits
    d_model: int = 32              # both models' embedding width
    n_heads: int = 2               # transformer heads (head width 16)
    extra: int = 16                # targets per sequence: T = k + extra
    batch: int = 32
    lr_transformer: float = 3e-3   # converged at every k tried (2 - 256); not tuned further
    lr_lstm: float = 1e-2          # the LSTM's best of {3e-3, 1e-2, 3e-2} at k = 8 (0.35, 0.40, 0.37 at 200 steps)
    eval_batch: int = 512
    threshold: float = 0.9         # "solved": accuracy at or above this (chance is 1/V)


MAX_PARAM_GAP = 0.10           # "the same size": LSTM and transformer parameter counts within 10%
LONGRANGE_QUICK = dict(ks=[2, 4, 8, 16, 32, 64], steps=200)
LONGRANGE_FULL = dict(ks=[2, 4, 8, 16, 32, 64, 128, 256], steps=600, d_model=64)   # head width 32: see notes


def copy_batch(batch: int, k: int, extra: int, vocab: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """A batch of the copy-at-distance task.

    Args:
        batch: B sequences; k: the distance (>= 1); extra: targets per sequence; vocab: V tokens.
    Returns:
        x (B, k + extra) int64 tokens in [0, V), and y (B, extra) with y[:, i] = x[:, i], the target
        of position t = k + i (so a model's outputs ``logits[:, k:]`` line up with y).
    """
    if k < 1 or extra < 1 or batch < 1 or vocab < 2:
        raise ValueError(f"copy_batch needs k >= 1, extra >= 1, batch >= 1 and vocab >= 2, got k={k}, "
                         f"extra={extra}, batch={batch}, vocab={vocab}")
    x = torch.randint(0, vocab, (batch, k + extra), generator=generator)   # (B, T)
    return x, x[:, :extra]                                                  # (B, T), (B, extra)


class LagTransformer(nn.Module):
    """Causal transformer for token streams: (B, T) ids -> (B, T, V) logits. RoPE: no length limit."""

    def __init__(self, vocab: int, d_model: int, n_heads: int = 2, n_layers: int = 1):
        super().__init__()
        from ..nn import BlockConfig, TransformerBlock
        from ..nn.blocks import make_norm
        cfg = BlockConfig(d_model=d_model, n_heads=n_heads, causal=True, positional="rope", d_ff=2 * d_model)
        self.emb = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(TransformerBlock(cfg) for _ in range(n_layers))
        self.norm = make_norm(cfg)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, x: Tensor) -> Tensor:
        h = self.emb(x)                                     # (B, T, C)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))                      # (B, T, V)


class LagLSTM(nn.Module):
    """Embedding -> one-layer torch LSTM -> linear: (B, T) ids -> (B, T, V) logits."""

    def __init__(self, vocab: int, d_embed: int, hidden: int):
        super().__init__()
        self.emb = nn.Embedding(vocab, d_embed)
        self.rnn = nn.LSTM(d_embed, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x: Tensor) -> Tensor:
        out, _ = self.rnn(self.emb(x))                      # (B, T, hidden)
        return self.head(out)                               # (B, T, V)


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def matched_lstm(target: int, vocab: int, d_embed: int) -> LagLSTM:
    """The LagLSTM whose parameter count is closest to ``target`` (searching the hidden width).

    Example:
        lstm = matched_lstm(num_params(LagTransformer(8, 32)), vocab=8, d_embed=32)
    """
    def count(h: int) -> int:   # embedding + LSTM (4 gates: W_ih, W_hh, two biases) + head
        return vocab * d_embed + 4 * h * (d_embed + h + 2) + h * vocab + vocab
    hidden = min(range(1, 4096), key=lambda h: abs(count(h) - target))
    return LagLSTM(vocab, d_embed, hidden)


def train_copy(model: nn.Module, *, k: int, steps: int, lr: float, vocab: int = 8, extra: int = 16,
               batch: int = 32, eval_batch: int = 512, seed: int = 0) -> dict:
    """Train ``model`` on copy-at-distance k (AdamW, one-cycle schedule), then measure held-out accuracy.

    The training stream depends only on ``seed`` (both models of a pair see the same batches);
    the held-out batch on ``seed + 1``.
    Returns:
        {"accuracy": fraction of held-out targets predicted exactly, "loss": last training loss,
         "seconds": training time}
    """
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    model.train()
    t0 = time.perf_counter()
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        x, y = copy_batch(batch, k, extra, vocab, gen)
        logits = model(x)[:, k:]                                            # (B, extra, V)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    seconds = time.perf_counter() - t0
    acc = evaluate_copy(model, k=k, vocab=vocab, extra=extra, batch=eval_batch, seed=seed + 1)
    return {"accuracy": acc, "loss": loss.item(), "seconds": seconds}


def evaluate_copy(model: nn.Module, *, k: int, vocab: int = 8, extra: int = 16, batch: int = 512,
                  seed: int = 1) -> float:
    """Fraction of the targets of a fresh copy-at-distance-k batch that ``model`` (B, T) -> (B, T, V) gets exactly.

    Example:
        evaluate_copy(model, k=8)          # 1.0 for a model that outputs x_{t-8} at every t >= 8
    """
    model.eval()
    with torch.no_grad():
        x, y = copy_batch(batch, k, extra, vocab, torch.Generator().manual_seed(seed))
        return (model(x)[:, k:].argmax(-1) == y).double().mean().item()       # logits (B, extra, V) vs y


def judge_longrange(ks: list[int], acc_transformer: list[float], acc_lstm: list[float],
                    threshold: float = 0.9, param_gap: float = 0.0, max_gap: float = MAX_PARAM_GAP) -> list[Check]:
    """The transformer solves every k; the LSTM solves the smallest k (a positive control: it is trained
    and can learn the task) but not the largest; parameter counts within ``max_gap``.

    An untrained LSTM (chance at every k) fails the positive control, so the LSTM's failure at the
    largest k means something.
    """
    complete = bool(ks) and len(acc_transformer) == len(ks) == len(acc_lstm)
    first = min(range(len(ks)), key=lambda i: ks[i]) if complete else None
    last = max(range(len(ks)), key=lambda i: ks[i]) if complete else None

    def at(acc, i):
        return f"{acc[i]:.4g} at k = {ks[i]}" if i is not None else "n/a"
    low = min(range(len(ks)), key=lambda i: acc_transformer[i]) if complete else None
    return [Check("an accuracy for both models at every k", complete,
                  f"{len(ks)} k, {len(acc_transformer)} transformer, {len(acc_lstm)} LSTM"),
            Check(f"parameter counts within {max_gap:.0%}", param_gap <= max_gap, f"{param_gap:.1%}"),
            Check(f"the transformer's held-out accuracy is >= {threshold} at every k",
                  complete and all(a >= threshold for a in acc_transformer), "min " + at(acc_transformer, low)),
            Check(f"positive control: the LSTM's is >= {threshold} at the smallest k (it learns the task where the "
                  "distance is short; an untrained LSTM is at chance)",
                  complete and acc_lstm[first] >= threshold, at(acc_lstm, first)),
            Check(f"the LSTM's is < {threshold} at the largest k", complete and acc_lstm[last] < threshold,
                  at(acc_lstm, last))]


def run_longrange(cfg: LongRangeConfig, seed: int = 0) -> dict:
    """Train one transformer and one matched LSTM per k; accuracies, parameter counts and times."""
    rows = []
    with threads(1):      # tiny models: one thread is as fast, and steadier on a shared machine
        for k in cfg.ks:
            torch.manual_seed(seed)
            tf = LagTransformer(cfg.vocab, cfg.d_model, cfg.n_heads)
            lstm = matched_lstm(num_params(tf), cfg.vocab, cfg.d_model)
            common = dict(k=k, steps=cfg.steps, vocab=cfg.vocab, extra=cfg.extra, batch=cfg.batch,
                          eval_batch=cfg.eval_batch, seed=seed)
            r_tf = train_copy(tf, lr=cfg.lr_transformer, **common)
            r_lstm = train_copy(lstm, lr=cfg.lr_lstm, **common)
            rows.append({"k": k, "transformer": r_tf, "lstm": r_lstm, "params_transformer": num_params(tf),
                         "params_lstm": num_params(lstm), "lstm_hidden": lstm.rnn.hidden_size})
    return {"rows": rows}


def _plot(ks: list[int], acc_tf: list[float], acc_lstm: list[float], cfg: LongRangeConfig, params: tuple) -> bytes:
    """Accuracy against k; ``params`` = (transformer parameters, LSTM parameters, LSTM hidden width)."""
    fig, ax = new_figure(1, width=5.6)
    ax.plot(ks, acc_tf, marker="o", label=f"transformer (1 block, RoPE, d={cfg.d_model}): {params[0]:,} params")
    ax.plot(ks, acc_lstm, marker="s", label=f"LSTM (hidden {params[2]}): {params[1]:,} params")
    ax.axhline(cfg.threshold, ls="--", c="grey", lw=1, label=f"threshold {cfg.threshold}")
    ax.axhline(1 / cfg.vocab, ls=":", c="k", lw=1, label=f"chance 1/{cfg.vocab}")
    n_axis(ax, ks)
    ax.set(ylim=(0, 1.03), xlabel="distance k (tokens back)", ylabel="held-out accuracy",
           title=f"copy the token k back ({cfg.steps} steps each)")
    ax.legend(fontsize=8, loc="center left")
    return png_bytes(fig)


def claim_long_range_dependencies(ctx: VerifyContext, cfg: Optional[LongRangeConfig] = None) -> Claim:
    """A transformer reaches k tokens back at any k; an LSTM of the same size loses the token as k grows."""
    cfg = cfg or LongRangeConfig(**(LONGRANGE_QUICK if ctx.quick else LONGRANGE_FULL))
    rows = run_longrange(cfg, ctx.seed)["rows"]
    ks = [r["k"] for r in rows]
    acc_tf = [r["transformer"]["accuracy"] for r in rows]
    acc_lstm = [r["lstm"]["accuracy"] for r in rows]
    gap = max(abs(r["params_lstm"] / r["params_transformer"] - 1) for r in rows)
    last = ks.index(max(ks))
    checks = judge_longrange(ks, acc_tf, acc_lstm, cfg.threshold, gap)
    torch.manual_seed(ctx.seed)                  # what the positive control rules out: an LSTM that learned nothing
    untrained = evaluate_copy(LagLSTM(cfg.vocab, cfg.d_model, rows[0]["lstm_hidden"]), k=min(ks), vocab=cfg.vocab,
                              extra=cfg.extra, batch=cfg.eval_batch, seed=ctx.seed + 1)
    seconds = {"transformer": [round(r["transformer"]["seconds"], 2) for r in rows],
               "lstm": [round(r["lstm"]["seconds"], 2) for r in rows]}
    return Claim(
        "long-range-dependencies", "Long-range dependencies: transformer vs LSTM, accuracy against distance k",
        statement="Self-attention connects any two positions in one step, so a token k positions back is as easy "
                  "to use as the previous one; a recurrent network must carry it through k state updates.",
        criterion=f"copy-at-distance (V={cfg.vocab}, output x_(t-k) at every t >= k), one model pair per k in {ks}, "
                  f"both trained {cfg.steps} steps of batch {cfg.batch} on the same stream "
                  f"({rows[0]['params_transformer']:,} vs {rows[0]['params_lstm']:,} parameters), accuracy on a "
                  f"held-out batch of {cfg.eval_batch}",
        checks=checks,
        measurement={"k": ks, "accuracy_transformer": acc_tf, "accuracy_lstm": acc_lstm,
                     "params_transformer": [r["params_transformer"] for r in rows],
                     "params_lstm": [r["params_lstm"] for r in rows], "lstm_hidden": rows[0]["lstm_hidden"],
                     "max_param_gap": round(gap, 4), "train_seconds": seconds, "chance": 1 / cfg.vocab,
                     "untrained_lstm_accuracy_at_smallest_k": untrained,
                     "config": {k: v for k, v in vars(cfg).items() if k != "ks"}},
        summary=f"k={max(ks)}: transformer {acc_tf[last]:.2f}, LSTM {acc_lstm[last]:.2f} (chance {1 / cfg.vocab:.2f}); "
                f"LSTM >= {cfg.threshold} at k in {[k for k, a in zip(ks, acc_lstm) if a >= cfg.threshold]}",
        figure=_plot(ks, acc_tf, acc_lstm, cfg, (rows[0]["params_transformer"], rows[0]["params_lstm"],
                                                 rows[0]["lstm_hidden"])),
        notes=f"The positive control: an LSTM must solve the shortest distance (k = {min(ks)}), else its failure at "
              f"large k could be a broken training or evaluation; the same LSTM untrained scores {untrained:.3f} "
              f"there (chance {1 / cfg.vocab:.3f}). "
              "Equal budgets, not equal best effort: both models get the same steps and data, each its own "
              "learning rate from a small sweep. With more steps the LSTM reaches further (it can in principle "
              "hold k tokens in its state: Hochreiter & Schmidhuber 1997 train lags of hundreds of steps, with "
              "far longer training), so the LSTM's curve is a statement about this budget; the transformer's flat "
              "curve is the structural point: its one attention step to position t-k costs the same at every k. "
              "The transformer uses RoPE, whose scores depend on the offset t - s only, so 'attend exactly k "
              "back' is one pattern for every position. Its head width matters at large k: with heads of 16 "
              "(d_model 32, the quick set-up) it reached 1.0 up to k = 128 but stalled near 0.75 at k = 256 "
              "(600 or 1200 steps; RoPE base 256 instead of 10000 did not help), with heads of 32 (d_model 64, "
              "the full set-up) it reached 1.0 at k = 256 in 600 steps: resolving offset 256 from 255 takes "
              "enough rotation frequencies. Trained on one thread (tiny models); times per model are in the "
              "measurement.")


CLAIMS = [claim_long_range_dependencies]
