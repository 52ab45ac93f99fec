"""attnlab verify: the runner (errors, --only, ids), the CLI's exit codes, and each experiment's criterion.

The criteria are fed measurements that must fail as well as ones that must pass; the real
experiments run in one slow test (quick mode).
"""
import argparse
import json
import math
import sys
import types

import pytest
import torch
from verify_cli import verify_cli

from attnlab.cli.verify import add_verify
from attnlab.lab import exp_basics as eb
from attnlab.lab import exp_complexity as ec
from attnlab.lab import verify
from attnlab.lab.claims import Claim, VerifyContext, all_passed


# -- fakes --------------------------------------------------------------------------------------------
def claim_always_true(ctx):
    """A claim that holds."""
    return Claim("always-true", "holds", statement="s", criterion="c", passed=True, measurement={"x": 1.0})


def claim_always_false(ctx):
    """A claim that fails its criterion."""
    return Claim("always-false", "fails", statement="s", criterion="c", passed=False)


def claim_boom(ctx):
    """An experiment that crashes."""
    raise RuntimeError("kaboom in the experiment")


def claim_not_a_claim(ctx):
    return {"passed": True}


def claim_leaky(ctx):
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    return Claim("leaky", "t", statement="s", criterion="c", passed=1)


def _entries(*fns, module="fake"):
    return [verify.ClaimEntry(verify.claim_id(f), module, f) for f in fns]


def _ctx(tmp_path, quick=True):
    return VerifyContext(quick=quick, workdir=tmp_path)


# -- runner -------------------------------------------------------------------------------------------
def test_claim_id_from_name_or_attribute():
    assert verify.claim_id(eb.claim_sqrt_dk_scaling) == "sqrt-dk-scaling"

    def whatever(ctx):
        pass
    whatever.claim_id = "custom-id"
    assert verify.claim_id(whatever) == "custom-id"


def test_exception_becomes_a_failed_claim_and_the_rest_still_runs(tmp_path):
    claims = verify.run_claims(_entries(claim_boom, claim_always_true, claim_not_a_claim), _ctx(tmp_path))
    boom, ok, bad = claims
    assert not boom.passed and "RuntimeError: kaboom in the experiment" in boom.error
    assert boom.id == "boom" and boom.title == "An experiment that crashes." and "claim_boom" in boom.error
    assert ok.passed and ok.error is None and ok.seconds >= 0
    assert not bad.passed and "returned dict, not a Claim" in bad.error


def test_global_state_restored_and_passed_is_a_bool(tmp_path):
    (claim,) = verify.run_claims(_entries(claim_leaky), _ctx(tmp_path))
    assert claim.passed is True
    assert torch.get_default_dtype() == torch.float32 and torch.is_grad_enabled()


def test_each_claim_starts_from_the_seed(tmp_path):
    draws = []

    def claim_draw(ctx):
        draws.append(torch.rand(()).item())
        return Claim("draw", "t", statement="s", criterion="c", passed=True)
    verify.run_claims(_entries(claim_draw, claim_draw), VerifyContext(True, tmp_path, seed=3))
    assert draws[0] == draws[1]


def test_only_selects_by_id_or_module_and_rejects_unknown_ids():
    entries = _entries(claim_always_true, claim_always_false) + _entries(claim_boom, module="other")
    assert [e.id for e in verify.select(entries, ["always-false"])] == ["always-false"]
    assert [e.id for e in verify.select(entries, ["other", "always-true"])] == ["always-true", "boom"]
    assert len(verify.select(entries, None)) == 3
    with pytest.raises(verify.UnknownClaimError, match="unknown claim id 'nope'; choose from always-true"):
        verify.select(entries, ["always-true", "nope"])


