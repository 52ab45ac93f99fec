"""ViT (models/vit.py), the digits data (data/digits.py) and the ViT task (tasks/vit.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnlab.data.digits import load_digits_data, random_shift, stratified_split
from attnlab.models.vit import ViT, ViTConfig, attention_rollout, patchify, unpatchify
from attnlab.tasks import load_model
from attnlab.tasks.vit import SPEC, ViTTask
from attnlab.train import Trainer, TrainConfig, load_checkpoint


def tiny(**over) -> ViT:
    torch.manual_seed(0)
    return ViT(ViTConfig(**{**dict(image_size=8, patch_size=2, d_model=32, n_layers=2, n_heads=4), **over})).eval()


def uniform_attention(model: ViT) -> ViT:
    """Zero the query and key projections: every score is 0, so every attention row is uniform."""
    with torch.no_grad():
        for layer in model.encoder.layers:
            for lin in (layer.self_attn.q_proj, layer.self_attn.k_proj):
                lin.weight.zero_()
                lin.bias.zero_()
    return model


@pytest.mark.parametrize("C, H, W, p", [(1, 8, 8, 2), (3, 8, 12, 4), (2, 6, 9, 3), (3, 32, 32, 16), (1, 5, 7, 1)])
def test_patchify_matches_slicing_and_unpatchify_inverts_it(C, H, W, p):
    x = torch.randn(2, C, H, W)
    patches = patchify(x, p)
    gh, gw = H // p, W // p
    assert patches.shape == (2, gh * gw, C * p * p)
    for r in range(gh):                                   # row-major patches, each flattened (c, p1, p2)
        for c in range(gw):
            torch.testing.assert_close(patches[:, r * gw + c], x[:, :, r * p:(r + 1) * p, c * p:(c + 1) * p].flatten(1))
    assert torch.equal(unpatchify(patches, p, (H, W)), x)


def test_linear_patch_embedding_is_a_strided_conv():
    x, lin = torch.randn(2, 3, 8, 12), torch.nn.Linear(3 * 4 * 4, 5)
    conv = F.conv2d(x, lin.weight.view(5, 3, 4, 4), lin.bias, stride=4)           # (2, 5, 2, 3)
    torch.testing.assert_close(lin(patchify(x, 4)), conv.flatten(2).transpose(1, 2))


def test_patch_sizes_that_do_not_tile_are_errors():
    with pytest.raises(ValueError, match="does not split into 3x3"):
        patchify(torch.randn(1, 1, 8, 8), 3)
    with pytest.raises(ValueError, match="do not tile"):
        unpatchify(torch.randn(1, 5, 4), 2, (4, 4))
    with pytest.raises(ValueError, match="not divisible into 3x3"):
        ViTConfig(image_size=8, patch_size=3)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_shapes_and_pooling(pooling, positional):
    model = tiny(pooling=pooling, positional=positional)
    x = torch.randn(3, 1, 8, 8)
    T = 16 + (pooling == "cls")
    h = model.encode(x)
    assert h.shape == (3, T, 32) and model.features(x).shape == (3, 16, 32)
    pooled = h[:, 0] if pooling == "cls" else h.mean(1)
    torch.testing.assert_close(model(x), model.head(pooled))
    assert model(x).shape == (3, 10)
    # the fixed sin-cos table is recomputed, not saved; a learned one is a parameter
    assert ("pos_enc.table" in model.state_dict()) == (positional == "learned")
    assert not any("pos_table" in k for k in model.state_dict())


def test_cls_output_depends_on_every_patch_and_mean_pooling_ignores_patch_order_without_positions():
    model = tiny(pooling="mean")
    model.pos_table.zero_()                               # no positions: a set of patches
    x = torch.randn(2, 1, 8, 8)
    perm = torch.randperm(16)
    shuffled = unpatchify(patchify(x, 2)[:, perm], 2, (8, 8))
    torch.testing.assert_close(model(shuffled), model(x), atol=1e-5, rtol=1e-5)
    cls = tiny(pooling="cls")
    y = x.clone()
    y[:, :, 6:, 6:] += 1.0                                # only the last patch changes
    assert (cls(y) - cls(x)).abs().max() > 1e-4


@pytest.mark.parametrize("bad, expect", [((2, 3, 8, 8), "expects 1 channel.*got 3.*channels=3"),
                                         ((2, 1, 16, 16), "expects 8x8 images, got 16x16.*resize"),
                                         ((1, 8, 8), r"\(B, C, H, W\).*images\[None\]")])
def test_wrong_images_are_value_errors_naming_expected_got_and_fix(bad, expect):
    with pytest.raises(ValueError, match=expect):
        tiny()(torch.randn(*bad))


def _numpy_rollout(weights):
    out = None
    for w in weights:
        a = w.double().numpy().mean(axis=1)
        a = a + np.eye(a.shape[-1])
        a = a / a.sum(-1, keepdims=True)
        out = a if out is None else np.einsum("bij,bjk->bik", a, out)
    return out


def test_rollout_rows_sum_to_one_and_match_an_independent_computation():
    g = torch.Generator().manual_seed(0)
    weights = [torch.rand(2, 3, 5, 5, generator=g).softmax(-1) for _ in range(4)]
    R = attention_rollout(weights)
    torch.testing.assert_close(R.sum(-1), torch.ones(2, 5))
    np.testing.assert_allclose(R.numpy(), _numpy_rollout(weights), atol=1e-6)


def test_rollout_is_identity_when_attention_mixes_nothing():
    eye = torch.eye(6).expand(2, 4, 6, 6)                 # every token attends only to itself
    torch.testing.assert_close(attention_rollout([eye] * 3), torch.eye(6).expand(2, 6, 6))


def test_rollout_of_a_model_with_uniform_attention_has_the_closed_form():
    # (I + U) / 2 per layer with U U = U: after L layers, 2^-L I + (1 - 2^-L) U
    model = uniform_attention(tiny(n_layers=3))
    cap: list = []
    model.encode(torch.randn(2, 1, 8, 8), capture=cap)
    T, L = 17, 3
    expect = 2.0 ** -L * torch.eye(T) + (1 - 2.0 ** -L) * torch.full((T, T), 1 / T)
    torch.testing.assert_close(attention_rollout([c.weights for c in cap]), expect.expand(2, T, T))
    torch.testing.assert_close(attention_rollout([c.weights for c in cap], residual=False),
                               torch.full((2, T, T), 1 / T))
    # and its maps over the patch grid are uniform: 1/16 per patch, each map summing to 1
    x = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(model.attention_maps(x), torch.full((2, 3, 4, 4, 4), 1 / 16))
    torch.testing.assert_close(model.rollout_map(x), torch.full((2, 4, 4), 1 / 16))


def test_attention_maps_are_distributions_over_the_patch_grid():
    for pooling in ("cls", "mean"):
        model = tiny(pooling=pooling)
        x = torch.randn(2, 1, 8, 8)
        maps, roll = model.attention_maps(x), model.rollout_map(x)
        assert maps.shape == (2, 2, 4, 4, 4) and roll.shape == (2, 4, 4)
        torch.testing.assert_close(maps.sum((-1, -2)), torch.ones(2, 2, 4))
        torch.testing.assert_close(roll.sum((-1, -2)), torch.ones(2))
        assert (maps >= 0).all()


def test_digits_split_is_stratified_disjoint_complete_and_seeded():
    data = load_digits_data(0)
    parts = [data.train_idx, data.val_idx, data.test_idx]
    allidx = torch.cat(parts)
    assert len(allidx) == 1797 and len(allidx.unique()) == 1797
    assert (len(data.train_y), len(data.val_y), len(data.test_y)) == (1295, 143, 359)
    for y, frac in ((data.test_y, 0.2), (data.val_y, 0.08)):
        counts = torch.bincount(y, minlength=10).float()
        assert ((counts - frac * torch.bincount(torch.cat([data.train_y, data.val_y, data.test_y]))).abs() <= 1).all()
    again, other = load_digits_data(0), load_digits_data(1)
    assert torch.equal(again.test_idx, data.test_idx) and not torch.equal(other.test_idx, data.test_idx)
    assert abs(float(data.normalize(data.train_x).mean())) < 1e-5
    with pytest.raises(ValueError):
        stratified_split(data.train_y, (0.6, 0.5), 0)


def test_random_shift_moves_each_image_with_zero_fill():
    x = torch.rand(50, 2, 8, 8)
    g = torch.Generator().manual_seed(3)
    out = random_shift(x, 2, g)
    dy, dx = torch.randint(-2, 3, (2, 50), generator=torch.Generator().manual_seed(3))
    for i in range(50):                                   # independent: roll, then zero what wrapped around
        ref = torch.roll(x[i], (int(dy[i]), int(dx[i])), dims=(1, 2))
        if dy[i] > 0:
            ref[:, : dy[i]] = 0
        elif dy[i] < 0:
            ref[:, dy[i]:] = 0
        if dx[i] > 0:
            ref[:, :, : dx[i]] = 0
        elif dx[i] < 0:
            ref[:, :, dx[i]:] = 0
        assert torch.equal(out[i], ref), f"image {i} shift ({int(dy[i])}, {int(dx[i])})"


def test_task_sampler_resumes_and_eval_batches_are_fixed():
    task = ViTTask(ViTConfig.preset("digits", d_model=32, n_layers=1))
    s = task.sampler(16, seed=0)
    s.next()
    state = s.state()
    a = s.next()
    s.set_state(state)
    b = s.next()
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert a[0].shape == (16, 1, 8, 8) and a[1].dtype == torch.int64
    e1, e2 = task.eval_batches(64, 5, seed=1), task.eval_batches(64, 5, seed=1)
    assert sum(len(y) for _, y in e1) == 143                          # the whole validation split, once
    assert all(torch.equal(x1, x2) for (x1, _), (x2, _) in zip(e1, e2))
    with pytest.raises(ValueError, match="ViTConfig"):
        ViTTask(ViTConfig(image_size=16, patch_size=4))
    image, x, label = task.test_example(5)
    assert image.shape == (1, 8, 8) and 0 <= image.min() and image.max() <= 1 and label == int(task.data.test_y[5])
    torch.testing.assert_close(x, task.data.normalize(task.data.test_x[5:6]))
    with pytest.raises(ValueError, match="359 images"):
        task.test_example(359)


def test_training_smoke_and_eval_from_the_checkpoint(tmp_path):
    task = ViTTask(ViTConfig.preset("digits", patch_size=4, d_model=32, n_layers=2, n_heads=2))
    before = task.evaluate(task.build_model())["test_accuracy"]
    cfg = TrainConfig(**{**SPEC.train_defaults, "steps": 100, "eval_interval": 50, "warmup_steps": 10,
                         "lr": 3e-3, "min_lr": 1e-3, "checkpoint_interval": 100, "out_dir": str(tmp_path / "run")})
    trainer = Trainer(task, cfg, progress=False)
    losses = trainer.train()
    acc = task.evaluate(trainer.model)["test_accuracy"]
    assert sum(losses[-10:]) < sum(losses[:10]) and acc > max(0.7, before + 0.5), (before, acc)
    model, again = load_model(tmp_path / "run")                   # what `attnlab eval` does
    assert again.evaluate(model)["test_accuracy"] == acc
    ckpt = load_checkpoint(tmp_path / "run")
    ckpt.extra["data"]["mean"] += 0.01                            # another split (e.g. other scikit-learn data)
    with pytest.raises(ValueError, match="digits split differs"):
        SPEC.from_checkpoint(ckpt)
