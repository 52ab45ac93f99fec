"""The code task: file-level split, tokenizer offsets, GPT / LSTM / bigram models, training and loading."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from attnlab.models import GPTConfig
from attnlab.tasks.code import (HELD_OUT_EVERY, CodeTask, code_files, encode_with_offsets, make_code_task,
                                prepare_code_data)
from attnlab.tasks.code_models import BigramLM, CodeLSTM, CodeLSTMConfig, matched_lstm_config

BYTES = 300_000                  # a few dozen stdlib files: BPE training takes about a second


@pytest.fixture(scope="module")
def data():
    return prepare_code_data(BYTES, vocab_size=300)


def test_split_is_by_whole_file_and_disjoint():
    train, held = code_files(BYTES)
    names_t, names_h = {n for n, _ in train}, {n for n, _ in held}
    assert names_t and names_h and not names_t & names_h
    assert len(held) == pytest.approx((len(train) + len(held)) / HELD_OUT_EVERY, abs=1)


def test_tokenizer_never_saw_heldout_text(data):
    train, held = code_files(BYTES)
    assert data.info["train_files"] == len(train) and data.info["heldout_files"] == len(held)
    assert data.tokenizer.decode(data.val_ids.tolist()) == "\n\n".join(t for _, t in held)
    other = prepare_code_data(BYTES, vocab_size=300)         # deterministic: same merges, same ids
    assert torch.equal(other.train_ids, data.train_ids)
    sel, test = data.heldout_half("select"), data.heldout_half("test")
    assert len(sel) + len(test) == len(held) and not {n for n, _ in sel} & {n for n, _ in test}


def test_encode_with_offsets_maps_every_character(data):
    text = 'def f(x):\n    return "é€" + g([x])  # ü\n'
    ids, where = encode_with_offsets(data.tokenizer, text)
    assert ids == data.tokenizer.encode(text) and len(where) == len(text)
    assert (where[1:] >= where[:-1]).all() and where[0] == 0 and where[-1] == len(ids) - 1
    for c, ch in enumerate(text):              # the token holding character c decodes to text containing it
        if ch.isascii():
            assert ch in data.tokenizer.decode([ids[where[c]]])


def test_lstm_is_parameter_matched_and_causal():
    gpt_cfg = GPTConfig(vocab_size=300, n_layers=2, n_heads=2, d_model=32, max_len=64)
    from attnlab.models import GPT
    target = GPT(gpt_cfg).num_params()
    lstm = CodeLSTM(matched_lstm_config(target, 300, d_embed=32))
    assert abs(lstm.num_params() / target - 1) < 0.05
    x = torch.randint(0, 300, (2, 12))
    y1 = lstm(x)
    x2 = x.clone()
    x2[:, 8:] = 0
    assert torch.allclose(lstm(x2)[:, :8], y1[:, :8])        # the future does not reach the past
    steps = list(lstm.generate_tokens(x[:, :4], 5, seed=0))
    assert len(steps) == 5 and steps[0].shape == (2,)
    assert torch.equal(torch.stack(steps, 1), torch.stack(list(lstm.generate_tokens(x[:, :4], 5, seed=0)), 1))


def test_bigram_counts():
    ids = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    bg = BigramLM.from_ids(ids, vocab_size=3, alpha=0.01)
    assert torch.allclose(bg.log_probs.exp().sum(1), torch.ones(3))
    assert bg.log_probs.argmax(1).tolist() == [1, 2, 0]
    out = list(bg.generate_tokens(torch.tensor([[0]]), 4, temperature=0))
    assert [int(t) for t in out] == [1, 2, 0, 1]
    assert bg.loss(ids[None, :-1], ids[None, 1:]).item() < 0.05


def test_task_trains_saves_and_loads(tmp_path, data):
    from attnlab.tasks import load_model
    from attnlab.train import Trainer, TrainConfig, load_gpt
    for arch in ("gpt", "lstm"):
        task = make_code_task(arch, "code-small", data=data)
        out = tmp_path / arch
        Trainer(task, TrainConfig(steps=3, batch_size=2, eval_interval=3, eval_iters=1, warmup_steps=1,
                                  out_dir=str(out)), progress=False).train(plot=False)
        model, again = load_model(out)
        assert isinstance(again, CodeTask) and again.seq_len == task.seq_len
        assert isinstance(model, CodeLSTM) == (arch == "lstm")
        assert set(again.evaluate(model, batches=1, batch_size=2)) >= {"val_loss", "val_nats_per_char"}
    gpt, tok = load_gpt(tmp_path / "gpt")                      # `attnlab generate` reads it like any GPT
    assert gpt.cfg.max_len == 256 and tok.vocab_size == 300
    from attnlab.lab.code_pictures import show_code
    code = "def f(a):\n    return (a[0])\n\n\ny = f([1])\n"
    paths = show_code(tmp_path / "gpt", code, out=str(tmp_path / "show"), windows=2)
    assert [p.name.split("-L")[0] for p in paths] == ["code-brackets", "code-def-use"]
    assert all(p.stat().st_size > 1000 for p in paths)
    with pytest.raises(ValueError, match="LSTM baseline"):
        show_code(tmp_path / "lstm", out=str(tmp_path / "show"))
    with pytest.raises(ValueError, match="no bracket pairs"):
        show_code(tmp_path / "gpt", "x = 1\n", out=str(tmp_path / "show"), windows=1)


def test_bad_options_are_clear_errors():
    with pytest.raises(ValueError, match="code preset"):
        make_code_task("gpt", "huge", data=None)
    with pytest.raises(ValueError, match="vocab_size"):
        CodeTask(CodeLSTMConfig(vocab_size=7), prepare_code_data(BYTES, vocab_size=300))
    r = subprocess.run([sys.executable, "-m", "attnlab", "train", "code", "--corpus-bytes", "1000", "--steps", "1",
                        "--out", "/nonexistent/x"], capture_output=True, text=True)
    assert r.returncode == 2 and "attnlab: error:" in r.stderr and "--corpus-bytes" in r.stderr
