"""``attnlab verify``: run the experiments that check the theory's claims; print a table, write the report.

    attnlab verify --quick                                # every claim at small sizes (< 3 min on 2 cores)
    attnlab verify                                        # full sizes (< 30 min)
    attnlab verify --only sqrt-dk-scaling causal-gradient --out runs/v
    attnlab verify --list                                 # the claim ids, without running anything

Progress goes to stderr, the pass/fail table and the report's path to stdout. Exit status: 0 when
every claim passes, 1 when any fails (or raised), 2 on bad usage (an unknown claim id).
"""
from __future__ import annotations

import argparse
import shutil

from .util import fail

__all__ = ["add_verify", "format_table"]

DEFAULT_OUT = "runs/verify"


def format_table(claims, width: int = 100) -> str:
    """One line per claim: PASS/FAIL/ERROR, id, seconds, the headline measurement (cut to ``width``)."""
    from ..lab.report import summary_text
    w = max([len(c.id) for c in claims] + [5])
    lines = []
    for c in claims:
        verdict = "PASS" if c.passed else ("ERROR" if c.error else "FAIL")
        line = f"{verdict:<5}  {c.id:<{w}}  {c.seconds:6.1f} s  {summary_text(c)}"
        lines.append(line if len(line) <= width else line[: width - 3] + "...")
    return "\n".join(lines)


def _run_verify(args: argparse.Namespace) -> int:
    from ..lab.verify import UnknownClaimError, collect, run_verify, select
    if args.list:
        try:
            entries = select(collect(), args.only)
        except UnknownClaimError as e:
            return fail(str(e))
        for e in entries:
            doc = (e.fn.__doc__ or "").strip().split("\n")[0]
            print(f"{e.id:<32} {e.module:<16} {doc}")
        return 0
    try:
        result = run_verify(quick=args.quick, only=args.only, out=args.out, seed=args.seed,
                            argv=getattr(args, "argv", None))
    except UnknownClaimError as e:
        return fail(str(e))
    claims = result.claims
    if not claims:
        return fail("no experiments were found (are the attnlab.lab.exp_* modules installed?)")
    print(format_table(claims, max(80, shutil.get_terminal_size((120, 20)).columns)))
    n_pass = sum(c.passed for c in claims)
    print(f"{n_pass} of {len(claims)} claims pass ({result.seconds:.0f} s); report: {result.paths['html']}")
    return 0 if result.all_passed else 1


def add_verify(sub) -> None:
    """Add the ``verify`` subcommand to an argparse subparsers object (``attnlab.cli``)."""
    p = sub.add_parser(
        "verify", help="run the experiments that check each claim of the theory; HTML + JSON report",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Each claim of the theory (order-blindness without PE, the sinusoid, sqrt(d_k), O(n^2), causal\n"
                    "masking, multi-head cost, parallelism, long range, what a pretrained model attends to) is\n"
                    "measured, judged against a criterion stated in advance, and written to a self-contained\n"
                    "HTML report (figures inline, no network) plus JSON and PNG files.",
        epilog="exit status: 0 when every claim passes, 1 when any fails or raises, 2 on bad usage\n"
               "(e.g. an unknown claim id). `attnlab verify --list` shows the ids.")
    p.add_argument("--quick", action="store_true", help="small sizes: every claim in under 3 minutes on 2 CPU cores")
    p.add_argument("--only", nargs="+", metavar="ID",
                   help="run only these claims (ids from --list, or module names such as exp_basics)")
    p.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                   help=f"where report.html, report.json and the PNGs go (default {DEFAULT_OUT})")
    p.add_argument("--seed", type=int, default=0, help="seed of every experiment's randomness (default 0)")
    p.add_argument("--list", action="store_true", help="list the claim ids and exit, running nothing")
    p.set_defaults(run=_run_verify)
