"""Issue #30's contacts claim: train the MSA Transformer and its ablation, read contacts, judge (a long experiment).

Runs ``lab/exp_contacts.py``'s claim ``msa-contacts`` through the lab's runner, so its report
(report.html, report.json and the figure) is the one ``attnlab verify`` writes; the claim is not in
verify's module list because its training takes 2 x 12 minutes of the machine. Run it alone on an
idle machine (the trainer's time limit decides the steps, so a busy machine trains less)::

    .venv/bin/python scripts/msa_contacts.py --out runs/msa-contacts

Models are trained into OUT/work/msa-attention and OUT/work/msa-mean (``attnlab show --checkpoint
OUT/work/msa-attention`` draws them) and reused by a second run with the same configuration.
Exit status: 0 when the claim passes, 1 when it fails (its checks say which), as ``verify``.
"""
from __future__ import annotations

import argparse
import sys

from attnlab.lab.verify import MODULES, run_verify


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/msa-contacts", help="report directory (default runs/msa-contacts)")
    args = p.parse_args(argv)
    result = run_verify(only=["msa-contacts"], modules=[*MODULES, "exp_contacts"], out=args.out, argv=sys.argv)
    for c in result.claims:
        print(f"{c.id}: {'PASS' if c.passed else 'FAIL'} - {c.summary}")
        for check in c.checks:
            print(f"  [{'x' if check.passed else ' '}] {check.label}: {check.measured}")
        if c.error:
            print(c.error, file=sys.stderr)
    print(f"report: {result.paths['html']}")
    return 0 if result.claims and all(c.passed for c in result.claims) else 1


if __name__ == "__main__":
    sys.exit(main())
