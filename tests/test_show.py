"""attnlab.lab.heatmaps and ``attnlab show``: figures hold the right panels, data and labels; files are written;
patch attention lands on the right patch; the CLI renders a model and rejects bad input with exit status 2."""
from __future__ import annotations

import argparse

import matplotlib
import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg

from attnlab.cli.show import add_show
from attnlab.lab.heatmaps import (MAX_LABELS, cross_attention, head_grid, layer_head_grid, patch_attention,
                                  plot_head, save, tick_positions)

TOKENS = ["[CLS]", "the", "award", ",", "sat", "proud", "##ly", "[SEP]"]


def _softmax_rows(*shape, seed=0) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=shape) * 2
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _heatmap_axes(fig):
    """The Axes that hold a heatmap (the colour bar's Axes holds no AxesImage)."""
    return [ax for ax in fig.axes if ax.images]


def _ticklabels(ax, axis: str) -> list[str]:
    return [t.get_text() for t in (ax.get_xticklabels() if axis == "x" else ax.get_yticklabels())]


# -- single head -------------------------------------------------------------------------------------
def test_plot_head_draws_the_matrix_with_token_labels():
    w = _softmax_rows(8, 8)
    fig = plot_head(torch.tensor(w), TOKENS, title="h")
    (ax,) = _heatmap_axes(fig)
    assert len(fig.axes) == 2                                       # the heatmap and its colour bar
    np.testing.assert_allclose(np.asarray(ax.images[0].get_array()), w, rtol=0, atol=1e-6)
    assert _ticklabels(ax, "x") == TOKENS and _ticklabels(ax, "y") == TOKENS
    assert ax.images[0].get_clim() == (0.0, pytest.approx(w.max()))


def test_plot_head_cross_labels_and_existing_axes():
    from matplotlib.figure import Figure
    fig = Figure()
    ax = fig.add_subplot()
    w = _softmax_rows(3, 5)
    out = plot_head(w, ["a", "b", "c"], ["p", "q", "r", "s", "t"], ax=ax, colorbar=False)
    assert out is fig and fig.axes == [ax]
    assert _ticklabels(ax, "y") == ["a", "b", "c"] and _ticklabels(ax, "x") == ["p", "q", "r", "s", "t"]


def test_plot_head_marks_a_cell():
    fig = plot_head(_softmax_rows(4, 4), ["a", "b", "c", "d"], mark=[(3, 1)])
    (rect,) = _heatmap_axes(fig)[0].patches
    assert rect.get_xy() == (0.5, 2.5) and rect.get_width() == rect.get_height() == 1   # key 1, query 3
    with pytest.raises(ValueError, match="outside"):
        plot_head(_softmax_rows(4, 4), mark=[(4, 0)])


