"""What the ``attnlab show`` renderers share (``show.py``, ``show_tasks.py``): file names, and the checks
of ``--layer``/``--head``/``--image-index`` and of options a kind of checkpoint does not use.

    out_file(Path("runs/show"), "gpt", "layer0", "png")      # runs/show/gpt-layer0.png
    pick(None, 4, "head")                                    # [0, 1, 2, 3]: every head
    pick(7, 4, "head")                                       # ValueError: head 7 does not exist: ...
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

__all__ = ["out_file", "pick", "reject_unused"]


def out_file(out: Path, stem: str, part: str, fmt: str) -> Path:
    """``out/STEM-PART.FMT``: every picture's name."""
    return out / f"{stem}-{part}.{fmt}"


def pick(value: Optional[int], n: int, what: str) -> list[int]:
    """The indices a ``--layer``/``--head`` value selects among ``n``: all of them for None, else that one
    (a ValueError naming the range when it does not exist)."""
    if value is None:
        return list(range(n))
    if not 0 <= value < n:
        raise ValueError(f"{what} {value} does not exist: the model has {n} {what}s, numbered 0..{n - 1}")
    return [value]


def reject_unused(args: argparse.Namespace, kind: str, *flags: str) -> None:
    """Reject options that mean nothing for this kind of checkpoint (rather than silently ignoring them)."""
    for flag in flags:
        if getattr(args, flag.lstrip("-").replace("-", "_")) is not None:
            raise ValueError(f"{flag} is not used by {kind} checkpoints")
