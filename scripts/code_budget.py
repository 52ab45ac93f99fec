"""The code claims against training length: a GPT and an LSTM at a decided CPU budget, judged along the way.

Two ways to train, both with ``CODE_FULL``'s data, tokenizer, batch and learning rates on 2 threads:

- ``--cpu-budget S`` (issue #30's decided budget, docs/results.md): the GPT **and** its LSTM, each
  calibrated to S CPU-seconds of training steps (``code_train.calibrate``, as every full claim),
  one after the other, with ``--checkpoints`` evenly spaced checkpoints each. Every GPT checkpoint
  is judged by the attention claims (brackets, def → use, variable scope: heads chosen on the
  select half, judged on the test half) and both models' syntax rates on the claim's prompts; the
  syntax claim (GPT against the LSTM and the bigram) is judged at each pair of checkpoints. The
  verdicts are the last checkpoints' (the learning rate decays over the whole run).
- ``--steps N``: the GPT alone for exactly N steps (the earlier study of the claims against training
  length; the syntax claim's comparison is then not judged).

Usage (issue #30's run: about 50 minutes of the idle 2-core machine per model, then ~4 minutes of
judging per checkpoint)::

    .venv/bin/python scripts/code_budget.py --cpu-budget 4320 --checkpoints 4 --out runs/code-budget-30
    .venv/bin/python scripts/code_budget.py --judge-only --out runs/code-budget-30          # judge again

Prints one JSON line per checkpoint and writes everything (runs, checkpoints, verdict) to
OUT/judged.json. The machine it ran on is recorded there too.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from attnlab.measure.machine import machine_info
from attnlab.lab.code_scope import held_out_scope_stats, scope_verdict
from attnlab.lab.code_train import finished_record, train_code_model
from attnlab.lab.exp_code import (CODE_FULL, bracket_verdict, defuse_verdict, held_out_stats, judge_syntax,
                                  sample_bodies, syntax_prompts)
from attnlab.measure.threads import threads
from attnlab.tasks import load_model
from attnlab.tasks.code import CODE_PRESETS, prepare_code_data
from attnlab.tasks.code_models import BigramLM
from attnlab.train.metrics import read_records


def _checks(checks) -> dict:
    return {"passed": all(c.passed for c in checks),
            "checks": [{"label": c.label, "passed": c.passed, "measured": c.measured} for c in checks]}


def syntax_rate(model, data, prompts, cfg, seed: int = 0):
    """Share of the prompts whose sampled body parses (None without prompts)."""
    ok = [s["ok"] for s in sample_bodies(model, data, prompts, cfg, seed)]
    return float(np.mean(ok)) if ok else None


def judge_checkpoint(path: Path, data, cfg=CODE_FULL, seed: int = 0, prompts=None) -> dict:
    """One GPT checkpoint judged as the attention claims judge, with its syntax rate on ``prompts`` (default: the
    syntax claim's, ``syntax_prompts``) (module docstring)."""
    gpt, _ = load_model(path)
    stats = held_out_stats(gpt, data, cfg)
    row = {"checkpoint": path.name}
    for name, verdict in (("brackets", bracket_verdict), ("def_use", defuse_verdict)):
        layer, head, _, checks = verdict(stats, cfg)
        row[name] = {"head": f"L{layer}H{head}", **_checks(checks)}
    layer, head, s, s_ctrl, checks = scope_verdict(held_out_scope_stats(gpt, data, cfg), cfg)
    row["scope"] = {"head": f"L{layer}H{head}", "summary": s, "control": s_ctrl, **_checks(checks)}
    prompts = syntax_prompts(data, cfg, gpt.cfg.max_len) if prompts is None else prompts
    row["gpt_syntax_rate"] = syntax_rate(gpt, data, prompts, cfg, seed)
    row["prompts"] = len(prompts)
    return row


def judge_syntax_pair(gpt_row: dict, lstm_path: Path, data, prompts: list, bigram_rate: float, cfg=CODE_FULL,
                      seed: int = 0) -> dict:
    """The syntax claim at one pair of checkpoints: the LSTM's rate on the GPT's ``prompts``, against the GPT's
    and the bigram's (the bigram is the same at every checkpoint, so its rate is measured once)."""
    lstm, _ = load_model(lstm_path)
    rates = {"gpt": gpt_row["gpt_syntax_rate"] or 0.0, "lstm": syntax_rate(lstm, data, prompts, cfg, seed) or 0.0,
             "bigram": bigram_rate}
    return {"lstm_checkpoint": lstm_path.name, "rates": rates,
            **_checks(judge_syntax(rates, len(prompts), cfg.min_syntax_rate))}


def _val_losses(run: Path) -> dict:
    return {r["step"]: r["val_loss"] for r in read_records(run / "metrics.jsonl") if "val_loss" in r}


def judge_runs(out: Path, data, cfg=CODE_FULL) -> dict:
    """Judge every checkpoint in OUT/gpt (and, where there is OUT/lstm, the syntax claim at each pair)."""
    gpt_dir, lstm_dir = out / "gpt", out / "lstm"
    gpts, lstms = sorted(gpt_dir.glob("step-*")), sorted(lstm_dir.glob("step-*"))
    if lstms and len(lstms) != len(gpts):
        raise ValueError(f"{len(gpts)} GPT checkpoints but {len(lstms)} LSTM checkpoints in {out}: "
                         "the syntax claim pairs them by position")
    prompts = syntax_prompts(data, cfg, CODE_PRESETS[cfg.train.preset]["max_len"])      # the GPT's context
    gpt_val, lstm_val = _val_losses(gpt_dir), (_val_losses(lstm_dir) if lstms else {})
    rows = []
    with threads(cfg.train.threads):
        if lstms:
            bigram = BigramLM.from_ids(data.train_ids, data.tokenizer.vocab_size)
            bigram_rate = syntax_rate(bigram, data, prompts, cfg) or 0.0
        for k, path in enumerate(gpts):
            step = int(path.name.split("-")[1])
            row = {"fraction": f"{k + 1}/{len(gpts)}", "step": step, "val_loss": gpt_val.get(step),
                   **judge_checkpoint(path, data, cfg, prompts=prompts)}
            if lstms:
                lstm_step = int(lstms[k].name.split("-")[1])
                row["syntax"] = {"lstm_step": lstm_step, "lstm_val_loss": lstm_val.get(lstm_step),
                                 **judge_syntax_pair(row, lstms[k], data, prompts, bigram_rate, cfg)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    last = rows[-1] if rows else {}
    verdict = {k: last[k]["passed"] for k in ("brackets", "def_use", "scope", "syntax") if k in last}
    return {"runs": {"gpt": finished_record(gpt_dir), "lstm": finished_record(lstm_dir)}, "checkpoints": rows,
            "verdict": verdict,
            "machine": {**machine_info(), "command": " ".join(["python", "scripts/code_budget.py", *sys.argv[1:]])}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    how = p.add_mutually_exclusive_group()
    how.add_argument("--cpu-budget", type=float, metavar="S",
                     help="train the GPT and the LSTM, each calibrated to S CPU-seconds (issue #30: 4320)")
    how.add_argument("--steps", type=int, help="train the GPT alone for exactly this many steps")
    how.add_argument("--judge-only", action="store_true", help="judge the checkpoints already in --out")
    p.add_argument("--checkpoints", type=int, default=3, help="evenly spaced checkpoints per model (default 3)")
    p.add_argument("--out", type=Path, default=Path("runs/code-budget"),
                   help="run directory (its gpt/ and lstm/ are replaced when training)")
    args = p.parse_args(argv)
    if args.cpu_budget is None and args.steps is None and not args.judge_only:
        p.error("give --cpu-budget or --steps to train, or --judge-only to judge the checkpoints already in --out")
    if args.checkpoints < 1 or (args.steps is not None and args.steps < args.checkpoints):
        p.error(f"--steps ({args.steps}) must be >= --checkpoints ({args.checkpoints}) >= 1")
    if args.cpu_budget is not None and not args.cpu_budget > 0:
        p.error(f"--cpu-budget must be > 0 CPU-seconds, got {args.cpu_budget}")
    if args.judge_only and not any((args.out / "gpt").glob("step-*")):
        p.error(f"--judge-only: no checkpoints in {args.out / 'gpt'}")
    train_cfg = CODE_FULL.train if args.cpu_budget is None else replace(CODE_FULL.train, cpu_budget_s=args.cpu_budget)
    data = prepare_code_data(train_cfg.max_bytes, train_cfg.vocab_size)
    archs = ("gpt", "lstm") if args.cpu_budget is not None else ("gpt",) if args.steps is not None else ()
    if args.steps is not None and (args.out / "lstm").exists():
        shutil.rmtree(args.out / "lstm")                      # a GPT-only run: no LSTM of another run to pair
    for arch in archs:
        record = train_code_model(arch, train_cfg, args.out / arch, data, steps=args.steps,
                                  checkpoints=args.checkpoints)
        print(json.dumps({"arch": arch, **{k: record[k] for k in ("steps", "cpu_s", "wall_s", "val_loss")}}),
              flush=True)
    judged = judge_runs(args.out, data, replace(CODE_FULL, train=train_cfg))
    (args.out / "judged.json").write_text(json.dumps(judged, indent=1))
    print(json.dumps({"verdict": judged["verdict"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
