"""attnlab train / generate: a few steps end to end, resume, streaming output, stop strings, errors."""
from __future__ import annotations

import json
import os
import re
import signal
import sys

import pytest

from attnlab.cli import main
from attnlab.cli.generate import stream_with_stops

TEXT = "".join(f"def f{i}(x):\n    return x * {i % 7} + {i % 5}\n\n" for i in range(80))
TRAIN = ["--preset", "nano", "--max-len", "16", "--batch-size", "4", "--eval-iters", "2", "--eval-interval", "2",
         "--no-progress"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    (root / "code.txt").write_text(TEXT)
    out = root / "run"
    assert main(["train", "gpt", "--data", str(root / "code.txt"), "--steps", "4", "--out", str(out), *TRAIN]) == 0
    return out


class Recorder:
    """Stands in for sys.stdout and keeps every write, to see that text arrives piece by piece."""

    def __init__(self):
        self.writes: list[str] = []

    def write(self, s):
        self.writes.append(s)

    def flush(self):
        pass


def generate(monkeypatch, *argv) -> tuple[int, Recorder]:
    rec = Recorder()
    monkeypatch.setattr(sys, "stdout", rec)
    rc = main(["generate", *argv])
    monkeypatch.undo()
    return rc, rec


def test_train_writes_checkpoint_metrics_and_plot(run_dir, capsys):
    assert (run_dir / "step-000004" / "model.safetensors").is_file()
    assert (run_dir / "metrics.jsonl").is_file() and (run_dir / "loss.png").is_file()
    assert main(["train", "gpt", "--out", str(run_dir.parent / "run"), "--resume", "--steps", "6", *TRAIN[-1:]]) == 0
    out = capsys.readouterr().out
    assert "step 6: validation loss" in out and "nats/char" in out
    assert (run_dir / "step-000006").is_dir()


def test_generate_streams_tokens_and_is_seeded(run_dir, monkeypatch):
    rc, rec = generate(monkeypatch, str(run_dir), "--prompt", "def f", "--max-new-tokens", "30", "--seed", "1")
    assert rc == 0
    text = "".join(rec.writes)
    assert text.startswith("def f") and len(text) == len("def f") + 30 + 1        # char-level: 30 characters, "\n"
    assert sum(1 for w in rec.writes if w) >= 30                     # one write per token, not one at the end
    rc, again = generate(monkeypatch, str(run_dir), "--prompt", "def f", "--max-new-tokens", "30", "--seed", "1")
    assert "".join(again.writes) == text


def test_stop_string_ends_generation_before_it(run_dir, monkeypatch):
    args = [str(run_dir), "--prompt", "def", "--max-new-tokens", "40", "--seed", "3", "--no-echo"]
    _, free = generate(monkeypatch, *args)
    full = "".join(free.writes)[:-1]
    stop = full[10:12]
    _, stopped = generate(monkeypatch, *args, "--stop", stop)
    assert "".join(stopped.writes) == full[: full.index(stop)] + "\n"


def test_stream_with_stops_holds_back_partial_matches():
    assert "".join(stream_with_stops(["ab", "c\n", "\nde"], ["\n\n"])) == "abc"
    pieces = list(stream_with_stops(["a", "\n", "b", "\n", "\n", "zz"], ["\n\n", "QQ"]))
    assert pieces == ["a", "\nb", ""]                                               # "\n" held until "b" arrives
    assert "".join(stream_with_stops(["xy", "z"], [])) == "xyz"


def test_generate_errors_and_long_prompt(run_dir, monkeypatch, capsys):
    rc, _ = generate(monkeypatch, str(run_dir), "--prompt", "déf ✓")
    assert rc == 2 and "does not know 'é', '✓'" in capsys.readouterr().err
    rc, _ = generate(monkeypatch, str(run_dir.parent / "nowhere"))
    assert rc == 2 and "no checkpoint" in capsys.readouterr().err
    rc, rec = generate(monkeypatch, str(run_dir), "--prompt", "x" * 40, "--max-new-tokens", "3", "--seed", "0")
    assert rc == 0 and "only its last 16 tokens are used" in capsys.readouterr().err
    assert "".join(rec.writes).startswith("x" * 40)


def test_train_errors(tmp_path, capsys):
    assert main(["train", "gpt", "--data", str(tmp_path / "missing.txt"), "--steps", "2", *TRAIN]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["train", "gpt", "--preset", "huge"])
    assert e.value.code == 2 and "invalid choice: 'huge'" in capsys.readouterr().err
    assert main(["train", "gpt", "--resume", "--out", str(tmp_path)]) == 2
    assert "no checkpoint" in capsys.readouterr().err


def test_bpe_run_generates_any_text(tmp_path, monkeypatch):
    (tmp_path / "c.txt").write_text(TEXT)
    out = tmp_path / "bpe"
    assert main(["train", "gpt", "--data", str(tmp_path / "c.txt"), "--tokenizer", "bpe", "--vocab-size", "280",
                 "--steps", "2", "--out", str(out), *TRAIN]) == 0
    rc, rec = generate(monkeypatch, str(out), "--prompt", "déf ✓", "--max-new-tokens", "5", "--seed", "0")
    assert rc == 0 and "".join(rec.writes).startswith("déf ✓")


# -- behaviour that must not surprise (issue #18) ------------------------------------------------------------
def _tree(path):
    """{relative path: bytes} of every file under path: to see that a run was left untouched."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_resume_into_another_out_leaves_the_source_run_untouched(tmp_path, capsys):
    (tmp_path / "code.txt").write_text(TEXT)
    src, dst = tmp_path / "src", tmp_path / "dst"
    assert main(["train", "gpt", "--data", str(tmp_path / "code.txt"), "--steps", "4", "--checkpoint-interval", "2",
                 "--out", str(src), *TRAIN]) == 0
    before = _tree(src)
    # the stored out_dir names src: a resume must still write where --out says, and prune nothing there
    assert main(["train", "gpt", "--resume", str(src), "--out", str(dst), "--steps", "8",
                 "--checkpoint-interval", "2", *TRAIN[-1:]]) == 0
    assert _tree(src) == before                                             # not one byte changed, nothing pruned
    assert [p.name for p in sorted(dst.glob("step-*"))] == ["step-000006", "step-000008"]
    steps = [json.loads(line)["step"] for line in (dst / "metrics.jsonl").read_text().splitlines()
             if "loss" in json.loads(line)]
    assert steps == list(range(1, 9))                                        # the branch's log: source history first
    assert "-> " + str(dst) in capsys.readouterr().err
    # an older checkpoint of src, branched into a directory holding another run's checkpoints: refused
    assert main(["train", "gpt", "--resume", str(src / "step-000002"), "--out", str(dst), "--steps", "6",
                 *TRAIN[-1:]]) == 2
    assert "already holds checkpoints of another run" in capsys.readouterr().err
    assert _tree(src) == before


def test_resume_defaults_to_the_checkpoints_own_directory(tmp_path, monkeypatch, capsys):
    (tmp_path / "code.txt").write_text(TEXT)
    monkeypatch.chdir(tmp_path)
    assert main(["train", "gpt", "--data", "code.txt", "--steps", "2", "--out", "runA", *TRAIN]) == 0
    moved = tmp_path / "elsewhere" / "runB"
    moved.parent.mkdir()
    (tmp_path / "runA").rename(moved)          # the stored out_dir "runA" (relative to the cwd) is gone
    assert main(["train", "gpt", "--resume", "elsewhere/runB/step-000002", "--steps", "3", *TRAIN[-1:]]) == 0
    assert (moved / "step-000003").is_dir() and not (tmp_path / "runA").exists()
    assert main(["train", "gpt", "--resume", "--steps", "4", *TRAIN[-1:]]) == 2
    assert "--resume needs the run to continue" in capsys.readouterr().err


@pytest.mark.parametrize("argv, flag", [
    (["--time-limit", "-1"], "--time-limit must be a positive number"),
    (["--warmup", "-3"], "--warmup must be >= 0"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--eval-iters", "0"], "--eval-iters must be >= 1"),
    (["--lr", "1e-6"], "--lr"),                                              # below the preset's min_lr
    (["--out", "README.md"], "--out README.md is a file"),
    (["--out", "/proc/nope"], "--out /proc/nope: /proc is not writable"),
])
def test_train_errors_name_flags(tmp_path, monkeypatch, capsys, argv, flag):
    (tmp_path / "code.txt").write_text(TEXT)
    (tmp_path / "README.md").write_text("a file, not a run directory")
    monkeypatch.chdir(tmp_path)
    rc = main(["train", "gpt", "--data", "code.txt", "--steps", "2", *TRAIN, *argv])
    err = capsys.readouterr().err
    assert rc == 2 and f"attnlab: error: {flag}" in err and "Traceback" not in err, err
    assert not re.search(r"\b(time_limit_min|warmup_steps|batch_size|eval_iters)\b", err), err
    if "--lr" in argv:
        assert "is below min_lr=" in err and "give a larger --lr" in err


def test_time_limit_wins_over_a_presets_step_count():
    from attnlab.cli import build_parser
    from attnlab.cli.train import _overrides
    from attnlab.tasks import get_spec
    from attnlab.train import TrainConfig
    args = build_parser().parse_args(["train", "gpt", "--preset", "nano", "--time-limit", "1"])
    cfg = TrainConfig(**{**get_spec("gpt").defaults_for(args), **_overrides(args)})
    assert cfg.steps is None and cfg.time_limit_min == 1.0                    # sized to fit the minute, not 500 steps
    both = build_parser().parse_args(["train", "gpt", "--preset", "nano", "--time-limit", "1", "--steps", "50"])
    cfg = TrainConfig(**{**get_spec("gpt").defaults_for(both), **_overrides(both)})
    assert (cfg.steps, cfg.time_limit_min) == (50, 1.0)                        # both: whichever comes first


def test_ctrl_c_in_train_saves_and_exits_130(tmp_path, monkeypatch, capsys):
    from attnlab.train import load_checkpoint
    from attnlab.train.trainer import Trainer
    (tmp_path / "code.txt").write_text(TEXT)
    real = Trainer._train_step

    def step_then_interrupt(self):
        loss = real(self)
        if self.step == 1:
            os.kill(os.getpid(), signal.SIGINT)                               # as Ctrl-C would, during step 2
        return loss

    monkeypatch.setattr(Trainer, "_train_step", step_then_interrupt)
    rc = main(["train", "gpt", "--data", str(tmp_path / "code.txt"), "--steps", "50", "--out", str(tmp_path / "r"),
               *TRAIN])
    assert rc == 130 and load_checkpoint(tmp_path / "r").step == 2
    assert "--resume" in capsys.readouterr().out                                # how to continue


@pytest.mark.parametrize("argv, flag", [
    (["--max-new-tokens", "-5"], "--max-new-tokens must be >= 1"),
    (["--temperature", "-1"], "--temperature must be >= 0"),
    (["--top-k", "0"], "--top-k must be >= 1"),
    (["--top-p", "1.5"], "--top-p must be in (0, 1]"),
    (["--prompt", ""], "--prompt must not be empty"),
])
def test_generate_checks_its_flags_before_printing_anything(run_dir, monkeypatch, capsys, argv, flag):
    rc, rec = generate(monkeypatch, str(run_dir), "--prompt", "def f", *argv)
    err = capsys.readouterr().err
    assert rc == 2 and f"attnlab: error: {flag}" in err and "Traceback" not in err
    assert rec.writes == []                                                    # the prompt was not echoed first


def test_ctrl_c_in_generate_ends_the_line_without_a_traceback(run_dir, monkeypatch, capsys):
    class Interrupting(Recorder):
        def write(self, s):
            super().write(s)
            if len(self.writes) == 4:
                raise KeyboardInterrupt

    rec = Interrupting()
    monkeypatch.setattr(sys, "stdout", rec)
    rc = main(["generate", str(run_dir), "--prompt", "def", "--max-new-tokens", "50", "--seed", "0"])
    monkeypatch.undo()
    assert rc == 130 and rec.writes[-1] == "\n"
    err = capsys.readouterr().err
    assert "interrupted" in err and "Traceback" not in err


def test_generate_needs_only_the_weights(run_dir, tmp_path, monkeypatch):
    import shutil
    copy = tmp_path / "weights-only"
    shutil.copytree(run_dir, copy)
    for state in copy.glob("step-*/train_state.safetensors"):
        state.unlink()                                                         # e.g. shipped without optimizer state
    rc, rec = generate(monkeypatch, str(copy), "--prompt", "def", "--max-new-tokens", "5", "--seed", "2")
    _, ref = generate(monkeypatch, str(run_dir), "--prompt", "def", "--max-new-tokens", "5", "--seed", "2")
    assert rc == 0 and "".join(rec.writes) == "".join(ref.writes)
    assert main(["eval", str(copy)]) == 0


def test_generate_without_seed_differs_between_runs(run_dir, monkeypatch):
    texts = {"".join(generate(monkeypatch, str(run_dir), "--prompt", "d", "--max-new-tokens", "40")[1].writes)
             for _ in range(3)}
    assert len(texts) > 1                                                      # "default: random", as --help says


def test_context_fill_warns_once(run_dir, monkeypatch, capsys):
    rc, rec = generate(monkeypatch, str(run_dir), "--prompt", "def", "--max-new-tokens", "60", "--seed", "0")
    err = capsys.readouterr().err
    assert rc == 0 and err.count("the context (16 tokens) is full") == 1, err


# -- generate: inputs that used to do nothing, or a traceback (issue #28) --------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["--stop", ""], "--stop must not be empty"),
    (["--stop", "\\n", ""], "--stop must not be empty"),
    (["--seed", "-1"], "--seed must be an integer from 0 to 2**63 - 1"),
    (["--seed", str(2 ** 64)], "--seed must be an integer from 0 to 2**63 - 1"),
])
def test_generate_refuses_a_stop_or_seed_that_cannot_work(run_dir, monkeypatch, capsys, argv, message):
    rc, rec = generate(monkeypatch, str(run_dir), "--prompt", "def", "--max-new-tokens", "5", *argv)
    err = capsys.readouterr().err
    assert rc == 2 and f"attnlab: error: {message}" in err and "Traceback" not in err, err
    assert rec.writes == []


def test_stop_escapes(capsys):
    from attnlab.cli import build_parser
    args = build_parser().parse_args(["generate", "run", "--stop", "\\n\\n", "\\u2713", "é✓", "a\\\\b"])
    assert args.stop == ["\n\n", "✓", "é✓", "a\\b"]
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["generate", "run", "--stop", "\\x"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "argument --stop: cannot read the escapes in '\\\\x'" in err, err


def _task_run(path, task):
    from attnlab.train.checkpoint import save_checkpoint
    save_checkpoint(path, 1, task.build_model(), tokenizer_json=task.tokenizer_json() or "",
                    model_config=task.model_config(), train_config={},
                    extra={"task": task.name, "data": task.info()})


def _vit():
    from attnlab.models.vit import ViTConfig
    from attnlab.tasks.vit import ViTTask
    return ViTTask(ViTConfig.preset("digits", n_layers=1, d_model=16, n_heads=2))


def _seq2seq():
    from attnlab.data.seq2seq_tasks import make_task
    from attnlab.tasks.seq2seq import Seq2SeqTask, default_config
    data = make_task("reversal", n_symbols=6, min_len=2, max_len=6)
    return Seq2SeqTask(data, default_config(data, d_model=16, n_heads=2))


@pytest.mark.parametrize("make, name", [(_vit, "vit"), (_seq2seq, "seq2seq")])
def test_generate_on_a_run_that_is_not_a_language_model(make, name, tmp_path, monkeypatch, capsys):
    _task_run(tmp_path / name, make())
    rc, rec = generate(monkeypatch, str(tmp_path / name), "--prompt", "x")
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(f"attnlab: error: {tmp_path / name} is a {name!r} run: generate takes a "
                                      "language-model run (written by `attnlab train gpt or code`)"), err
    assert "Traceback" not in err and rec.writes == []

