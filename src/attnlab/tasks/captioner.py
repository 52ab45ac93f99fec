"""``attnlab train captioner``: caption two-digit scenes, evaluated on held-out combinations (``Task``).

Training scenes (``attnlab.data.scenes``) combine train-split digit images in 300 of the 400
(a, b, layout) combinations; validation and test scenes use the other 100 combinations with
the validation / test digit images. ``evaluate`` captions a fixed set of test scenes greedily:

- ``exact_caption``: the fraction whose caption (up to EOS) equals the reference exactly;
- ``token_accuracy``: teacher-forced, the fraction of target tokens (EOS included) predicted right.

Example::

    task = CaptionerTask(CaptionerConfig(vocab_size=len(VOCAB)))
    trainer = Trainer(task, TrainConfig(**SPEC.train_defaults, out_dir="runs/captioner"))
    trainer.train()
    task.evaluate(trainer.model)            # {"exact_caption": 0.9.., "token_accuracy": 0.9..}
"""
from __future__ import annotations

import argparse
from typing import Optional

import torch
from torch import Tensor, nn

from ..data.digits import load_digits_data
from ..data.scenes import EOS, IGNORE, MAX_LEN, PAD, VOCAB, SceneBatch, Scenes, decode
from ..models.captioner import Captioner, CaptionerConfig
from ..models.vit import ViTConfig
from ..train.sizes import FLOAT, INDEX, SizeEstimate, model_params, stack_activations
from ..train.task import DrawSampler, TaskSpec, check_options
from .vit import vit_activations

__all__ = ["CaptionerTask", "SPEC", "caption_scores", "scene_text_size_estimate", "validate_scene_options"]

EVAL_SCENES = 1000          # test scenes per evaluate(): 10 per held-out combination on average
EVAL_SEED = 1234            # fixed, so every evaluation (and every run) scores the same scenes


@torch.no_grad()
def caption_scores(model: Captioner, batch: SceneBatch, batch_size: int = 250) -> dict:
    """{"exact_caption", "token_accuracy"} of a model on scenes (see the module docstring)."""
    was_training = model.training
    model.eval()
    exact = right = total = 0
    try:
        for i in range(0, len(batch.images), batch_size):
            images, tgt_in, tgt_out = (t[i:i + batch_size] for t in (batch.images, batch.tgt_in, batch.tgt_out))
            ids = model.caption(images)                                        # (b, T') greedy
            ref = tgt_out.masked_fill(tgt_out == IGNORE, PAD)                  # (b, MAX_LEN): words, EOS, PAD
            got = torch.full_like(ref, PAD)
            got[:, : ids.shape[1]] = ids[:, : ref.shape[1]]
            # after EOS both are PAD, so whole-row equality is "equal up to and including EOS"
            exact += int((got == ref).all(dim=1).sum())
            pred = model(images, tgt_in).argmax(-1)                            # (b, MAX_LEN) teacher-forced
            real = tgt_out != IGNORE
            right += int(((pred == tgt_out) & real).sum())
            total += int(real.sum())
    finally:
        model.train(was_training)
    return {"exact_caption": exact / len(batch.images), "token_accuracy": right / total}


class CaptionerTask:
    """Scene captioning; see the module docstring."""
    name = "captioner"
    unit = "ex"
    loss_label = "cross-entropy (nats / caption token)"

    def __init__(self, cfg: CaptionerConfig, *, data_seed: int = 0, scene_seed: int = 0, shift: int = 0):
        if cfg.vocab_size != len(VOCAB) or cfg.max_len < MAX_LEN or (cfg.pad_id, cfg.eos_id) != (PAD, EOS):
            raise ValueError(f"scene captions need vocab_size={len(VOCAB)}, max_len >= {MAX_LEN}, pad_id={PAD}, "
                             f"eos_id={EOS}; got {cfg.vocab_size}, {cfg.max_len}, {cfg.pad_id}, {cfg.eos_id}")
        if cfg.vit.image_size != (16, 16) or cfg.vit.channels != 1:
            raise ValueError(f"scenes are 1 x 16 x 16 images; the captioner's ViT has channels={cfg.vit.channels}, "
                             f"image_size={cfg.vit.image_size}: build its ViTConfig(image_size=16, channels=1)")
        self.cfg = cfg
        self.data = load_digits_data(data_seed)
        self.scenes = Scenes(self.data, seed=scene_seed, shift=shift)

    def _norm(self, b: SceneBatch) -> SceneBatch:
        b.images = self.data.normalize(b.images)
        return b

    def title(self) -> str:
        return f"on digit scenes ({self.cfg.vit.n_patches} patches)"

    def model_config(self) -> dict:
        return self.cfg.to_dict()

    def build_model(self) -> Captioner:
        return Captioner(self.cfg)

    def info(self) -> dict:
        return self.scenes.info()

    def tokenizer_json(self) -> Optional[str]:
        return None

    def sampler(self, batch_size: int, seed: int) -> DrawSampler:
        def draw(g: torch.Generator, b: int):
            s = self._norm(self.scenes.sample(g, b, "train"))
            return s.images, s.tgt_in, s.tgt_out                   # (b, 1, 16, 16), (b, 8), (b, 8)

        return DrawSampler(draw, batch_size, seed)

    def eval_batches(self, batch_size: int, n: int, seed: int) -> list:
        """n batches of validation scenes (held-out combinations, validation digit images)."""
        g = torch.Generator().manual_seed(seed)
        return [(s.images, s.tgt_in, s.tgt_out) for s in
                (self._norm(self.scenes.sample(g, batch_size, "val")) for _ in range(n))]

    def units_per_batch(self, batch_size: int) -> int:
        return batch_size

    def size_estimate(self, batch_size: int) -> SizeEstimate:
        return scene_text_size_estimate(self.cfg, batch_size)

    def val_metrics(self, val_loss: float) -> dict:
        return {}

    def test_scenes(self, n: int = EVAL_SCENES, *, normalize: bool = True) -> SceneBatch:
        """The fixed test scenes evaluate() scores (model inputs; ``normalize=False``: pixels in [0, 1])."""
        s = self.scenes.sample(torch.Generator().manual_seed(EVAL_SEED), n, "test")
        return self._norm(s) if normalize else s

    def test_example(self, index: int) -> tuple[Tensor, Tensor, str]:
        """Test scene ``index``: (image (1, 16, 16) in [0, 1] to draw, model input (1, 1, 16, 16), caption)."""
        if not 0 <= index < EVAL_SCENES:
            raise ValueError(f"test scene index {index} is out of range: evaluate() uses {EVAL_SCENES} scenes "
                             f"(0..{EVAL_SCENES - 1})")
        s = self.test_scenes(normalize=False)
        image = s.images[index]
        return image, self.data.normalize(image[None]), decode(s.tgt_out[index])

    def evaluate(self, model: nn.Module) -> dict:
        return caption_scores(model, self.test_scenes())


