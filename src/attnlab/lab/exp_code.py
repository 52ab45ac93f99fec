"""The Codex case: a GPT on the standard library's source, against an LSTM and a bigram, and its attention.

Three claims of the source text ("self-attention ... learns long-range dependencies inherent in
code: a function definition and its call site many lines later, the matching of brackets; ...
generates syntactically correct code completions"), measured on held-out stdlib files
(``tasks.code``: whole files the model and its tokenizer never saw):

- ``code-syntax``: the share of sampled function bodies (prompt = a held-out ``def`` line and
  docstring) that ``ast.parse`` accepts with a statement after the docstring, for the GPT, a
  parameter-matched LSTM trained for the same CPU time, and a bigram model;
- ``code-brackets``: the bracket head (chosen on one half of the held-out files, measured on the
  other) — does its strongest attention from a closing bracket land on the matching opening one,
  by distance and for nested pairs, against the nearest preceding opening bracket and against the
  same head's weight on non-matching opening brackets at the same distance;
- ``code-def-use``: the def → use head (chosen alike) — its weight from a use on the definition's
  tokens many lines back, against its weight at the same distance from every other position;
- ``code-scope`` (measured by ``lab/code_scope``): the scope head (chosen alike) — its weight from a use on the
  binding the use reads by Python's scoping rules against the same name bound in a scope the use
  cannot see, and the same with both bindings' names scrambled.

Models (``code_train.code_models``): full run: GPT preset ``code`` (4 layers, d = 128, context 256)
and its LSTM, 18 CPU-minutes each on 2 threads (about 9 minutes of the 2-core machine); ``--quick``:
preset ``code-small`` (2 layers, d = 64) on 1.5 MB, 120 CPU-seconds each on one thread — both trained
by the claim unless a finished pair with the same configuration is in the verify work directory
(then reused, and the claim says so).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .claims import Check, Claim, VerifyContext
from .code_measure import attention_stats, head_summary, pick_prompts, syntax_samples
from .code_scope import held_out_scope_stats, scope_verdict
from .code_train import CodeModels, CodeTrainConfig, code_models
from .report import new_figure, png_bytes

__all__ = ["CodeClaimConfig", "CODE_QUICK", "CODE_FULL", "judge_syntax", "judge_brackets", "judge_def_use",
           "best_head", "bracket_verdict", "defuse_verdict", "held_out_stats", "syntax_prompts", "sample_bodies",
           "claim_code_syntax", "claim_code_brackets", "claim_code_def_use", "claim_code_scope", "CLAIMS"]


@dataclass(frozen=True)
class CodeClaimConfig:
    train: CodeTrainConfig
    prompts: int                   # syntax: held-out function prompts, each sampled once per model
    max_new_tokens: int
    windows: Optional[int]         # attention: windows per held-out half (None: all)
    min_syntax_rate: float         # the GPT's syntax rate must reach this ...
    nested_accuracy: float         # bracket head: accuracy on nested pairs at least this
    weight_ratio: float            # match / same-distance control weight, per distance bin
    min_bin_pairs: int             # bins with fewer controlled pairs are shown, not judged
    defuse_ratio: float            # def weight / same-distance control weight
    defuse_beats: float            # share of pairs whose def weight beats their control
    min_defuse_pairs: int = 30
    temperature: float = 0.8       # sampling, the same for the three models
    top_k: int = 40
    scope_beats: float = 0.75      # scope head: share of uses with w_in > w_out at least this ...
    scope_ratio: float = 2.0       # ... and mean w_in / mean w_out at least this (the control must miss one)
    min_scope_pairs: int = 30


# Full: 9 minutes per model on both of the machine's cores (18 CPU-minutes on 2 threads; the issue allows
# 10 minutes here). Runs 1-3 gave each model 6, then 9 CPU-minutes on one thread (docs/results.md). The
# criteria below are unchanged since the first run.
CODE_FULL = CodeClaimConfig(CodeTrainConfig("code", 5_000_000, 1024, 1080.0, threads=2), prompts=60, max_new_tokens=128,
                            windows=200, min_syntax_rate=0.25, nested_accuracy=0.5, weight_ratio=2.0,
                            min_bin_pairs=20, defuse_ratio=3.0, defuse_beats=0.75)
CODE_QUICK = CodeClaimConfig(CodeTrainConfig("code-small", 1_500_000, 512, 120.0), prompts=30, max_new_tokens=96,
                             windows=60, min_syntax_rate=0.1, nested_accuracy=0.3, weight_ratio=1.5,
                             min_bin_pairs=20, defuse_ratio=2.0, defuse_beats=0.6)

_MODELS: dict = {}                 # (workdir, config) -> CodeModels: the three claims share one pair
_STATS: dict = {}                  # (workdir, config, measure) -> that measure's held-out stats, both halves


def _config(ctx: VerifyContext) -> CodeClaimConfig:
    cfg = CODE_QUICK if ctx.quick else CODE_FULL
    if ctx.seed != cfg.train.seed:
        from dataclasses import replace
        cfg = replace(cfg, train=replace(cfg.train, seed=ctx.seed))
    return cfg


def _models(ctx: VerifyContext, cfg: CodeClaimConfig) -> CodeModels:
    key = (str(ctx.workdir), cfg.train)
    if key not in _MODELS:
        _MODELS.clear()
        _MODELS[key] = code_models(cfg.train, ctx.workdir)
    return _MODELS[key]


def _stats(ctx: VerifyContext, cfg: CodeClaimConfig, m: CodeModels, measure=None) -> dict:
    """``measure``'s (default ``held_out_stats``) measurements of every head on the select half and the test
    half, computed once per models; those of other models are dropped."""
    measure = measure or held_out_stats
    key = (str(ctx.workdir), cfg, measure)
    if key not in _STATS:
        for old in [k for k in _STATS if k[:2] != key[:2]]:
            del _STATS[old]
        _STATS[key] = measure(m.gpt, m.data, cfg)
    return _STATS[key]


def held_out_stats(gpt, data, cfg: CodeClaimConfig) -> dict:
    """``attention_stats`` of every head on each half of the held-out files: {"select": ..., "test": ...}."""
    return {half: attention_stats(gpt, data.tokenizer, data.heldout_half(half), gpt.cfg.max_len, cfg.windows)
            for half in ("select", "test")}


def syntax_prompts(data, cfg: CodeClaimConfig, context: int) -> list:
    """The syntax claim's prompts: from every held-out file (the select/test halves matter only where a head is
    chosen, and nothing is chosen here; the test half alone has ~27 prompts of <= 128 tokens, under the 60 the
    criteria were set for), at most half the context long."""
    return pick_prompts(data.tokenizer, data.heldout, cfg.prompts, context // 2)


def sample_bodies(model, data, prompts: list, cfg: CodeClaimConfig, seed: int) -> list[dict]:
    """``syntax_samples`` with the claim's sampling settings."""
    return syntax_samples(model, data.tokenizer, prompts, max_new_tokens=cfg.max_new_tokens,
                          temperature=cfg.temperature, top_k=cfg.top_k, seed=seed)


