"""The code claims against training length: is it compute?

Trains the full code claim's GPT (``CODE_FULL``: preset ``code``, the same data, tokenizer, batch
and learning rates, 2 threads) for a fixed number of steps with evenly spaced checkpoints, and
judges each checkpoint with the claims' own code: the bracket and def → use heads chosen on the
select half of the held-out files and judged on the test half (``bracket_verdict``,
``defuse_verdict``), and the GPT's syntax rate on the claim's prompts. The LSTM is not trained: the
attention claims do not involve it, and the syntax claim's comparison needs it at the same CPU
time, so only the GPT's rate is reported. The learning rate decays over the whole run, so only the
last checkpoint is a finished run; the earlier ones show the trend.

The full claim gave the GPT 4,320 steps (run 4, docs/results.md). Usage (about 0.16-0.19 s a step
on the idle 2-core machine, then ~3.5 minutes of measuring per checkpoint)::

    .venv/bin/python scripts/code_budget.py --steps 17280 --checkpoints 2 --out runs/code-budget-4x
    .venv/bin/python scripts/code_budget.py --judge-only --out runs/code-budget-4x      # judge again

Prints one JSON line per checkpoint (step, held-out loss in nats/token, the checks) and writes them to
OUT/judged.json.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from attnlab.lab.code_train import train_code_model
from attnlab.lab.exp_code import (CODE_FULL, bracket_verdict, defuse_verdict, held_out_stats, sample_bodies,
                                  syntax_prompts)
from attnlab.lab.exp_sequential import threads
from attnlab.tasks import load_model
from attnlab.tasks.code import prepare_code_data
from attnlab.train.metrics import read_records


def judge_checkpoint(path: Path, data, cfg=CODE_FULL, seed: int = 0) -> dict:
    """One checkpoint judged as the claims judge (see the module docstring)."""
    gpt, _ = load_model(path)
    stats = held_out_stats(gpt, data, cfg)
    row = {"checkpoint": path.name}
    for name, verdict in (("brackets", bracket_verdict), ("def_use", defuse_verdict)):
        layer, head, _, checks = verdict(stats, cfg)
        row[name] = {"head": f"L{layer}H{head}", "passed": all(c.passed for c in checks),
                     "checks": [{"label": c.label, "passed": c.passed, "measured": c.measured} for c in checks]}
    prompts = syntax_prompts(data, cfg, gpt.cfg.max_len)
    ok = [s["ok"] for s in sample_bodies(gpt, data, prompts, cfg, seed)]
    row["gpt_syntax_rate"] = float(np.mean(ok)) if ok else None
    row["prompts"] = len(prompts)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, help="training steps of the GPT (the full claim: ~4,320); not with --judge-only")
    p.add_argument("--checkpoints", type=int, default=3, help="evenly spaced checkpoints to judge (default 3)")
    p.add_argument("--out", type=Path, default=Path("runs/code-budget"), help="run directory (its gpt/ is replaced)")
    p.add_argument("--judge-only", action="store_true", help="judge the checkpoints already in --out")
    args = p.parse_args(argv)
    if args.judge_only != (args.steps is None):
        p.error("give --steps to train, or --judge-only to judge the checkpoints already in --out")
    if not args.judge_only and (args.steps < args.checkpoints or args.checkpoints < 1):
        p.error(f"--steps ({args.steps}) must be >= --checkpoints ({args.checkpoints}) >= 1")
    gpt_dir = args.out / "gpt"
    if args.judge_only and not any(gpt_dir.glob("step-*")):
        p.error(f"--judge-only: no checkpoints in {gpt_dir}")
    cfg = CODE_FULL.train
    data = prepare_code_data(cfg.max_bytes, cfg.vocab_size)
    if not args.judge_only:
        record = train_code_model("gpt", cfg, gpt_dir, data, steps=args.steps, checkpoints=args.checkpoints)
        print(json.dumps({k: record[k] for k in ("steps", "cpu_s", "wall_s", "val_loss")}), flush=True)
    val = {r["step"]: r["val_loss"] for r in read_records(gpt_dir / "metrics.jsonl") if "val_loss" in r}
    rows = []
    with threads(cfg.threads):
        for path in sorted(gpt_dir.glob("step-*")):
            step = int(path.name.split("-")[1])
            rows.append({"step": step, "val_loss": val.get(step), **judge_checkpoint(path, data)})
            print(json.dumps(rows[-1]), flush=True)
    (args.out / "judged.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
