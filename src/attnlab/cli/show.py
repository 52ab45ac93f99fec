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
from pathlib import Path
from typing import Callable, Optional

from .show_common import out_file, pick, reject_unused
from .show_tasks import show_evoformer, show_msa, show_vqa
from .util import fail, writable_dir

__all__ = ["add_show", "show_text", "DEFAULT_OUT"]

DEFAULT_OUT = "runs/show"
_STEM_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


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
    from ..lab.heatmaps import FORMATS, head_grid, layer_head_grid, plot_head, save
    from ..lab.inspect import attention_maps
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
                            out_file(outdir, stem, "layers", fmt)))
    for i, layer_no in enumerate(maps.layers):
        fig = head_grid(w[i], tokens, title=f"{name}, layer {layer_no}")
        written.append(save(fig, out_file(outdir, stem, f"layer{layer_no}", fmt)))
    if head is not None:
        for i, layer_no in enumerate(maps.layers):
            fig = plot_head(w[i, head], tokens, title=f"{name}, layer {layer_no}, head {head}")
            written.append(save(fig, out_file(outdir, stem, f"layer{layer_no}-head{head}", fmt)))
    return written


def _stem(checkpoint) -> str:
    """``ckpt-<run directory name>``: a file prefix, and a valid registered model name."""
    return ("ckpt-" + _STEM_CHARS.sub("-", Path(checkpoint).resolve().name).strip("-"))[:64]


def _checkpoint_kind(path: str) -> str:
    """The task that wrote the checkpoint at ``path`` (GPT checkpoints from before tasks have none)."""
    from ..train.checkpoint import load_checkpoint
    return load_checkpoint(path).extra.get("task", "gpt")


def _show_gpt_checkpoint(args: argparse.Namespace) -> list[Path]:
    from ..lab.inspect import register_model
    from ..train.checkpoint import load_gpt
    ckpt = Path(args.checkpoint)
    # a registered name, so the checkpoint gets the same tokenizing, caps and checks as the built-in models
    name = _stem(ckpt)
    register_model(name, lambda: load_gpt(ckpt), description=f"GPT checkpoint {ckpt}")
    return _show_named(args, name)


def _show_named(args: argparse.Namespace, name: str) -> list[Path]:
    if args.text is None:
        raise ValueError(f"--text is required for {name!r}: the sentence whose attention to draw")
    for flag, given in (("--source", args.source), ("--image-index", args.image_index)):
        if given is not None:
            raise ValueError(f"{flag} is for seq2seq / image checkpoints, not the text model {name!r}")
    return show_text(name, args.text, layer=args.layer, head=args.head, out=args.out, fmt=args.format)


def _show_vit(args: argparse.Namespace, model, task, stem: str) -> list[Path]:
    """Per layer, where the pooled output ([CLS], or the mean of all queries) looks in test image N; rollout."""
    import torch

    from ..lab.heatmaps import patch_attention, save
    reject_unused(args, "vit", "--text", "--source")
    i = args.image_index or 0
    raw, x, label = task.test_example(i)                              # (C, H, W) pixels; (1, C, H', W') model input
    with torch.no_grad():
        pred = int(model(x).argmax(-1))
    maps = model.attention_maps(x)[0]                                 # (layers, heads, gh, gw)
    layers, heads = pick(args.layer, maps.shape[0], "layer"), pick(args.head, maps.shape[1], "head")
    grid = tuple(maps.shape[-2:])
    who = "[CLS]" if model.cfg.pooling == "cls" else "the mean query"
    about = f"test image {i}: digit {label}, predicted {pred}"
    out, written = Path(args.out), []
    for layer in layers:
        fig = patch_attention(raw, maps[layer, heads].flatten(1), grid, head_names=[f"head {h}" for h in heads],
                              title=f"ViT layer {layer}: where {who} looks; {about}")
        written.append(save(fig, out_file(out, stem, f"image{i}-layer{layer}", args.format)))
    if args.layer is None and args.head is None:
        rollout = model.rollout_map(x)[0].flatten()                   # (N,): attention composed over layers
        fig = patch_attention(raw, rollout, grid, head_names=["rollout"], title=f"ViT attention rollout; {about}")
        written.append(save(fig, out_file(out, stem, f"image{i}-rollout", args.format)))
    return written


def _show_captioner(args: argparse.Namespace, model, task, stem: str) -> list[Path]:
    """Caption test scene N, then per decoder layer where each generated word looked in the image."""
    from ..data.scenes import EOS, VOCAB
    from ..lab.heatmaps import cross_attention, save
    reject_unused(args, "captioner", "--text", "--source")
    i = args.image_index or 0
    raw, x, truth = task.test_example(i)                              # (C, H, W); (1, C, H, W); the true caption
    ids, w = model.caption(x, return_cross_attention=True)            # (1, T); (1, layers, heads, T, S)
    words = ids[0].tolist()
    T = words.index(EOS) + 1 if EOS in words else len(words)          # the words and the EOS they ended with
    labels = [VOCAB[t] for t in words[:T]]
    w = w[0, :, :, :T]                                                # (layers, heads, T, S)
    layers, heads = pick(args.layer, w.shape[0], "layer"), pick(args.head, w.shape[1], "head")
    said = " ".join(label for label in labels if label != VOCAB[EOS])
    out, written = Path(args.out), []
    for layer in layers:
        fig = cross_attention(w[layer, heads], labels, image=raw, grid=model.cfg.vit.grid,
                              title=f"captioner layer {layer}: {said!r} (true: {truth!r})")
        written.append(save(fig, out_file(out, stem, f"scene{i}-layer{layer}", args.format)))
    return written


