"""Long experiments: their recorded results are listed in the verify report, apart from the count."""
from __future__ import annotations

import datetime
import importlib
import inspect
import json

from attnlab.lab.claims import Claim, Check
from attnlab.lab.long_experiments import LONG_EXPERIMENTS, LongResult
from attnlab.lab.report import render_html, report_dict, write_report
from attnlab.lab.verify import MODULES

# the experiment module of each long claim: it must not be one verify runs
LONG_MODULES = ("exp_code", "exp_contacts")


def _claim() -> Claim:
    return Claim("permutation-equivariance", "Permutation", "Attention is permutation equivariant.",
                 checks=[Check("max error <= 1e-6", True, "3e-7")])


def test_every_record_names_a_claim_of_a_long_module_with_date_machine_and_command():
    sources = {m: inspect.getsource(importlib.import_module(f"attnlab.lab.{m}")) for m in LONG_MODULES}
    assert not set(LONG_MODULES) & set(MODULES)                   # verify does not run them
    for r in LONG_EXPERIMENTS:
        assert any(f'"{r.claim}"' in src for src in sources.values()), r.claim
        datetime.date.fromisoformat(r.date)
        assert r.machine and r.command and r.result and r.where


def test_the_report_lists_them_after_the_count_and_never_counts_them(tmp_path):
    html = render_html([_claim()])
    head, _, long_part = html.partition("Long experiments")
    assert long_part and "1 of 1" in head                         # the headline counts the run's claim only
    for r in LONG_EXPERIMENTS:
        assert r.claim in long_part and r.date in long_part
    d = report_dict([_claim()])
    assert d["summary"]["total"] == 1
    assert [e["claim"] for e in d["long_experiments"]] == [r.claim for r in LONG_EXPERIMENTS]
    paths = write_report([_claim()], tmp_path)
    assert json.loads(paths["json"].read_text())["long_experiments"][0]["command"] == LONG_EXPERIMENTS[0].command


def test_a_record_without_a_verdict_shows_no_badge():
    from attnlab.lab.report import _long
    rows = "".join(_long([LongResult("x", "X", None, "not run", "2026-12-03", "cpu", "cmd")]))
    assert "badge" not in rows and "not run" in rows
