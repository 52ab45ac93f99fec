"""``attnlab demo`` (what ``make demo`` runs): the whole system in about four minutes, on embedded defaults.

1. trains a small GPT on Python's documentation (``docs``, ships with Python) for a fixed time,
   with the trainer's progress bar, into ``runs/demo/gpt``;
2. generates a sample from it with the KV cache (and says how fast, per token);
3. runs ``attnlab verify --quick``: every claim of the theory checked, report in ``runs/demo/verify``
   (the counted claims, the refuted ones with the checks they fail, the accounting; the demo's exit
   status is verify's: 0 when the run is as recorded);
4. renders attention maps (the trained GPT, and the real pretrained MiniLM on the "award ... sat"
   sentence) into ``runs/demo/maps``;
5. prints where everything is and how to start the web lab (``attnlab serve`` finds the demo GPT
   as "gpt-demo" when started from the same directory).

The GPT is trained in a scratch directory and moved into place only when complete, so a demo
interrupted half-way never leaves a broken ``runs/demo/gpt`` for ``attnlab serve`` to load.

Example::

    attnlab demo                          # defaults: 1.5 min of training, quick verification
    attnlab demo --train-minutes 5 --out runs/demo2
"""
from __future__ import annotations

import argparse
import math
import shutil
import textwrap
import time
from pathlib import Path

from .util import fail, fail_run, writable_dir
from .verify import format_result, report_departures, verdict_line

__all__ = ["add_demo", "DEMO_SENTENCE"]

DEMO_SENTENCE = "The award, which was given for lifetime achievement, sat proudly on the shelf."
DEMO_PROMPT = "The with statement "


def _say(msg: str) -> None:
    print(f"\n== {msg}", flush=True)


def _train_gpt(out: Path, minutes: float, progress: bool) -> Path:
    from ..data.prepare import prepare_lm_data
    from ..models import GPTConfig
    from ..tasks.lm import LMTask
    from ..train import Trainer, TrainConfig
    final, scratch = out / "gpt", out / ".gpt-training"
    shutil.rmtree(scratch, ignore_errors=True)
    data = prepare_lm_data("docs", "char")
    task = LMTask(GPTConfig.preset("nano", vocab_size=data.tokenizer.vocab_size), data)
    cfg = TrainConfig.for_preset("nano", steps=None, time_limit_min=minutes, out_dir=str(scratch),
                                 eval_interval=100, eval_iters=10, checkpoint_interval=10**6)
    trainer = Trainer(task, cfg, progress=progress)
    n = sum(p.numel() for p in trainer.model.parameters())
    print(f"GPT nano, {n / 1e6:.2f}M parameters, character-level on Python's docs "
          f"({len(data.train_ids):,} training characters), {minutes} min", flush=True)
    trainer.train()
    if trainer.interrupted:                    # Ctrl-C stops the demo (main: exit 130), not just its training
        raise KeyboardInterrupt
    per_char = trainer.last_val / data.val_chars_per_token
    print(f"validation loss after {trainer.step} steps: {per_char:.3f} nats/char "
          f"(uniform over {data.tokenizer.vocab_size} symbols: {math.log(data.tokenizer.vocab_size):.2f})")
    old = out / ".gpt-old"
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)                      # the previous demo's model goes only once the new one is complete
    scratch.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def _generate(path: Path, n_tokens: int) -> None:
    import torch

    from ..train import load_gpt
    model, tok = load_gpt(path)
    ids = torch.tensor([tok.encode(DEMO_PROMPT)])                        # (1, P)
    t0 = time.perf_counter()
    out = model.generate(ids, n_tokens, temperature=0.8, top_k=20, seed=0)   # KV cache: one new token per step
    dt = time.perf_counter() - t0
    print(tok.decode(out[0].tolist()))
    print(f"({n_tokens} tokens with the KV cache in {dt:.2f} s: {1e3 * dt / n_tokens:.1f} ms per token)")


def _check_args(args: argparse.Namespace) -> None:
    """ValueError naming the flag, before minutes of training: --train-minutes, --tokens, --out."""
    if not 0 < args.train_minutes < math.inf:
        raise ValueError(f"--train-minutes must be a positive number of minutes, got {args.train_minutes:g}")
    if args.tokens < 1:
        raise ValueError(f"--tokens must be >= 1 (tokens to sample), got {args.tokens}")
    writable_dir(args.out, "--out")


def _run_demo(args: argparse.Namespace) -> int:
    from ..lab.verify import run_verify
    from .show import show_text
    try:
        _check_args(args)
    except ValueError as e:
        return fail(str(e))
    t0 = time.perf_counter()
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        _say(f"1/4 training a small GPT ({args.train_minutes} min)")
        gpt = _train_gpt(out, args.train_minutes, progress=not args.no_progress)
        _say("2/4 sampling from it with the KV cache")
        _generate(gpt, args.tokens)
        _say("3/4 verifying the theory's claims (attnlab verify --quick)")
        result = run_verify(quick=True, out=str(out / "verify"), argv=["verify", "--quick"])
        print(textwrap.indent(format_result(result, 100), "  "))
        _say("4/4 rendering attention maps")
        from ..lab.inspect import register_model
        from ..train import load_gpt
        register_model("demo-run", lambda: load_gpt(gpt), description=f"the demo's GPT ({gpt})")
        maps = show_text("demo-run", DEMO_PROMPT.strip(), out=str(out / "maps"), stem="gpt")
        maps += show_text("minilm", DEMO_SENTENCE, layer=5, head=4, out=str(out / "maps"), stem="minilm")
        for p in maps:
            print(f"  {p}")
    except ValueError as e:
        return fail(str(e))
    except OSError as e:                       # a disk that failed half-way: what was written stays listed above
        return fail_run(f"{e.strerror or e}{f' ({e.filename})' if e.filename else ''}")
    _say(f"done in {time.perf_counter() - t0:.0f} s")
    print(f"claims verified: {verdict_line(result)}")
    print(f"report:          {result.paths['html']}")
    print(f"attention maps:  {out / 'maps'}")
    print(f"trained GPT:     {gpt}   (attnlab generate {gpt} --prompt 'The ')")
    print("web lab:         attnlab serve   (from this directory; then open http://127.0.0.1:8000/)")
    print("lesson:          http://127.0.0.1:8000/lesson   (same server: self-attention with Python in the page)")
    return report_departures(result)           # 0 when as recorded; what changed on stderr


def add_demo(sub) -> None:
    d = sub.add_parser("demo", help="the main job: train a small GPT, sample, verify the theory, draw attention",
                       description="Train a small GPT on embedded text, sample from it with the KV cache, run "
                                   "`attnlab verify --quick`, render attention maps, and print where the report "
                                   "is. Exit status 1 when a claim fails, or a claim recorded as refuted "
                                   "now passes or raises.")
    d.add_argument("--out", default="runs/demo", help="where everything goes (default runs/demo)")
    d.add_argument("--train-minutes", type=float, default=1.5, help="GPT training time, > 0 (default 1.5)")
    d.add_argument("--tokens", type=int, default=200, help="tokens to sample, >= 1 (default 200)")
    d.add_argument("--no-progress", action="store_true", help="no progress bar")
    d.set_defaults(run=_run_demo)
