"""``attnlab tune`` and the profile ``auto`` reads (functional/profile.py, bench/tune.py, cli/tune.py)."""
import json
import logging

import pytest
import torch

from attnlab.cli import main
from attnlab.functional import explain, masks
from attnlab.functional import profile as profile_mod
from attnlab.functional.auto_rule import pick
from attnlab.functional.backends.native import why_unavailable
from attnlab.functional.profile import Profile, current_profile, machine_key, profile_path, save_profile
from attnlab.functional.request import make_request

needs_native = pytest.mark.skipif(why_unavailable() is not None, reason="the compiled kernel is not built")


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """An empty profile directory per test, and no profile remembered from another test."""
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("ATTNLAB_PROFILE", raising=False)
    profile_mod._loaded.clear()
    yield
    profile_mod._loaded.clear()


def _plain(dtype="bfloat16", mask="none", mode="fwd", n=1024, native=1.0, sdpa=2.0, D=64):
    return dict(dtype=dtype, mask=mask, mode=mode, n=n, D=D, ms={"native": native, "sdpa": sdpa})


def _masked(skippable, native, sdpa, dtype="bfloat16", mode="fwd", n=2048, D=64):
    return dict(dtype=dtype, mode=mode, n=n, D=D, padded=skippable, skippable=skippable,
                ms={"native": native, "sdpa": sdpa})


def _req(n, dtype=torch.bfloat16, D=64, **kw):
    q = torch.randn(1, 8, n, D, dtype=dtype)
    return make_request(q, q, q, **kw)


def test_no_profile_means_the_class_rules_and_explain_says_so():
    q = torch.randn(1, 8, 1024, 64, dtype=torch.bfloat16)
    assert current_profile() is None
    text = explain(q, q, q, causal=True)
    assert "rule source: the built-in rules for CPU class" in text and "`attnlab tune` measures one" in text


@needs_native
@pytest.mark.parametrize("native_ms, sdpa_ms, want", [(1.0, 2.0, "native"), (2.0, 1.0, "sdpa")])
def test_a_plain_request_follows_the_profile(native_ms, sdpa_ms, want):
    save_profile([_plain(n=1024, native=native_ms, sdpa=sdpa_ms)], [])
    name, why = pick(_req(1024))
    assert name == want and "this machine's profile" in why
    q = torch.randn(1, 8, 1024, 64, dtype=torch.bfloat16)
    assert "rule source: this machine's profile" in explain(q, q, q)


@needs_native
@pytest.mark.parametrize("native_ms, sdpa_ms, tie", [(1.0, 1.02, True), (1.02, 1.0, True), (1.0, 1.04, False),
                                                     (1.04, 1.0, False)])
def test_a_tie_in_the_profile_is_left_to_the_class_rules(native_ms, sdpa_ms, tie, capsys):
    """Issue #27: two timings within profile.TIE of each other are one tune's noise, not a measurement."""
    save_profile([_plain(n=1024, native=native_ms, sdpa=sdpa_ms)], [])
    assert main(["tune", "--show"]) == 0
    assert ("-> a tie: the built-in rule" in capsys.readouterr().out) is tie
    name, why = pick(_req(1024))
    assert ("this machine's profile" in why) is not tie
    if not tie:
        assert name == ("native" if native_ms < sdpa_ms else "sdpa")
    q = torch.randn(1, 8, 1024, 64, dtype=torch.bfloat16)
    assert ("measured a tie" in explain(q, q, q)) is tie


@needs_native
def test_the_nearest_measured_n_decides():
    save_profile([_plain(n=1024, native=1.0, sdpa=2.0), _plain(n=4096, native=2.0, sdpa=1.0)], [])
    assert pick(_req(1536))[0] == "native"          # nearer 1024 on a log scale
    assert pick(_req(3000))[0] == "sdpa"            # nearer 4096
    assert "n = 4096" in pick(_req(3000))[1]


@needs_native
def test_a_kind_the_profile_did_not_measure_falls_back_to_the_class_rules():
    save_profile([_plain(mask="causal", native=1.0, sdpa=2.0)], [])
    name, why = pick(_req(1024))                    # no mask: not measured
    assert "this machine's profile" not in why
    q = torch.randn(1, 8, 1024, 64, dtype=torch.bfloat16)
    assert "has no measurement for this request's kind" in explain(q, q, q)


def test_masked_choice_takes_the_kernel_from_where_it_keeps_winning():
    prof = Profile(profile_path(), machine_key(), "2026-12-03T00:00", (),
                   (_masked(0.05, 3, 2), _masked(0.1, 1, 2), _masked(0.2, 3, 2), _masked(0.35, 1, 2),
                    _masked(0.5, 1, 2)), 64)
    assert prof.masked_choice("bfloat16", False, 0.4)[0] == "native"
    assert prof.masked_choice("bfloat16", False, 0.35)[0] == "native"
    assert prof.masked_choice("bfloat16", False, 0.12)[0] == "sdpa"   # a lone win at 10% is not a threshold
    assert prof.masked_choice("bfloat16", True, 0.4) is None          # fwd+bwd not measured
    never = Profile(profile_path(), machine_key(), "x", (), (_masked(0.1, 3, 2), _masked(0.5, 3, 2)), 64)
    assert never.masked_choice("bfloat16", False, 0.3)[0] == "sdpa"
    assert never.masked_choice("bfloat16", False, 0.9) is None        # beyond what was measured


@needs_native
def test_a_masked_request_follows_the_profile():
    save_profile([], [_masked(0.1, 3, 2), _masked(0.2, 1, 2), _masked(0.5, 1, 2)])
    cut = masks.padding(torch.tensor([1024 - 410]))                  # ~40% of the keys padded
    assert pick(_req(1024, mask=cut))[0] == "native"
    few = masks.padding(torch.tensor([1024 - 40]))                   # ~4%
    name, why = pick(_req(1024, mask=few))
    assert name == "sdpa" and "this machine's profile" in why