def _provenance(m: CodeModels) -> str:
    p = m.provenance
    return "; ".join(f"{a.upper()} {p[a]['params']:,} params, {p[a]['steps']} steps x {p[a]['cpu_s_per_step']} "
                     f"CPU s ({p[a]['source']})" for a in ("gpt", "lstm"))


# ------------------------------------------------------------------------------------------- judges
def _se(p: float, q: float, n: int) -> float:
    return math.sqrt(max(p * (1 - p) + q * (1 - q), 1e-12) / max(n, 1))


def judge_syntax(rates: dict, n: int, min_rate: float) -> list[Check]:
    """GPT rate >= min_rate and above the LSTM's and the bigram's by more than two standard errors."""
    g = rates["gpt"]
    checks = [Check(f"GPT syntax rate >= {min_rate}", n > 0 and g >= min_rate, f"{g:.2f} of {n}")]
    for other in ("lstm", "bigram"):
        o = rates[other]
        two_se = 2 * _se(g, o, n)
        checks.append(Check(f"GPT rate - {other} rate > 2 standard errors of the difference", n > 0 and g - o > two_se,
                            f"{g:.2f} - {o:.2f} = {g - o:+.2f} vs {two_se:.2f}"))
    return checks


def judge_brackets(s: dict, nested_accuracy: float, ratio: float, min_pairs: int) -> list[Check]:
    """Nested-pair accuracy >= ``nested_accuracy`` and above the nearest-opening baseline; match weight
    >= ``ratio`` x the same-distance control in every bin with >= ``min_pairs`` controlled pairs (at least two bins)."""
    acc, base = s["bracket_accuracy_nested"], s["nearest_open_accuracy_nested"]
    checks = [Check(f"nested pairs: the head's strongest attention is on the match in >= {nested_accuracy:.0%} "
                    "and more often than the nearest preceding opening bracket",
                    s["nested_pairs"] > 0 and acc >= nested_accuracy and acc > base,
                    f"{acc:.2f} vs {base:.2f} ({s['nested_pairs']} pairs)")]
    judged = []
    for name, b in s["by_distance"].items():
        if b["controlled_pairs"] >= min_pairs and b["weight_control"] is not None:
            judged.append((name, b["weight_match"] / max(b["weight_control"], 1e-12)))
    worst = min(judged, key=lambda t: t[1]) if judged else ("-", 0.0)
    checks.append(Check(f"weight on the match >= {ratio} x the weight on non-matching opening brackets at the same "
                        f"distance, in every distance bin with >= {min_pairs} pairs (at least two bins)",
                        len(judged) >= 2 and worst[1] >= ratio,
                        f"{len(judged)} bins, lowest ratio {worst[1]:.1f} at {worst[0]} tokens"))
    return checks


