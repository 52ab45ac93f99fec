"""Write the legacy checkpoints in tests/data/checkpoints_v1/ (run once, with the code *before* issue 19).

These are "checkpoints written by the previous layout": their model configs say ``n_layer``,
``n_head``, ``block_size`` (GPT), ``max_position`` (encoder), and the code task's data info says
``block_size``. ``tests/test_legacy_checkpoints.py`` loads them with the current code and checks
that the outputs equal the ones recorded here (``expected.safetensors`` beside each checkpoint,
computed by the code that wrote the checkpoint).

How they were made (at commit 54fe916, models/, nn/, train/ and tasks/ as committed there):

- ``gpt/``: a ``tasks.lm.LMTask`` (a tiny GPTConfig on ``tiny.txt``, char tokenizer) trained one
  step by ``train.Trainer`` -- the same ``Trainer.save`` -> ``save_checkpoint`` call as
  ``attnlab train gpt`` (optimizer state, RNG states and data info included);
- ``code_lstm/``: a ``tasks.code.CodeTask`` with a ``CodeLSTMConfig`` (``n_layer``) and a 16-token
  window (data info ``block_size``), on ``tiny.txt`` instead of the stdlib (so the test needs no
  BPE training), trained one step by ``Trainer`` likewise;
- ``encoder/``: an ``Encoder`` (no training task exists for it) saved with ``save_checkpoint``
  directly, its config as ``dataclasses.asdict``, weights perturbed so no tensor is at its init.

Run from the repository root: ``python scripts/make_legacy_checkpoints.py`` (it refuses to run with
code that no longer has the old names: the point is the old layout).
"""
from __future__ import annotations

import dataclasses
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

OUT = Path("tests/data/checkpoints_v1")
TEXT = OUT / "tiny.txt"
TRAIN = dict(steps=1, batch_size=2, eval_iters=1, eval_interval=1, warmup_steps=0, lr=1e-2, min_lr=1e-3,
             checkpoint_interval=1, keep_checkpoints=1, bf16="off", seed=0)


def _ids(vocab: int, shape=(2, 8)) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(1))         # (B, L)


def make_gpt() -> None:
    from attnlab.data.prepare import prepare_lm_data
    from attnlab.models import GPTConfig
    from attnlab.tasks.lm import LMTask
    from attnlab.train import TrainConfig, Trainer
    from attnlab.train.checkpoint import load_gpt
    data = prepare_lm_data(str(TEXT), "char", val_fraction=0.3)
    cfg = GPTConfig(vocab_size=data.tokenizer.vocab_size, block_size=16, n_layer=2, n_head=2, d_model=16)
    out = OUT / "gpt"
    trainer = Trainer(LMTask(cfg, data), TrainConfig(**TRAIN, out_dir=str(out), val_fraction=0.3), progress=False)
    trainer.train(plot=False)
    model, _ = load_gpt(out)
    idx = _ids(cfg.vocab_size)
    save_file({"idx": idx, "logits": model(idx).detach().contiguous(),                       # (2, 8), (2, 8, V)
               "generated": model.generate(idx[:, :4], 14, top_k=5, seed=3)}, out / "expected.safetensors")


def make_code_lstm() -> None:
    from attnlab.data.tokenization import train_tokenizer
    from attnlab.tasks.code import CodeData, CodeTask, build_code_model
    from attnlab.tasks.code_models import CodeLSTMConfig
    from attnlab.train import TrainConfig, Trainer
    from attnlab.train.checkpoint import load_checkpoint
    text = TEXT.read_text()
    tok = train_tokenizer("char", text, 0)
    ids = torch.tensor(tok.encode(text), dtype=torch.int64)                                   # (N,)
    cut = int(0.7 * len(ids))
    data = CodeData(tok, ids[:cut], ids[cut:], (("tiny.txt", text),),
                    {"name": "tiny-code", "max_bytes": len(text), "val_chars": len(text) - cut})
    cfg = CodeLSTMConfig(vocab_size=tok.vocab_size, d_embed=8, hidden=12, n_layer=2)
    out = OUT / "code_lstm"
    trainer = Trainer(CodeTask(cfg, data, block_size=16), TrainConfig(**TRAIN, out_dir=str(out)), progress=False)
    trainer.train(plot=False)
    ckpt = load_checkpoint(out, train_state=False)
    model = build_code_model(ckpt.model_config)
    model.load_state_dict(ckpt.model_state)
    idx = _ids(cfg.vocab_size)
    save_file({"idx": idx, "logits": model.eval()(idx).detach().contiguous()}, out / "expected.safetensors")


def make_encoder() -> None:
    from attnlab.models import Encoder, EncoderConfig
    from attnlab.train.checkpoint import save_checkpoint
    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=40, d_model=16, n_layer=2, n_head=2, d_ff=32, max_position=12, n_classes=3)
    model = Encoder(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():                     # off the init: biases and LayerNorms matter too
            p.add_(0.05 * torch.randn_like(p))
    out = OUT / "encoder"
    save_checkpoint(out, 0, model, tokenizer_json="", model_config=dataclasses.asdict(cfg), train_config={},
                    extra={"model": "encoder"}, keep=1)
    ids = _ids(cfg.vocab_size, (2, 10))
    mask = torch.tensor([[1] * 10, [1] * 7 + [0] * 3])                                        # (2, 10)
    save_file({"input_ids": ids, "attention_mask": mask, "hidden": model(ids, mask).contiguous(),
               "mlm_logits": model.mlm_logits(ids, mask).contiguous(), "classify": model.classify(ids, mask)},
              out / "expected.safetensors")


def main() -> None:
    from attnlab.models import GPTConfig
    if "block_size" not in {f.name for f in dataclasses.fields(GPTConfig)}:
        sys.exit("this code already has the new config names: check out a commit before issue 19 to run this")
    if not TEXT.is_file():
        sys.exit(f"{TEXT} is missing: run from the repository root")
    for name in ("gpt", "code_lstm", "encoder"):
        shutil.rmtree(OUT / name, ignore_errors=True)
    with torch.no_grad():
        make_encoder()
    make_gpt()
    make_code_lstm()


if __name__ == "__main__":
    main()