def test_collect_reports_a_missing_or_broken_module_as_a_failed_claim(monkeypatch):
    broken = types.ModuleType("attnlab.lab.fake_broken")
    broken.CLAIMS = "not a list"
    good = types.ModuleType("attnlab.lab.fake_good")
    good.CLAIMS = [claim_always_true]
    monkeypatch.setitem(sys.modules, broken.__name__, broken)
    monkeypatch.setitem(sys.modules, good.__name__, good)
    entries = verify.collect(["fake_good", "fake_broken"])
    assert [(e.id, e.module) for e in entries] == [("always-true", "fake_good"), ("fake-broken-import", "fake_broken")]
    claims = verify.run_claims(entries, VerifyContext(True, None))
    assert claims[0].passed and not claims[1].passed and "CLAIMS must be a list" in claims[1].error
    (required,) = verify.collect(["fake_missing_required"])     # a missing module: one failing claim
    (claim,) = verify.run_claims([required], VerifyContext(True, None))
    assert not claim.passed and "No module named 'attnlab.lab.fake_missing_required'" in claim.error


def test_every_module_claim_has_a_unique_id():
    entries = verify.collect()
    ids = [e.id for e in entries]
    assert len(ids) == len(set(ids)) >= len(eb.CLAIMS) + len(ec.CLAIMS) + 5
    assert all(i == i.lower() and " " not in i and "_" not in i for i in ids)


def test_every_judge_returns_labelled_checks():
    """The report's criterion text is generated from the judges' checks: no judge may return a bare bool."""
    import inspect
    modules = ["exp_basics", "exp_complexity", "exp_sequential", "exp_longrange", "exp_pretrained"]
    judges = [(name, fn) for m in modules for name, fn in vars(verify._import(m)).items()
              if name.startswith("judge_") and callable(fn)]
    assert len(judges) >= 13
    bare = [name for name, fn in judges if inspect.signature(fn).return_annotation not in ("list[Check]",)]
    assert not bare, bare


def test_run_verify_writes_the_report(tmp_path):
    res = verify.run_verify(quick=True, only=["always-true", "boom"], out=str(tmp_path),
                            entries=_entries(claim_always_true, claim_always_false, claim_boom))
    assert [c.id for c in res.claims] == ["always-true", "boom"] and not res.all_passed
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["summary"]["failed"] == 1 and data["meta"]["quick"] is True and data["meta"]["torch"]
    assert "kaboom" in (tmp_path / "report.html").read_text()


def account_counted(ctx):
    """A count that holds by construction."""
    return Claim("counted", "a count", statement="s", criterion="c", passed=False, measurement={"flops": 4})


def test_accounting_is_shown_but_never_counted(tmp_path, monkeypatch):
    """An ACCOUNTING entry runs and is reported in its own section, but neither the count nor the verdict sees it."""
    mod = types.ModuleType("attnlab.lab.fake_acct")
    mod.CLAIMS, mod.ACCOUNTING = [claim_always_true], [account_counted]
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    entries = verify.collect(["fake_acct"])
    assert [(e.id, e.kind) for e in entries] == [("always-true", "claim"), ("counted", "accounting")]
    res = verify.run_verify(quick=True, out=str(tmp_path), modules=["fake_acct"])
    assert [c.id for c in res.claims] == ["always-true"] and [c.id for c in res.accounting] == ["counted"]
    assert res.all_passed and res.accounting[0].kind == "accounting"           # a failing count does not fail the run
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["summary"] == {"total": 1, "passed": 1, "failed": 0, "all_passed": True}
    assert [c["id"] for c in data["claims"]] == ["always-true"] and data["accounting"][0]["id"] == "counted"
    page = (tmp_path / "report.html").read_text()
    assert "1 of 1 claims pass" in page and page.index("Accounting (shown, not counted") < page.index("a count")
    res = verify.run_verify(quick=True, out=str(tmp_path), modules=["fake_acct"], only=["counted"])
    assert res.claims == [] and [c.id for c in res.accounting] == ["counted"]


def test_the_flop_counts_are_accounting_not_claims():
    entries = {e.id: e.kind for e in verify.collect(["exp_basics", "exp_complexity"])}
    assert entries["multihead-flops"] == entries["flops-scaling"] == "accounting"
    assert entries["causal-gradient"] == entries["memory-scaling"] == "claim"
    with pytest.raises(ValueError, match="kind must be one of"):
        Claim("x", "t", statement="s", passed=True, kind="maybe")


