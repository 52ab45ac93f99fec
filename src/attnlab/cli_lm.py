"""``attnlab train`` and ``attnlab generate``: train a GPT on a text corpus, then sample from it.

    attnlab train gpt --data docs --preset micro                  # char-level, time-budgeted (see TRAIN_PRESETS)
    attnlab train gpt --data stdlib --preset nano --tokenizer bpe --steps 300 --out runs/code
    attnlab train gpt --out runs/code --resume --steps 600        # continue (same data, same schedule unless changed)
    attnlab generate runs/code --prompt "def " --max-new-tokens 200 --top-k 20 --seed 0 --stop "\\n\\n"
    torchrun --nproc_per_node=4 -m attnlab train gpt --preset mini --batch-size 64   # data-parallel, 16 rows each

Under torchrun every process trains its slice of the global ``--batch-size``; only rank 0 writes
(checkpoints, metrics, output) and the other ranks log warnings only (see ``train/distributed.py``).

Results go to stdout, progress and warnings to stderr. Errors (unknown data path, a prompt the
tokenizer cannot encode, a broken checkpoint) end with "attnlab: error: ..." and exit status 2.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_train", "add_generate", "stream_with_stops"]


def _fail(msg: str) -> int:
    print(f"attnlab: error: {msg}", file=sys.stderr)
    return 2


def _overrides(args: argparse.Namespace) -> dict:
    """TrainConfig fields given explicitly on the command line."""
    given = {"steps": args.steps, "time_limit_min": args.time_limit, "batch_size": args.batch_size, "lr": args.lr,
             "grad_accum": args.grad_accum, "seed": args.seed, "bf16": args.bf16, "eval_interval": args.eval_interval,
             "eval_iters": args.eval_iters, "checkpoint_interval": args.checkpoint_interval,
             "warmup_steps": args.warmup}
    return {k: v for k, v in given.items() if v is not None}


def _run_train(args: argparse.Namespace) -> int:
    import logging

    from .train.distributed import DistributedError, init_distributed
    try:
        dist = init_distributed(timeout_s=args.dist_timeout)
    except ValueError as e:
        return _fail(str(e))
    if not dist.is_main:                                    # one voice: the other ranks only warn
        logging.getLogger("attnlab").setLevel(logging.WARNING)
    try:
        code = _train(args, dist)
        if code == 0:
            dist.shutdown(synchronize=True)             # every rank done before any leaves
        return code
    except DistributedError as e:
        return _fail(str(e))
    finally:
        dist.shutdown()


def _train(args: argparse.Namespace, dist) -> int:
    from .data.prepare import prepare_lm_data
    from .data.tokenization import tokenizer_from_json
    from .models import GPTConfig
    from .train import CheckpointError, Trainer, TrainConfig, load_checkpoint
    say = print if dist.is_main else (lambda *a, **k: None)
    try:
        if args.resume:
            if args.out is None:
                return _fail("--resume needs --out DIR, the run directory to continue")
            ckpt = load_checkpoint(args.out)
            info = ckpt.extra.get("data", {})
            if args.data is not None and args.data != info.get("name"):
                return _fail(f"the run in {args.out} was trained on {info.get('name')!r}, not {args.data!r}")
            data = prepare_lm_data(info["name"], tokenizer_from_json(ckpt.tokenizer_json),
                                   val_fraction=ckpt.train_config["val_fraction"],
                                   expect_sha256=info.get("text_sha256"))
            overrides = _overrides(args)
            if args.steps is not None and args.time_limit is None:
                overrides["time_limit_min"] = None          # an explicit step count replaces a time budget
            trainer = Trainer.from_checkpoint(ckpt, data, progress=not args.no_progress, dist=dist, **overrides)
            say(f"resuming {ckpt.path} at step {ckpt.step}", file=sys.stderr)
        else:
            data_name = args.data or "docs"
            out = args.out or f"runs/{args.model}-{args.preset}-{Path(data_name).name or 'data'}"
            overrides = _overrides(args)
            if args.steps is not None and args.time_limit is None:
                overrides["time_limit_min"] = None
            cfg = TrainConfig.for_preset(args.preset, out_dir=out, **overrides)
            data = prepare_lm_data(data_name, args.tokenizer, vocab_size=args.vocab_size, val_fraction=cfg.val_fraction)
            model_over = {k: v for k, v in {"block_size": args.block_size, "dropout": args.dropout}.items()
                          if v is not None}
            mcfg = GPTConfig.preset(args.preset, vocab_size=data.tokenizer.vocab_size, **model_over)
            trainer = Trainer(mcfg, cfg, data, progress=not args.no_progress, dist=dist)
            say(f"training GPT {args.preset} ({trainer.model.num_params() / 1e6:.2f}M parameters) on "
                  f"{data_name}: {len(data.train_ids):,} train / {len(data.val_ids):,} validation tokens, "
                  f"{args.tokenizer} tokenizer ({data.tokenizer.vocab_size} ids) -> {out}", file=sys.stderr)
        trainer.train()
    except (ValueError, CheckpointError) as e:
        return _fail(str(e))
    if not dist.is_main:
        return 0
    out = trainer.out
    per_char = trainer.last_val / data.val_chars_per_token
    print(f"step {trainer.step}: validation loss {trainer.last_val:.4f} nats/token ({per_char:.4f} nats/char)")
    print(f"checkpoint: {out / f'step-{trainer.saved_step:06d}'}; metrics: "
          f"{out / 'metrics.jsonl'}; loss curve: {out / 'loss.png'}")
    if trainer.cfg.steps is not None and trainer.step < trainer.cfg.steps:
        print(f"stopped early; continue with: attnlab train {args.model} --out {out} --resume")
    print(f"sample: attnlab generate {out} --prompt 'The ' --max-new-tokens 200 --top-k 20")
    return 0


def add_train(sub) -> None:
    from .models import PRESETS
    t = sub.add_parser("train", help="train a small language model (GPT) on a text corpus, with checkpoints",
                       description="Train a GPT on docs (Python's documentation), stdlib (Python's standard "
                                   "library source) or your UTF-8 text. Checkpoints are safetensors + JSON, "
                                   "written atomically; --resume continues a run exactly.")
    t.add_argument("model", choices=["gpt"], help="the model to train")
    t.add_argument("--data", help="docs | stdlib | PATH to a UTF-8 text file or a directory of them (default docs)")
    t.add_argument("--preset", choices=sorted(PRESETS), default="micro",
                   help="model size and training defaults (default micro: 4 layers, d=128, 14 min budget)")
    t.add_argument("--tokenizer", choices=["char", "bpe"], default="char", help="characters, or byte-level BPE")
    t.add_argument("--vocab-size", type=int, default=512, help="BPE vocabulary size (default 512)")
    t.add_argument("--steps", type=int, help="optimizer steps (replaces the preset's time budget)")
    t.add_argument("--time-limit", type=float, metavar="MIN",
                   help="stop after MIN minutes; without --steps the schedule is sized to fit")
    t.add_argument("--batch-size", type=int,
                   help="sequences per micro-batch, in total: under torchrun it is split evenly over the processes")
    t.add_argument("--grad-accum", type=int, help="micro-batches per optimizer step")
    t.add_argument("--lr", type=float, help="peak learning rate")
    t.add_argument("--warmup", type=int, help="warmup steps")
    t.add_argument("--block-size", type=int, help="context length (default: the preset's)")
    t.add_argument("--dropout", type=float, help="dropout (default: the preset's, 0)")
    t.add_argument("--bf16", choices=["auto", "on", "off"], help="bfloat16 autocast (auto: off on CPU, measured)")
    t.add_argument("--eval-interval", type=int)
    t.add_argument("--eval-iters", type=int)
    t.add_argument("--checkpoint-interval", type=int)
    t.add_argument("--seed", type=int)
    t.add_argument("--out", help="run directory (default runs/gpt-PRESET-DATA)")
    t.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--dist-timeout", type=float, default=300.0, metavar="SEC",
                   help="under torchrun: fail (not hang) when another process is silent this long (default 300)")
    t.set_defaults(run=_run_train)


def stream_with_stops(pieces, stops: list[str]):
    """Yield text from an iterator of pieces, ending before the first stop string (not included).

    Text that could be the start of a stop string is held back until it is known not to be.
    """
    text, sent = "", 0
    for piece in pieces:
        text += piece
        hits = [i for i in (text.find(s) for s in stops) if i >= 0]
        if hits:
            yield text[sent:min(hits)]
            return
        hold = max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        if len(text) - hold > sent:
            yield text[sent:len(text) - hold]
            sent = len(text) - hold
    yield text[sent:]


def _run_generate(args: argparse.Namespace) -> int:
    import torch

    from .data.tokenization import IncrementalDecoder
    from .train import CheckpointError, load_gpt
    try:
        model, tok = load_gpt(args.checkpoint)
        if not args.prompt:
            return _fail("--prompt must not be empty (the model needs at least one token to continue)")
        ids = tok.encode(args.prompt)
        if len(ids) > model.cfg.block_size:
            print(f"warning: the prompt is {len(ids)} tokens, the context holds {model.cfg.block_size}: "
                  f"only its last {model.cfg.block_size} tokens are used", file=sys.stderr)
            ids = ids[-model.cfg.block_size:]
        stream = model.generate_tokens(torch.tensor([ids]), args.max_new_tokens, temperature=args.temperature,
                                       top_k=args.top_k, top_p=args.top_p, seed=args.seed, use_cache=not args.no_cache)
        decoder = IncrementalDecoder(tok)

        def pieces():
            for nxt in stream:
                yield decoder.push(int(nxt[0]))
            yield decoder.flush()

        if not args.no_echo:
            sys.stdout.write(args.prompt)
        for piece in stream_with_stops(pieces(), args.stop or []):
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
    except (ValueError, CheckpointError) as e:
        return _fail(str(e))
    return 0


def add_generate(sub) -> None:
    g = sub.add_parser("generate", help="sample text from a trained GPT checkpoint, streamed as it comes",
                       description="Continue --prompt with a model saved by `attnlab train`. Tokens are printed as "
                                   "they are sampled. A prompt longer than the model's context is cut from the left "
                                   "(with a warning).")
    g.add_argument("checkpoint", help="a run directory (its latest checkpoint) or a step-NNNNNN directory")
    g.add_argument("--prompt", default="\n", help="the text to continue (default: a newline)")
    g.add_argument("--max-new-tokens", type=int, default=200)
    g.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    g.add_argument("--top-k", type=int, help="sample among the k most likely tokens")
    g.add_argument("--top-p", type=float, help="nucleus sampling: the smallest set with probability >= p")
    g.add_argument("--seed", type=int, help="same seed, same text (default: random)")
    g.add_argument("--stop", nargs="+", metavar="STR", type=_unescape,
                   help="end when the generated text contains STR (not printed); escapes like \\n are understood")
    g.add_argument("--no-echo", action="store_true", help="print only the generated text, not the prompt")
    g.add_argument("--no-cache", action="store_true", help="recompute the whole context each token (slower)")
    g.set_defaults(run=_run_generate)


def _unescape(s: str) -> str:
    return s.encode("utf-8").decode("unicode_escape").encode("latin-1").decode("utf-8")
