"""``attnlab train vit``: a ViT classifying scikit-learn's 8x8 digits (the ``Task`` protocol).

Training batches draw train images with replacement from a seeded generator, shift each by up
to ``shift`` pixels (zero fill), optionally upsample, then standardise with the train statistics.
Validation loss uses the validation split (no augmentation); ``evaluate`` reports accuracy on
the 20% test split, which nothing in training looks at.

Example::

    task = ViTTask(ViTConfig.preset("digits"))
    trainer = Trainer(task, TrainConfig(**SPEC.train_defaults, out_dir="runs/vit"))
    trainer.train()
    task.evaluate(trainer.model)                   # {"test_accuracy": 0.97...}
"""
from __future__ import annotations

import argparse
from typing import Optional

import torch
from torch import Tensor, nn

from ..data.digits import DigitsData, load_digits_data, random_shift, upsample
from ..models.vit import ViT, ViTConfig
from ..train.sizes import FLOAT, INDEX, SizeEstimate, model_params, stack_activations
from ..train.task import DrawSampler, TaskSpec, check_options

__all__ = ["ViTTask", "SPEC", "batched_accuracy", "vit_activations", "vit_size_estimate"]


@torch.no_grad()
def batched_accuracy(model: nn.Module, images: Tensor, labels: Tensor, batch_size: int = 256) -> float:
    """Fraction of images whose argmax logit is the label (model in eval mode, then restored)."""
    was_training = model.training
    model.eval()
    try:
        right = sum(int((model(images[i:i + batch_size]).argmax(-1) == labels[i:i + batch_size]).sum())
                    for i in range(0, len(labels), batch_size))
    finally:
        model.train(was_training)
    return right / len(labels)


class ViTTask:
    """Digits classification with a ViT; see the module docstring."""
    name = "vit"
    unit = "ex"
    loss_label = "cross-entropy (nats / image)"

    def __init__(self, cfg: ViTConfig, *, data_seed: int = 0, shift: int = 1, upsample: int = 1,
                 data: Optional[DigitsData] = None):
        if shift < 0 or upsample < 1:
            raise ValueError(f"need shift >= 0 and upsample >= 1, got shift={shift}, upsample={upsample}")
        side = 8 * upsample
        if cfg.image_size != (side, side) or cfg.channels != 1 or cfg.n_classes != 10:
            raise ValueError(f"digits at upsample={upsample} are 1 x {side} x {side} images of 10 classes, but the "
                             f"ViTConfig has channels={cfg.channels}, image_size={cfg.image_size}, "
                             f"n_classes={cfg.n_classes}; build ViTConfig(image_size={side}, channels=1, n_classes=10)")
        self.cfg, self.shift, self.upsample = cfg, shift, upsample
        self.data = data if data is not None else load_digits_data(data_seed)

    def _prepare(self, images: Tensor) -> Tensor:
        return self.data.normalize(upsample(images, self.upsample))

    def title(self) -> str:
        p = self.cfg.patch_size
        return f"on digits, {p}x{p} patches ({self.cfg.n_patches} tokens)"

    def model_config(self) -> dict:
        return self.cfg.to_dict()

    def build_model(self) -> ViT:
        return ViT(self.cfg)

    def info(self) -> dict:
        return {**self.data.info(), "shift": self.shift, "upsample": self.upsample}

    def tokenizer_json(self) -> Optional[str]:
        return None

    def sampler(self, batch_size: int, seed: int) -> DrawSampler:
        x, y = self.data.train_x, self.data.train_y

        def draw(g: torch.Generator, b: int):
            idx = torch.randint(0, len(y), (b,), generator=g)                  # (b,)
            return self._prepare(random_shift(x[idx], self.shift, g)), y[idx]  # (b, 1, H, W), (b,)

        return DrawSampler(draw, batch_size, seed)

    def eval_batches(self, batch_size: int, n: int, seed: int) -> list:
        """Up to n batches covering the validation split (a seeded order, each image at most once)."""
        order = torch.randperm(len(self.data.val_y), generator=torch.Generator().manual_seed(seed))
        order = order[: n * batch_size]
        return [(self._prepare(self.data.val_x[i]), self.data.val_y[i]) for i in order.split(batch_size)]

    def units_per_batch(self, batch_size: int) -> int:
        return batch_size

    def size_estimate(self, batch_size: int) -> SizeEstimate:
        return vit_size_estimate(self.cfg, batch_size)

    def val_metrics(self, val_loss: float) -> dict:
        return {}

    def test_example(self, index: int) -> tuple[Tensor, Tensor, int]:
        """Test image ``index``: (image (1, 8, 8) in [0, 1] to draw, model input (1, 1, H, W), label)."""
        n = len(self.data.test_y)
        if not 0 <= index < n:
            raise ValueError(f"test image index {index} is out of range: the test split has {n} images (0..{n - 1})")
        image = self.data.test_x[index]
        return image, self._prepare(image[None]), int(self.data.test_y[index])

    def evaluate(self, model: nn.Module) -> dict:
        """{"test_accuracy": fraction of the test split classified right}."""
        return {"test_accuracy": batched_accuracy(model, self._prepare(self.data.test_x), self.data.test_y)}


