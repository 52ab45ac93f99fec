"""``attnlab show``: attention heatmaps of a model for an input, written as PNG or SVG files.

    attnlab show --text "The award, which was given for lifetime achievement, sat proudly on the shelf"
    attnlab show --model toy-encoder --text "the dog bit the man" --format svg --out runs/show
    attnlab show --text "..." --layer 2 --head 7             # layer 2's head grid and head 7's own map
    attnlab show --checkpoint runs/gpt --text "def main"     # a GPT trained by `attnlab train gpt`

Files (``--out``, default runs/show; ``STEM`` is the model name or ``ckpt-<run directory>``):

    STEM-layers.EXT             every layer and head as small multiples (without --layer)
    STEM-layerL.EXT             layer L's heads in a grid, token labels, one colour scale
    STEM-layerL-headH.EXT       one head's map (with --head; in every layer, or only --layer's)

Checkpoints of the other models of issue #6 slot in by their task name (``extra["task"]``):
``--image-index N`` picks a test image (ViT: attention of [CLS] over the patches; captioner:
each caption token's attention over the image), ``--source "..."`` a seq2seq input (decoder to
source cross-attention). Kinds without a renderer yet fail with "checkpoint kind X is not
supported yet". The written paths go to stdout, one per line; errors end with
"attnlab: error: ..." and exit status 2.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Callable, Optional

from .cli_util import fail

__all__ = ["add_show", "show_text", "DEFAULT_OUT"]

DEFAULT_OUT = "runs/show"
_STEM_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


def _file(out: Path, stem: str, part: str, fmt: str) -> Path:
    return out / f"{stem}-{part}.{fmt}"


def show_text(name: str, text: str, *, layer: Optional[int] = None, head: Optional[int] = None,
              out: str = DEFAULT_OUT, fmt: str = "png", stem: Optional[str] = None) -> list[Path]:
    """Render the attention of registered model ``name`` (``attnlab.lab.inspect``) on ``text``.

    Args:
        layer: only this layer's head grid (default: every layer, plus the all-layers overview).
        head: also one map of this head, in ``layer`` or (without it) in every layer.
        out, fmt: directory and "png" / "svg".
        stem: the file name prefix (default ``name``).
    Returns:
        the files written, in the order above.
    Example:
        show_text("toy-encoder", "the dog bit the man", layer=0, head=1)   # [.../toy-encoder-layer0.png, ...]
    """
    from .lab.heatmaps import FORMATS, head_grid, layer_head_grid, plot_head, save
    from .lab.inspect import attention_maps
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    # one pass on the reference backend: exact weights, no second run to measure agreement
    maps = attention_maps(name, text, layer=layer, head=None, backend="reference")
    w, tokens = maps.weights.numpy(), maps.tokens                 # (len(layers), H, L, L)
    if head is not None and not 0 <= head < w.shape[1]:
        raise ValueError(f"head {head} does not exist: {name!r} has {w.shape[1]} heads, numbered 0..{w.shape[1] - 1}")
    outdir, stem = Path(out), stem or name
    written = []
    if layer is None and len(maps.layers) > 1:
        written.append(save(layer_head_grid(w, title=f"{name}: every layer and head  ({len(tokens)} tokens)"),
                            _file(outdir, stem, "layers", fmt)))
    for i, l in enumerate(maps.layers):
        written.append(save(head_grid(w[i], tokens, title=f"{name}, layer {l}"), _file(outdir, stem, f"layer{l}", fmt)))
    if head is not None:
        for i, l in enumerate(maps.layers):
            fig = plot_head(w[i, head], tokens, title=f"{name}, layer {l}, head {head}")
            written.append(save(fig, _file(outdir, stem, f"layer{l}-head{head}", fmt)))
    return written


def _checkpoint_kind(path: str) -> str:
    """The task that wrote the checkpoint at ``path`` (GPT checkpoints from before tasks have none)."""
    from .train.checkpoint import load_checkpoint
    return load_checkpoint(path).extra.get("task", "gpt")


def _show_gpt_checkpoint(args: argparse.Namespace) -> list[Path]:
    from .lab.inspect import register_model
    from .train.checkpoint import load_gpt
    ckpt = Path(args.checkpoint)
    # a registered name, so the checkpoint gets the same tokenizing, caps and checks as the built-in models
    name = ("ckpt-" + _STEM_CHARS.sub("-", ckpt.resolve().name).strip("-"))[:64]
    register_model(name, lambda: load_gpt(ckpt), description=f"GPT checkpoint {ckpt}")
    return _show_named(args, name)


def _show_named(args: argparse.Namespace, name: str) -> list[Path]:
    if args.text is None:
        raise ValueError(f"--text is required for {name!r}: the sentence whose attention to draw")
    for flag, given in (("--source", args.source), ("--image-index", args.image_index)):
        if given is not None:
            raise ValueError(f"{flag} is for seq2seq / image checkpoints, not the text model {name!r}")
    return show_text(name, args.text, layer=args.layer, head=args.head, out=args.out, fmt=args.format)


# Renderers by checkpoint kind (the task name in the checkpoint). Kinds not listed fail clearly.
_CHECKPOINT_RENDERERS: dict[str, Callable[[argparse.Namespace], list[Path]]] = {
    "gpt": _show_gpt_checkpoint,
}


def _run_show(args: argparse.Namespace) -> int:
    from .lab.heatmaps import FORMATS
    from .lab.inspect import ModelLoadError
    from .train.checkpoint import CheckpointError
    try:
        if args.format not in FORMATS:
            raise ValueError(f"unknown format {args.format!r}; choose from {', '.join(FORMATS)}")
        for flag, v in (("--layer", args.layer), ("--head", args.head), ("--image-index", args.image_index)):
            if v is not None and v < 0:
                raise ValueError(f"{flag} must be >= 0, got {v}")
        if args.checkpoint is not None:
            kind = _checkpoint_kind(args.checkpoint)
            if kind not in _CHECKPOINT_RENDERERS:
                raise ValueError(f"checkpoint kind {kind!r} is not supported yet by `attnlab show` "
                                 f"(supported: {', '.join(_CHECKPOINT_RENDERERS)})")
            written = _CHECKPOINT_RENDERERS[kind](args)
        else:
            written = _show_named(args, args.model)
    except (ValueError, CheckpointError, ModelLoadError) as e:    # bad input or a broken checkpoint
        return fail(str(e))
    for p in written:
        print(p)
    return 0


def add_show(sub) -> None:
    """Register ``attnlab show`` on an argparse subparsers object."""
    s = sub.add_parser(
        "show", help="attention heatmaps (PNG/SVG) of a model for a text, image or source sentence",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Draw attention weights: per layer a grid of every head with token labels and one colour\n"
                    "scale, an overview of all layers, and single heads on request. Writes PNG or SVG files and\n"
                    "prints their paths.",
        epilog="models: minilm (pretrained all-MiniLM-L6-v2), toy-encoder (small, random, instant),\n"
               "gpt-demo (the GPT `make demo` trains); or --checkpoint PATH from `attnlab train`.")
    which = s.add_mutually_exclusive_group()
    which.add_argument("--model", default="minilm", help="a registered model name (default minilm)")
    which.add_argument("--checkpoint", metavar="PATH", help="a run or step-* directory written by `attnlab train`")
    s.add_argument("--text", help="the input sentence (text models)")
    s.add_argument("--source", metavar="TEXT", help="seq2seq checkpoints: the source sentence to translate")
    s.add_argument("--image-index", type=int, metavar="N",
                   help="ViT / captioner checkpoints: which test image to show (default 0)")
    s.add_argument("--layer", type=int, metavar="L", help="only this layer (numbered from 0)")
    s.add_argument("--head", type=int, metavar="H", help="also draw this head alone (numbered from 0)")
    s.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help=f"output directory (default {DEFAULT_OUT})")
    s.add_argument("--format", default="png", metavar="FMT", help="png (default) or svg")
    s.set_defaults(run=_run_show)
