"""Claims too long for ``attnlab verify``: their last recorded result, shown in the report, not counted.

The code model's claims need about 50 minutes of the machine per model at the decided budget, the
contacts claim 24 minutes of training: more than ``verify`` (or CI) can spend. They are run by
their scripts, once, on an idle machine, and what they gave is recorded here by hand, with the
date, the machine and the command, next to the figures in docs/results.md. The verify report lists
these records under "Long experiments" so that a reader sees every claim of the theory and where
each stands, and never mistakes a recorded result for one measured in this run.

Example::

    passed = {r.claim: r.passed for r in LONG_EXPERIMENTS}       # {"msa-contacts": True, "code-scope": None, ...}
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["LongResult", "LONG_EXPERIMENTS"]


@dataclass(frozen=True)
class LongResult:
    claim: str                     # the claim's id, as its experiment module names it
    title: str
    passed: Optional[bool]         # the recorded verdict (None: not run yet at the recorded budget)
    result: str                    # the figures the verdict rests on, in one or two sentences
    date: str                      # when it ran (ISO date)
    machine: str                   # the CPU, as `lscpu` names it, and the threads
    command: str                   # what reproduces it
    where: str = "docs/results.md"  # the section with the full figures


_RUN4 = ".venv/bin/python -c \"from attnlab.lab.verify import run_verify, MODULES; " \
        "run_verify(only=['exp_code'], modules=MODULES + ['exp_code'], out='runs/verify-2core')\""

LONG_EXPERIMENTS: list[LongResult] = [
    LongResult("code-syntax", "Code completion: valid syntax, GPT vs LSTM vs bigram", False,
               "at the earlier budget (1,080 CPU-s per model, run 4): GPT 0.27, LSTM 0.22, bigram 0.05 on 60 "
               "held-out functions: GPT >= 0.25 passes, GPT - LSTM +0.05 is under two standard errors "
               "(0.16)", "2026-12-02",
               "not recorded (by date the AMD Zen 4), 2 threads", _RUN4, "docs/results.md, 'The code model'"),
    LongResult("code-brackets", "Code: a bracket-matching head, by distance and nesting", False,
               "at the earlier budget (run 4): head L0H2: nested accuracy 0.03 vs 0.00 for the nearest opening "
               "bracket (50% asked); lowest match/control ratio 1.1 at 1-2 tokens (2 asked)", "2026-12-02",
               "not recorded (by date the AMD Zen 4), 2 threads", _RUN4, "docs/results.md, 'The code model'"),
    LongResult("code-def-use", "Code: definition -> use attention across lines", False,
               "at the earlier budget (run 4): head L1H0: weight 0.052 vs 0.017 at the same distance (3.04x, 3x "
               "asked), beats its control in 46% of 35 pairs (75% asked)", "2026-12-02",
               "not recorded (by date the AMD Zen 4), 2 threads", _RUN4, "docs/results.md, 'The code model'"),
    LongResult("code-scope", "Code: a use attends to the binding in its own scope", None,
               "not run yet: it is judged on the code claims' models at the decided budget (4,320 CPU-s per "
               "model), with its criterion written in docs/results.md before that run", "2026-12-03",
               "-", ".venv/bin/python scripts/code_budget.py --cpu-budget 4320 --checkpoints 4 --out "
               "runs/code-budget-30", "docs/results.md, 'Issue #30: the criteria'"),
    LongResult("msa-contacts", "Evoformer case: contacts read from row attention", True,
               "precision of the top L/5 long-range pairs on 20 held-out families: row attention 1.00 (38x the "
               "base rate 0.026), the model without row attention 0.08 (12.9x less); DCA 0.99 (shown)", "2026-12-03",
               "Intel(R) Xeon(R) Processor (AMX), 2 threads", ".venv/bin/python scripts/msa_contacts.py --out "
               "runs/msa-contacts", "docs/results.md, 'Issue #30: contacts read from row attention'"),
]
