"""The benchmark's own correctness: FLOP counts, mask translations, the CLI's JSON, memory, fits.

No timing is asserted (the machine may be busy); only that the numbers exist and make sense.
"""
import json
import math
import statistics

import pytest
import torch

from attnlab.bench import MASK_KINDS, Case, allowed_pairs, extrapolate, fit_power_law, measure_peak, useful_flops
from attnlab.bench.cases import attnlab_mask, flex_mods, sdpa_kwargs
from attnlab.measure import timing
from attnlab.measure.timing import time_interleaved
from attnlab.cli import main

# Awkward on purpose: n not a multiple of the docs or of any tile, W < n, batch > 1 for padding.
SMALL = [dict(n=37, batch=1), dict(n=64, batch=3), dict(n=50, batch=2)]


def _dense(case: Case) -> torch.Tensor:
    """(B, H, n, n) bool: the attnlab structured mask, materialized."""
    mask, _ = attnlab_mask(case)
    shape = (case.batch, case.heads, case.n, case.n)
    return torch.ones(shape, dtype=torch.bool) if mask is None else mask.dense(case.n, case.n).expand(shape)


def _brute_force(case: Case) -> torch.Tensor:
    """(B, n, n) bool straight from the written definitions in MASK_KINDS, loop by loop."""
    n, B, W = case.n, case.batch, case.window
    docs = [i * case.docs // n for i in range(n)]
    lengths = [3 * n // 4] if B == 1 else [n * (4 - b % 4) // 4 for b in range(B)]
    rule = {"none": lambda b, i, j: True,
            "causal": lambda b, i, j: j <= i,
            "alibi": lambda b, i, j: j <= i,
            "padding": lambda b, i, j: j < lengths[b],
            "window": lambda b, i, j: i - W <= j <= i,
            "documents": lambda b, i, j: docs[i] == docs[j],
            "dense": lambda b, i, j: j <= i and j < lengths[b]}[case.mask]
    return torch.tensor([[[rule(b, i, j) for j in range(n)] for i in range(n)] for b in range(B)])


@pytest.mark.parametrize("mask", list(MASK_KINDS))
@pytest.mark.parametrize("shape", SMALL)
def test_flop_count_matches_brute_force(mask, shape):
    case = Case(mask, shape["n"], "float32", "fwd", batch=shape["batch"], heads=2, head_dim=8, window=5, docs=3)
    truth = _brute_force(case)
    assert allowed_pairs(case) == int(truth.sum()), f"{mask}: {allowed_pairs(case)} vs {int(truth.sum())}"
    assert torch.equal(_dense(case)[:, 0], truth)
    assert useful_flops(case) == 4 * case.heads * case.head_dim * int(truth.sum())
    bwd = Case(mask, shape["n"], "float32", "fwdbwd", batch=shape["batch"], heads=2, head_dim=8, window=5, docs=3)
    assert useful_flops(bwd) == int(3.5 * useful_flops(case))


@pytest.mark.parametrize("mask", list(MASK_KINDS))
def test_peer_masks_match_attnlab(mask):
    """torch-sdpa's dense mask and flex's mask_mod/score_mod encode exactly the attnlab case."""
    case = Case(mask, 40, "float32", "fwd", batch=2, heads=4, head_dim=8, window=6, docs=3)
    allowed = _dense(case)                                                # (B, H, n, n)
    b, h, i, j = (torch.arange(s).view([-1 if d == k else 1 for k in range(4)])
                  for d, s in enumerate(allowed.shape))
    mask_mod, score_mod = flex_mods(case)
    if mask_mod is not None:
        assert torch.equal(mask_mod(b, h, i, j).expand_as(allowed), allowed)
    kw = sdpa_kwargs(case)
    if "attn_mask" in kw and kw["attn_mask"].dtype == torch.bool:
        assert torch.equal(kw["attn_mask"].expand_as(allowed), allowed)
    if mask == "causal":
        assert kw == {"is_causal": True}
    if mask == "alibi":
        _, bias = attnlab_mask(case)
        want = bias.dense(case.n, case.n).expand(allowed.shape).masked_fill(~allowed, float("-inf"))
        torch.testing.assert_close(kw["attn_mask"].expand_as(want), want)
        got = score_mod(torch.zeros(()), b, h, i, j).expand_as(want).masked_fill(~allowed, float("-inf"))
        torch.testing.assert_close(got, want)


def test_tiny_bench_through_cli(tmp_path):
    path = tmp_path / "kernels.json"
    rc = main(["bench", "--n", "128", "--repeats", "1", "--no-flex", "--no-memory", "--dtype", "float32",
               "--mask", "none", "causal", "window", "alibi", "--mode", "fwd", "fwdbwd", "--json", str(path)])
    assert rc == 0
    report = json.loads(path.read_text())
    meta = report["meta"]
    for key in ("torch", "torch_threads", "cpu_model", "date", "command", "gemm_peak_gflops", "mask_kinds", "config"):
        assert key in meta, f"missing meta[{key!r}]"
    assert meta["gemm_peak_gflops"]["float32"] > 0
    rows = report["results"]
    assert {r["contestant"] for r in rows} == {"torch-sdpa", "reference", "sdpa", "tiled", "auto"}
    assert len(rows) == 4 * 2 * 5
    for r in rows:
        assert r["status"] == "ok", r
        for key in ("median_ms", "gflops", "pct_peak", "x_sdpa", "useful_gflop"):
            assert math.isfinite(r[key]) and r[key] > 0, f"{r['contestant']} {r['case']}: {key}={r.get(key)}"
        if r["contestant"] != "torch-sdpa":
            assert r["max_abs_diff_vs_torch_sdpa"] < 1e-3, r
        if r["contestant"] == "auto":          # judged against reference, sdpa and tiled of its case
            assert r["best_exact"] in ("reference", "sdpa", "tiled") and r["auto_vs_best"] > 0


def _rows(auto_ms, **exact_ms):
    rows = [dict(contestant="torch-sdpa", peer=True, status="ok", median_ms=1.0, notes=[]),
            dict(contestant="auto", peer=False, status="ok", median_ms=auto_ms, notes=["auto -> sdpa"], picked="sdpa",
                 case=dict(mask="causal", n=1024, dtype="float32", mode="fwd"))]
    return rows + [dict(contestant=n, peer=False, status="ok", median_ms=t, notes=[]) for n, t in exact_ms.items()]


@pytest.mark.parametrize("auto_ms, within", [(10.0, True), (10.5, True), (10.6, False), (20.0, False)])
def test_auto_verdict_fails_a_slow_pick(auto_ms, within):
    from attnlab.bench.kernels import _add_auto_verdict
    from attnlab.bench.report import format_auto
    rows = _rows(auto_ms, sdpa=10.0, tiled=12.0, linear=1.0)      # linear is approximate: never the yardstick
    _add_auto_verdict(rows)
    auto = rows[1]
    assert auto["best_exact"] == "sdpa" and auto["auto_within"] is within
    assert auto["auto_vs_best"] == pytest.approx(10.0 / auto_ms)
    text = "\n".join(format_auto({"results": rows}))
    assert f"within 5% on {int(within)} of 1 cases" in text and ("yes" if within else "NO") in text


def _timed(rows, **times_ms):
    """Give the named rows per-round times (their median as median_ms), as run_case leaves them."""
    for r in rows:
        if r["contestant"] in times_ms:
            r.update(times_ms=times_ms[r["contestant"]], median_ms=statistics.median(times_ms[r["contestant"]]))
    return rows


def test_auto_verdict_pairs_the_rounds_against_drift():
    # The machine ran 3x slower in the last three rounds: auto, 2% behind sdpa in every round, has the
    # median of a slow round and sdpa of a fast one, so the medians' ratio (0.33) would call it wrong.
    from attnlab.bench.kernels import _add_auto_verdict
    rows = _timed(_rows(1.0, sdpa=1.0, tiled=1.0), sdpa=[10, 10, 10, 30, 30], tiled=[12, 12, 36, 36, 36],
                  auto=[10.2, 10.2, 30.6, 30.6, 30.6])
    _add_auto_verdict(rows)
    auto = rows[1]
    assert auto["best_exact"] == "sdpa" and auto["auto_within"] is True
    assert auto["auto_vs_best"] == pytest.approx(10 / 10.2) and auto["auto_vs_best_medians"] == pytest.approx(10 / 30.6)


@pytest.mark.parametrize("slower, within", [(1.04, True), (1.06, False), (1.5, False)])
def test_auto_verdict_fails_a_pick_slower_in_every_round(slower, within):
    # Pairing must not excuse a slow pick: auto `slower` x sdpa's time in every round, whatever the drift.
    from attnlab.bench.kernels import _add_auto_verdict
    sdpa = [10, 25, 12, 40, 11]
    rows = _timed(_rows(1.0, sdpa=1.0, tiled=1.0), sdpa=sdpa, tiled=[2 * t for t in sdpa],
                  auto=[slower * t for t in sdpa])
    _add_auto_verdict(rows)
    assert rows[1]["auto_within"] is within and rows[1]["auto_vs_best"] == pytest.approx(1 / slower)


def test_auto_gets_no_verdict_without_two_exact_backends():
    from attnlab.bench.kernels import _add_auto_verdict
    rows = _rows(10.0, sdpa=10.0)
    _add_auto_verdict(rows)
    assert "auto_within" not in rows[1]


def test_memory_subprocess_reports_a_positive_peak():
    # The reference holds (B, H, n, n) scores: 4 * 256 * 256 * 4 bytes = 1 MB per copy.
    rep = measure_peak("reference", Case("causal", 256, "float32", "fwd", heads=4, head_dim=16))
    assert "error" not in rep, rep
    assert rep["peak_extra_bytes"] > 0
    assert rep["out_finite"]


def test_power_law_fit_recovers_exponent():
    ns = [512, 1024, 2048, 4096]
    c, p = fit_power_law(ns, [7.0 * n ** 1.7 for n in ns])
    assert math.isclose(p, 1.7, rel_tol=1e-9) and math.isclose(c, 7.0, rel_tol=1e-9)
    fit = extrapolate(ns, [3.0 * n ** 2 + 1e5 for n in ns], 32768)   # a constant offset: fit the top 3
    assert fit["fit_n"] == [1024, 2048, 4096]
    assert 1.9 < fit["exponent"] < 2.0
    assert math.isclose(fit["value"], 3.0 * 32768 ** 2, rel_tol=0.2)
    with pytest.raises(ValueError, match="needs >= 2"):
        fit_power_law([1024], [1.0])


def test_interleaved_timing_runs_round_robin_in_both_orders():
    calls = []
    fns = [lambda: calls.append("a"), lambda: calls.append("b"), lambda: calls.append("c")]
    times = time_interleaved(fns, repeats=3)
    assert calls == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert [len(t) for t in times] == [3, 3, 3] and all(x >= 0 for t in times for x in t)
    calls.clear()
    assert [len(t) for t in time_interleaved(fns, repeats=timing.paired(3))] == [4, 4, 4]
    assert timing.paired(4) == 4 and timing.paired(None) is None
    calls.clear()
    monkey_clock = iter(range(10**6))                      # adaptive: whole pairs of rounds only
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(timing.time, "perf_counter", lambda: float(next(monkey_clock)))
        assert len(time_interleaved(fns[:2])[0]) % 2 == 0


def test_interleaved_timing_cancels_what_ran_before(monkeypatch):
    # A fake clock in which a run costs 1 s when it opens a round and 1.1 s after another run: timed
    # in one fixed order, the second function would look 10% slower than the first; pairs cancel that.
    clock, runs = [0.0], [0]

    def run():
        clock[0] += 1.0 if runs[0] % 2 == 0 else 1.1
        runs[0] += 1

    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
    ta, tb = time_interleaved([run, run], repeats=4)
    assert sorted(ta) == pytest.approx([1.0, 1.0, 1.1, 1.1]) and sorted(tb) == pytest.approx([1.0, 1.0, 1.1, 1.1])
    assert statistics.median(b / a for a, b in zip(ta, tb)) == pytest.approx((1.1 + 1 / 1.1) / 2)  # ~1.005


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mkl_half_gemm_is_the_product(dtype):
    gemm = timing._mkl_half_gemm(dtype)
    if gemm is None:
        pytest.skip(f"this torch build exports no {timing._MKL_HALF_GEMMS[dtype]}")
    a, b = torch.randn(33, 20).to(dtype), torch.randn(20, 47).to(dtype)     # odd sizes: lda, ldb, ldc
    out = gemm(a, b)
    assert out.dtype == torch.float32 and out.shape == (33, 47)
    torch.testing.assert_close(out, a.double().matmul(b.double()).float(), atol=1e-4, rtol=1e-5)


def test_a_half_precision_peak_is_the_faster_of_torch_and_mkl(monkeypatch):
    """bf16 and fp16 peaks take MKL's GEMM where torch's matmul is a slow fallback (both off AVX-512 on the
    Zen 3): a peak from the fallback alone made an fp16 SDPA row read 2,362% of it. fp32 has no MKL half GEMM."""
    called = []
    monkeypatch.setattr(timing, "_affordable_size", lambda gemm, dtype, size: 8)
    monkeypatch.setattr(timing.torch, "matmul", lambda a, b: called.append("torch"))
    monkeypatch.setattr(timing, "_mkl_half_gemm",
                        lambda dtype: None if dtype == torch.float32 else (lambda a, b: called.append("mkl")))
    seconds = {"torch": 1.0, "mkl": 0.01}

    def fake_time(fn, repeats):
        fn()
        s = seconds[called[-1]]
        return timing.Timing(s, [s], s)
    monkeypatch.setattr(timing, "time_median", fake_time)
    gflop = 2 * 8 ** 3 / 1e9
    for dtype in (torch.float16, torch.bfloat16):
        assert timing.gemm_peak_gflops(dtype) == pytest.approx(gflop / 0.01)
    assert timing.gemm_peak_gflops(torch.float32) == pytest.approx(gflop / 1.0)


def test_a_slow_gemm_is_measured_at_a_smaller_size(monkeypatch):
    """A GEMM whose 256^3 probe says a 2048^3 call takes minutes (torch's bf16 fallback off AVX-512) is
    timed at a size whose call fits MAX_CALL_S; a fast one at the size asked."""
    clock = iter(range(1000))
    monkeypatch.setattr(timing.time, "perf_counter", lambda: float(next(clock)))    # every call: 1 s
    assert timing._affordable_size(lambda a, b: None, torch.float32, 2048) == 256
    monkeypatch.setattr(timing.time, "perf_counter", lambda: 0.0)                   # every call: free
    assert timing._affordable_size(lambda a, b: None, torch.float32, 2048) == 2048


def test_every_report_footer_warns_of_a_busy_machine_the_same_way():
    from attnlab.measure.machine import BUSY_WARN, busy_warning
    assert busy_warning({"load": {"other_cpu_fraction": 0.6}}) == [
        "WARNING: other processes used 60% of the CPUs during this run; the timings are not trustworthy, "
        "rerun on an idle machine"]
    for quiet in ({}, {"load": None}, {"load": {"other_cpu_fraction": None}},
                  {"load": {"other_cpu_fraction": BUSY_WARN}}):
        assert busy_warning(quiet) == []


def test_the_footer_notes_freed_memory_the_host_took_back_during_the_run():
    from attnlab.measure.machine import RECLAIM_NOTE_MIB, run_warnings
    for load, noted in (({"free_page_reporting": True, "host_reclaimed_mib": 11276.0}, "11,276 MiB"),
                        ({"free_page_reporting": True, "host_reclaimed_mib": None}, "an unknown amount"),
                        ({"free_page_reporting": True, "host_reclaimed_mib": RECLAIM_NOTE_MIB - 1.0}, None),
                        ({"free_page_reporting": False, "host_reclaimed_mib": 11276.0}, None), ({}, None)):
        lines = run_warnings({"load": {"other_cpu_fraction": 0.0, **load}})
        if noted is None:
            assert lines == [], (load, lines)
        else:
            assert len(lines) == 1 and noted in lines[0] and "MALLOC_MMAP_MAX_=0" in lines[0], (load, lines)
    busy = run_warnings({"load": {"other_cpu_fraction": 0.6, "free_page_reporting": True, "host_reclaimed_mib": 2e3}})
    assert [line.split(":")[0] for line in busy] == ["WARNING", "NOTE"]


def test_the_load_monitor_reads_free_page_reporting_from_the_balloon_and_the_kernel(tmp_path, monkeypatch):
    from attnlab.measure import machine
    dev, counter = tmp_path / "virtio_balloon" / "virtio0", tmp_path / "reported_kib"
    dev.mkdir(parents=True)
    (dev / "features").write_text("0000010000000000\n")         # bit 5: VIRTIO_BALLOON_F_REPORTING
    counter.write_text("1000\n")
    monkeypatch.setattr(machine, "_BALLOON", str(tmp_path / "virtio_balloon"))
    monkeypatch.setattr(machine, "_REPORTED_KIB", str(counter))
    mon = machine.LoadMonitor()
    counter.write_text(f"{1000 + 3 * 1024}\n")
    load = mon.stop()
    assert load["free_page_reporting"] is True and load["host_reclaimed_mib"] == 3.0
    (dev / "features").write_text("0000000000000000\n")
    counter.unlink()                                              # a kernel that does not count them
    load = machine.LoadMonitor().stop()
    assert load["free_page_reporting"] is False and load["host_reclaimed_mib"] is None
