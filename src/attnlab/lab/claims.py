"""A claim of the theory, checked by an experiment: what was measured, the criterion, pass/fail.

Every experiment of ``attnlab verify`` is a function ``(ctx: VerifyContext) -> Claim``. The report
writer turns a list of claims into a self-contained HTML page and a JSON file.

Each ``lab/exp_*.py`` module lists its experiments in ``CLAIMS``. The runner selects them by id
(``attnlab verify --only ID``) before running them, so an experiment's id must be knowable from the
function: name it ``claim_<id with underscores>`` (``claim_causal_gradient`` -> "causal-gradient"),
or set ``fn.claim_id = "..."``; the Claim it returns carries the same id. Figures are PNG bytes
(``attnlab.lab.report.png_bytes(fig)``).

Example::

    def claim_causal_no_future_gradient(ctx: VerifyContext) -> Claim:
        grad = ...                                         # measure
        return Claim("causal-gradient", "Causal masking blocks the future",
                     statement="no gradient flows from future tokens to earlier outputs",
                     criterion="max |d out_i / d x_j| for j > i is exactly 0",
                     passed=bool(grad == 0), measurement={"max_future_grad": float(grad)})
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

__all__ = ["Claim", "VerifyContext"]


@dataclass
class VerifyContext:
    quick: bool                    # --quick: smaller sizes, fewer repeats (whole run < 3 minutes)
    workdir: Path                  # scratch space for checkpoints or intermediate files
    seed: int = 0


@dataclass
class Claim:
    id: str                        # short, stable, kebab-case: "permutation-equivariance"
    title: str                     # one line for the report's heading
    statement: str                 # the claim of the theory, in a sentence
    criterion: str                 # the pass criterion, stated before measuring
    passed: bool
    measurement: dict[str, Any] = field(default_factory=dict)   # JSON-ready numbers/lists/strings
    figure: Optional[bytes] = None  # a PNG (inlined as base64 in the HTML; written beside the JSON)
    notes: str = ""                # honest remarks: caveats, why the machine behaves as it does
    seconds: float = 0.0           # how long the experiment took (set by the runner)
    error: Optional[str] = None    # set by the runner when the experiment raised (then passed=False)
    summary: str = ""              # the headline measurement in one line, for the report's table
                                   # ("" = the report shows the measurement's scalar entries)
