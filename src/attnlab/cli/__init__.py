"""The ``attnlab`` command: one argparse subcommand per job (``attnlab --help`` lists them), one module each.

    attnlab demo                 demo.py       train a small GPT, sample, verify --quick, draw attention maps
    attnlab train NAME | eval RUN  train.py    any registered task (attnlab.tasks)
    attnlab generate RUN         generate.py   sample from a language-model checkpoint
    attnlab verify               verify.py     the lab's claims, judged, as a report
    attnlab show                 show.py       attention maps of a model or checkpoint (show_tasks.py: VQA, Evoformer)
    attnlab serve                serve.py      the web lab
    attnlab bench                bench.py      kernel timings and the other benchmarks (``attnlab bench --help``)
    attnlab explain              explain.py    which backend auto picks for a shape, and why (``attnlab.explain``)
    attnlab tune                 tune.py       measure this machine for auto's choices (a profile auto reads)

``util.py`` holds what every command shares: ``fail`` (``attnlab: error: ...``, exit 2 for bad input),
``fail_run`` (exit 1, a failure at run time), ``writable_dir``/``writable_file`` (an output path checked
before any work) and the status of a run stopped by Ctrl-C (130). An ``OSError`` that reaches ``main``
is one ``attnlab: error:`` line, exit 1, never a traceback.

Adding a subcommand: a module here with ``add_<name>(sub)`` that builds its parser and sets ``run=``
(a function of the parsed args returning the exit status), listed in ``SUBCOMMANDS`` below. Progress goes
to stderr (through ``logging``), results to stdout.
"""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Callable, Optional

from .bench import add_bench
from .demo import add_demo
from .explain import add_explain
from .generate import add_generate
from .serve import add_serve
from .show import add_show
from .train import add_eval, add_train
from .tune import add_tune
from .util import EXIT_INTERRUPTED, fail_run
from .verify import add_verify

__all__ = ["main", "build_parser", "SUBCOMMANDS"]

# in the order `attnlab --help` lists them
SUBCOMMANDS: list[Callable] = [
    add_demo, add_train, add_eval, add_generate, add_verify, add_show, add_serve, add_bench, add_explain,
    add_tune,
]


def build_parser() -> argparse.ArgumentParser:
    """The ``attnlab`` parser: every command of ``SUBCOMMANDS`` as a subparser (built on each call, so tests
    that patch a command's ``run`` see it)."""
    from ..tasks import task_names
    p = argparse.ArgumentParser(prog="attnlab", description="attnlab: exact, tested self-attention.",
                                epilog=f"models to train and evaluate (attnlab train NAME): {', '.join(task_names())}")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(sub)
    return p


def main(argv: Optional[list[str]] = None) -> int:
    """Run ``attnlab ARGV`` and return its exit status (0 ok, 1 a failed check, 2 bad input, 130 Ctrl-C).

    >>> main(["verify", "--list"])  # doctest: +SKIP
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.argv = argv                      # recorded in the report's metadata
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("attnlab")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        return args.run(args)
    except KeyboardInterrupt:            # Ctrl-C outside a command's own handling: a line, not a traceback
        print("\nattnlab: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as e:                 # the last net under every command: a disk, not the input, failed
        where = f" ({e.filename})" if e.filename else ""
        return fail_run(f"{e.strerror or e}{where}")
    finally:
        logger.removeHandler(handler)    # main() may be called again in-process (tests)