# -- CLI ----------------------------------------------------------------------------------------------
def test_cli_exit_codes_and_table(tmp_path, monkeypatch, capsys):
    ok, bad = _entries(claim_always_true), _entries(claim_always_true, claim_always_false)
    assert verify_cli(["verify", "--out", str(tmp_path)], monkeypatch, ok) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "always-true" in out and "x = 1" in out and str(tmp_path / "report.html") in out
    assert verify_cli(["verify", "--out", str(tmp_path)], monkeypatch, bad) == 1
    assert "FAIL   always-false" in capsys.readouterr().out
    assert verify_cli(["verify", "--only", "always-true", "--out", str(tmp_path)], monkeypatch, bad) == 0
    assert verify_cli(["verify", "--only", "nope", "--out", str(tmp_path)], monkeypatch, bad) == 2
    assert "attnlab: error: unknown claim id 'nope'" in capsys.readouterr().err
    assert verify_cli(["verify", "--list"], monkeypatch, bad) == 0
    assert "always-false" in capsys.readouterr().out and not (tmp_path / "x").exists()


def test_attnlab_main_runs_verify(tmp_path, monkeypatch, capsys):
    from attnlab import cli
    monkeypatch.setattr(verify, "collect", lambda modules=None: _entries(claim_always_true, claim_always_false))
    assert cli.main(["verify", "--only", "always-true", "--out", str(tmp_path)]) == 0
    assert cli.main(["verify", "--out", str(tmp_path)]) == 1
    assert "1 of 2 claims pass" in capsys.readouterr().out
    meta = json.loads((tmp_path / "report.json").read_text())["meta"]
    assert meta["command"] == f"attnlab verify --out {tmp_path}"


def test_cli_help_states_the_exit_status(capsys):
    p = argparse.ArgumentParser(prog="attnlab")
    add_verify(p.add_subparsers(dest="cmd"))
    with pytest.raises(SystemExit):
        p.parse_args(["verify", "--help"])
    text = capsys.readouterr().out
    assert "0 when the run is as recorded: every claim passes and every refuted claim\nfails without an error" in text
    assert "a refuted claim now passes or\nraises" in text and "--quick" in text and "--only" in text


# -- criteria of exp_basics ---------------------------------------------------------------------------
def test_multiset_distance_counts_duplicates():
    a = torch.tensor([[0.0, 1.0], [2.0, 3.0], [2.0, 3.0]], dtype=torch.float64)
    assert eb.multiset_distance(a, a[[2, 0, 1]]) == 0.0
    b = torch.tensor([[0.0, 1.0], [0.0, 1.0], [2.0, 3.0]], dtype=torch.float64)       # same set, different multiset
    assert eb.multiset_distance(a, b) == pytest.approx(math.hypot(2, 2))
    assert eb.multiset_distance(a, a + torch.tensor([0.0, 1e-3])) == pytest.approx(1e-3)
    with pytest.raises(ValueError, match="L=9 is too many"):
        eb.multiset_distance(torch.zeros(9, 2), torch.zeros(9, 2))


def test_equivariance_criterion_can_fail():
    assert all_passed(eb.judge_equivariance(4e-16, 0.3))
    assert not all_passed(eb.judge_equivariance(1e-6, 0.3))       # order leaked in without PE
    assert not all_passed(eb.judge_equivariance(0.0, 1e-5))       # PE changed nothing


def test_sinusoid_values_criterion_can_fail():
    closed = [eb._closed_form(p, 4) for p in (0, 1)]
    assert closed[1][:2] == [math.sin(1), math.cos(1)]
    assert all_passed(eb.judge_sinusoid_values(closed, closed, 1e-6))
    swapped = [closed[0], [closed[1][1], closed[1][0], *closed[1][2:]]]           # cos before sin
    assert not all_passed(eb.judge_sinusoid_values(swapped, closed, 1e-6))
    assert not all_passed(eb.judge_sinusoid_values([closed[0], [v + 1e-3 for v in closed[1]]], closed, 1e-6))


def test_relative_position_criterion_can_fail():
    good = {1: 1e-14, 5: 2e-14}
    assert all_passed(eb.judge_relative_position(good, good, 5.0, 3.0))
    assert not all_passed(eb.judge_relative_position({1: 1e-14, 5: 1e-6}, good, 5.0, 3.0))
    assert not all_passed(eb.judge_relative_position(good, {1: 1e-3}, 5.0, 3.0))
    assert not all_passed(eb.judge_relative_position(good, good, 1e-13, 3.0))  # the control passes: blind check


