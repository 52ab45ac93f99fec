"""Refuted claims: measured, found not borne out, recorded in docs/results.md, and still judged.

A module lists them in ``REFUTED``. The run is *as recorded* (exit 0) while every counted claim passes
and every refuted claim fails without an error; a refuted claim that passes or raises is a change the
run must not hide (exit 1, one ``attnlab: error:`` line saying what changed). Fakes only: fast.
"""
from __future__ import annotations

import json
import sys
import types

import pytest
from verify_cli import verify_cli

from attnlab.lab import verify
from attnlab.lab.claims import Check, Claim

CHANGED = "was recorded as refuted but now passes: re-examine it and move it to CLAIMS"


def claim_holds(ctx):
    """A counted claim that holds."""
    return Claim("holds", "holds", statement="s", checks=[Check("x >= 1", True, "1")])


def claim_fails(ctx):
    """A counted claim that fails."""
    return Claim("fails", "fails", statement="s", checks=[Check("x >= 1", False, "0")])


def claim_not_borne_out(ctx):
    """A claim of the theory the measurement does not bear out."""
    return Claim("not-borne-out", "a head links verbs to subjects", statement="s",
                 checks=[Check("some head links the verb", True, "yes"),
                         Check("2x against other keys", False, "1.94x")], summary="1.94x where 2x is required")


def claim_borne_out_after_all(ctx):
    """A refuted claim whose judge now passes."""
    return Claim("borne-out-after-all", "t", statement="s", checks=[Check("2x against other keys", True, "2.1x")])


def claim_refuted_boom(ctx):
    """A refuted claim whose experiment raises."""
    raise RuntimeError("kaboom in the refuted experiment")


def account_count(ctx):
    """A count that holds by construction."""
    return Claim("count", "a count", statement="s", passed=True, measurement={"flops": 4})


def account_boom(ctx):
    """A count that cannot be made."""
    raise RuntimeError("kaboom in the count")


def _entries(claims=(), refuted=(), accounting=()):
    kinds = (("claim", claims), ("refuted", refuted), ("accounting", accounting))
    return [verify.ClaimEntry(verify.claim_id(f), "fake", f, kind) for kind, fns in kinds for f in fns]


# -- the runner -----------------------------------------------------------------------------------------------
def test_collect_reads_refuted_from_a_module(tmp_path, monkeypatch):
    mod = types.ModuleType("attnlab.lab.fake_refuted")
    mod.CLAIMS, mod.REFUTED, mod.ACCOUNTING = [claim_holds], [claim_not_borne_out], [account_count]
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    entries = verify.collect(["fake_refuted"])
    assert [(e.id, e.kind) for e in entries] == [("holds", "claim"), ("count", "accounting"),
                                                 ("not-borne-out", "refuted")]
    res = verify.run_verify(quick=True, out=str(tmp_path), modules=["fake_refuted"])
    assert [c.id for c in res.claims] == ["holds"] and [c.id for c in res.refuted] == ["not-borne-out"]
    assert res.refuted[0].kind == "refuted" and not res.refuted[0].passed
    assert res.all_passed and res.as_recorded and res.departures == []


def test_a_broken_refuted_list_is_a_failed_entry(monkeypatch):
    mod = types.ModuleType("attnlab.lab.fake_bad_refuted")
    mod.CLAIMS, mod.REFUTED = [claim_holds], "claim_not_borne_out"
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    entries = verify.collect(["fake_bad_refuted"])
    assert [e.id for e in entries] == ["holds", "fake-bad-refuted-import"]
    (bad,) = verify.run_claims(entries[1:], verify.VerifyContext(True, None))
    assert "REFUTED must be a list" in bad.error


