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
    assert set(SWITCHES.values()) == {"--minilm", "--lm", "--hf", "--ring", "--complexity", "--favor-accuracy",
                                      "--memory-scaling"}
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
