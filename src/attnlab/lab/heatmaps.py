"""Attention as pictures: heatmaps of one head, a layer's heads, a whole model, ViT patches, cross-attention.

Every function returns a ``matplotlib.figure.Figure`` built without pyplot (no global figure
registry, nothing to close, no display needed); ``save(fig, path)`` writes PNG or SVG by suffix.
Weights are rows = queries (L), columns = keys (S), each row a probability distribution; torch
tensors and numpy arrays are both accepted.

Example::

    maps = attention_maps("minilm", "The award ... sat proudly on the shelf")   # weights (layers, H, L, L)
    save(head_grid(maps.weights[2], maps.tokens, title="layer 2"), "runs/show/layer2.png")
    save(patch_attention(img, cls_attn, grid=(4, 4)), "runs/show/vit.svg")     # img (H, W), cls_attn (heads, 16)
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

__all__ = ["plot_head", "head_grid", "layer_head_grid", "patch_attention", "cross_attention", "save",
           "tick_positions", "FORMATS", "MAX_LABELS"]

FORMATS = ("png", "svg")
MAX_LABELS = 40               # beyond this many tokens, label every k-th one (k = ceil(n / MAX_LABELS))
CMAP = "viridis"              # perceptually uniform: equal weight steps look equally different
_CELL_IN = 0.14               # inches per token: a 7 pt label fits in one cell
_LABEL_PT = 7

ArrayLike = Union[np.ndarray, "torch.Tensor", Sequence]  # noqa: F821  (torch is optional here)


def _array(x, ndims: Sequence[int], name: str) -> np.ndarray:
    """``x`` as a float numpy array with one of ``ndims`` dimensions; ValueError naming the shape otherwise."""
    if hasattr(x, "detach"):                                 # a torch tensor, possibly on a GPU / with grad
        x = x.detach().float().cpu().numpy()
    a = np.asarray(x, dtype=np.float64)
    if a.ndim not in ndims:
        want = " or ".join(f"{d}-D" for d in ndims)
        raise ValueError(f"{name} must be {want}, got shape {a.shape}")
    if a.size == 0:
        raise ValueError(f"{name} is empty (shape {a.shape}): there is nothing to draw")
    if not np.isfinite(a).all():
        raise ValueError(f"{name} holds NaN or inf: attention weights should be finite probabilities")
    return a


def _labels(labels: Optional[Sequence[str]], n: int, name: str) -> Optional[list[str]]:
    if labels is None:
        return None
    labels = [str(t) for t in labels]
    if len(labels) != n:
        raise ValueError(f"{name} has {len(labels)} labels but the weights have {n} positions along that axis")
    # '$' would start mathtext; a newline or tab token (GPT, BPE) would break the row of labels
    return [t.replace("$", r"\$").replace("\n", "\\n").replace("\t", "\\t") for t in labels]


def tick_positions(n: int, max_labels: int = MAX_LABELS) -> list[int]:
    """Which of n tokens get a label: all of them up to max_labels, else every ceil(n / max_labels)-th.

    Example:
        tick_positions(100)      # [0, 3, 6, ..., 99]: 34 labels
    """
    step = max(1, math.ceil(n / max_labels))
    return list(range(0, n, step))


def _panel_inches(n: int) -> float:
    """Side of one heatmap in inches: a cell per token up to MAX_LABELS tokens, then fixed."""
    return min(max(n, 8), MAX_LABELS) * _CELL_IN


def _ticks(ax, q_labels, k_labels, *, show_q: bool = True, show_k: bool = True) -> None:
    for labels, show, set_ticks, set_labels in ((k_labels, show_k, ax.set_xticks, ax.set_xticklabels),
                                                (q_labels, show_q, ax.set_yticks, ax.set_yticklabels)):
        if labels is None or not show:
            set_ticks([])
            continue
        pos = tick_positions(len(labels))
        set_ticks(pos)
        set_labels([labels[i] for i in pos], fontsize=_LABEL_PT)
    ax.tick_params(axis="x", labelrotation=90, length=2)
    ax.tick_params(axis="y", length=2)


def _draw(ax, w: np.ndarray, *, vmin: float, vmax: float, cmap: str):
    # nearest: each cell is one (query, key) weight, never blurred into its neighbours
    return ax.imshow(w, cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest", aspect="auto")


def plot_head(weights: ArrayLike, q_labels: Optional[Sequence[str]] = None,
              k_labels: Optional[Sequence[str]] = None, *, ax=None, title: Optional[str] = None,
              vmin: float = 0.0, vmax: Optional[float] = None, cmap: str = CMAP, colorbar: bool = True,
              mark: Sequence[tuple[int, int]] = ()) -> Figure:
    """One head's attention matrix as a heatmap with token labels.

    Args:
        weights: (L, S) attention weights, row i = where query i looks.
        q_labels: L query tokens (y axis); k_labels: S key tokens (x axis); None = q_labels when L == S.
        ax: draw into this Axes (e.g. a panel of your own figure); None = a new Figure sized to the tokens.
        vmin, vmax: the colour scale (vmax None = the largest weight).
        colorbar: add a colour bar beside the Axes.
        mark: (query, key) cells to outline in red, e.g. the link a claim is about.
    Returns:
        the Figure drawn into.
    Example:
        fig = plot_head(w[5, 4], tokens, title="layer 5 head 4", mark=[(11, 2)])   # w (layers, heads, L, L)
    """
    w = _array(weights, (2,), "weights (L, S)")
    L, S = w.shape
    if k_labels is None and L == S:
        k_labels = q_labels
    q_labels, k_labels = _labels(q_labels, L, "q_labels"), _labels(k_labels, S, "k_labels")
    if ax is None:
        fig = Figure(figsize=(_panel_inches(S) + 2.2, _panel_inches(L) + 1.6), layout="constrained")
        ax = fig.add_subplot()
    fig = ax.get_figure()
    im = _draw(ax, w, vmin=vmin, vmax=(float(w.max()) or 1.0) if vmax is None else vmax, cmap=cmap)
    _ticks(ax, q_labels, k_labels)
    for i, j in mark:
        if not (0 <= i < L and 0 <= j < S):
            raise ValueError(f"mark ({i}, {j}) is outside the {L} x {S} weights")
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.5))
    ax.set_xlabel("key (attended to)", fontsize=8)
    ax.set_ylabel("query (attending)", fontsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    if colorbar:
        fig.colorbar(im, ax=ax, shrink=0.8, label="attention weight")
    return fig


def _grid_shape(n: int, ncols: Optional[int]) -> tuple[int, int]:
    cols = ncols or math.ceil(math.sqrt(n))
    if cols < 1:
        raise ValueError(f"ncols must be >= 1, got {cols}")
    return math.ceil(n / cols), cols


def head_grid(weights: ArrayLike, labels: Optional[Sequence[str]] = None,
              k_labels: Optional[Sequence[str]] = None, *, title: Optional[str] = None,
              ncols: Optional[int] = None, head_names: Optional[Sequence[str]] = None,
              cmap: str = CMAP) -> Figure:
    """All heads of one layer side by side, one shared colour scale, token labels on the outer panels.

    Args:
        weights: (H, L, S) one layer's attention weights.
        labels: L query tokens (and the keys too when k_labels is None and L == S).
        k_labels: S key tokens, for cross-attention (L != S or different sequences).
        ncols: panels per row (default ceil(sqrt(H))).
        head_names: H panel titles (default "head 0" ...).
    Returns:
        a Figure with H heatmap Axes (one image each) and one colour-bar Axes.
    Example:
        fig = head_grid(maps.weights[3], maps.tokens, title="MiniLM layer 3")
    """
    w = _array(weights, (3,), "weights (H, L, S)")
    H, L, S = w.shape
    if k_labels is None and L == S:
        k_labels = labels
    q_labels, k_labels = _labels(labels, L, "labels"), _labels(k_labels, S, "k_labels")
    names = list(head_names) if head_names is not None else [f"head {h}" for h in range(H)]
    if len(names) != H:
        raise ValueError(f"head_names has {len(names)} names for {H} heads")
    rows, cols = _grid_shape(H, ncols)
    label_in = 1.2 if (q_labels or k_labels) else 0.3        # room for the outer token labels
    fig = Figure(figsize=(cols * (_panel_inches(S) + 0.25) + label_in + 1.0,
                          rows * (_panel_inches(L) + 0.4) + label_in + 0.5), layout="constrained")
    vmax = float(w.max()) or 1.0                             # shared: heads compare by colour
    axes, im = [], None
    for h in range(H):
        r, c = divmod(h, cols)
        ax = fig.add_subplot(rows, cols, h + 1)
        im = _draw(ax, w[h], vmin=0.0, vmax=vmax, cmap=cmap)
        below_empty = (r + 1) * cols + c >= H                 # nothing under this panel: it is a bottom one
        _ticks(ax, q_labels, k_labels, show_q=c == 0, show_k=below_empty)
        ax.set_title(names[h], fontsize=8)
        axes.append(ax)
    fig.colorbar(im, ax=axes, shrink=0.6, label="attention weight")
    fig.supxlabel("key (attended to)", fontsize=8)
    fig.supylabel("query (attending)", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def layer_head_grid(weights: ArrayLike, *, title: Optional[str] = None, cmap: str = CMAP,
                    panel_inches: float = 1.1) -> Figure:
    """Small multiples of a whole model: one row per layer, one column per head, no token labels.

    Args:
        weights: (layers, heads, L, S).
        panel_inches: side of one panel.
    Returns:
        a Figure with layers * heads heatmap Axes (row-major: layer l, head h is Axes l * heads + h)
        and one colour-bar Axes; rows are labelled "layer l", columns "head h".
    Example:
        fig = layer_head_grid(maps.weights, title="MiniLM: every head")
    """
    w = _array(weights, (4,), "weights (layers, heads, L, S)")
    n_layers, H = w.shape[:2]
    fig = Figure(figsize=(H * panel_inches + 1.6, n_layers * panel_inches + 0.8), layout="constrained")
    vmax = float(w.max()) or 1.0
    axes, im = [], None
    for layer in range(n_layers):
        for h in range(H):
            ax = fig.add_subplot(n_layers, H, layer * H + h + 1)
            im = _draw(ax, w[layer, h], vmin=0.0, vmax=vmax, cmap=cmap)
            ax.set_xticks([])
            ax.set_yticks([])
            if layer == 0:
                ax.set_title(f"head {h}", fontsize=7)
            if h == 0:
                ax.set_ylabel(f"layer {layer}", fontsize=7)
            axes.append(ax)
    fig.colorbar(im, ax=axes, shrink=0.6, label="attention weight")
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def _image(image: ArrayLike) -> tuple[np.ndarray, Optional[str]]:
    """(H, W) or (H, W, 3) array for imshow and its colour map, from (H, W), (1, H, W) or (3, H, W)."""
    img = _array(image, (2, 3), "image (C, H, W) or (H, W)")
    if img.ndim == 3:
        if img.shape[0] not in (1, 3):
            raise ValueError(f"image must be (C, H, W) with C = 1 or 3 channels, got shape {img.shape}")
        img = img[0] if img.shape[0] == 1 else np.moveaxis(img, 0, -1)
    lo, hi = float(img.min()), float(img.max())
    img = (img - lo) / (hi - lo) if hi > lo else np.zeros_like(img)   # imshow wants RGB in [0, 1]
    return img, ("gray" if img.ndim == 2 else None)


def _patch_grid(attn: np.ndarray, grid: tuple[int, int], name: str) -> np.ndarray:
    """(..., N) attention over N = gh * gw patches -> (..., gh, gw), row-major as ViT flattens them."""
    gh, gw = (int(g) for g in grid)
    if gh < 1 or gw < 1:
        raise ValueError(f"grid must be two positive ints (patch rows, patch columns), got {grid}")
    N = attn.shape[-1]
    if N != gh * gw:
        hint = " (drop the [CLS] key first: attn[..., 1:])" if N == gh * gw + 1 else ""
        raise ValueError(f"{name} covers {N} positions but grid {gh}x{gw} has {gh * gw} patches{hint}")
    return attn.reshape(*attn.shape[:-1], gh, gw)             # patch n -> (n // gw, n % gw)


def _fading(cmap: str, alpha: float):
    """``cmap`` whose opacity rises from 0 to ``alpha`` with the weight: unattended patches show the image."""
    import matplotlib
    from matplotlib.colors import ListedColormap
    colours = matplotlib.colormaps[cmap](np.linspace(0.0, 1.0, 256))     # (256, 4) RGBA
    colours[:, 3] = alpha * np.linspace(0.0, 1.0, 256) ** 0.5           # sqrt: small weights still tint
    return ListedColormap(colours, name=f"{cmap}_fading")


def _overlay(ax, img: np.ndarray, img_cmap, heat: np.ndarray, *, vmax: float, alpha: float, cmap: str):
    """The image, then the patch heatmap stretched over it (nearest: a patch stays a sharp square)."""
    Hp, Wp = img.shape[:2]
    ax.imshow(img, cmap=img_cmap, extent=(0, Wp, Hp, 0), interpolation="nearest")
    im = ax.imshow(heat, cmap=_fading(cmap, alpha), vmin=0.0, vmax=vmax, extent=(0, Wp, Hp, 0),
                   interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    return im


def patch_attention(image: ArrayLike, attn: ArrayLike, grid: tuple[int, int], *, title: Optional[str] = None,
                    head_names: Optional[Sequence[str]] = None, alpha: float = 0.85, cmap: str = "inferno",
                    ncols: Optional[int] = None) -> Figure:
    """ViT: where one query (usually [CLS]) looks in the image, per head, drawn over the image.

    Args:
        image: (C, H, W) with C in {1, 3}, or (H, W); any value range (rescaled to [0, 1] for display).
        attn: (heads, N) or (N,) weights over the N = gh * gw patches (drop a [CLS] key first).
        grid: (gh, gw) patch rows and columns; patch n sits at row n // gw, column n % gw.
        alpha: opacity of the heatmap at the largest weight (it fades to transparent at 0).
    Returns:
        a Figure: the plain image first, then one overlay Axes per head (image + heatmap, 2 images
        each; the heatmap is the Axes' last image, shape (gh, gw)), and a colour bar.
    Example:
        fig = patch_attention(x[0], maps.weights[-1, :, 0, 1:], grid=(4, 4))   # last layer, [CLS] row
    """
    img, img_cmap = _image(image)
    a = _array(attn, (1, 2), "attn (heads, N) or (N,)")
    a = a[None] if a.ndim == 1 else a
    heat = _patch_grid(a, grid, "attn")                      # (heads, gh, gw)
    n = heat.shape[0]
    names = list(head_names) if head_names is not None else \
        (["attention"] if n == 1 else [f"head {h}" for h in range(n)])
    if len(names) != n:
        raise ValueError(f"head_names has {len(names)} names for {n} heads")
    rows, cols = _grid_shape(n + 1, ncols)
    fig = Figure(figsize=(cols * 2.2 + 1.0, rows * 2.3 + 0.4), layout="constrained")
    ax0 = fig.add_subplot(rows, cols, 1)
    ax0.imshow(img, cmap=img_cmap, interpolation="nearest")
    ax0.set_xticks([])
    ax0.set_yticks([])
    ax0.set_title("image", fontsize=8)
    vmax = float(heat.max()) or 1.0
    axes, im = [], None
    for h in range(n):
        ax = fig.add_subplot(rows, cols, h + 2)
        im = _overlay(ax, img, img_cmap, heat[h], vmax=vmax, alpha=alpha, cmap=cmap)
        ax.set_title(names[h], fontsize=8)
        axes.append(ax)
    fig.colorbar(im, ax=axes, shrink=0.7, label="attention weight")
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def cross_attention(weights: ArrayLike, text_labels: Sequence[str], source_labels: Optional[Sequence[str]] = None,
                    *, image: Optional[ArrayLike] = None, grid: Optional[tuple[int, int]] = None,
                    title: Optional[str] = None, alpha: float = 0.85, cmap: str = CMAP,
                    ncols: Optional[int] = None) -> Figure:
    """Decoder-to-source attention: seq2seq (source tokens) or a captioner (image patches).

    Args:
        weights: (L_text, S) for one head, or (H, L_text, S): heads are drawn as a grid against source
            tokens and averaged (the title says so) over an image.
        text_labels: the L_text decoder tokens (queries).
        source_labels: the S source tokens (seq2seq); give either these or ``image`` and ``grid``.
        image, grid: the captioner's image (C, H, W) or (H, W) and its (gh, gw) patch grid, S = gh * gw;
            one panel per text token shows where that token looked.
    Returns:
        a Figure: a heatmap (or head grid) with text rows and source columns; or one overlay Axes per
        text token (titled with it) and a colour bar.
    Example:
        fig = cross_attention(w, ["<s>", "el", "gato"], ["the", "cat", "</s>"])   # w (3, 3)
        fig = cross_attention(w, caption_tokens, image=img, grid=(4, 4))          # w (len(caption), 16)
    """
    w = _array(weights, (2, 3), "weights (L_text, S) or (H, L_text, S)")
    if (source_labels is None) == (image is None):
        raise ValueError("give either source_labels (seq2seq: source tokens) or image and grid (captioner)")
    if source_labels is not None:
        if w.ndim == 3:
            return head_grid(w, text_labels, source_labels, title=title, ncols=ncols, cmap=cmap)
        fig = plot_head(w, text_labels, source_labels, title=title, cmap=cmap)
        fig.axes[0].set_xlabel("source token (key)", fontsize=8)
        fig.axes[0].set_ylabel("output token (query)", fontsize=8)
        return fig
    if grid is None:
        raise ValueError("image needs grid=(patch rows, patch columns) to place the attention over it")
    n_heads = w.shape[0] if w.ndim == 3 else 1
    w = w.mean(axis=0) if w.ndim == 3 else w                 # (L_text, S): one picture per token
    tokens = _labels(text_labels, w.shape[0], "text_labels")
    heat = _patch_grid(w, grid, "weights")                   # (L_text, gh, gw)
    img, img_cmap = _image(image)
    rows, cols = _grid_shape(len(tokens), ncols)
    fig = Figure(figsize=(cols * 2.0 + 1.0, rows * 2.1 + 0.5), layout="constrained")
    vmax = float(heat.max()) or 1.0
    axes, im = [], None
    for t, tok in enumerate(tokens):
        ax = fig.add_subplot(rows, cols, t + 1)
        im = _overlay(ax, img, img_cmap, heat[t], vmax=vmax, alpha=alpha, cmap="inferno")
        ax.set_title(tok, fontsize=8)
        axes.append(ax)
    fig.colorbar(im, ax=axes, shrink=0.7, label="attention weight")
    suffix = f" (mean of {n_heads} heads)" if n_heads > 1 else ""
    fig.suptitle((title or "cross-attention over the image") + suffix, fontsize=10)
    return fig


def save(fig: Figure, path: Union[str, os.PathLike], *, dpi: int = 110) -> Path:
    """Write ``fig`` as PNG or SVG (by the file suffix), creating the directory; returns the path.

    The file appears whole or not at all (written beside it, then renamed).
    Example:
        save(head_grid(w, tokens), "runs/show/layer0.svg")
    """
    p = Path(path)
    fmt = p.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise ValueError(f"cannot save {p}: the suffix must be one of {', '.join('.' + f for f in FORMATS)}")
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp")
    try:
        fig.savefig(tmp, format=fmt, dpi=dpi)
        os.replace(tmp, p)
    finally:
        tmp.unlink(missing_ok=True)
    return p