def test_the_whole_verdict(tmp_path):
    def run(**lists):
        return verify.run_verify(quick=True, out=str(tmp_path), entries=_entries(**lists))
    res = run(claims=[claim_holds], refuted=[claim_not_borne_out])
    assert res.all_passed and res.as_recorded
    res = run(claims=[claim_holds], refuted=[claim_borne_out_after_all])
    assert res.all_passed and not res.as_recorded                 # all_passed still means the counted ones
    assert res.departures == [f"borne-out-after-all {CHANGED}"]
    res = run(claims=[claim_holds], refuted=[claim_refuted_boom])
    assert not res.as_recorded and not res.refuted[0].passed
    assert res.departures == ["refuted-boom was recorded as refuted but raised: "
                              "RuntimeError: kaboom in the refuted experiment"]
    res = run(claims=[claim_holds, claim_fails], refuted=[claim_not_borne_out])
    assert not res.all_passed and not res.as_recorded and res.departures == []
    res = run(claims=[claim_holds], accounting=[account_boom])
    assert not res.as_recorded and res.departures == ["boom (accounting) raised: RuntimeError: kaboom in the count"]
    res = verify.run_verify(quick=True, out=str(tmp_path), only=["not-borne-out"],
                            entries=_entries(claims=[claim_fails], refuted=[claim_not_borne_out]))
    assert res.claims == [] and res.as_recorded and not res.all_passed   # --only a refuted id: as recorded


def test_the_pretrained_subject_link_is_recorded_as_refuted():
    kinds = {e.id: e.kind for e in verify.collect(["exp_pretrained"])}
    assert kinds == {"minilm-sat-award": "refuted", "heads-attend-differently": "claim"}


# -- the report -----------------------------------------------------------------------------------------------
def test_report_lists_the_three_kinds_and_the_whole_verdict(tmp_path):
    res = verify.run_verify(quick=True, out=str(tmp_path), entries=_entries(
        claims=[claim_holds], refuted=[claim_not_borne_out], accounting=[account_count]))
    data = json.loads(res.paths["json"].read_text())
    assert [c["id"] for c in data["claims"]] == ["holds"] and [c["id"] for c in data["accounting"]] == ["count"]
    assert [c["id"] for c in data["refuted"]] == ["not-borne-out"] and data["refuted"][0]["kind"] == "refuted"
    assert data["summary"] == {"total": 1, "passed": 1, "failed": 0, "all_passed": True}
    assert data["verdict"] == {"as_recorded": True, "departures": [],
                               "headline": "1 of 1 claims pass; 1 refuted as recorded; 1 accounting"}
    page = res.paths["html"].read_text()
    assert "<title>attnlab verify: 1 of 1 claims pass; 1 refuted as recorded; 1 accounting</title>" in page
    section = page.index("Refuted here (claims of the theory not borne out by this measurement)")
    assert section < page.index("a head links verbs to subjects") < page.index("Accounting (shown")
    assert '<span class="badge refuted">REFUTED</span>' in page and "2x against other keys" in page
    assert '<tr class="refuted">' in page and "every claim passed" in page and "not as recorded" not in page


def test_report_says_what_changed(tmp_path):
    res = verify.run_verify(quick=True, out=str(tmp_path), entries=_entries(
        claims=[claim_holds], refuted=[claim_borne_out_after_all, claim_not_borne_out]))
    data = json.loads(res.paths["json"].read_text())
    assert data["verdict"]["as_recorded"] is False
    assert data["verdict"]["departures"] == [f"borne-out-after-all {CHANGED}"]
    page = res.paths["html"].read_text()
    assert "1 of 1 claims pass; 1 of 2 refuted as recorded" in page and "NOW PASSES" in page
    assert "every claim passed; not as recorded" in page and f"borne-out-after-all {CHANGED}" in page


# -- the CLIs -------------------------------------------------------------------------------------------------
def test_verify_exits_0_when_the_refuted_claim_fails_as_recorded(tmp_path, monkeypatch, capsys):
    entries = _entries(claims=[claim_holds], refuted=[claim_not_borne_out], accounting=[account_count])
    assert verify_cli(["verify", "--out", str(tmp_path)], monkeypatch, entries) == 0
    out, err = capsys.readouterr()
    refuted, accounting = out.index("refuted here ("), out.index("accounting (holds by construction")
    assert out.index("PASS   holds") < refuted < out.index("FAIL   not-borne-out") < accounting
    assert "not met: 2x against other keys (measured: 1.94x)" in out and "some head links" not in out
    assert out.index("COUNT  count") > accounting and err == ""
    assert "1 of 1 claims pass; 1 refuted as recorded; 1 accounting: as recorded (" in out


def test_verify_exits_1_when_a_refuted_claim_now_passes(tmp_path, monkeypatch, capsys):
    entries = _entries(claims=[claim_holds], refuted=[claim_borne_out_after_all])
    assert verify_cli(["verify", "--out", str(tmp_path)], monkeypatch, entries) == 1
    out, err = capsys.readouterr()
    assert err == f"attnlab: error: borne-out-after-all {CHANGED}\n"
    assert "1 of 1 claims pass; 0 of 1 refuted as recorded: NOT as recorded" in out


