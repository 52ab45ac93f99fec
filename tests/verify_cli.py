"""``attnlab verify`` run in-process on given experiments (no lab module collected): what the CLI prints and
returns for them. Shared by tests/test_verify.py and tests/test_claims_refuted.py.

Example::

    assert verify_cli(["verify", "--list"], monkeypatch, entries) == 0
"""
from __future__ import annotations

import argparse

from attnlab.cli.verify import add_verify
from attnlab.lab import verify


def verify_cli(argv, monkeypatch, entries) -> int:
    """The exit status of ``attnlab ARGV`` with ``verify.collect`` answering ``entries`` (ClaimEntry list)."""
    monkeypatch.setattr(verify, "collect", lambda modules=None: entries)
    p = argparse.ArgumentParser(prog="attnlab")
    add_verify(p.add_subparsers(dest="cmd", required=True))
    args = p.parse_args(argv)
    args.argv = argv
    return args.run(args)
