"""``attnlab show --checkpoint`` pictures for the VQA and Evoformer checkpoints (registered in ``cli.show``).

    attnlab show --checkpoint runs/vqa --image-index 3            # where each answer word looked
    attnlab show --checkpoint runs/evoformer-tagged-axial --image-index 0

VQA: test question N is answered greedily; per decoder layer one panel per answer word (and the
EOS) shows its cross-attention over the image patches (mean of the heads, or ``--head``).
Evoformer: held-out sample N; the predicted contact probabilities with the true contacts outlined,
and per block the row attention averaged over the R sequences (query column -> key column, one
panel per head; a tagged sample's tag column is labelled "tag").
"""
from __future__ import annotations

import argparse
from pathlib import Path

from .show_common import out_file, pick, reject_unused

__all__ = ["show_vqa", "show_evoformer"]


def show_vqa(args: argparse.Namespace, model, task, stem: str) -> list[Path]:
    """Answer test question N, then per decoder layer where each answer word looked in the image."""
    from ..data.vqa import EOS, VOCAB, decode
    from ..lab.heatmaps import cross_attention, save
    reject_unused(args, "vqa", "--text", "--source")
    i = args.image_index or 0
    raw, x, question, truth = task.test_example(i)          # (C, H, W); (1, C, H, W); (1, Lq); the true answer
    ids, w = model.answer(x, question)                       # (1, T); (1, layers, heads, T, S)
    words = ids[0].tolist()
    T = words.index(EOS) + 1 if EOS in words else len(words)
    labels = [VOCAB[t] for t in words[:T]]
    w = w[0, :, :, :T]                                       # (layers, heads, T, S)
    layers, heads = pick(args.layer, w.shape[0], "layer"), pick(args.head, w.shape[1], "head")
    said = " ".join(label for label in labels if label != VOCAB[EOS])
    blind = " [text-only model: it saw zeros]" if model.cfg.blind else ""
    out, written = Path(args.out), []
    for layer in layers:
        fig = cross_attention(w[layer, heads], labels, image=raw, grid=model.cfg.vit.grid,
                              title=f"VQA layer {layer}: {decode(question[0])!r}{blind}\n"
                                    f"answer {said!r} (true: {truth!r})")
        written.append(save(fig, out_file(out, stem, f"question{i}-layer{layer}", args.format)))
    return written


def show_evoformer(args: argparse.Namespace, model, task, stem: str) -> list[Path]:
    """Held-out sample N: predicted contacts against the truth, and each block's row attention."""
    import torch

    from ..lab.heatmaps import head_grid, plot_head, save
    reject_unused(args, "evoformer", "--text", "--source")
    i = args.image_index or 0
    samples = [(m[j], c[j]) for m, c in task.test_set() for j in range(len(m))]
    if not 0 <= i < len(samples):
        raise ValueError(f"held-out sample {i} is out of range: evaluate() uses {len(samples)} (0..{len(samples) - 1})")
    msa, contacts = samples[i]                                                  # (R, C), (C, C)
    cap: list = []
    with torch.no_grad():
        prob = torch.sigmoid(model(msa[None], capture=cap))[0]                  # (C, C)
    A = task.data.vocab
    labels = ["tag" if bool((msa[:, c] >= A).all()) else str(c) for c in range(msa.shape[1])]
    truth = [(a, b) for a, b in torch.triu(contacts, 1).nonzero().tolist()]
    cfg = model.cfg
    what = f"{task.data.coupling} contacts" + (f", without {', '.join(cfg.ablate)}" if cfg.ablate else "")
    out, written = Path(args.out), []
    prob.fill_diagonal_(0.0)                                                    # a column is not its own contact
    fig = plot_head(prob.numpy(), labels, labels, vmin=0.0, vmax=1.0, mark=truth,
                    title=f"{cfg.kind} model, {what}\nP(contact), true contacts outlined (sample {i})")
    fig.axes[0].set_xlabel("column j", fontsize=8)
    fig.axes[0].set_ylabel("column i", fontsize=8)
    fig.axes[1].set_ylabel("P(contact)")
    written.append(save(fig, out_file(out, stem, f"sample{i}-contacts", args.format)))
    if cfg.kind != "axial" or "row-attention" in cfg.ablate:
        return written                                                          # no row attention to draw
    per_block = len(cap) // cfg.n_blocks                                        # row (and column) attention
    rows = [cap[b * per_block].weights[0].mean(0) for b in range(cfg.n_blocks)]  # (H, C, C) each, mean over R
    heads = pick(args.head, cfg.n_heads, "head")
    for b in pick(args.layer, cfg.n_blocks, "layer"):
        fig = head_grid(rows[b][heads].numpy(), labels, head_names=[f"head {h}" for h in heads],
                        title=f"block {b} row attention (mean over the {msa.shape[0]} sequences), {what}")
        written.append(save(fig, out_file(out, stem, f"sample{i}-block{b}-rows", args.format)))
    return written