def vit_activations(cfg: ViTConfig, batch_size: int) -> int:
    """Bytes a ViT's training step keeps for backward: its patch tokens (and CLS) through every block."""
    tokens = cfg.n_patches + (cfg.pooling == "cls")
    return stack_activations(batch_size, tokens, cfg.d_model, cfg.n_layers, heads=cfg.n_heads, ffn=cfg.d_ff)


def vit_size_estimate(cfg: ViTConfig, batch_size: int) -> SizeEstimate:
    H, W = cfg.image_size
    images = FLOAT * batch_size * cfg.channels * H * W
    return SizeEstimate(model_params(cfg.to_dict()), vit_activations(cfg, batch_size) + 2 * images,
                        images + INDEX * batch_size, model_fix="lower --d-model or --layers",
                        batch_fix="lower --batch-size or --upsample (or use a larger --patch)")


def _validate(args: argparse.Namespace) -> None:
    check_options(args, positive=("--patch", "--upsample", "--d-model", "--layers", "--heads"),
                  non_negative=("--shift",), seeds=("--data-seed",))


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--patch", type=int, default=None, help="patch size (default 2 on 8x8, 4 with --upsample 2)")
    p.add_argument("--upsample", type=int, default=1, help="nearest upsampling factor of the 8x8 digits")
    p.add_argument("--pooling", choices=["cls", "mean"], default="cls")
    p.add_argument("--positional", choices=["sinusoidal", "learned"], default="sinusoidal")
    p.add_argument("--d-model", type=int, default=None)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--heads", type=int, default=None)
    p.add_argument("--shift", type=int, default=1, help="random shift augmentation, in pixels (0: none)")
    p.add_argument("--data-seed", type=int, default=0, help="seed of the train/val/test split")


def _from_args(args: argparse.Namespace) -> ViTTask:
    side = 8 * args.upsample
    given = {"d_model": args.d_model, "n_layers": args.layers, "n_heads": args.heads}
    patch = args.patch if args.patch is not None else 2 * args.upsample       # --patch 0 is refused, not replaced
    cfg = ViTConfig.preset("digits", image_size=side, patch_size=patch,
                           pooling=args.pooling, positional=args.positional,
                           **{k: v for k, v in given.items() if v is not None})
    return ViTTask(cfg, data_seed=args.data_seed, shift=args.shift, upsample=args.upsample)


def _from_checkpoint(ckpt) -> ViTTask:
    info = ckpt.extra.get("data", {})
    task = ViTTask(ViTConfig(**ckpt.model_config), data_seed=info.get("seed", 0), shift=info.get("shift", 1),
                   upsample=info.get("upsample", 1))
    task.data.check_info(info)
    return task


# Measured on the shared 2-core CPU (docs/benchmarks.md): 98.3% test accuracy in 80 s (1500 steps);
# the time limit is a safety net on a busy machine (it stops the fixed schedule early).
SPEC = TaskSpec(name="vit", help="ViT on scikit-learn's 8x8 digits (target: >= 95% test accuracy)",
                add_arguments=_add_arguments, from_args=_from_args, from_checkpoint=_from_checkpoint,
                train_defaults=dict(steps=1500, batch_size=64, lr=2e-3, min_lr=1e-5, warmup_steps=100,
                                    weight_decay=0.05, eval_interval=250, eval_iters=3,
                                    checkpoint_interval=750, time_limit_min=9.0),
                validate=_validate)
