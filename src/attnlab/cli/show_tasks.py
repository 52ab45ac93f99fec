"""``attnlab show --checkpoint`` pictures for the VQA, Evoformer and MSA checkpoints (registered in ``cli.show``).

    attnlab show --checkpoint runs/vqa --image-index 3            # where each answer word looked
    attnlab show --checkpoint runs/evoformer-tagged-axial --image-index 0
    attnlab show --checkpoint runs/msa-attention --image-index 2 --layer 3

VQA: test question N is answered greedily; per decoder layer one panel per answer word (and the
EOS) shows its cross-attention over the image patches (mean of the heads, or ``--head``).
Evoformer: held-out sample N; the predicted contact probabilities with the true contacts outlined,
and per block the row attention averaged over the R sequences (query column -> key column, one
panel per head; a tagged sample's tag column is labelled "tag").
MSA (``attnlab train msa``): held-out family N of the Potts *test* split; its true contact map beside
the tied row-attention maps (averaged over the family's blocks of ``rows`` sequences, symmetrized and
APC-corrected as the contact readout reads them): the mean over heads of every layer, or with
``--layer`` each head of that layer (``--head``: one head). The ablation (``--row mean``) has no row
attention: an error.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from .show_common import out_file, pick, reject_unused

__all__ = ["show_vqa", "show_evoformer", "show_msa"]


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


def show_msa(args: argparse.Namespace, model, task, stem: str) -> list[Path]:
    """Test family N: the true contacts, and the symmetrized, APC-corrected row-attention maps; one picture."""
    import numpy as np
    from matplotlib.figure import Figure

    from ..lab.contacts import apc, symmetrize
    from ..lab.heatmaps import save
    reject_unused(args, "msa", "--text", "--source")
    if model.cfg.row != "attention":
        raise ValueError(f"this checkpoint is the ablation without row attention (row={model.cfg.row!r}: mean "
                         "pooling over each row's columns): it has no row-attention maps to draw")
    i = args.image_index or 0
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    layers, heads = pick(args.layer, n_layers, "layer"), pick(args.head, n_heads, "head")
    fam = task.test_family(i)
    maps = task.row_maps(model, fam.msa)                                        # (layers, H, L, L)
    if args.layer is not None:
        panels = [(f"layer {layers[0]} head {h}", maps[layers[0], h]) for h in heads]
    elif args.head is not None:
        panels = [(f"layer {layer} head {heads[0]}", maps[layer, heads[0]]) for layer in layers]
    else:
        panels = [(f"layer {layer}, mean of {n_heads} heads", maps[layer].mean(0)) for layer in layers]
    L = fam.contacts.shape[0]
    near = np.abs(np.subtract.outer(np.arange(L), np.arange(L))) < task.data.min_separation   # never contacts
    ci, cj = np.nonzero(np.tril(fam.contacts))                                  # true contacts, lower triangle
    cols = min(len(panels) + 1, 5)
    rows = -(-(len(panels) + 1) // cols)
    fig = Figure(figsize=(2.6 * cols + 0.6, 2.6 * rows + 0.8), layout="constrained")
    ax = fig.add_subplot(rows, cols, 1)
    ax.imshow(fam.contacts, cmap="Greys", interpolation="nearest")
    ax.set_title(f"true contacts ({int(np.triu(fam.contacts).sum())})", fontsize=8)
    for k, (name, w) in enumerate(panels):
        score = np.where(near, np.nan, apc(symmetrize(np.asarray(w, dtype=np.float64))))   # (L, L)
        ax = fig.add_subplot(rows, cols, k + 2)
        # the colour scale of pairs that can be contacts; below 0 (APC: less than the background) is dark
        ax.imshow(score, cmap="viridis", vmin=0.0, vmax=max(float(np.nanmax(score)), 1e-12), interpolation="nearest")
        ax.scatter(cj, ci, s=16, facecolors="none", edgecolors="red", linewidths=0.9)
        ax.set_title(name, fontsize=8)
    for ax in fig.axes:
        ax.tick_params(labelsize=6)
    fig.suptitle(f"held-out test family {i} ({L} residues, {fam.msa.shape[0]} sequences): tied row attention, "
                 f"symmetrized and APC-corrected, averaged over blocks of {task.rows} sequences;\n"
                 f"true contacts circled in red below the diagonal", fontsize=9)
    which = [f"layer{args.layer}"] * (args.layer is not None) + [f"head{args.head}"] * (args.head is not None)
    part = "-".join([f"family{i}", *(which or ["layers"])])                  # family3-layers, family3-layer2-head1
    return [save(fig, out_file(Path(args.out), stem, part, args.format))]