def scene_text_size_estimate(cfg: CaptionerConfig, batch_size: int) -> SizeEstimate:
    """One training step of a ViT + cross-attending decoder (the captioner, VQA) on 16 x 16 scenes."""
    act = (vit_activations(cfg.vit, batch_size)
           + stack_activations(batch_size, cfg.max_len, cfg.d_model, cfg.n_layers, heads=cfg.n_heads, ffn=cfg.d_ff,
                               context=cfg.vit.n_patches)
           + 3 * FLOAT * batch_size * cfg.max_len * cfg.vocab_size)
    data = FLOAT * batch_size * 16 * 16 + 2 * INDEX * batch_size * cfg.max_len
    return SizeEstimate(model_params(cfg.to_dict()), act, data, model_fix="lower --d-model, --layers or --vit-layers",
                        batch_fix="lower --batch-size (or use a larger --patch)")


def validate_scene_options(args: argparse.Namespace) -> None:
    """The captioner's and VQA's options: sizes >= 1, shift >= 0, seeds in range."""
    check_options(args, positive=("--patch", "--vit-layers", "--layers", "--d-model", "--heads"),
                  non_negative=("--shift",), seeds=("--data-seed", "--scene-seed"))


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--patch", type=int, default=4, help="ViT patch size on the 16x16 canvas")
    p.add_argument("--vit-layers", type=int, default=3)
    p.add_argument("--layers", type=int, default=2, help="decoder layers")
    p.add_argument("--d-model", type=int, default=64, help="width of the ViT and of the decoder")
    p.add_argument("--heads", type=int, default=4)
    # measured (3 seeds, 1500 steps): no shift 98.3 / 98.8 / 97.6% exact, 1 pixel 97.0 / 97.7 / 97.9%
    p.add_argument("--shift", type=int, default=0, help="random shift of each training digit in its cell, pixels")
    p.add_argument("--data-seed", type=int, default=0, help="seed of the digits' train/val/test split")
    p.add_argument("--scene-seed", type=int, default=0, help="seed of the held-out combinations")


def default_config(*, patch: int = 4, vit_layers: int = 3, layers: int = 2, d_model: int = 64,
                   heads: int = 4) -> CaptionerConfig:
    vit = ViTConfig(image_size=16, channels=1, patch_size=patch, n_classes=None, pooling="mean",
                    d_model=d_model, n_layers=vit_layers, n_heads=heads)
    return CaptionerConfig(vocab_size=len(VOCAB), vit=vit, max_len=MAX_LEN, d_model=d_model, n_layers=layers,
                           n_heads=heads)


def _from_args(args: argparse.Namespace) -> CaptionerTask:
    cfg = default_config(patch=args.patch, vit_layers=args.vit_layers, layers=args.layers, d_model=args.d_model,
                         heads=args.heads)
    return CaptionerTask(cfg, data_seed=args.data_seed, scene_seed=args.scene_seed, shift=args.shift)


def _from_checkpoint(ckpt) -> CaptionerTask:
    info = ckpt.extra.get("data", {})
    digits = info.get("digits", {})
    task = CaptionerTask(CaptionerConfig(**ckpt.model_config), data_seed=digits.get("seed", 0),
                         scene_seed=info.get("seed", 0), shift=info.get("shift", 0))
    task.data.check_info(digits)
    return task


# Measured on the shared 2-core CPU (docs/benchmarks.md): 97.0% exact held-out captions in 89 s (1500 steps).
SPEC = TaskSpec(name="captioner", help="ViT + text decoder captioning two-digit scenes "
                                       "(target: >= 90% exact captions on held-out combinations)",
                add_arguments=_add_arguments, from_args=_from_args, from_checkpoint=_from_checkpoint,
                train_defaults=dict(steps=1500, batch_size=64, lr=2e-3, min_lr=1e-5, warmup_steps=100,
                                    weight_decay=0.05, eval_interval=250, eval_iters=4,
                                    checkpoint_interval=750, time_limit_min=9.0),
                validate=validate_scene_options)
