"""attnlab train / generate: a few steps end to end, resume, streaming output, stop strings, errors."""
from __future__ import annotations

import sys

import pytest

from attnlab.cli import main
from attnlab.cli_lm import stream_with_stops

TEXT = "".join(f"def f{i}(x):\n    return x * {i % 7} + {i % 5}\n\n" for i in range(80))
TRAIN = ["--preset", "nano", "--block-size", "16", "--batch-size", "4", "--eval-iters", "2", "--eval-interval", "2",
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
