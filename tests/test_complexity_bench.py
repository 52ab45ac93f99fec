"""The complexity and FAVOR+ accuracy benchmarks run end to end on tiny sizes.

No timing is asserted (the machine may be busy): only that every number exists and makes sense,
that points over a budget are skipped with a note instead of crashing, and that the files appear.
"""
import json
import math

import pytest

from attnlab.bench.accuracy import AccuracyConfig, format_accuracy, plot_accuracy, run_favor_accuracy
from attnlab.bench.complexity import (SERIES, ComplexityConfig, _predicted_s, format_complexity, plot_complexity,
                                      run_complexity)
from attnlab.cli import main
from attnlab.functional import available_backends

TINY = dict(n=[64, 128], long_n=[256], fit_min_n=64, causal_n=256, sparse_n=256, repeats=1, memory=False)
PNG = b"\x89PNG"


def _png(path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == PNG


def test_every_series_timed_fitted_and_plotted(tmp_path):
    rep = run_complexity(ComplexityConfig(**TINY))
    for name, s in rep["series"].items():
        if SERIES[name][0] not in available_backends():
            assert "not registered" in s["note"]
            continue
        ns = [p["n"] for p in s["points"]]
        assert ns == ([64, 128, 256] if name in ("sparse", "linear") else [64, 128]), f"{name}: {ns}"
        assert all(p["median_s"] > 0 for p in s["points"])
        assert math.isfinite(s["fit"]["alpha"]) and s["fit"]["fit_n"] == ns
    causal = rep["targets"]["causal_fwdbwd"]
    assert causal["linear"]["median_s"] > 0 and causal["ratio"] > 0
    text = format_complexity(rep)
    assert "time ~ n^" in text and "not judged" in text, text
    paths = plot_complexity(rep, str(tmp_path / "c"))
    assert [p.rsplit("-", 1)[1] for p in paths] == ["time.png"] and all(_png(p) for p in paths)


def test_budgets_skip_points_with_a_note():
    cfg = ComplexityConfig(**{**TINY, "n": [64, 128, 256], "long_n": [], "series": ["tiled"],
                              "run_budget_s": 1e-9, "targets": False})
    pts = run_complexity(cfg)["series"]["tiled"]["points"]
    assert "median_s" in pts[0]
    assert all("predicted" in p["note"] and "median_s" not in p for p in pts[1:]), pts
    cfg = ComplexityConfig(**{**TINY, "series": ["reference"], "memory_limit_gb": 1e-6, "targets": False})
    rep = run_complexity(cfg)
    assert all("would need" in p["note"] for p in rep["series"]["reference"]["points"])
    assert "skipped" in format_complexity(rep)


def test_prediction_uses_the_last_two_points():
    pts = [{"n": 1024, "median_s": 1.0}, {"n": 2048, "median_s": 4.0}]
    assert math.isclose(_predicted_s(pts, 4096), 16.0)
    assert math.isclose(_predicted_s(pts[:1], 2048), 4.0)            # one point: assume n^2
    assert _predicted_s([], 2048) is None


def test_memory_is_measured_in_a_subprocess():
    cfg = ComplexityConfig(**{**TINY, "series": ["linear"], "memory": True, "memory_n": [128], "long_n": [],
                              "targets": False})
    pts = run_complexity(cfg)["series"]["linear"]["points"]
    assert "peak_extra_bytes" not in pts[0] and pts[1]["peak_extra_bytes"] > 0


def test_favor_accuracy_report(tmp_path):
    rep = run_favor_accuracy(AccuracyConfig(features=[16, 256], seeds=2, n=64, heads=1, stds=[0.5]))
    (reg,) = rep["regimes"]
    assert reg["favor"][1]["median"] < reg["favor"][0]["median"], "more features, smaller error"
    assert 0 < reg["elu_error"] < 1
    assert "elu + 1" in format_accuracy(rep)
    assert _png(plot_accuracy(rep, str(tmp_path / "a.png")))


def test_cli_favor_accuracy_quick(tmp_path, capsys):
    path = tmp_path / "fa.json"
    assert main(["bench", "--favor-accuracy", "--quick", "--json", str(path)]) == 0
    assert "features m" in capsys.readouterr().out
    assert json.loads(path.read_text())["regimes"] and _png(tmp_path / "fa.png")


@pytest.mark.slow
def test_cli_complexity_quick(tmp_path, capsys):
    path = tmp_path / "cx.json"
    assert main(["bench", "--complexity", "--quick", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "issue #4 targets" in out and "peak extra memory" in out
    rep = json.loads(path.read_text())
    assert set(rep["series"]) == {"reference", "sdpa", "tiled", "sparse", "linear"}
    assert _png(tmp_path / "cx-time.png") and _png(tmp_path / "cx-memory.png")