def test_softmax_saturation_matches_autograd():
    s = torch.randn(3, 5, dtype=torch.float64)
    ent, grad = eb.softmax_saturation(s)
    for t in range(3):
        jac = torch.autograd.functional.jacobian(lambda x: torch.softmax(x, -1), s[t])      # (5, 5)
        assert grad[t] == pytest.approx(jac.abs().max().item(), abs=1e-15)
        p = torch.softmax(s[t], -1)
        assert ent[t] == pytest.approx(-(p * p.log()).sum().item(), abs=1e-12)
    ent, grad = eb.softmax_saturation(torch.tensor([[0.0, 0.0], [1e4, 0.0]], dtype=torch.float64))
    assert ent[0] == pytest.approx(math.log(2)) and grad[0] == pytest.approx(0.25) and grad[1] == 0 == ent[1]


def test_scaling_criterion_can_fail():
    scaled_e, scaled_g = [3.68, 3.69, 3.67], [0.085, 0.086, 0.084]
    assert all_passed(eb.judge_scaling([1.4, 0.6, 0.12], scaled_e, [0.2, 0.1, 1e-4], scaled_g))
    assert not all_passed(eb.judge_scaling([1.4, 1.3, 1.2], scaled_e, [0.2, 0.1, 1e-4], scaled_g))   # no collapse
    assert not all_passed(eb.judge_scaling([1.4, 0.6, 0.12], scaled_e, [0.2, 0.1, 0.05], scaled_g))  # grad alive
    assert not all_passed(eb.judge_scaling([1.4, 0.6, 0.12], [3.7, 3.0, 2.0], [0.2, 0.1, 1e-4], scaled_g))


def test_causal_criterion_can_fail():
    blocks = torch.tensor([[1.0, 0.0, 0.0], [0.5, 2.0, 0.0], [0.1, 0.2, 0.3]], dtype=torch.float64)
    assert eb._future_past(blocks) == {"future_max": 0.0, "past_min": 0.1}
    leak = blocks.clone()
    leak[0, 2] = 1e-30
    assert eb._future_past(leak)["future_max"] == 1e-30
    ok = {"reference": {"future_max": 0.0, "past_min": 0.1}, "tiled": {"future_max": 0.0, "past_min": 0.2}}
    assert all_passed(eb.judge_causal(ok, control_future=0.05))
    assert not all_passed(eb.judge_causal({**ok, "sdpa": {"future_max": 1e-30, "past_min": 0.1}}, 0.05))
    assert not all_passed(eb.judge_causal({"reference": {"future_max": 0.0, "past_min": 0.0}}, 0.05))  # no flow
    assert not all_passed(eb.judge_causal({}, 0.05))                                                  # none ran
    assert not all_passed(eb.judge_causal(ok, control_future=0.0))                           # blind measurement


def test_a_backend_that_raises_fails_the_causal_criterion():
    raised = {**{"reference": {"future_max": 0.0, "past_min": 0.1}}, "tiled": {"error": "ValueError: no float64"}}
    checks = eb.judge_causal(raised, control_future=0.05)
    assert [c.passed for c in checks] == [False, True, True, True]
    assert "tiled: ValueError: no float64" in checks[0].measured
    assert not all_passed(eb.judge_causal({"tiled": {"skipped": "x"}}, 0.05))     # no measurement is no pass


def test_the_causal_claim_fails_when_a_backend_raises(tmp_path, monkeypatch):
    """A registered exact backend that raises (even a ValueError, "cannot take this request") fails the claim,
    with the backend and its error in the measurement; it is never skipped silently."""
    from attnlab.functional import registry

    def broken(q, k, v, **kw):
        raise ValueError("broken backend cannot take float64")
    monkeypatch.setitem(registry._BACKENDS, "broken", registry.Backend("broken", broken, True, lambda r: None, "x"))
    claim = eb.claim_causal_gradient(_ctx(tmp_path))
    assert not claim.passed and claim.error is None
    assert claim.measurement["backends"]["broken"] == {"error": "ValueError: broken backend cannot take float64"}
    assert claim.measurement["backends"]["reference"]["future_max"] == 0.0 and "broken RAISED" in claim.summary