def judge_def_use(s: dict, ratio: float, beats: float, min_pairs: int) -> list[Check]:
    """Enough pairs; def weight >= ``ratio`` x same-distance control; share of pairs beating it >= ``beats``."""
    w, c, n = s["defuse_weight"], s["defuse_control"], s["defuse_pairs"]
    return [Check(f"at least {min_pairs} definition -> use pairs", n >= min_pairs, str(n)),
            Check(f"mean weight on the definition >= {ratio} x the same head's weight at the same distance",
                  n > 0 and w >= ratio * c, f"{w:.3f} vs {c:.3f}"),
            Check(f"the definition gets more than the control in >= {beats:.0%} of pairs",
                  n > 0 and s["defuse_beats_control"] >= beats, f"{s['defuse_beats_control']:.0%}")]


def best_head(stats: dict, score) -> tuple[int, int]:
    """(layer, head) maximising ``score(head_summary)`` over every head."""
    n_layers, n_heads = stats["shape"]
    return max(((l, h) for l in range(n_layers) for h in range(n_heads)),
               key=lambda lh: score(head_summary(stats, *lh)))


def _bracket_score(s: dict) -> float:
    return s["bracket_accuracy"]


def _defuse_score(s: dict) -> float:
    return s["defuse_weight"] - s["defuse_control"]


def bracket_verdict(stats: dict, cfg: CodeClaimConfig) -> tuple[int, int, dict, list[Check]]:
    """The bracket head chosen on ``stats["select"]``, summarised and judged on ``stats["test"]``:
    (layer, head, head_summary, checks)."""
    layer, head = best_head(stats["select"], _bracket_score)
    s = head_summary(stats["test"], layer, head)
    return layer, head, s, judge_brackets(s, cfg.nested_accuracy, cfg.weight_ratio, cfg.min_bin_pairs)


def defuse_verdict(stats: dict, cfg: CodeClaimConfig) -> tuple[int, int, dict, list[Check]]:
    """The def → use head chosen on ``stats["select"]``, judged on ``stats["test"]`` (as ``bracket_verdict``)."""
    layer, head = best_head(stats["select"], _defuse_score)
    s = head_summary(stats["test"], layer, head)
    return layer, head, s, judge_def_use(s, cfg.defuse_ratio, cfg.defuse_beats, cfg.min_defuse_pairs)


