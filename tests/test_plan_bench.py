"""attnlab bench --plan: a quick run through the CLI (both sides' outputs identical), and its refusals."""
import json

import pytest

from attnlab.bench.plan import PlanBenchConfig, _document_ids, format_plan
from attnlab.cli import main


def test_document_ids_pack_the_asked_number_of_documents():
    import torch
    ids = _document_ids(3, 20, 4, torch.Generator().manual_seed(0))                # (3, 20)
    assert ids.shape == (3, 20)
    for row in ids:
        assert row[0] == 0 and row[-1] == 3 and (row.diff() >= 0).all() and (row.diff() <= 1).all()


def test_cli_quick_times_both_sides_with_the_same_outputs(tmp_path, capsys):
    path = tmp_path / "plan.json"
    assert main(["bench", "--plan", "--quick", "--n", "32", "--backend", "tiled", "--repeats", "1",
                 "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    assert [r["backend"] for r in report["rows"]] == ["tiled", "native", "auto"]   # encoder, GPT step, decision
    assert report["rows"][-1]["workload"].startswith("auto's decision")
    assert all(r["identical"] and r["kept_ms"] > 0 and r["fresh_ms"] > 0 for r in report["rows"])
    out = capsys.readouterr().out
    assert "fresh / kept" in out and "NO" not in out.split("\n\n")[0]
    assert "encoder 12 layers" in format_plan(report)


@pytest.mark.parametrize("argv, message", [
    (["--docs", "40", "--n", "32"], "--docs (40) must be between 1 and --n (32)"),
    (["--n", "32", "64"], "--plan times one sequence length"),
])
def test_bad_sizes_are_refused_with_the_flag_names(argv, message, tmp_path, capsys):
    assert main(["bench", "--plan", "--quick", *argv, "--json", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab: error: ") and message in err


def test_config_checks_its_documents():
    with pytest.raises(ValueError, match="--docs"):
        PlanBenchConfig(n=8, docs=9)
