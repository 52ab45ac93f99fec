"""``attnlab bench``'s benchmarks: each switch runs its own entry of the table, one per run.

The benchmarks themselves are tested in test_bench.py, test_complexity_bench.py, test_lm_bench.py, ...;
here their runners are replaced by stand-ins that record the call, so every flag's dispatch is checked
in milliseconds (including --memory-scaling and --device cuda, too slow or impossible to run here).
"""
import itertools
import json

import pytest

from attnlab.cli import bench as cli_bench
from attnlab.cli import main
from attnlab.cli.bench import BENCHMARKS, Benchmark

SWITCHES = {name: b.flag for name, b in BENCHMARKS.items() if b.help is not None}


def _stand_in(name, calls):
    def run(args):
        calls.append(name)
        return {"meta": {"which": name}}, f"table of {name}\n", args.json, []
    return run


@pytest.fixture
def calls(monkeypatch):
    """Every runner (the table's and the kernel table's) replaced by one that records its name."""
    seen: list[str] = []
    for name, b in BENCHMARKS.items():
        monkeypatch.setitem(BENCHMARKS, name, Benchmark(b.flag, _stand_in(name, seen), b.help))
    monkeypatch.setattr(cli_bench, "_kernels", _stand_in("kernels", seen))
    return seen


@pytest.mark.parametrize("argv, expected", [
    ([], "kernels"),
    (["--device", "cuda"], "gpu"),
    (["--device", "cpu"], "kernels"),
    *[([flag], name) for name, flag in SWITCHES.items()],
])
def test_each_flag_runs_its_own_benchmark(argv, expected, calls, tmp_path, capsys):
    path = tmp_path / "out.json"
    assert main(["bench", *argv, "--json", str(path)]) == 0
    assert calls == [expected]
    assert json.loads(path.read_text())["meta"]["which"] == expected
    assert f"table of {expected}" in capsys.readouterr().out


def test_the_published_switches_are_all_in_the_table():
    # the commands in README.md and docs/benchmarks.md
    assert set(SWITCHES.values()) == {"--minilm", "--lm", "--hf", "--ring", "--plan", "--complexity",
                                      "--favor-accuracy", "--memory-scaling"}
    assert BENCHMARKS["gpu"].flag == "--device cuda"