# ------------------------------------------------------------------------------------------- claims
def _syntax_plot(rates: dict, n: int, cfg: CodeClaimConfig) -> bytes:
    fig, ax = new_figure(1, width=5.0)
    names = ["gpt", "lstm", "bigram"]
    vals = [rates[k] for k in names]
    err = [1.96 * math.sqrt(max(v * (1 - v), 1e-12) / n) for v in vals]
    ax.bar(["GPT (attention)", "LSTM (same size,\nsame CPU time)", "bigram"], vals, yerr=err, capsize=4,
           color=["tab:blue", "tab:orange", "tab:grey"])
    ax.axhline(cfg.min_syntax_rate, ls="--", c="k", lw=1, label=f"GPT must reach {cfg.min_syntax_rate}")
    ax.set(ylim=(0, 1), ylabel="share of bodies ast.parse accepts",
           title=f"{n} held-out functions:\ndef line + docstring -> sampled body")
    ax.legend(fontsize=8)
    return png_bytes(fig)


def claim_code_syntax(ctx: VerifyContext) -> Claim:
    """A code GPT completes held-out functions with valid syntax more often than an LSTM or a bigram model."""
    cfg = _config(ctx)
    m = _models(ctx, cfg)
    prompts = syntax_prompts(m.data, cfg, m.gpt.cfg.max_len)
    samples, rates, finished = {}, {}, {}
    for name, model in (("gpt", m.gpt), ("lstm", m.lstm), ("bigram", m.bigram)):
        samples[name] = sample_bodies(model, m.data, prompts, cfg, ctx.seed)
        rates[name] = float(np.mean([s["ok"] for s in samples[name]])) if prompts else 0.0
        finished[name] = float(np.mean([s["finished"] for s in samples[name]])) if prompts else 0.0
    n = len(prompts)
    checks = judge_syntax(rates, n, cfg.min_syntax_rate)
    example = next((s for s in samples["gpt"] if s["ok"]), samples["gpt"][0] if n else {"name": "", "body": ""})
    return Claim(
        "code-syntax", "Code completion: valid syntax, GPT vs LSTM vs bigram",
        statement="Attending to all of the code context, a model generates syntactically correct completions.",
        criterion=f"{n} held-out functions, each prompt its def line and docstring, one body sampled per model "
                  f"(temperature {cfg.temperature}, top-k {cfg.top_k}, at most {cfg.max_new_tokens} tokens, cut "
                  "where the function ends), accepted when ast.parse takes prompt + body with a statement after "
                  "the docstring",
        checks=checks,
        measurement={"syntax_rate": rates, "finished_rate": finished, "prompts": n,
                     "models": m.provenance, "example": {"function": example["name"], "body": example["body"][:400]},
                     "sampling": {"temperature": cfg.temperature, "top_k": cfg.top_k,
                                  "max_new_tokens": cfg.max_new_tokens}},
        summary=f"syntax rate: GPT {rates['gpt']:.2f}, LSTM {rates['lstm']:.2f}, bigram {rates['bigram']:.2f} "
                f"({n} held-out functions)",
        figure=_syntax_plot(rates, n, cfg),
        notes=f"Models: {_provenance(m)}. 'The same time' is CPU time on {cfg.train.threads} thread(s) (all "
              "counted), so the machine's load does not decide who gets more steps; the LSTM's step is cheaper "
              "on a CPU than the GPT's, so it takes more steps. The bigram is counted from the training tokens. "
              "A body cut by the token limit before the function ended is judged on its complete lines "
              "('finished_rate' says how many ended on their own).")


def _bracket_plot(s: dict, layer: int, head: int) -> bytes:
    fig, (a1, a2) = new_figure(2, width=10.0)
    bins = list(s["by_distance"])
    b = s["by_distance"]
    x = np.arange(len(bins))
    a1.plot(x, [b[k]["head_accuracy"] for k in bins], marker="o", label=f"head L{layer}H{head}: all pairs")
    nested = [b[k]["head_accuracy_nested"] for k in bins]
    a1.plot(x, [np.nan if v is None else v for v in nested], marker="s", label="head: nested pairs")
    a1.plot(x, [b[k]["nearest_open_accuracy"] for k in bins], ls="--", c="grey",
            label="nearest preceding opening bracket")
    a1.set(xticks=x, xticklabels=bins, ylim=(0, 1.03), xlabel="tokens between the brackets",
           ylabel="strongest attention on the match", title="closing bracket -> its opening bracket")
    a1.legend(fontsize=8)
    wm = [np.nan if b[k]["weight_match"] is None else b[k]["weight_match"] for k in bins]
    wc = [np.nan if b[k]["weight_control"] is None else b[k]["weight_control"] for k in bins]
    a2.bar(x - 0.2, wm, width=0.4, label="matching opening bracket")
    a2.bar(x + 0.2, wc, width=0.4, label="non-matching opening bracket, same distance")
    a2.set(xticks=x, xticklabels=bins, xlabel="tokens between the brackets", ylabel="mean attention weight",
           title=f"layer {layer} head {head}: weight on opening brackets")
    a2.legend(fontsize=8)
    return png_bytes(fig)


