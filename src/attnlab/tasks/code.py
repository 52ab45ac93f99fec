"""The code-model task (the Codex case): a GPT, or its LSTM baseline, on the standard library's source.

``attnlab train code`` trains a byte-level BPE on the training files of the ``stdlib`` corpus
(``data.corpora``: sorted ``.py`` files, tests skipped, at most ``--corpus-bytes``), then a GPT
(``--arch gpt``, default) or a parameter-matched token LSTM (``--arch lstm``) on their token stream,
within a time budget. Unlike ``train gpt --data stdlib`` the split is by *file*: every
``HELD_OUT_EVERY``-th file (sorted order) is held out whole, so the measurements (``lab/exp_code``)
run on modules the model never saw, and the tokenizer never saw them either. The held-out files
alternate between a "select" half (choosing the best head) and a "test" half (measuring it).

Checkpoints of ``--arch gpt`` hold a plain ``GPTConfig``: ``attnlab generate`` and ``attnlab show``
read them like any GPT.

Example::

    data = prepare_code_data(max_bytes=600_000, vocab_size=512)
    task = CodeTask(GPTConfig.preset("nano", vocab_size=512), data)
    Trainer(task, TrainConfig(steps=200, out_dir="runs/code-try")).train()
    ids, where = encode_with_offsets(data.tokenizer, "f(x)")   # where[c]: the token holding character c
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Union

import numpy as np
import torch
from torch import nn

from ..data.batches import BatchSampler
from ..data.corpora import STDLIB_MAX_BYTES, _stdlib_files
from ..data.tokenization import Tokenizer, train_tokenizer
from ..models import GPT, GPTConfig
from ..train.sizes import SizeEstimate
from ..train.task import TaskSpec, check_options
from .code_models import CodeLSTM, CodeLSTMConfig, matched_lstm_config
from .lm import check_vocab_size, lm_size_estimate

__all__ = ["HELD_OUT_EVERY", "CODE_PRESETS", "CodeData", "CodeTask", "code_files", "prepare_code_data",
           "encode_with_offsets", "build_code_model", "make_code_task", "SPEC"]

HELD_OUT_EVERY = 10                  # file i (sorted) is held out when i % 10 == 5
_SEP = "\n\n"

# Model sizes. "code": the `attnlab train code` default (0.9M-parameter GPT, 256-token context);
# "code-small": the quick verify model (2 CPU-minutes of training).
CODE_PRESETS: dict[str, dict] = {
    "code": dict(n_layers=4, n_heads=4, d_model=128, max_len=256),
    "code-small": dict(n_layers=2, n_heads=4, d_model=64, max_len=256),
}
_TRAIN_DEFAULTS = dict(steps=None, time_limit_min=9.0, batch_size=8, lr=4e-3,    # as lab/code_train.py (swept there)
                       min_lr=1e-4, warmup_steps=100,
                       eval_interval=250, eval_iters=10, checkpoint_interval=500)
_LSTM_LR = 3e-3                       # the LSTM's own rate: 2e-3 vs 3e-3 vs 1e-2 tried, not swept further


@lru_cache(maxsize=4)
def code_files(max_bytes: int = STDLIB_MAX_BYTES) -> tuple[tuple, tuple]:
    """(training files, held-out files) of the stdlib corpus, each a tuple of (relative path, text).

    Files that are not UTF-8 are left out (as in the ``stdlib`` corpus).
    """
    paths, root = _stdlib_files(max_bytes)
    train, held = [], []
    for i, path in enumerate(paths):
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            continue
        (held if i % HELD_OUT_EVERY == HELD_OUT_EVERY // 2 else train).append((path.relative_to(root).as_posix(), text))
    return tuple(train), tuple(held)


@dataclass
class CodeData:
    tokenizer: Tokenizer
    train_ids: torch.Tensor          # (N_train,) int64: the training files, joined by a blank line
    val_ids: torch.Tensor            # (N_val,) int64: the held-out files, joined alike
    heldout: tuple                   # ((relative path, text), ...): the held-out files
    info: dict

    @property
    def val_chars_per_token(self) -> float:
        return self.info["val_chars"] / max(1, len(self.val_ids))

    def heldout_half(self, which: str) -> tuple:
        """The "select" (even) or "test" (odd) half of the held-out files."""
        if which not in ("select", "test"):
            raise ValueError(f"which must be 'select' or 'test', got {which!r}")
        return self.heldout[0 if which == "select" else 1::2]


def prepare_code_data(max_bytes: int = STDLIB_MAX_BYTES, vocab_size: int = 1024,
                      tokenizer: Optional[Tokenizer] = None, expect_sha256: Optional[str] = None) -> CodeData:
    """Split the stdlib files, train a byte-level BPE on the training files (or use ``tokenizer``), encode."""
    train, held = code_files(max_bytes)
    if not train or not held:
        raise ValueError(f"--corpus-bytes {max_bytes} selects too few files ({len(train)} training, {len(held)} "
                         f"held out); use at least ~200000")
    train_text, val_text = _SEP.join(t for _, t in train), _SEP.join(t for _, t in held)
    digest = hashlib.sha256(train_text.encode("utf-8")).hexdigest()
    if expect_sha256 is not None and digest != expect_sha256:
        raise ValueError(f"the standard library here is not the one this run was trained on (SHA-256 {digest[:12]}"
                         f"... != {expect_sha256[:12]}...); train a new model with `attnlab train code`")
    tok = tokenizer or train_tokenizer("bpe", train_text, vocab_size)
    train_ids = torch.tensor(tok.encode(train_text), dtype=torch.int64)                  # (N_train,)
    val_ids = torch.tensor(tok.encode(val_text), dtype=torch.int64)                      # (N_val,)
    info = {"name": "stdlib-code", "max_bytes": max_bytes, "train_files": len(train), "heldout_files": len(held),
            "held_out": f"file i (sorted) with i % {HELD_OUT_EVERY} == {HELD_OUT_EVERY // 2}",
            "text_sha256": digest, "tokens": len(train_ids), "val_tokens": len(val_ids), "val_chars": len(val_text),
            "vocab_size": tok.vocab_size}
    return CodeData(tok, train_ids, val_ids, held, info)


def encode_with_offsets(tokenizer: Tokenizer, text: str) -> tuple[list[int], np.ndarray]:
    """(ids, where): ``where[c]`` is the index of the token holding character c of ``text`` (int64, len(text)).

    Byte-level BPE splits a multi-byte character over several tokens: the first of them holds it.
    """
    if tokenizer.kind == "char":
        return tokenizer.encode(text), np.arange(len(text))
    enc = tokenizer._tok.encode(text)                     # the tokenizers library's Encoding: char offsets
    where = np.zeros(len(text), dtype=np.int64)
    offsets = enc.offsets                                 # read once: the property rebuilds the list per access
    for i in range(len(enc.ids) - 1, -1, -1):             # backwards, so the first token of a shared span wins
        a, b = offsets[i]
        where[a:b] = i
    return list(enc.ids), where


def build_code_model(config: dict) -> nn.Module:
    """A GPT (a GPTConfig dict) or a CodeLSTM (a dict with ``arch="lstm"``)."""
    if config.get("arch") == "lstm":
        return CodeLSTM(CodeLSTMConfig.from_dict(config))
    return GPT(GPTConfig.from_dict(config))


class CodeTask:
    """Next-token prediction on the stdlib training files; validation on the held-out files."""

    name, unit = "code", "tok"
    loss_label = "cross-entropy (nats / token)"

    def __init__(self, model_config: Union[GPTConfig, CodeLSTMConfig], data: CodeData, seq_len: int = 256):
        if data.tokenizer.vocab_size != model_config.vocab_size:
            raise ValueError(f"model vocab_size {model_config.vocab_size} != tokenizer's {data.tokenizer.vocab_size}")
        self.config, self.data = model_config, data
        # the training window: a GPT's whole context; an LSTM (no context limit) trains on seq_len tokens
        self.seq_len = model_config.max_len if isinstance(model_config, GPTConfig) else seq_len
        short = min(len(data.train_ids), len(data.val_ids))
        if short < self.seq_len + 1:
            raise ValueError(f"--corpus-bytes {data.info['max_bytes']} gives {len(data.train_ids)} training and "
                             f"{len(data.val_ids)} held-out tokens; both need at least seq_len + 1 = "
                             f"{self.seq_len + 1}: use more source (e.g. --corpus-bytes 300000)")

    def model_config(self) -> dict:
        return self.config.to_dict()

    def build_model(self) -> nn.Module:
        return build_code_model(self.config.to_dict())

    def info(self) -> dict:
        return {**self.data.info, "seq_len": self.seq_len}

    def title(self) -> str:
        return f"{'LSTM' if isinstance(self.config, CodeLSTMConfig) else 'GPT'} on stdlib code"

    def describe(self) -> str:
        d = self.data.info
        return (f"on stdlib code: {d['train_files']} training files ({d['tokens']:,} tokens), {d['heldout_files']} "
                f"held out ({d['val_tokens']:,} tokens), BPE {d['vocab_size']}")

    def tokenizer_json(self) -> Optional[str]:
        return self.data.tokenizer.to_json()

    def sampler(self, batch_size: int, seed: int) -> BatchSampler:
        return BatchSampler(self.data.train_ids, self.seq_len, batch_size, seed=seed)

    def eval_batches(self, batch_size: int, n: int, seed: int) -> list:
        return BatchSampler(self.data.val_ids, self.seq_len, batch_size, seed=seed).fixed_batches(n)

    def units_per_batch(self, batch_size: int) -> int:
        return batch_size * self.seq_len

    def size_estimate(self, batch_size: int) -> SizeEstimate:
        return lm_size_estimate(self.config, batch_size, self.seq_len,
                                model_fix="choose --preset code-small (or a smaller --vocab-size)",
                                batch_fix="lower --batch-size")

    def val_metrics(self, val_loss: float) -> dict:
        return {"val_nats_per_char": val_loss / self.data.val_chars_per_token}

    @torch.no_grad()
    def evaluate(self, model: nn.Module, batches: int = 20, batch_size: int = 16) -> dict:
        """Loss on held-out files: nats/token, nats/char and perplexity (the code metrics: ``attnlab verify``)."""
        model.eval()
        losses = [model.loss(x, y).item() for x, y in self.eval_batches(batch_size, batches, seed=12345)]
        loss = sum(losses) / len(losses)
        return {"val_loss": loss, **self.val_metrics(loss), "perplexity": math.exp(loss)}


def make_code_task(arch: str = "gpt", preset: str = "code", vocab_size: int = 1024,
                   max_bytes: int = STDLIB_MAX_BYTES, data: Optional[CodeData] = None) -> CodeTask:
    """The task for ``arch`` "gpt" or "lstm" (matched to the preset's GPT within a few percent)."""
    if preset not in CODE_PRESETS:
        raise ValueError(f"unknown code preset {preset!r}; choose from {sorted(CODE_PRESETS)}")
    data = data or prepare_code_data(max_bytes, vocab_size)
    gpt = GPTConfig(vocab_size=data.tokenizer.vocab_size, **CODE_PRESETS[preset])
    if arch == "gpt":
        return CodeTask(gpt, data)
    if arch == "lstm":
        lstm = matched_lstm_config(GPT(gpt).num_params(), gpt.vocab_size, d_embed=gpt.d_model)
        return CodeTask(lstm, data, seq_len=gpt.max_len)
    raise ValueError(f"unknown --arch {arch!r}; choose gpt or lstm")


def _from_checkpoint(ckpt) -> CodeTask:
    from ..data.tokenization import tokenizer_from_json
    info = ckpt.extra.get("data", {})
    data = prepare_code_data(info["max_bytes"], tokenizer=tokenizer_from_json(ckpt.tokenizer_json),
                             expect_sha256=info.get("text_sha256"))
    cfg = ckpt.model_config
    model_cfg = CodeLSTMConfig.from_dict(cfg) if cfg.get("arch") == "lstm" else GPTConfig.from_dict(cfg)
    return CodeTask(model_cfg, data, seq_len=info.get("seq_len", 256))    # load_checkpoint renamed old keys


def _validate(args) -> None:
    check_options(args, positive=("--corpus-bytes",))
    check_vocab_size(args.vocab_size)


def _from_args(args) -> CodeTask:
    _validate(args)
    return make_code_task(args.arch, args.preset, args.vocab_size, args.corpus_bytes)


def _add_arguments(t) -> None:
    t.add_argument("--arch", choices=["gpt", "lstm"], default="gpt",
                   help="the transformer (default), or the parameter-matched LSTM baseline")
    t.add_argument("--preset", choices=sorted(CODE_PRESETS), default="code",
                   help="model size (default code: 4 layers, d=128, context 256 tokens)")
    t.add_argument("--vocab-size", type=int, default=1024, help="byte-level BPE vocabulary (default 1024)")
    t.add_argument("--corpus-bytes", type=int, default=STDLIB_MAX_BYTES,
                   help=f"stdlib source to use, at most (default {STDLIB_MAX_BYTES:,})")


def _defaults(args) -> dict:
    return {**_TRAIN_DEFAULTS, **({"lr": _LSTM_LR} if args.arch == "lstm" else {})}


SPEC = TaskSpec(name="code", help="a code model on the standard library's source (GPT, or the LSTM baseline)",
                add_arguments=_add_arguments, from_args=_from_args, from_checkpoint=_from_checkpoint,
                train_defaults=_defaults, run_name=lambda args: "code" if args.arch == "gpt" else "code-lstm",
                validate=_validate)
