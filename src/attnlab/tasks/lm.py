"""The language-model task: a GPT on a text corpus (next-token prediction), for the generic trainer.

Batches are random windows of the token stream (``data.BatchSampler``); validation batches are
drawn once from the held-out end of the stream; the metric is validation loss in nats per token
and per character (comparable across tokenizers).

Example::

    data = prepare_lm_data("docs", "char")
    task = LMTask(GPTConfig.preset("micro", vocab_size=data.tokenizer.vocab_size), data)
    Trainer(task, TrainConfig.for_preset("micro", out_dir="runs/a")).train()
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from ..data.batches import BatchSampler
from ..data.prepare import LMData
from ..models import GPT, GPTConfig
from ..train.config import TRAIN_PRESETS
from ..train.sizes import FLOAT, INDEX, SizeEstimate, model_params, stack_activations
from ..train.task import TaskSpec, check_options

__all__ = ["LMTask", "SPEC", "MAX_BPE_VOCAB", "check_vocab_size", "lm_size_estimate"]

# The tokenizers library reserves ~71 bytes per vocabulary entry before training: --vocab-size 10**9 asked
# for 71 GB and aborted the process (a Rust panic). GPT-class vocabularies are 50k-260k entries.
MAX_BPE_VOCAB = 1_000_000
MIN_BPE_VOCAB = 256                 # byte-level BPE starts from the 256 bytes


def check_vocab_size(value: int) -> None:
    """ValueError naming --vocab-size unless it is a byte-level BPE size this machine can train."""
    if not MIN_BPE_VOCAB <= value <= MAX_BPE_VOCAB:
        raise ValueError(f"--vocab-size must be from {MIN_BPE_VOCAB} (the byte alphabet) to {MAX_BPE_VOCAB:,}, "
                         f"got {value:,}")


def lm_size_estimate(config, batch_size: int, seq_len: int, **fixes) -> SizeEstimate:
    """One training step of a language model (a GPTConfig, or the code LSTM's config: ``hidden``) on
    ``batch_size`` windows of ``seq_len`` tokens; ``fixes``: SizeEstimate's model_fix / batch_fix."""
    if hasattr(config, "hidden"):                                             # the LSTM: ~10 vectors per step
        blocks = FLOAT * batch_size * seq_len * config.n_layers * 10 * config.hidden
    else:
        blocks = stack_activations(batch_size, seq_len, config.d_model, config.n_layers, heads=config.n_heads)
    logits = 3 * FLOAT * batch_size * seq_len * config.vocab_size             # logits, log-softmax, gradient
    return SizeEstimate(model_params(config.to_dict()), blocks + logits, 2 * INDEX * batch_size * seq_len, **fixes)


class LMTask:
    name, unit = "gpt", "tok"
    loss_label = "cross-entropy (nats / token)"

    def __init__(self, model_config: GPTConfig, data: LMData):
        if data.tokenizer.vocab_size != model_config.vocab_size:
            raise ValueError(f"model vocab_size {model_config.vocab_size} != tokenizer's {data.tokenizer.vocab_size}")
        if len(data.val_ids) < model_config.max_len + 1:
            raise ValueError(f"the validation split has {len(data.val_ids)} tokens, fewer than max_len + 1 = "
                             f"{model_config.max_len + 1}; give more text or a smaller context (--max-len)")
        self.config, self.data = model_config, data

    def model_config(self) -> dict:
        return self.config.to_dict()

    def build_model(self) -> nn.Module:
        return GPT(self.config)

    def info(self) -> dict:
        return self.data.info

    def title(self) -> str:
        return f"on {self.data.info.get('name', '?')}"

    def describe(self) -> str:
        d = self.data
        return (f"on {d.info.get('name')}: {len(d.train_ids):,} train / {len(d.val_ids):,} validation tokens, "
                f"{d.tokenizer.vocab_size} token ids")

    def tokenizer_json(self) -> Optional[str]:
        return self.data.tokenizer.to_json()

    def sampler(self, batch_size: int, seed: int) -> BatchSampler:
        return BatchSampler(self.data.train_ids, self.config.max_len, batch_size, seed=seed)

    def eval_batches(self, batch_size: int, n: int, seed: int) -> list:
        return BatchSampler(self.data.val_ids, self.config.max_len, batch_size, seed=seed).fixed_batches(n)

    def units_per_batch(self, batch_size: int) -> int:
        return batch_size * self.config.max_len

    def size_estimate(self, batch_size: int) -> SizeEstimate:
        return lm_size_estimate(self.config, batch_size, self.config.max_len,
                                model_fix="choose a smaller --preset (or --vocab-size)",
                                batch_fix="lower --batch-size or --max-len")

    def val_metrics(self, val_loss: float) -> dict:
        return {"val_nats_per_char": val_loss / self.data.val_chars_per_token}

    @torch.no_grad()
    def evaluate(self, model: nn.Module, batches: int = 20, batch_size: int = 16) -> dict:
        """Validation loss over ``batches`` fixed windows: nats/token, nats/char and perplexity."""
        model.eval()
        losses = [model.loss(x, y).item() for x, y in self.eval_batches(batch_size, batches, seed=12345)]
        loss = sum(losses) / len(losses)
        return {"val_loss": loss, **self.val_metrics(loss), "perplexity": math.exp(loss)}


def _from_checkpoint(ckpt) -> LMTask:
    from ..data.prepare import prepare_lm_data
    from ..data.tokenization import tokenizer_from_json
    info = ckpt.extra.get("data", {})
    data = prepare_lm_data(info["name"], tokenizer_from_json(ckpt.tokenizer_json),
                           val_fraction=ckpt.train_config["val_fraction"], expect_sha256=info.get("text_sha256"))
    return LMTask(GPTConfig.from_dict(ckpt.model_config), data)


def _from_args(args) -> LMTask:
    from ..data.prepare import prepare_lm_data
    data = prepare_lm_data(args.data or "docs", args.tokenizer, vocab_size=args.vocab_size,
                           val_fraction=args.val_fraction)
    over = {k: v for k, v in {"max_len": args.max_len, "dropout": args.dropout}.items() if v is not None}
    return LMTask(GPTConfig.preset(args.preset, vocab_size=data.tokenizer.vocab_size, **over), data)


def _add_arguments(t) -> None:
    from ..models import PRESETS
    t.add_argument("--data", help="docs | stdlib | PATH to a UTF-8 text file or a directory of them (default docs)")
    t.add_argument("--preset", choices=sorted(PRESETS), default="micro",
                   help="model size and training defaults: nano (2 layers, d=64, 500 steps), micro "
                        "(4 layers, d=128, a 14-minute time budget; the default), mini (6 layers, d=384, "
                        "5000 steps)")
    t.add_argument("--tokenizer", choices=["char", "bpe"], default="char", help="characters, or byte-level BPE")
    t.add_argument("--vocab-size", type=int, default=512, help="BPE vocabulary size (default 512)")
    t.add_argument("--max-len", "--block-size", dest="max_len", type=int,
                   help="context length in tokens (default: the preset's; --block-size is its old name)")
    t.add_argument("--dropout", type=float, help="dropout (default: the preset's, 0)")


def _validate(args) -> None:
    check_options(args, positive=("--max-len",))
    check_vocab_size(args.vocab_size)
    if args.dropout is not None and not 0 <= args.dropout < 1:
        raise ValueError(f"--dropout must be a probability in [0, 1), got {args.dropout}")


def _run_name(args) -> str:
    from pathlib import Path
    return f"gpt-{args.preset}-{Path(args.data or 'docs').name or 'data'}"


SPEC = TaskSpec(name="gpt", help="a GPT language model on a text corpus (docs, stdlib or your files)",
                add_arguments=_add_arguments, from_args=_from_args, from_checkpoint=_from_checkpoint,
                train_defaults=lambda args: TRAIN_PRESETS[args.preset], run_name=_run_name, validate=_validate)
