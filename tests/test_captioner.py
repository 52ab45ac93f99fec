"""Captioner (models/captioner.py), the scenes (data/scenes.py) and the captioner task (tasks/captioner.py)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab.data.digits import _raw_digits, load_digits_data
from attnlab.data.scenes import BOS, EOS, IGNORE, LAYOUTS, MAX_LEN, PAD, VOCAB, Scenes, decode, encode
from attnlab.models.captioner import Captioner, CaptionerConfig
from attnlab.models.vit import ViTConfig
from attnlab.tasks import load_model
from attnlab.tasks.captioner import SPEC, CaptionerTask, caption_scores, default_config
from attnlab.train import Trainer, TrainConfig


@pytest.fixture(scope="module")
def scenes():
    return Scenes(load_digits_data(0), seed=0, shift=1)


def tiny(**over) -> Captioner:
    """A small random captioner whose untied, large-scale head makes greedy outputs vary by image."""
    torch.manual_seed(0)
    vit = ViTConfig(image_size=16, patch_size=4, n_classes=None, pooling="mean", d_model=32, n_layers=1, n_heads=2)
    model = Captioner(CaptionerConfig(**{**dict(vocab_size=len(VOCAB), vit=vit, d_model=24, n_heads=3,
                                                n_layers=2, tie_weights=False), **over})).eval()
    nn.init.normal_(model.lm_head.weight, std=1.0)
    return model


def batch(scenes, n=6, split="train", seed=0):
    return scenes.sample(torch.Generator().manual_seed(seed), n, split)


def test_cross_attention_is_text_by_patches_and_sums_to_one_over_patches(scenes):
    model, b = tiny(), batch(scenes)
    w = model.cross_attention(b.images, b.tgt_in)
    assert w.shape == (6, 2, 3, MAX_LEN, 16)                   # (B, layers, heads, text L, patches S)
    torch.testing.assert_close(w.sum(-1), torch.ones(6, 2, 3, MAX_LEN))
    assert model.patch_grid(w).shape == (6, 2, 3, MAX_LEN, 4, 4)
    # with zeroed query and key projections the cross-attention is uniform: 1/S on every patch
    for layer in model.decoder.layers:
        for lin in (layer.cross_attn.q_proj, layer.cross_attn.k_proj):
            nn.init.zeros_(lin.weight)
            nn.init.zeros_(lin.bias)
    torch.testing.assert_close(model.cross_attention(b.images, b.tgt_in), torch.full_like(w, 1 / 16))


def test_text_cannot_see_future_tokens(scenes):
    model, b = tiny(), batch(scenes)
    base = model(b.images, b.tgt_in)                           # (B, L, V)
    for t in range(MAX_LEN - 1):
        changed = b.tgt_in.clone()
        changed[:, t + 1:] = torch.randint(0, len(VOCAB), changed[:, t + 1:].shape)
        torch.testing.assert_close(model(b.images, changed)[:, : t + 1], base[:, : t + 1])
        assert (model(b.images, changed)[:, t + 1:] - base[:, t + 1:]).abs().max() > 1e-4


def test_logits_depend_on_the_image(scenes):
    model, b = tiny(), batch(scenes)
    other = batch(scenes, seed=1)
    assert (model(b.images, b.tgt_in) - model(other.images, b.tgt_in)).abs().max() > 1e-3


def test_cached_caption_equals_recomputation_and_the_teacher_forced_attention(scenes):
    model, b = tiny(), batch(scenes, n=8)
    ids, cross = model.caption(b.images, return_cross_attention=True)
    slow, slow_cross = model.caption(b.images, use_cache=False, return_cross_attention=True)
    assert torch.equal(ids, slow)
    assert len(set(map(tuple, ids.tolist()))) > 1, "a degenerate model: every caption the same"
    torch.testing.assert_close(cross, slow_cross, atol=1e-5, rtol=1e-5)
    # the same words fed back by teacher forcing give the same cross-attention, word by word
    prefix = torch.cat([torch.full((8, 1), BOS), ids[:, :-1]], dim=1)
    torch.testing.assert_close(cross, model.cross_attention(b.images, prefix), atol=1e-5, rtol=1e-5)
    steps = model.caption(b.images, max_new_tokens=3)
    assert steps.shape[1] <= 3 and torch.equal(steps, ids[:, : steps.shape[1]])


class ScriptedHead(nn.Module):
    """An lm_head whose argmax is word "a" until step stop[row], then EOS (ignoring its input)."""

    def __init__(self, stop):
        super().__init__()
        self.stop, self.step = torch.tensor(stop), 0

    def forward(self, h):                                          # h (B, L, d) -> (B, L, V)
        logits = torch.zeros(*h.shape[:2], len(VOCAB))
        eos = self.step >= self.stop                               # (B,)
        logits[:, :, encode(["a"])[0]] = (~eos).float()[:, None]
        logits[:, :, EOS] = eos.float()[:, None]
        self.step += 1
        return logits


@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_caption_stops_at_eos_pads_after_it_and_ends_when_all_are_done(scenes, use_cache):
    model, b = tiny(), batch(scenes, n=3)
    model.lm_head = ScriptedHead([0, 2, 4])
    ids = model.caption(b.images, use_cache=use_cache)
    a = encode(["a"])[0]
    assert ids.tolist() == [[EOS, PAD, PAD, PAD, PAD], [a, a, EOS, PAD, PAD], [a, a, a, a, EOS]]


def test_bad_inputs_are_errors(scenes):
    model, b = tiny(), batch(scenes)
    with pytest.raises(ValueError, match="exceed max_len=8"):
        model(b.images, torch.ones(6, 9, dtype=torch.int64))
    with pytest.raises(ValueError, match="expects 16x16 images"):
        model(torch.randn(6, 1, 8, 8), b.tgt_in)
    with pytest.raises(ValueError, match="n_classes=None"):
        CaptionerConfig(vocab_size=17, vit=ViTConfig(image_size=16, patch_size=4, n_classes=10))
    with pytest.raises(ValueError, match="distinct"):
        CaptionerConfig(vocab_size=17, eos_id=1)


def test_scene_split_is_disjoint_in_combinations_and_digit_images(scenes):
    held = {tuple(r) for r in scenes.held_out.tolist()}
    trained = {tuple(r) for r in scenes.trained.tolist()}
    assert len(held) == 100 and len(trained) == 300 and not held & trained
    for a in range(10):                                        # every pair is trained in 3 of its 4 layouts
        for b_ in range(10):
            assert sum((a, b_, k) in trained for k in range(4)) == 3
    digits = scenes.digits
    for split, idx in (("train", digits.train_idx), ("val", digits.val_idx), ("test", digits.test_idx)):
        s = batch(scenes, 400, split)
        combos = {tuple(r) for r in s.combos.tolist()}
        assert combos <= (trained if split == "train" else held)
        assert torch.isin(s.digit_idx, idx).all()
    test = batch(scenes, 400, "test")
    assert not torch.isin(test.digit_idx, digits.train_idx).any()


def test_scene_images_and_captions_agree(scenes):
    raw, labels = _raw_digits()
    s = batch(scenes, 40, "val")                               # no augmentation outside train
    for i in range(40):
        a, b_, k = s.combos[i].tolist()
        rel, first, second = LAYOUTS[k]
        cells = s.images[i, 0].unflatten(0, (2, 8)).unflatten(2, (2, 8)).permute(0, 2, 1, 3).flatten(0, 1)  # (4, 8, 8)
        assert torch.equal(cells[first], raw[s.digit_idx[i, 0], 0]) and torch.equal(cells[second],
                                                                                      raw[s.digit_idx[i, 1], 0])
        assert all(cells[c].abs().sum() == 0 for c in range(4) if c not in (first, second))
        assert labels[s.digit_idx[i]].tolist() == [a, b_]
        assert decode(s.tgt_out[i]) == f"a {a} {rel} a {b_}"
        assert s.tgt_in[i, 0] == BOS and torch.equal(s.tgt_in[i, 1:][s.tgt_out[i, :-1] != IGNORE],
                                                     s.tgt_out[i, :-1][s.tgt_out[i, :-1] != IGNORE])
    assert decode(encode(["a", "3", "above", "a", "7"])) == "a 3 above a 7"
    t = batch(scenes, 40, "train")                             # shifted digits stay inside their own cells
    for i in range(40):
        _, _, k = t.combos[i].tolist()
        cells = t.images[i, 0].unflatten(0, (2, 8)).unflatten(2, (2, 8)).permute(0, 2, 1, 3).flatten(0, 1)
        assert [bool(cells[c].abs().sum() > 0) for c in range(4)] == [c in LAYOUTS[k][1:] for c in range(4)]


class Oracle(nn.Module):
    """Captions from a lookup of the true targets (to test the metric, not a model)."""

    def __init__(self, tgt_out, wrong_rows=()):
        super().__init__()
        self.tgt_out, self.wrong = tgt_out, list(wrong_rows)

    def caption(self, images):
        ids = self.tgt_out[: len(images)].masked_fill(self.tgt_out[: len(images)] == IGNORE, PAD).clone()
        ids[self.wrong, 1] = (ids[self.wrong, 1] - 6) % 10 + 7       # another digit in the first-digit slot
        return ids

    def forward(self, images, tgt_in):
        out = self.caption(images)
        return nn.functional.one_hot(out, len(VOCAB)).float()


def test_caption_metrics_on_an_oracle(scenes):
    s = batch(scenes, 20, "test")
    assert caption_scores(Oracle(s.tgt_out), s) == {"exact_caption": 1.0, "token_accuracy": 1.0}
    scores = caption_scores(Oracle(s.tgt_out, wrong_rows=[0, 3]), s)
    real = int((s.tgt_out != IGNORE).sum())
    assert scores == {"exact_caption": 18 / 20, "token_accuracy": (real - 2) / real}


def test_training_smoke_and_eval_from_the_checkpoint(tmp_path):
    task = CaptionerTask(default_config(d_model=32, vit_layers=1, layers=1, heads=2))
    cfg = TrainConfig(**{**SPEC.train_defaults, "steps": 60, "eval_interval": 30, "warmup_steps": 10,
                         "lr": 3e-3, "min_lr": 1e-3, "checkpoint_interval": 60, "out_dir": str(tmp_path / "run")})
    trainer = Trainer(task, cfg, progress=False)
    losses = trainer.train()
    assert sum(losses[-10:]) < 0.7 * sum(losses[:10])
    scores = task.evaluate(trainer.model)
    assert set(scores) == {"exact_caption", "token_accuracy"} and scores["token_accuracy"] > 0.5
    model, again = load_model(tmp_path / "run")                   # what `attnlab eval` does
    assert again.evaluate(model) == scores
    image, x, caption = task.test_example(7)
    ref = task.test_scenes()
    assert image.shape == (1, 16, 16) and torch.equal(x, ref.images[7:8]) and caption == decode(ref.tgt_out[7])
    with pytest.raises(ValueError, match="out of range"):
        task.test_example(-1)