def test_a_profile_of_another_machine_or_a_broken_file_is_ignored(caplog):
    path = profile_path()
    path.parent.mkdir(parents=True)
    good = {"version": 1, "key": {**machine_key(), "threads": 99}, "measured_at": "x",
            "plain": [_plain()], "masked": []}
    for text in (json.dumps(good), "{not json", json.dumps({**good, "key": machine_key(), "plain": [
            _plain(native=float("nan"))]})):
        path.write_text(text)
        profile_mod._loaded.clear()
        with caplog.at_level(logging.WARNING, logger="attnlab.functional.profile"):
            assert current_profile() is None
        assert "ignoring the speed profile" in caplog.text
        caplog.clear()


def test_the_key_changes_with_the_thread_count():
    before = profile_path()
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert profile_path() != before
    finally:
        torch.set_num_threads(threads)


def test_profile_off_ignores_it(monkeypatch):
    save_profile([_plain()], [])
    assert current_profile() is not None
    monkeypatch.setenv("ATTNLAB_PROFILE", "off")
    assert current_profile() is None


def test_save_refuses_what_it_could_not_read():
    with pytest.raises(ValueError, match="two positive timings"):
        save_profile([_plain(native=0.0)], [])
    assert not profile_path().exists()


@needs_native
@pytest.mark.parametrize("cls", ["amx", "avx512_bf16", "avx2"])
def test_fp16_follows_a_profile_that_measured_it(cls, monkeypatch):
    """The profile decides plain fp16 inference where it measured it (at n = 1024 the built-in rule says SDPA on the
    Xeon with AMX, the kernel off AMX); the built-in rule keeps fp16 training, which the kernel wins on every class
    (2-13x off AMX, 1.0-2.1x on AMX)."""
    monkeypatch.setattr("attnlab.functional.auto_rule.cpu_class", lambda: cls)
    monkeypatch.setattr("attnlab.functional.auto_rule.on_tiles", lambda D, Dv: False)
    monkeypatch.setattr("attnlab.functional.auto_rule.on_amx", lambda D, Dv: False)
    assert pick(_req(1024, dtype=torch.float16))[0] == ("sdpa" if cls == "amx" else "native")
    save_profile([_plain(dtype="float16", n=1024, native=1.0, sdpa=2.0),
                  _plain(dtype="float16", mode="fwdbwd", n=1024, native=2.0, sdpa=1.0)], [])
    name, why = pick(_req(1024, dtype=torch.float16))
    assert name == "native" and "this machine's profile" in why
    q = torch.randn(1, 8, 1024, 64, dtype=torch.float16, requires_grad=True)
    name, why = pick(make_request(q, q, q))
    assert (name, "this machine's profile" in why) == ("native", False)


@needs_native
def test_tune_measures_saves_shows_and_forgets(capsys):
    assert main(["tune", "--quick", "--n", "64", "--dtype", "float32", "--repeats", "1", "--keep-busy"]) == 0
    prof = current_profile()
    assert prof is not None and prof.D == 64
    assert {(r["mask"], r["mode"]) for r in prof.plain} == {(m, d) for m in ("none", "causal")
                                                          for d in ("fwd", "fwdbwd")}
    assert sorted(r["padded"] for r in prof.masked if r["mode"] == "fwd") == [0.1, 0.25, 0.5]
    assert all(0 <= r["skippable"] <= 1 for r in prof.masked)
    capsys.readouterr()
    assert main(["tune", "--show"]) == 0
    assert "this machine's profile" in capsys.readouterr().out
    assert main(["tune", "--forget"]) == 0 and current_profile() is None


@needs_native
def test_a_tune_on_a_busy_machine_is_not_saved(monkeypatch, capsys):
    from attnlab.measure import machine
    monkeypatch.setattr(machine.LoadMonitor, "stop", lambda self: {"other_cpu_fraction": 0.6})
    assert main(["tune", "--quick", "--n", "64", "--dtype", "float32", "--repeats", "1"]) == 1
    err = capsys.readouterr().err
    assert "attnlab: error: other processes used 60%" in err and "--keep-busy" in err
    assert not profile_path().exists()


@needs_native
@pytest.mark.parametrize("mib, noted", [(2048.0, True), (None, True), (8.0, False)])
def test_a_tune_notes_the_memory_the_host_took_back_as_the_bench_does(monkeypatch, capsys, mib, noted):
    from attnlab.measure import machine
    load = {"other_cpu_fraction": 0.0, "free_page_reporting": True, "host_reclaimed_mib": mib}
    monkeypatch.setattr(machine.LoadMonitor, "stop", lambda self: dict(load))
    assert main(["tune", "--quick", "--n", "64", "--dtype", "float32", "--repeats", "1"]) == 0
    err = capsys.readouterr().err
    assert ("NOTE: this VM reports the memory it frees to its host" in err) == noted, err
    assert profile_path().exists()


@pytest.mark.parametrize("argv, flag", [(["--n", "0"], "--n"), (["--repeats", "0"], "--repeats")])
def test_bad_values_are_refused_by_the_parser(argv, flag, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["tune", *argv])
    assert stop.value.code == 2 and flag in capsys.readouterr().err


@pytest.mark.parametrize("argv, flag", [(["--n", "32"], "--n"), (["--show", "--forget"], "--forget")])
def test_bad_combinations_are_one_line(argv, flag, capsys):
    assert main(["tune", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab: error:") and flag in err and "Traceback" not in err
    assert not profile_path().exists()
