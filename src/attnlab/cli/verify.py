"""``attnlab verify``: run the experiments that check the theory's claims; print a table, write the report.

    attnlab verify --quick                                # every claim at small sizes (< 3 min on 2 cores)
    attnlab verify                                        # full sizes (< 30 min)
    attnlab verify --only sqrt-dk-scaling causal-gradient --out runs/v
    attnlab verify --list                                 # the ids and their kinds, without running anything

Progress goes to stderr; the tables (counted claims, then the refuted claims with the checks they fail,
then the accounting entries) and the report's path go to stdout. Exit status: 0 when the run is as
recorded (every counted claim passes and every refuted claim fails without an error), 1 otherwise (a
claim failed or raised, or a refuted claim now passes or raised: the stderr line says which), 2 on bad
usage (an unknown claim id).
"""
from __future__ import annotations

import argparse
import shutil
import textwrap

from .util import fail, fail_run, writable_dir

__all__ = ["add_verify", "format_table", "format_result", "verdict_line"]

DEFAULT_OUT = "runs/verify"


def _verdict(c) -> str:
    if c.error:
        return "ERROR"
    if c.kind == "accounting":
        return "COUNT"                       # shown, not judged (lab/claims.py KINDS)
    return "PASS" if c.passed else "FAIL"


def _cut(line: str, width: int) -> str:
    return line if len(line) <= width else line[: width - 3] + "..."


def format_table(claims, width: int = 100, *, failing_checks: bool = False) -> str:
    """One line per claim: PASS/FAIL/ERROR (COUNT for accounting), id, seconds, the headline measurement (cut
    to ``width``); with ``failing_checks``, each check a claim fails below it, indented and wrapped."""
    from ..lab.report import summary_text
    w = max([len(c.id) for c in claims] + [5])
    lines = []
    for c in claims:
        lines.append(_cut(f"{_verdict(c):<5}  {c.id:<{w}}  {c.seconds:6.1f} s  {summary_text(c)}", width))
        if failing_checks:
            lines += [textwrap.fill(f"not met: {k.label}" + (f" (measured: {k.measured})" if k.measured else ""),
                                    width, initial_indent=" " * 7, subsequent_indent=" " * 16)
                      for k in c.checks if not k.passed]           # wrapped, not cut: the reason is the point
    return "\n".join(lines)


def format_result(result, width: int = 100) -> str:
    """A VerifyResult as blocks: the counted claims, the refuted ones, the accounting; an empty kind is left
    out. Every failing check is printed under its claim: a CI log that shows only this output must say which
    check failed and what was measured."""
    blocks = []
    if result.claims:
        blocks.append(format_table(result.claims, width, failing_checks=True))
    if result.refuted:
        blocks.append("refuted here (claims of the theory not borne out, as docs/results.md records; "
                      "not counted):\n" + format_table(result.refuted, width, failing_checks=True))
    if result.accounting:
        blocks.append("accounting (holds by construction; shown, not counted):\n"
                      + format_table(result.accounting, width))
    return "\n\n".join(blocks)


def verdict_line(result) -> str:
    """The whole verdict in one line: "10 of 10 claims pass; 1 refuted as recorded; 2 accounting: as recorded"."""
    from ..lab.report import headline
    return (f"{headline(result.claims + result.refuted + result.accounting)}: "
            f"{'as recorded' if result.as_recorded else 'NOT as recorded'}")


def report_departures(result) -> int:
    """Print what departs from the record (``attnlab: error:`` lines) and return the exit status (0 or 1)."""
    for d in result.departures:
        fail_run(d)
    return 0 if result.as_recorded else 1


def _run_verify(args: argparse.Namespace) -> int:
    from ..lab.verify import UnknownClaimError, collect, run_verify, select
    if args.list:
        try:
            entries = select(collect(), args.only)
        except UnknownClaimError as e:
            return fail(str(e))
        for e in entries:
            doc = (e.fn.__doc__ or "").strip().split("\n")[0]
            print(f"{e.id:<32} {e.kind:<10} {e.module:<16} {doc}")
        return 0
    from ..train.config import check_seed
    try:
        check_seed(args.seed, "--seed")
        writable_dir(args.out, "--out")               # before minutes of experiments, not after
    except ValueError as e:
        return fail(str(e))
    try:
        result = run_verify(quick=args.quick, only=args.only, out=args.out, seed=args.seed,
                            argv=getattr(args, "argv", None))
    except UnknownClaimError as e:
        return fail(str(e))
    if not (result.claims or result.refuted or result.accounting):
        return fail("no experiments were found (are the attnlab.lab.exp_* modules installed?)")
    print(format_result(result, max(80, shutil.get_terminal_size((120, 20)).columns)))
    print(f"{verdict_line(result)} ({result.seconds:.0f} s); report: {result.paths['html']}")
    return report_departures(result)


def add_verify(sub) -> None:
    """Add the ``verify`` subcommand to an argparse subparsers object (``attnlab.cli``)."""
    p = sub.add_parser(
        "verify", help="run the experiments that check each claim of the theory; HTML + JSON report",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Each claim of the theory (order-blindness without PE, the sinusoid, sqrt(d_k), O(n^2), causal\n"
                    "masking, multi-head cost, parallelism, long range, what a pretrained model attends to) is\n"
                    "measured, judged against a criterion stated in advance, and written to a self-contained\n"
                    "HTML report (figures inline, no network) plus JSON and PNG files. Claims the lab finds\n"
                    "not borne out are listed as refuted (docs/results.md) and still judged; accounting\n"
                    "entries (counts that hold by construction) are shown, not counted.",
        epilog="exit status: 0 when the run is as recorded: every claim passes and every refuted claim\n"
               "fails without an error; 1 when a claim fails or raises, or a refuted claim now passes or\n"
               "raises (re-examine it); 2 on bad usage (e.g. an unknown claim id).\n"
               "`attnlab verify --list` shows the ids and their kinds (claim, refuted, accounting).")
    p.add_argument("--quick", action="store_true",
                   help="small sizes and fewer repeats (~31 s on the idle 2-core AMD Zen 4, docs/benchmarks.md)")
    p.add_argument("--only", nargs="+", metavar="ID",
                   help="run only these entries (ids from --list, of any kind, or module names such as exp_basics)")
    p.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                   help=f"where report.html, report.json and the PNGs go (default {DEFAULT_OUT})")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of every experiment's randomness, 0..2**63 - 1 (default 0)")
    p.add_argument("--list", action="store_true", help="list the ids and their kinds and exit, running nothing")
    p.set_defaults(run=_run_verify)