def _show_seq2seq(args: argparse.Namespace, model, task, stem: str) -> list[Path]:
    """Greedy-decode --source, then per decoder layer its cross-attention heads (output rows, source columns)."""
    import torch

    from ..data.seq2seq_tasks import EOS
    from ..lab.heatmaps import cross_attention, plot_head, save
    reject_unused(args, "seq2seq", "--text", "--image-index")
    if not args.source:
        raise ValueError("--source is required for seq2seq checkpoints: the input sequence to transduce")
    vocab = task.data.vocab
    ids = vocab.encode(list(args.source)) + [EOS]                     # one token per character, then EOS
    if len(ids) > model.cfg.max_len:
        raise ValueError(f"--source is {len(ids)} tokens with EOS, over this model's max_len {model.cfg.max_len}")
    src = torch.tensor([ids])                                         # (1, S)
    out_ids = model.greedy(src)[0].tolist()                           # generated, EOS included, then PAD
    out_ids = out_ids[:out_ids.index(EOS) + 1] if EOS in out_ids else out_ids
    tgt_in = torch.tensor([[model.cfg.bos_id] + out_ids[:-1]])        # (1, L): row t produces out_ids[t]
    w = model.cross_attention(src, tgt_in)[0].numpy()                 # (layers, H, L, S)
    show = [t if t != " " else "\u2423" for t in vocab.tokens]          # a visible space
    src_labels, out_labels = [show[t] for t in ids], [show[t] for t in out_ids]
    layers = pick(args.layer, w.shape[0], "layer")
    if args.head is not None:
        pick(args.head, w.shape[1], "head")
    title = f"cross-attention: {args.source!r} -> {vocab.decode(out_ids)!r}"
    out, written = Path(args.out), []
    for layer in layers:
        fig = cross_attention(w[layer], out_labels, src_labels, title=f"decoder layer {layer} {title}")
        written.append(save(fig, out_file(out, stem, f"cross-layer{layer}", args.format)))
        if args.head is not None:
            fig = plot_head(w[layer, args.head], out_labels, src_labels, title=f"layer {layer} head {args.head}")
            written.append(save(fig, out_file(out, stem, f"cross-layer{layer}-head{args.head}", args.format)))
    return written


def _show_code_checkpoint(args: argparse.Namespace) -> list[Path]:
    """The bracket head and the def -> use head of a code GPT (`attnlab train code`), on --text or an example."""
    from ..lab.code_pictures import show_code
    reject_unused(args, "code", "--source", "--image-index", "--layer", "--head")
    return show_code(args.checkpoint, args.text, out=args.out, fmt=args.format, stem=_stem(args.checkpoint))


def _show_task_checkpoint(render) -> Callable[[argparse.Namespace], list[Path]]:
    """A renderer for a checkpoint rebuilt through the task registry (model in eval mode, task)."""
    def show(args: argparse.Namespace) -> list[Path]:
        from ..tasks import load_model
        model, task = load_model(args.checkpoint)
        return render(args, model, task, _stem(args.checkpoint))
    return show


# Renderers by checkpoint kind (the task name in the checkpoint). Kinds not listed fail clearly.
_CHECKPOINT_RENDERERS: dict[str, Callable[[argparse.Namespace], list[Path]]] = {
    "gpt": _show_gpt_checkpoint,
    "vit": _show_task_checkpoint(_show_vit),
    "seq2seq": _show_task_checkpoint(_show_seq2seq),
    "captioner": _show_task_checkpoint(_show_captioner),
    "code": _show_code_checkpoint,
    "vqa": _show_task_checkpoint(show_vqa),
    "evoformer": _show_task_checkpoint(show_evoformer),
    "msa": _show_task_checkpoint(show_msa),
}


def _run_show(args: argparse.Namespace) -> int:
    from ..lab.heatmaps import FORMATS
    from ..lab.inspect import ModelLoadError
    from ..train.checkpoint import CheckpointError
    try:
        if args.format not in FORMATS:
            raise ValueError(f"unknown format {args.format!r}; choose from {', '.join(FORMATS)}")
        for flag, v in (("--layer", args.layer), ("--head", args.head), ("--image-index", args.image_index)):
            if v is not None and v < 0:
                raise ValueError(f"{flag} must be >= 0, got {v}")
        writable_dir(args.out, "--out")                            # before a model is loaded
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
                   help="ViT / captioner / VQA checkpoints: which test image (question) to show; evoformer: "
                        "which held-out sample (default 0); msa: which test-split family")
    s.add_argument("--layer", type=int, metavar="L", help="only this layer (numbered from 0)")
    s.add_argument("--head", type=int, metavar="H", help="also draw this head alone (numbered from 0)")
    s.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help=f"output directory (default {DEFAULT_OUT})")
    s.add_argument("--format", default="png", metavar="FMT", help="png (default) or svg")
    s.set_defaults(run=_run_show)