def claim_code_brackets(ctx: VerifyContext) -> Claim:
    """A head of the code GPT matches closing brackets to their opening brackets, nested ones included."""
    cfg = _config(ctx)
    m = _models(ctx, cfg)
    st = _stats(ctx, cfg, m)
    layer, head, s, checks = bracket_verdict(st, cfg)
    return Claim(
        "code-brackets", "Code: a bracket-matching head, by distance and nesting",
        statement="Self-attention learns the matching of opening and closing brackets.",
        criterion=f"the head with the best bracket accuracy on the 'select' half of the held-out files, measured "
                  f"on the 'test' half ({st['test']['windows']} windows of {m.gpt.cfg.max_len} tokens)",
        checks=checks,
        measurement={"layer": layer, "head": head, **{k: v for k, v in s.items() if k not in ("layer", "head")},
                     "models": m.provenance},
        summary=f"L{layer}H{head}: bracket accuracy {s['bracket_accuracy']:.2f} ({s['bracket_pairs']} pairs), nested "
                f"{s['bracket_accuracy_nested']:.2f} vs nearest-opening {s['nearest_open_accuracy_nested']:.2f}",
        figure=_bracket_plot(s, layer, head),
        notes=f"GPT: {_provenance(m)}. Pairs come from Python's tokenize (brackets in strings and comments are "
              "not code); a pair whose bracket shares its BPE token with another bracket is left out. The nearest "
              "preceding opening bracket is right exactly when nothing is nested inside the pair, so on nested "
              "pairs it scores 0 by construction: beating it there needs a head that tracks depth. The query is "
              "the closing bracket's own token (what it attends to once it is read).")


def _defuse_plot(s: dict, layer: int, head: int) -> bytes:
    fig, ax = new_figure(1, width=5.2)
    ax.bar([0, 1], [s["defuse_weight"], s["defuse_control"]], color=["tab:blue", "tab:grey"])
    ax.set(xticks=[0, 1], xticklabels=["use -> its definition", "same distance,\nother positions"],
           ylabel="mean attention weight",
           title=f"layer {layer} head {head}: {s['defuse_pairs']} pairs, mean {s['defuse_mean_distance']:.0f} tokens")
    return png_bytes(fig)


def claim_code_def_use(ctx: VerifyContext) -> Claim:
    """A head of the code GPT links a name's use to its definition many lines back."""
    cfg = _config(ctx)
    m = _models(ctx, cfg)
    st = _stats(ctx, cfg, m)
    layer, head, s, checks = defuse_verdict(st, cfg)
    keys = ("defuse_pairs", "defuse_weight", "defuse_control", "defuse_beats_control", "defuse_argmax_on_def",
            "defuse_mean_distance")
    return Claim(
        "code-def-use", "Code: definition -> use attention across lines",
        statement="Self-attention connects a function definition (or assignment) with its use many lines later.",
        criterion="pairs: a name bound by def/class/assignment and a use >= 5 lines later with no other occurrence "
                  "of the name in between; the head with the largest (def weight - control) on the 'select' "
                  "half, measured on the 'test' half",
        checks=checks,
        measurement={"layer": layer, "head": head, **{k: s[k] for k in keys},
                     "models": m.provenance},
        summary=f"L{layer}H{head}: weight on the definition {s['defuse_weight']:.3f} vs {s['defuse_control']:.3f} at "
                f"the same distance ({s['defuse_pairs']} pairs, beats it in {s['defuse_beats_control']:.0%})",
        figure=_defuse_plot(s, layer, head),
        notes=f"GPT: {_provenance(m)}. The query is the use's last token; the weight is its total on the "
              "definition's tokens; the control is the head's mean total weight on the same offsets from every "
              "other position of the window (what a purely positional head would give).")