def test_verify_exits_1_when_a_refuted_claim_raises(tmp_path, monkeypatch, capsys):
    entries = _entries(claims=[claim_holds], refuted=[claim_refuted_boom])
    assert verify_cli(["verify", "--out", str(tmp_path)], monkeypatch, entries) == 1
    out, err = capsys.readouterr()
    assert "ERROR  refuted-boom" in out
    assert err == ("attnlab: error: refuted-boom was recorded as refuted but raised: "
                   "RuntimeError: kaboom in the refuted experiment\n")


def test_a_failing_counted_claim_still_fails_the_run(tmp_path, monkeypatch, capsys):
    entries = _entries(claims=[claim_holds, claim_fails], refuted=[claim_not_borne_out])
    assert verify_cli(["verify", "--out", str(tmp_path)], monkeypatch, entries) == 1
    out, err = capsys.readouterr()
    assert "FAIL   fails" in out and "1 of 2 claims pass; 1 refuted as recorded: NOT as recorded" in out
    assert out.index("FAIL   fails") < out.index("not met: x >= 1 (measured: 0)") < out.index("refuted here (")
    assert err == ""                                                # nothing departs from the record


def test_only_runs_accounting_and_refuted_ids(tmp_path, monkeypatch, capsys):
    entries = _entries(claims=[claim_fails], refuted=[claim_not_borne_out], accounting=[account_count])
    assert verify_cli(["verify", "--only", "count", "--out", str(tmp_path)], monkeypatch, entries) == 0
    out = capsys.readouterr().out
    assert "COUNT  count" in out and "fails" not in out and "0 of 0 claims pass; 1 accounting: as recorded" in out
    assert verify_cli(["verify", "--only", "not-borne-out", "--out", str(tmp_path)], monkeypatch, entries) == 0
    assert "FAIL   not-borne-out" in capsys.readouterr().out
    entries = _entries(accounting=[account_boom])
    assert verify_cli(["verify", "--only", "boom", "--out", str(tmp_path)], monkeypatch, entries) == 1
    assert "boom (accounting) raised" in capsys.readouterr().err


def test_list_shows_each_entrys_kind(monkeypatch, capsys):
    entries = _entries(claims=[claim_holds], refuted=[claim_not_borne_out], accounting=[account_count])
    assert verify_cli(["verify", "--list"], monkeypatch, entries) == 0
    rows = {line.split()[0]: line.split()[1] for line in capsys.readouterr().out.splitlines()}
    assert rows == {"holds": "claim", "not-borne-out": "refuted", "count": "accounting"}


@pytest.mark.parametrize("refuted, row, verdict, status", [
    (claim_not_borne_out, "FAIL   not-borne-out", "1 refuted as recorded; 1 accounting: as recorded", 0),
    (claim_borne_out_after_all, "PASS   borne-out-after-all", "0 of 1 refuted as recorded; 1 accounting: NOT", 1)])
def test_demo_exit_status_is_the_whole_verdict(refuted, row, verdict, status, tmp_path, monkeypatch, capsys):
    """The demo (what CI runs) stays green while the refuted claim fails as recorded, and turns red if it passes."""
    import attnlab.cli.demo as demo
    import attnlab.cli.show as show
    import attnlab.lab.inspect as inspect
    from attnlab.cli import main
    entries = _entries(claims=[claim_holds], refuted=[refuted], accounting=[account_count])
    real = verify.run_verify
    monkeypatch.setattr(verify, "run_verify", lambda **kw: real(**{**kw, "entries": entries}))
    monkeypatch.setattr(demo, "_train_gpt", lambda out, minutes, progress: out / "gpt")
    monkeypatch.setattr(demo, "_generate", lambda path, n: None)
    monkeypatch.setattr(show, "show_text", lambda *a, **kw: [])
    monkeypatch.setattr(inspect, "register_model", lambda *a, **kw: None)
    assert main(["demo", "--out", str(tmp_path), "--no-progress"]) == status
    out, err = capsys.readouterr()
    assert row in out and out.index("refuted here (") < out.index(row) < out.index("COUNT  count")
    assert f"claims verified: 1 of 1 claims pass; {verdict}" in out
    assert (CHANGED in err) == (status == 1)