def test_labels_are_thinned_beyond_the_limit():
    n = 100
    toks = [f"t{i}" for i in range(n)]
    fig = plot_head(_softmax_rows(n, n), toks)
    ax = _heatmap_axes(fig)[0]
    step = -(-n // MAX_LABELS)                                      # ceil: 3
    assert _ticklabels(ax, "x") == toks[::step]
    assert list(ax.get_xticks()) == list(range(0, n, step))        # each label sits on its own token
    assert len(tick_positions(n)) <= MAX_LABELS and tick_positions(MAX_LABELS) == list(range(MAX_LABELS))


def test_special_characters_in_tokens_do_not_break_rendering(tmp_path):
    toks = ["$x", "a\nb", "\t", "ok"]
    fig = plot_head(_softmax_rows(4, 4), toks)
    assert _ticklabels(_heatmap_axes(fig)[0], "x") == [r"\$x", "a\\nb", "\\t", "ok"]
    assert save(fig, tmp_path / "special.png").stat().st_size > 0  # mathtext would fail on an unmatched '$'


# -- grids ---------------------------------------------------------------------------------------------
def test_head_grid_one_panel_per_head_shared_scale_outer_labels():
    H = 5
    w = _softmax_rows(H, 8, 8)
    fig = head_grid(w, TOKENS, ncols=3)                            # 2 rows: 3 + 2 panels
    axes = _heatmap_axes(fig)
    assert len(axes) == H and len(fig.axes) == H + 1               # + one shared colour bar
    for h, ax in enumerate(axes):
        np.testing.assert_allclose(np.asarray(ax.images[0].get_array()), w[h], atol=1e-6)
        assert ax.images[0].get_clim() == (0.0, pytest.approx(w.max()))   # one scale for every head
        assert ax.get_title() == f"head {h}"
    # y labels on the first column only; x labels where no panel sits below (h = 2, 3, 4)
    assert [bool(_ticklabels(ax, "y")) for ax in axes] == [True, False, False, True, False]
    assert [bool(_ticklabels(ax, "x")) for ax in axes] == [False, False, True, True, True]
    assert _ticklabels(axes[3], "y") == TOKENS and _ticklabels(axes[4], "x") == TOKENS


def test_head_grid_default_is_square_ish():
    fig = head_grid(_softmax_rows(12, 4, 4), ["a", "b", "c", "d"])
    rows_cols = {ax.get_subplotspec().get_geometry()[:2] for ax in _heatmap_axes(fig)}
    assert rows_cols == {(3, 4)}                                   # ceil(sqrt(12)) = 4 columns


def test_layer_head_grid_small_multiples():
    n_layers, H = 3, 4
    w = _softmax_rows(n_layers, H, 6, 6)
    fig = layer_head_grid(torch.tensor(w))
    axes = _heatmap_axes(fig)
    assert len(axes) == n_layers * H
    for i, ax in enumerate(axes):
        layer, h = divmod(i, H)
        np.testing.assert_allclose(np.asarray(ax.images[0].get_array()), w[layer, h], atol=1e-6)
        assert ax.get_xticks().size == 0                           # too small for labels
    assert [axes[layer * H].get_ylabel() for layer in range(n_layers)] == ["layer 0", "layer 1", "layer 2"]
    assert [axes[h].get_title() for h in range(H)] == [f"head {h}" for h in range(H)]


# -- patches -------------------------------------------------------------------------------------------
def _rendered_cell_brightness(fig, ax, grid) -> np.ndarray:
    """Mean brightness of each patch cell of ``ax`` as actually rendered (Agg pixels), (gh, gw)."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    rgb = np.asarray(canvas.buffer_rgba())[..., :3].astype(float).sum(-1)   # (Hpx, Wpx)
    bb = ax.get_window_extent()
    top = rgb.shape[0] - bb.y1                                     # display y is measured from the bottom
    gh, gw = grid
    ch, cw = bb.height / gh, bb.width / gw
    out = np.zeros(grid)
    for r in range(gh):
        for c in range(gw):                                        # the middle half of each cell: no borders
            y0, x0 = int(top + (r + 0.25) * ch), int(bb.x0 + (c + 0.25) * cw)
            out[r, c] = rgb[y0:int(y0 + ch / 2), x0:int(x0 + cw / 2)].mean()
    return out


@pytest.mark.parametrize("n", [0, 4, 7, 14])
def test_patch_attention_one_hot_lights_the_right_patch(n):
    gh, gw = 3, 5                                                  # not square: rows and columns cannot swap
    image = np.zeros((1, 12, 20))                                  # (C, H, W), black: only the heat shows
    attn = np.zeros(gh * gw)
    attn[n] = 1.0
    fig = patch_attention(image, attn, (gh, gw))
    axes = _heatmap_axes(fig)
    assert len(axes) == 2                                          # the plain image + one overlay
    heat = np.asarray(axes[1].images[-1].get_array())
    assert heat.shape == (gh, gw)
    assert np.unravel_index(heat.argmax(), heat.shape) == (n // gw, n % gw)   # row-major patches
    bright = _rendered_cell_brightness(fig, axes[1], (gh, gw))
    assert np.unravel_index(bright.argmax(), bright.shape) == (n // gw, n % gw)
    assert (np.delete(bright.ravel(), n) < bright.ravel()[n] / 2).all()


def test_patch_attention_matches_vit_row_major_patch_order():
    from einops import rearrange
    img = torch.zeros(1, 8, 12)                                    # 2x3 patches of 4x4 pixels
    img[0, 5, 9] = 1.0                                             # a pixel in patch row 1, column 2
    patches = rearrange(img, "c (h p1) (w p2) -> (h w) (p1 p2 c)", p1=4, p2=4)   # ViT's flattening
    attn = patches.sum(-1)                                         # (6,): one-hot at the marked patch
    heat = np.asarray(_heatmap_axes(patch_attention(img, attn, (2, 3)))[1].images[-1].get_array())
    assert heat[1, 2] == 1.0 and heat.sum() == 1.0


def test_patch_attention_heads_and_rgb():
    attn = _softmax_rows(4, 16)
    fig = patch_attention(np.random.default_rng(0).random((3, 8, 8)), attn, (4, 4), title="vit")
    axes = _heatmap_axes(fig)
    assert len(axes) == 5 and [ax.get_title() for ax in axes[1:]] == [f"head {h}" for h in range(4)]
    assert axes[0].images[0].get_array().shape == (8, 8, 3)        # (C, H, W) shown as RGB
    for h, ax in enumerate(axes[1:]):
        np.testing.assert_allclose(np.asarray(ax.images[-1].get_array()), attn[h].reshape(4, 4), atol=1e-6)


def test_patch_attention_errors():
    with pytest.raises(ValueError, match=r"drop the \[CLS\] key"):
        patch_attention(np.zeros((8, 8)), np.ones(17) / 17, (4, 4))
    with pytest.raises(ValueError, match="C = 1 or 3"):
        patch_attention(np.zeros((2, 8, 8)), np.ones(16) / 16, (4, 4))
    with pytest.raises(ValueError, match="positive"):
        patch_attention(np.zeros((8, 8)), np.ones(16) / 16, (0, 16))


# -- cross-attention -----------------------------------------------------------------------------------
def test_cross_attention_text_to_source_tokens():
    w = _softmax_rows(3, 4)
    fig = cross_attention(w, ["<s>", "el", "gato"], ["the", "cat", "sat", "</s>"])
    (ax,) = _heatmap_axes(fig)
    assert _ticklabels(ax, "y") == ["<s>", "el", "gato"] and _ticklabels(ax, "x") == ["the", "cat", "sat", "</s>"]
    np.testing.assert_allclose(np.asarray(ax.images[0].get_array()), w, atol=1e-6)
    fig = cross_attention(_softmax_rows(2, 3, 4), ["<s>", "el", "gato"], ["the", "cat", "sat", "</s>"])
    assert len(_heatmap_axes(fig)) == 2                            # (H, L, S): one panel per head


def test_cross_attention_over_an_image_one_panel_per_token():
    tokens = ["a", "seven", "."]
    w = np.zeros((3, 16))
    w[0, 0], w[1, 6], w[2, 15] = 1.0, 1.0, 1.0
    fig = cross_attention(w, tokens, image=np.zeros((8, 8)), grid=(4, 4))
    axes = _heatmap_axes(fig)
    assert [ax.get_title() for ax in axes] == tokens
    spots = [np.unravel_index(np.asarray(ax.images[-1].get_array()).argmax(), (4, 4)) for ax in axes]
    assert spots == [(0, 0), (1, 2), (3, 3)]
    heads = cross_attention(np.stack([w, w]), tokens, image=np.zeros((8, 8)), grid=(4, 4))
    assert "mean of 2 heads" in heads.get_suptitle()


def test_cross_attention_needs_one_kind_of_source():
    with pytest.raises(ValueError, match="either source_labels"):
        cross_attention(np.ones((2, 4)) / 4, ["a", "b"])
    with pytest.raises(ValueError, match="grid"):
        cross_attention(np.ones((2, 4)) / 4, ["a", "b"], image=np.zeros((4, 4)))


# -- input checks and files ----------------------------------------------------------------------------
def test_bad_weights_and_labels():
    with pytest.raises(ValueError, match=r"\(H, L, S\)"):
        head_grid(np.ones((4, 4)), None)
    with pytest.raises(ValueError, match="3 labels"):
        plot_head(np.ones((4, 4)) / 4, ["a", "b", "c"])
    with pytest.raises(ValueError, match="NaN"):
        plot_head(np.full((2, 2), np.nan))


def test_save_png_and_svg(tmp_path):
    fig = head_grid(_softmax_rows(2, 8, 8), TOKENS)
    png, svg = save(fig, tmp_path / "a" / "g.png"), save(fig, tmp_path / "g.svg")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = svg.read_text()
    assert "<svg" in text and "award" in text                      # labels are text in the SVG
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "g.png", "g.svg"]   # no temporary files left
    with pytest.raises(ValueError, match=r"\.png, \.svg"):
        save(fig, tmp_path / "g.jpg")


def test_no_pyplot_figures_are_left_open():
    import matplotlib.pyplot as plt
    before = plt.get_fignums()
    head_grid(_softmax_rows(2, 4, 4), ["a", "b", "c", "d"])
    patch_attention(np.zeros((4, 4)), np.ones(4) / 4, (2, 2))
    assert plt.get_fignums() == before
    assert matplotlib.get_backend() is not None


# -- the CLI -------------------------------------------------------------------------------------------
def _show(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="attnlab")
    add_show(p.add_subparsers(dest="cmd", required=True))
    args = p.parse_args(["show", *argv])
    return args.run(args)


def test_cli_toy_encoder_writes_every_layer(tmp_path, capsys):
    out = tmp_path / "show"
    assert _show(["--model", "toy-encoder", "--text", "the dog bit the man", "--out", str(out)]) == 0
    printed = capsys.readouterr().out.split()
    names = ["toy-encoder-layers.png", "toy-encoder-layer0.png", "toy-encoder-layer1.png"]
    assert printed == [str(out / n) for n in names]
    assert all((out / n).stat().st_size > 1000 for n in names)


def test_cli_layer_and_head_in_svg(tmp_path, capsys):
    args = ["--model", "toy-encoder", "--text", "the dog bit the man", "--out", str(tmp_path), "--format", "svg"]
    assert _show(args + ["--layer", "1", "--head", "3"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(tmp_path / "toy-encoder-layer1.svg"), str(tmp_path / "toy-encoder-layer1-head3.svg")]
    assert "bit" in (tmp_path / "toy-encoder-layer1-head3.svg").read_text()


def _tiny_gpt_checkpoint(path, task=None, **config_overrides):
    from attnlab.data.tokenization import CharTokenizer
    from attnlab.models import GPT, GPTConfig
    from attnlab.train.checkpoint import save_checkpoint
    tok = CharTokenizer.train("hello world")
    cfg = GPTConfig(vocab_size=tok.vocab_size, max_len=16, n_layers=2, n_heads=2, d_model=16)
    torch.manual_seed(0)
    return save_checkpoint(path, 1, GPT(cfg), tokenizer_json=tok.to_json(),
                           model_config={**cfg.to_dict(), **config_overrides},
                           train_config={}, extra={"task": task} if task else {})


def test_cli_gpt_checkpoint(tmp_path, capsys):
    ckpt = _tiny_gpt_checkpoint(tmp_path / "run")
    assert _show(["--checkpoint", str(tmp_path / "run"), "--text", "hello", "--head", "1",
                  "--out", str(tmp_path / "o")]) == 0
    printed = capsys.readouterr().out.split()
    assert [p.rsplit("/", 1)[1] for p in printed] == ["ckpt-run-layers.png", "ckpt-run-layer0.png",
                                                      "ckpt-run-layer1.png", "ckpt-run-layer0-head1.png",
                                                      "ckpt-run-layer1-head1.png"]
    assert ckpt.is_dir()


@pytest.mark.parametrize("argv, message", [
    (["--model", "toy-encoder", "--text", "   "], "empty"),
    (["--model", "no-such-model", "--text", "hi"], "no-such-model"),
    (["--model", "toy-encoder", "--text", "hi", "--layer", "2"], "layer 2 does not exist"),
    (["--model", "toy-encoder", "--text", "hi", "--head", "4"], "head 4 does not exist"),
    (["--model", "toy-encoder", "--text", "hi", "--layer", "-1"], "--layer must be >= 0"),
    (["--model", "toy-encoder", "--text", "hi", "--format", "jpg"], "unknown format 'jpg'"),
    (["--model", "toy-encoder"], "--text is required"),
    (["--model", "toy-encoder", "--text", "hi", "--source", "x"], "--source is for seq2seq"),
])
def test_cli_errors(tmp_path, capsys, argv, message):
    assert _show(argv + ["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab: error: ") and message in err
    assert not any(tmp_path.iterdir())                             # nothing written on error


def test_cli_checkpoint_errors(tmp_path, capsys):
    assert _show(["--checkpoint", str(tmp_path / "missing"), "--text", "hi"]) == 2
    assert "does not exist" in capsys.readouterr().err
    _tiny_gpt_checkpoint(tmp_path / "evo", task="no-such-kind")   # a kind show has no renderer for
    assert _show(["--checkpoint", str(tmp_path / "evo"), "--text", "hi"]) == 2
    assert "checkpoint kind 'no-such-kind' is not supported yet" in capsys.readouterr().err
    _tiny_gpt_checkpoint(tmp_path / "evo2", task="evoformer")     # a GPT marked evoformer: an error, no traceback
    assert _show(["--checkpoint", str(tmp_path / "evo2"), "--text", "hi"]) == 2
    assert "not written by `attnlab train evoformer`" in capsys.readouterr().err
    _tiny_gpt_checkpoint(tmp_path / "bad", positional="bogus")  # verifies, but cannot build a GPT
    assert _show(["--checkpoint", str(tmp_path / "bad"), "--text", "hi"]) == 2
    assert "could not be loaded" in capsys.readouterr().err


# -- checkpoints of the other models (issue #6) -----------------------------------------------------------
def _task_checkpoint(path, task):
    from attnlab.train.checkpoint import save_checkpoint
    torch.manual_seed(0)
    return save_checkpoint(path, 1, task.build_model(), tokenizer_json=task.tokenizer_json() or "",
                           model_config=task.model_config(), train_config={},
                           extra={"task": task.name, "data": task.info()})


def _spy(monkeypatch, name):
    """Record the arguments of attnlab.lab.heatmaps.<name> (the CLI imports it at call time) and still draw."""
    import attnlab.lab.heatmaps as hm
    calls, real = [], getattr(hm, name)
    monkeypatch.setattr(hm, name, lambda *a, **k: calls.append((a, k)) or real(*a, **k))
    return calls


def test_cli_vit_checkpoint_draws_cls_attention_over_the_test_image(tmp_path, capsys, monkeypatch):
    from attnlab.models.vit import ViTConfig
    from attnlab.tasks import load_model
    from attnlab.tasks.vit import ViTTask
    _task_checkpoint(tmp_path / "vit", ViTTask(ViTConfig.preset("digits", n_layers=2, d_model=16, n_heads=2)))
    calls = _spy(monkeypatch, "patch_attention")
    assert _show(["--checkpoint", str(tmp_path / "vit"), "--image-index", "3", "--out", str(tmp_path / "o")]) == 0
    names = [p.rsplit("/", 1)[1] for p in capsys.readouterr().out.split()]
    assert names == ["ckpt-vit-image3-layer0.png", "ckpt-vit-image3-layer1.png", "ckpt-vit-image3-rollout.png"]
    # independently: the [CLS] row of each layer's captured weights, without its own column, renormalised
    model, task = load_model(tmp_path / "vit")
    x = task.data.normalize(task.data.test_x[3:4])                 # upsample 1: the digits as they are
    cap: list = []
    with torch.no_grad():
        model.encode(x, capture=cap)
    for layer, (args, kwargs) in enumerate(calls[:2]):
        image, attn, grid = args
        cls = cap[layer].weights[0, :, 0, 1:]                      # (heads, N)
        np.testing.assert_allclose(np.asarray(attn), (cls / cls.sum(-1, keepdim=True)).numpy(), atol=1e-6)
        assert tuple(grid) == (4, 4) and torch.equal(torch.as_tensor(image), task.data.test_x[3])


def test_cli_vit_checkpoint_errors(tmp_path, capsys):
    from attnlab.models.vit import ViTConfig
    from attnlab.tasks.vit import ViTTask
    _task_checkpoint(tmp_path / "vit", ViTTask(ViTConfig.preset("digits", n_layers=1, d_model=16, n_heads=2)))
    for argv, message in ((["--image-index", "100000"], "test image index 100000 is out of range"),
                          (["--text", "hi"], "--text is not used by vit"),
                          (["--head", "2"], "head 2 does not exist")):
        assert _show(["--checkpoint", str(tmp_path / "vit"), *argv, "--out", str(tmp_path / "o")]) == 2
        assert message in capsys.readouterr().err


def test_cli_captioner_checkpoint_draws_where_each_generated_word_looked(tmp_path, capsys, monkeypatch):
    from attnlab.data.scenes import EOS, VOCAB
    from attnlab.tasks import load_model
    from attnlab.tasks.captioner import CaptionerTask, default_config
    _task_checkpoint(tmp_path / "cap", CaptionerTask(default_config(vit_layers=1, layers=2, d_model=16, heads=2)))
    calls = _spy(monkeypatch, "cross_attention")
    argv = ["--checkpoint", str(tmp_path / "cap"), "--image-index", "5", "--out", str(tmp_path / "o")]
    assert _show(argv) == 0
    names = [p.rsplit("/", 1)[1] for p in capsys.readouterr().out.split()]
    assert names == ["ckpt-cap-scene5-layer0.png", "ckpt-cap-scene5-layer1.png"]
    # independently: caption the same scene and read the cross-attention back teacher-forced
    model, task = load_model(tmp_path / "cap")
    image, x, _ = task.test_example(5)
    ids = model.caption(x)[0].tolist()
    T = ids.index(EOS) + 1 if EOS in ids else len(ids)
    tgt_in = torch.tensor([[1] + ids[:T - 1]])                     # BOS, then the generated words
    forced = model.cross_attention(x, tgt_in)[0]                    # (layers, heads, T, S)
    for layer, (args, kwargs) in enumerate(calls):
        weights, labels = args
        assert labels == [VOCAB[t] for t in ids[:T]] and tuple(kwargs["grid"]) == (4, 4)
        np.testing.assert_allclose(np.asarray(weights), forced[layer].numpy(), atol=1e-5)
        assert torch.equal(torch.as_tensor(kwargs["image"]), image)
    assert _show(["--checkpoint", str(tmp_path / "cap"), "--source", "x", "--out", str(tmp_path / "o")]) == 2
    assert "--source is not used by captioner" in capsys.readouterr().err


def test_cli_seq2seq_checkpoint_draws_cross_attention(tmp_path, capsys, monkeypatch):
    from attnlab.data.seq2seq_tasks import make_task
    from attnlab.tasks import load_model
    from attnlab.tasks.seq2seq import Seq2SeqTask, default_config
    data = make_task("reversal", n_symbols=6, min_len=2, max_len=6)
    _task_checkpoint(tmp_path / "s2s", Seq2SeqTask(data, default_config(data, d_model=16, n_heads=2)))
    calls = _spy(monkeypatch, "cross_attention")
    argv = ["--checkpoint", str(tmp_path / "s2s"), "--source", "abc", "--layer", "1", "--head", "0"]
    assert _show(argv + ["--out", str(tmp_path / "o")]) == 0
    names = [p.rsplit("/", 1)[1] for p in capsys.readouterr().out.split()]
    assert names == ["ckpt-s2s-cross-layer1.png", "ckpt-s2s-cross-layer1-head0.png"]
    (weights, out_labels, src_labels), _ = calls[0]
    assert src_labels == ["a", "b", "c", "<eos>"]
    model, task = load_model(tmp_path / "s2s")
    out = model.greedy(torch.tensor([task.data.vocab.encode("abc") + [2]]))[0].tolist()   # 2 = EOS
    assert out_labels == [task.data.vocab.tokens[t] for t in out[:len(out_labels)]]
    assert weights.shape == (2, len(out_labels), 4)                # (heads, output tokens, source tokens)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert _show(["--checkpoint", str(tmp_path / "s2s"), "--out", str(tmp_path / "o")]) == 2
    assert "--source is required" in capsys.readouterr().err