def _scope_plot(s: dict, c: dict, layer: int, head: int) -> bytes:
    fig, ax = new_figure(1, width=5.6)
    x = np.arange(2)
    ax.bar(x - 0.2, [s["w_in"], c["w_in"]], width=0.4, color="tab:blue", label="b_in: the binding the use reads")
    ax.bar(x + 0.2, [s["w_out"], c["w_out"]], width=0.4, color="tab:grey", label="b_out: same name, other scope")
    ax.set(xticks=x, xticklabels=["held-out code", "both bindings' names\nscrambled (control)"],
           ylabel="mean attention weight from the use",
           title=f"layer {layer} head {head}: {s['pairs']} uses (test half)")
    ax.legend(fontsize=8)
    return png_bytes(fig)


def claim_code_scope(ctx: VerifyContext) -> Claim:
    """A head of the code GPT reads a name's use against the binding in its own scope."""
    cfg = _config(ctx)
    m = _models(ctx, cfg)
    st = _stats(ctx, cfg, m, held_out_scope_stats)
    layer, head, s, c, checks = scope_verdict(st, cfg)
    test = st["test"]
    n = test["windows"]
    nearest = float(np.mean(test["in_is_nearest"])) if n else 0.0
    nearer = int(np.sum(test["out_nearer"]))
    names, counts = np.unique(test["name"], return_counts=True) if n else (np.array([]), np.array([]))
    common = {str(k): int(v) for k, v in sorted(zip(names, counts), key=lambda t: -t[1])[:5]}
    return Claim(
        "code-scope", "Code: a use attends to the binding in its own scope",
        statement="Self-attention follows variable scope: a name's use attends to the binding it reads, not to the "
                  "same name bound in a scope it cannot see.",
        criterion=f"pairs: a use of a name in a held-out file, b_in = the latest earlier binding in the scope "
                  f"Python's rules say it reads, b_out = the latest earlier binding of the name in a scope it "
                  f"cannot see; query = the use's last token, window = the {m.gpt.cfg.max_len} tokens ending there, "
                  "both bindings inside; w = the head's total weight on a binding's tokens; control = the same "
                  "windows with both bindings' tokens replaced by random identifier tokens; the head with the "
                  "largest share of w_in > w_out on the 'select' half (ties: larger ratio), judged on the 'test' "
                  f"half ({n} uses)",
        checks=checks,
        measurement={"layer": layer, "head": head, "head_summary": s, "control_summary": c,
                     "in_is_nearest": nearest, "out_nearer": nearer,
                     "mean_distance_in": float(np.mean(test["d_in"])) if n else None,
                     "mean_distance_out": float(np.mean(test["d_out"])) if n else None,
                     "most_common_names": common, "select_pairs": st["select"]["windows"], "models": m.provenance},
        summary=f"L{layer}H{head}: w_in > w_out in {s['in_beats_out']:.0%} of {n} uses, {s['w_in']:.3f} vs "
                f"{s['w_out']:.3f}; names scrambled: {c['in_beats_out']:.0%}, {c['w_in']:.3f} vs {c['w_out']:.3f}",
        figure=_scope_plot(s, c, layer, head),
        notes=f"GPT: {_provenance(m)}. In the judged pairs the nearest preceding same-named token (any occurrence, "
              f"by tokenize) is b_in itself in {nearest:.0%} of uses, and b_out lies nearer to the use than b_in in "
              f"{nearer} of {n}: on held-out stdlib code the nearer binding is almost never the out-of-scope one, so "
              "the claim separates the binding the use reads from the same name bound in another scope, mostly "
              "not from recency (a head attending to the name's latest binding passes it). Scopes are resolved "
              "from the syntax tree (class bodies are not visible from methods; global / nonlocal honoured); the "
              "query is the use's last token.")


CLAIMS = [claim_code_syntax, claim_code_brackets, claim_code_def_use, claim_code_scope]