@pytest.mark.parametrize("a, b", list(itertools.combinations(["--device cuda", *SWITCHES.values()], 2)))
def test_two_benchmarks_at_once_are_refused_naming_both(a, b, calls, capsys):
    assert main(["bench", *a.split(), *b.split()]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab: error: ") and a in err and b in err and "one of them per run" in err
    assert calls == []                                                      # refused before anything runs


def test_a_repeated_switch_is_one_benchmark(calls, tmp_path):
    assert main(["bench", "--lm", "--lm", "--json", str(tmp_path / "x.json")]) == 0
    assert calls == ["lm"]


def test_help_groups_the_switches(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = capsys.readouterr().out
    group = out[out.index("instead of the kernel table (one per run)"):]
    assert all(flag in group for flag in SWITCHES.values())


# -- the report's path, checked before the run; results that survive a failing disk (issue #28) ---------------
@pytest.mark.parametrize("argv", [[], ["--lm"], ["--complexity"], ["--device", "cuda"]])
def test_a_json_path_that_is_a_directory_is_refused_before_running(argv, calls, tmp_path, capsys):
    assert main(["bench", *argv, "--json", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab: error: --json ") and "is a directory" in err and "Traceback" not in err
    assert calls == []                                                      # nothing ran, nothing was lost


def test_an_unwritable_json_path_is_refused_before_running(calls, capsys):
    assert main(["bench", "--lm", "--json", "/proc/attnlab-bench/lm.json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab: error: --json /proc/attnlab-bench/lm.json") and "writable" in err
    assert calls == []


def test_the_default_json_path_is_checked_and_written(calls, tmp_path, monkeypatch):
    from attnlab.bench.gpu import DEFAULT_GPU_JSON
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--ring"]) == 0
    assert json.loads((tmp_path / cli_bench.DEFAULT_RING_JSON).read_text())["meta"]["which"] == "ring"
    # the rule _json_path checks by (bench-results/<name>.json) is every default the runners write to
    defaults = {"kernels": cli_bench.DEFAULT_KERNELS_JSON, "memory-scaling": cli_bench.DEFAULT_SCALING_JSON,
                "complexity": cli_bench.DEFAULT_COMPLEXITY_JSON, "favor-accuracy": cli_bench.DEFAULT_ACCURACY_JSON,
                "minilm": cli_bench.DEFAULT_MINILM_JSON, "lm": cli_bench.DEFAULT_LM_JSON,
                "hf": cli_bench.DEFAULT_HF_JSON, "ring": cli_bench.DEFAULT_RING_JSON,
                "plan": cli_bench.DEFAULT_PLAN_JSON, "gpu": DEFAULT_GPU_JSON}
    assert defaults.keys() == set(BENCHMARKS) | {"kernels"}
    assert all(path == f"bench-results/{name}.json" for name, path in defaults.items())


def test_a_json_write_that_fails_at_the_end_still_prints_the_results(calls, tmp_path, monkeypatch, capsys):
    import errno

    import attnlab.bench as bench_pkg

    def full_disk(report, path):
        raise OSError(errno.ENOSPC, "No space left on device", path)
    monkeypatch.setattr(bench_pkg, "write_json", full_disk, raising=False)
    path = tmp_path / "lm.json"
    assert main(["bench", "--lm", "--json", str(path)]) == 1
    out, err = capsys.readouterr()
    assert "table of lm" in out                                             # the results, on stdout
    assert err.startswith(f"attnlab: error: could not write --json {path} (No space left on device)")
    assert "the results are the table above" in err and "Traceback" not in err


def test_plots_that_cannot_be_written_leave_the_numbers(caplog):
    def draw():
        raise OSError(28, "No space left on device", "c-time.png")
    assert cli_bench._plots(draw) == []
    assert "the plots could not be written (No space left on device: c-time.png)" in caplog.text


# -- limits are numbers that mean something ------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["--memory-limit-gb", "-1"], "--memory-limit-gb must be a positive number, got -1"),
    (["--memory-limit-gb", "0"], "--memory-limit-gb must be a positive number, got 0"),
    (["--memory-limit-gb", "nan"], "--memory-limit-gb must be a positive number, got nan"),
    (["--memory-limit-gb", "inf"], "--memory-limit-gb must be a positive number, got inf"),
    (["--complexity", "--run-budget-s", "0"], "--run-budget-s must be a positive number"),
])
def test_limits_and_sizes_are_checked_before_running(argv, message, calls, tmp_path, capsys):
    assert main(["bench", *argv, "--json", str(tmp_path / "x.json")]) == 2
    assert f"attnlab: error: {message}" in capsys.readouterr().err
    assert calls == []


# -- --memory-limit-gb counts the inputs, and a case over it allocates nothing --------------------------------
def _no_inputs(monkeypatch):
    """Make any allocation of a case's q, k, v fail the test (instead of taking 20 GB of memory)."""
    import attnlab.bench.kernels as kernels

    def refuse(case, seed=0):
        raise AssertionError(f"inputs allocated for {case.label()}")
    monkeypatch.setattr(kernels, "make_inputs", refuse)
    monkeypatch.setattr(kernels, "gemm_peak_gflops", lambda dtype: 100.0)


def test_the_memory_limit_counts_the_inputs():
    from attnlab.bench.cases import Case
    from attnlab.bench.contestants import estimate_peak_bytes, input_bytes, memory_skip_reason
    case = Case("causal", 1 << 14, "float32", "fwd")                     # q, k, v: 3 x 33.6 MB
    step, inputs = estimate_peak_bytes("tiled", case), input_bytes(case)
    assert inputs == 3 * 8 * (1 << 14) * 64 * 4
    limit_gb = (step + inputs / 2) / 1e9                                  # the step fits, step + inputs do not
    why = memory_skip_reason("tiled", case, limit_gb)
    assert why is not None and "inputs q, k, v 0.101 GB" in why, why
    assert memory_skip_reason("tiled", case, (step + inputs) * 1.01 / 1e9) is None
    grads = Case("causal", 1 << 14, "float32", "fwdbwd")
    assert input_bytes(grads) == 4 * 8 * (1 << 14) * 64 * 4               # and the upstream gradient


def test_a_case_over_the_limit_is_skipped_without_allocating(monkeypatch):
    from attnlab.bench.cases import Case
    from attnlab.bench.kernels import BenchConfig, run_case
    _no_inputs(monkeypatch)
    cfg = BenchConfig(n=[10_000_000], backends=["reference", "tiled"], flex=False, reference_max_n=None)
    rows = run_case(Case("none", 10_000_000, "float32", "fwd"), cfg)
    assert [r["contestant"] for r in rows] == ["torch-sdpa", "reference", "tiled"]
    assert all(r["status"] == "skipped" and "inputs q, k, v 61.4 GB" in r["notes"][0] for r in rows), rows


def test_a_run_where_nothing_fits_is_refused_up_front(monkeypatch, tmp_path, capsys):
    _no_inputs(monkeypatch)
    path = tmp_path / "k.json"
    rc = main(["bench", "--n", "10000000", "--backend", "reference", "--no-flex", "--json", str(path)])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("attnlab: error: nothing would run: the smallest case, ") and \
        "inputs q, k, v 61.4 GB" in err and "raise --memory-limit-gb" in err, err
    assert not path.exists()


def test_complexity_targets_respect_the_memory_limit(tmp_path, capsys):
    path = tmp_path / "c.json"
    assert main(["bench", "--complexity", "--quick", "--memory-limit-gb", "1e-6", "--json", str(path)]) == 0
    targets = json.loads(path.read_text())["targets"]
    assert "would need" in targets["causal_fwdbwd"]["note"] and "linear" not in targets["causal_fwdbwd"]
    assert "would need" in targets["sparse_vs_sdpa_dense"]["note"]
    assert "causal fwd+bwd n=2048: linear skipped: would need" in capsys.readouterr().out
