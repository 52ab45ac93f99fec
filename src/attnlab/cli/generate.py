"""``attnlab generate``: sample from a language model trained by ``attnlab train gpt`` or ``train code``.

    attnlab generate runs/code --prompt "def " --max-new-tokens 200 --top-k 20 --seed 0 --stop "\\n\\n"

Results go to stdout, progress and warnings to stderr. Errors (unknown data path, a prompt the
tokenizer cannot encode, a broken checkpoint, a run of another task such as vit) end with
"attnlab: error: ..." and exit status 2.
"""
from __future__ import annotations

import argparse
import sys

from .util import EXIT_INTERRUPTED, fail

__all__ = ["add_generate", "stream_with_stops"]


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


def _check_sampling(args: argparse.Namespace) -> None:
    """ValueError naming the flag, before anything is loaded or printed."""
    from ..train.config import check_seed
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if not 0 <= args.temperature < float("inf"):
        raise ValueError(f"--temperature must be >= 0 (0 = greedy), got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        raise ValueError(f"--top-k must be >= 1, got {args.top_k}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise ValueError(f"--top-p must be in (0, 1], got {args.top_p}")
    if not args.prompt:
        raise ValueError("--prompt must not be empty (the model needs at least one token to continue)")
    if args.stop is not None and "" in args.stop:
        raise ValueError("--stop must not be empty: every text contains the empty string, so nothing would be "
                         "generated; give the text to stop at, e.g. --stop '\\n\\n'")
    if args.seed is not None:
        check_seed(args.seed, "--seed")


# The tasks whose checkpoints hold a language model (a GPT, or the code task's LSTM baseline)
LANGUAGE_MODEL_TASKS = ("gpt", "code")


def _check_task(path: str) -> None:
    """ValueError when the checkpoint at ``path`` is not a language model (a ViT, a seq2seq model, ...)."""
    from ..train.checkpoint import load_checkpoint
    task = load_checkpoint(path, train_state=False).extra.get("task", "gpt")   # before tasks: a GPT
    if task not in LANGUAGE_MODEL_TASKS:
        raise ValueError(f"{path} is a {task!r} run: generate takes a language-model run (written by "
                         f"`attnlab train {' or '.join(LANGUAGE_MODEL_TASKS)}`); use `attnlab eval {path}` or "
                         f"`attnlab show --checkpoint {path}` for this one")


def _run_generate(args: argparse.Namespace) -> int:
    try:
        return _generate(args)
    except KeyboardInterrupt:                  # Ctrl-C while streaming: end the line, no traceback
        sys.stdout.write("\n")
        sys.stdout.flush()
        print("attnlab: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _generate(args: argparse.Namespace) -> int:
    import secrets

    import torch

    from ..data.tokenization import IncrementalDecoder
    from ..tasks.code_models import load_language_model
    from ..train import CheckpointError
    try:
        _check_sampling(args)
        _check_task(args.checkpoint)
        model, tok = load_language_model(args.checkpoint)          # a GPT, or the code task's LSTM baseline
        ids = tok.encode(args.prompt)
        if len(ids) > model.cfg.max_len:
            print(f"warning: the prompt is {len(ids)} tokens, the context holds {model.cfg.max_len}: "
                  f"only its last {model.cfg.max_len} tokens are used", file=sys.stderr)
            ids = ids[-model.cfg.max_len:]
        # no --seed: a fresh one each run (the library's default would repeat torch's global state)
        seed = args.seed if args.seed is not None else secrets.randbits(63)
        stream = model.generate_tokens(torch.tensor([ids]), args.max_new_tokens, temperature=args.temperature,
                                       top_k=args.top_k, top_p=args.top_p, seed=seed, use_cache=not args.no_cache)
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
        return fail(str(e))
    return 0


def add_generate(sub) -> None:
    g = sub.add_parser("generate", help="sample text from a trained language model (a gpt or code run), streamed",
                       description="Continue --prompt with a language model saved by `attnlab train gpt` or "
                                   "`attnlab train code`. Tokens are printed as "
                                   "they are sampled. A prompt longer than the model's context is cut from the left "
                                   "(with a warning).")
    g.add_argument("checkpoint", help="a run directory (its latest checkpoint) or a step-NNNNNN directory")
    g.add_argument("--prompt", default="\n", help="the text to continue (default: a newline)")
    g.add_argument("--max-new-tokens", type=int, default=200, help="tokens to sample, >= 1 (default 200)")
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
    """``--stop``'s text with Python's escapes read: '\\n' -> newline, '\\u2713' -> '✓'; other characters as given.

    Characters beyond latin-1 become \\uXXXX escapes first, so that unicode_escape (which reads bytes as
    latin-1) gives them back unchanged.
    """
    try:
        return s.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except UnicodeError as e:
        raise argparse.ArgumentTypeError(f"cannot read the escapes in {s!r} ({e.reason}); write \\n, \\t, "
                                         "\\\\ or \\uXXXX, or the character itself") from None