def test_flops_criterion_can_fail():
    N, d = 64, 48
    assert eb.mha_flops_formula(N, d) == 4 * 2 * N * d * d + 2 * (2 * N * N * d)
    e = eb.mha_flops_formula(N, d)
    assert all_passed(eb.judge_flops({1: e, 4: e}, e))
    assert not all_passed(eb.judge_flops({1: e, 4: e + 2}, e)) and not all_passed(eb.judge_flops({}, e))
    (check,) = eb.judge_flops({1: e, 4: e + 2}, e)
    assert "h=4" in check.measured and f"{e:,}" in check.label


def test_exponentials_the_flop_count_leaves_out_grow_with_h():
    """FlopCounterMode sees the products only; the softmax's exponentials are h N^2 (what the report says)."""
    N, d = 16, 32
    x = torch.randn(1, N, d, dtype=torch.float64)
    for h in (1, 4):
        layer = eb._layer(0, d_model=d, n_heads=h, backend="reference")
        assert eb.count_exponentials(layer, x) == h * N * N


def test_cheap_claims_pass_for_real(tmp_path):
    for fn in (eb.claim_sinusoidal_values, eb.claim_sinusoidal_relative_position, eb.claim_permutation_equivariance):
        c = fn(_ctx(tmp_path))
        assert c.passed and c.id == verify.claim_id(fn), (c.id, c.summary)
        assert c.checks and all(k.label in c.criterion_text for k in c.checks)   # the text is the judge's


# -- criteria of exp_complexity -----------------------------------------------------------------------
def test_increment_exponent_removes_the_constant():
    ns = [1024, 2048, 4096, 8192]
    assert ec.increment_exponent(ns, [5e7 + 3e3 * n for n in ns]) == pytest.approx(1.0)
    assert ec.increment_exponent(ns, [1e6 + 7.0 * n * n for n in ns]) == pytest.approx(2.0)
    assert ec.increment_exponent(ns, [10, 12, 11, 20]) is None                     # a shrinking step is noise
    assert ec.increment_exponent(ns[:2], [1, 2]) is None


def test_memory_criterion_can_fail():
    assert all_passed(ec.judge_memory(1.97, 1.0, 0.5))
    assert not all_passed(ec.judge_memory(1.97, 1.0, 0.5, ["tiled n=4096: timed out after 600 s"]))   # a lost point
    assert not all_passed(ec.judge_memory(1.5, 1.0, 0.5))
    assert not all_passed(ec.judge_memory(1.97, 1.9, 0.5))        # tiled growing quadratically
    assert not all_passed(ec.judge_memory(1.97, 1.0, 1.6))
    assert not all_passed(ec.judge_memory(None, 1.0, 0.5))        # too few points measured


def test_flops_scaling_criterion_can_fail():
    exp = {128: 4, 256: 16}
    assert all_passed(ec.judge_flops_scaling(dict(exp), exp, 2.0))
    assert not all_passed(ec.judge_flops_scaling({128: 4, 256: 15}, exp, 2.0))
    assert not all_passed(ec.judge_flops_scaling(dict(exp), exp, 1.5))
    assert not all_passed(ec.judge_flops_scaling({}, {}, 2.0))
    assert not all_passed(ec.judge_flops_scaling(dict(exp), exp, None))       # no fit


@pytest.mark.slow
def test_quick_run_of_every_claim_passes(tmp_path):
    res = verify.run_verify(quick=True, out=str(tmp_path), modules=["exp_basics", "exp_complexity"])
    assert len(res.claims) == len(eb.CLAIMS) + len(ec.CLAIMS)
    failed = {c.id: c.error or c.summary for c in res.claims + res.accounting if not c.passed}
    assert not failed, failed
    assert all(c.checks for c in res.claims), [c.id for c in res.claims if not c.checks]
    ids = [verify.claim_id(f) for f in eb.CLAIMS + ec.CLAIMS]
    assert [c.id for c in res.claims] == ids
    assert [c.id for c in res.accounting] == ["multihead-flops", "flops-scaling"]
    assert all(c.figure is None or (tmp_path / f"{c.id}.png").exists() for c in res.claims + res.accounting)
    assert res.refuted == [] and res.as_recorded                   # the whole verdict, what the CLI exits on
