"""Training the code GPT for a fixed number of steps (scripts/code_budget.py), and judging its checkpoints."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from attnlab.lab import code_train
from attnlab.lab.exp_code import CODE_QUICK
from attnlab.tasks.code import prepare_code_data

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "code_budget.py"
CFG = code_train.CodeTrainConfig("code-small", 600_000, 300, 1.0, batch_size=2)   # 6 held-out prompts


@pytest.fixture(scope="module")
def data():
    return prepare_code_data(CFG.max_bytes, CFG.vocab_size)


@pytest.fixture(scope="module")
def fixed_run(tmp_path_factory, data):
    out = tmp_path_factory.mktemp("work") / f"code-{CFG.tag()}-gpt"      # where code_models would look
    return out, code_train.train_code_model("gpt", CFG, out, data, steps=6, checkpoints=3)


def test_fixed_steps_train_exactly_and_checkpoint_evenly(fixed_run):
    out, record = fixed_run
    assert record["steps"] == 6 and record["steps_from"] == "fixed" and record["cpu_s_per_step"] is None
    assert sorted(p.name for p in out.glob("step-*")) == ["step-000002", "step-000004", "step-000006"]
    assert json.loads((out / "code-budget.json").read_text())["config"] == asdict(CFG)


def test_a_fixed_steps_run_is_never_reused_as_a_budget_run(fixed_run, monkeypatch):
    """Its config matches, but its length was not the budget's: code_models trains again."""
    out, _ = fixed_run
    trained = []

    class Stop(Exception):
        pass

    def train(arch, cfg, where, data=None, **kw):
        trained.append((arch, where))
        raise Stop

    monkeypatch.setattr(code_train, "train_code_model", train)
    with pytest.raises(Stop):
        code_train.code_models(CFG, out.parent)
    assert trained == [("gpt", out)]


@pytest.mark.parametrize("steps, checkpoints", [(2, 3), (5, 0)])
def test_steps_must_cover_the_checkpoints(tmp_path, steps, checkpoints):
    with pytest.raises(ValueError, match=f"steps={steps}, checkpoints={checkpoints}"):
        code_train.train_code_model("gpt", CFG, tmp_path / "run", steps=steps, checkpoints=checkpoints)
    assert not (tmp_path / "run").exists()


def test_script_judges_a_checkpoint_as_the_claims_do(fixed_run, data):
    spec = importlib.util.spec_from_file_location("code_budget", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out, _ = fixed_run
    cfg = replace(CODE_QUICK, prompts=2, max_new_tokens=8, windows=4)
    row = script.judge_checkpoint(out / "step-000006", data, cfg)
    assert row["checkpoint"] == "step-000006" and row["prompts"] == 2 and 0 <= row["gpt_syntax_rate"] <= 1
    for name, labels in (("brackets", 2), ("def_use", 3)):          # the judges' checks, one per criterion part
        assert len(row[name]["checks"]) == labels and row[name]["head"].startswith("L")
        assert row[name]["passed"] == all(c["passed"] for c in row[name]["checks"])
    assert not row["brackets"]["passed"]                               # 6 steps track no nesting


@pytest.mark.parametrize("args, message", [
    (["--steps", "2", "--checkpoints", "3"], "--steps (2) must be >= --checkpoints (3)"),
    ([], "give --cpu-budget or --steps to train, or --judge-only"),
    (["--steps", "9", "--judge-only"], "not allowed with argument"),
    (["--steps", "9", "--cpu-budget", "60"], "not allowed with argument"),
    (["--cpu-budget", "0"], "--cpu-budget must be > 0 CPU-seconds, got 0.0"),
])
def test_script_rejects_bad_arguments(tmp_path, args, message, capsys):
    """In this process (main(argv)); the test below runs the script as a user does."""
    with pytest.raises(SystemExit) as stop:
        _script().main([*args, "--out", str(tmp_path / "out")])
    assert stop.value.code == 2 and message in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_script_judge_only_needs_checkpoints(tmp_path):
    run = subprocess.run([sys.executable, str(SCRIPT), "--judge-only", "--out", str(tmp_path)],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 2 and f"no checkpoints in {tmp_path / 'gpt'}" in run.stderr


def _script():
    spec = importlib.util.spec_from_file_location("code_budget", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


@pytest.fixture(scope="module")
def pair_run(tmp_path_factory, data):
    out = tmp_path_factory.mktemp("pair")
    for arch in ("gpt", "lstm"):
        code_train.train_code_model(arch, CFG, out / arch, data, steps=4, checkpoints=2)
    return out


def test_script_judges_every_claim_at_each_pair_of_checkpoints(pair_run, data):
    cfg = replace(CODE_QUICK, train=CFG, prompts=2, max_new_tokens=8, windows=4)
    judged = _script().judge_runs(pair_run, data, cfg)
    rows = judged["checkpoints"]
    assert [(r["fraction"], r["step"]) for r in rows] == [("1/2", 2), ("2/2", 4)]
    assert [r["syntax"]["lstm_checkpoint"] for r in rows] == ["step-000002", "step-000004"]
    assert set(rows[-1]["syntax"]["rates"]) == {"gpt", "lstm", "bigram"}
    assert rows[-1]["syntax"]["rates"]["gpt"] == (rows[-1]["gpt_syntax_rate"] or 0.0)
    assert judged["verdict"] == {k: rows[-1][k]["passed"] for k in ("brackets", "def_use", "scope", "syntax")}
    assert judged["runs"]["gpt"]["steps"] == judged["runs"]["lstm"]["steps"] == 4
    assert judged["machine"]["cpu_model"] and "code_budget.py" in judged["machine"]["command"]


def test_script_refuses_unpaired_checkpoints(pair_run, data, tmp_path):
    import shutil
    out = tmp_path / "run"
    shutil.copytree(pair_run, out)
    shutil.rmtree(out / "lstm" / "step-000002")
    with pytest.raises(ValueError, match="2 GPT checkpoints but 1 LSTM checkpoints"):
        _script().judge_runs(out, data, replace(CODE_QUICK, train=CFG))
