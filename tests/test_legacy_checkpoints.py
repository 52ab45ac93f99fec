"""Checkpoints written by the previous layout (config keys n_layer, n_head, block_size, max_position) still load.

The checkpoints in tests/data/checkpoints_v1 were written by the code before the renames
(scripts/make_legacy_checkpoints.py says how), together with the outputs that code computed from
them (expected.safetensors). Here the current code loads them and must give the same outputs.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnlab.models import GPT, Encoder, EncoderConfig, GPTConfig
from attnlab.presets import LEGACY_KEYS, upgrade_keys
from attnlab.tasks import get_spec, load_model
from attnlab.tasks.code import build_code_model
from attnlab.tasks.code_models import CodeLSTMConfig
from attnlab.train import Trainer
from attnlab.train.checkpoint import load_checkpoint, load_gpt, resolve_checkpoint

ROOT = Path(__file__).resolve().parents[1]
V1 = ROOT / "tests" / "data" / "checkpoints_v1"


def _raw_config(name: str) -> dict:
    """The model_config exactly as stored on disk (no upgrade)."""
    return json.loads((resolve_checkpoint(V1 / name) / "checkpoint.json").read_text())["model_config"]


@pytest.mark.parametrize("name, old", [("gpt", {"n_layer", "n_head", "block_size"}),
                                       ("encoder", {"n_layer", "n_head", "max_position"}),
                                       ("code_lstm", {"n_layer"})])
def test_the_files_really_are_the_old_layout(name, old):
    raw = _raw_config(name)
    assert old <= set(raw) and not {"n_layers", "n_heads", "max_len"} & set(raw)


def test_load_checkpoint_renames_old_keys_and_leaves_the_files_alone():
    before = (resolve_checkpoint(V1 / "gpt") / "checkpoint.json").read_bytes()
    ckpt = load_checkpoint(V1 / "gpt")
    assert {"n_layers": 2, "n_heads": 2, "max_len": 16}.items() <= ckpt.model_config.items()
    assert not set(LEGACY_KEYS) & set(ckpt.model_config)
    assert (resolve_checkpoint(V1 / "gpt") / "checkpoint.json").read_bytes() == before
    code = load_checkpoint(V1 / "code_lstm", train_state=False)
    assert code.extra["data"]["seq_len"] == 16 and "block_size" not in code.extra["data"]


def test_old_gpt_checkpoint_gives_the_recorded_logits_and_samples():
    want = load_file(str(V1 / "gpt" / "expected.safetensors"))
    model, tok = load_gpt(V1 / "gpt")
    assert model.cfg.max_len == 16 and model.cfg.n_layers == 2 and model.cfg.n_heads == 2
    with torch.no_grad():
        torch.testing.assert_close(model(want["idx"]), want["logits"])                 # (2, 8, V)
    assert torch.equal(model.generate(want["idx"][:, :4], 14, top_k=5, seed=3), want["generated"])


def test_old_gpt_checkpoint_rebuilds_its_task_and_resumes(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)                    # the run's data path is stored relative to the repository
    want = load_file(str(V1 / "gpt" / "expected.safetensors"))
    model, task = load_model(V1 / "gpt")
    with torch.no_grad():
        torch.testing.assert_close(model(want["idx"]), want["logits"])
    ckpt = load_checkpoint(V1 / "gpt")
    trainer = Trainer.from_checkpoint(ckpt, get_spec("gpt").from_checkpoint(ckpt), progress=False,
                                      out_dir=str(tmp_path / "branch"), steps=2)
    trainer.train(plot=False)                  # one more step from the old optimizer state, saved in the new layout
    saved = json.loads((resolve_checkpoint(tmp_path / "branch") / "checkpoint.json").read_text())
    assert saved["step"] == 2 and {"n_layers", "n_heads", "max_len"} <= set(saved["model_config"])


def test_old_encoder_checkpoint_gives_the_recorded_outputs():
    want = load_file(str(V1 / "encoder" / "expected.safetensors"))
    ckpt = load_checkpoint(V1 / "encoder", train_state=False)
    model = Encoder(EncoderConfig.from_dict(_raw_config("encoder")))       # the old dict, as stored
    model.load_state_dict(ckpt.model_state)
    model.eval()
    assert model.cfg.max_len == 12 and model.cfg.n_layers == 2
    ids, mask = want["input_ids"], want["attention_mask"]
    with torch.no_grad():
        torch.testing.assert_close(model(ids, mask), want["hidden"])                   # (2, 10, C)
        torch.testing.assert_close(model.mlm_logits(ids, mask), want["mlm_logits"])
        torch.testing.assert_close(model.classify(ids, mask), want["classify"])


def test_old_code_lstm_checkpoint_gives_the_recorded_logits():
    want = load_file(str(V1 / "code_lstm" / "expected.safetensors"))
    ckpt = load_checkpoint(V1 / "code_lstm", train_state=False)
    model = build_code_model(_raw_config("code_lstm")).eval()             # the old dict, as stored
    model.load_state_dict(ckpt.model_state)
    assert model.cfg.n_layers == 2
    with torch.no_grad():
        torch.testing.assert_close(model(want["idx"]), want["logits"])


def test_old_config_names_are_accepted_by_dicts_and_presets():
    old = dict(vocab_size=20, block_size=32, n_layer=3, n_head=2, d_model=16)
    assert GPTConfig.from_dict(old) == GPTConfig(vocab_size=20, max_len=32, n_layers=3, n_heads=2, d_model=16)
    assert GPTConfig.preset("nano", vocab_size=20, block_size=40, n_layer=1).max_len == 40
    enc = EncoderConfig.from_dict(dict(vocab_size=9, d_model=8, n_layer=1, n_head=2, d_ff=8, max_position=6))
    assert (enc.n_layers, enc.n_heads, enc.max_len) == (1, 2, 6)
    assert EncoderConfig.preset("tiny", max_position=32).max_len == 32
    assert CodeLSTMConfig.from_dict(dict(vocab_size=5, n_layer=3)).n_layers == 3
    assert GPT(GPTConfig.from_dict(GPTConfig(vocab_size=7).to_dict())).cfg == GPTConfig(vocab_size=7)   # round trip


def test_a_key_given_under_both_names_is_an_error():
    with pytest.raises(ValueError, match="both 'block_size'.*'max_len'"):
        upgrade_keys({"block_size": 8, "max_len": 16})
    with pytest.raises(ValueError, match="both 'n_layer'"):
        GPTConfig.from_dict(dict(vocab_size=5, n_layer=2, n_layers=2))


def test_the_old_cli_flag_is_an_alias():
    import argparse
    p = argparse.ArgumentParser()
    get_spec("gpt").add_arguments(p)
    assert p.parse_args(["--block-size", "24"]).max_len == 24 == p.parse_args(["--max-len", "24"]).max_len
