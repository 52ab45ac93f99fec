"""scikit-learn's handwritten digits as tensors: a fixed stratified split, normalisation, augmentation.

``sklearn.datasets.load_digits`` ships with scikit-learn (no download): 1797 grey 8x8 images,
pixel values 0..16, labels 0..9 (~180 per class). ``load_digits_data(seed)`` splits them per
class (stratified) into test (20%), validation (10% of the rest) and train, with a seeded
permutation of its own, so the split does not depend on scikit-learn's splitting code.

Images are kept in [0, 1] (pixel / 16); ``normalize`` standardises them with the train split's
mean and std (one scalar each, stored in ``info()``). ``random_shift`` moves each image by up
to k pixels with zero (background) fill: the augmentation the ViT task trains with.

How 8x8 becomes patches (measured: ``ViTConfig.preset("digits")``, 1500 steps of 64, shared 2-core
CPU, see docs/benchmarks.md): **2x2 patches on the 8x8 image** (16 tokens of 4 pixels, a 4x4 map)
is the default: 98.3 / 98.3 / 98.1% test accuracy over three seeds. Nearest upsampling to 16x16
with 4x4 patches is the same model up to initialisation (each 4x4 patch is a 2x2 patch with
every pixel repeated) and measured the same (98.6%, one seed) at 4x the input. 1x1 patches
(64 tokens) reached 98.9% at ~2-3x the time. 4x4 patches on 8x8 (4 tokens) are the most accurate
and fastest (99.2 / 99.4 / 98.9%, ~1.6x faster) but leave a 2x2 attention map: ``--patch 4``.

Example::

    data = load_digits_data(seed=0)
    x = data.normalize(data.train_x[:32])        # (32, 1, 8, 8), standardised
    y = data.train_y[:32]                        # (32,) int64 in 0..9
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["DigitsData", "load_digits_data", "stratified_split", "random_shift", "upsample"]

N_CLASSES = 10


@lru_cache(maxsize=1)
def _raw_digits() -> tuple[Tensor, Tensor]:
    """All 1797 images (N, 1, 8, 8) float32 in [0, 1] and labels (N,) int64, from scikit-learn."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:                       # pragma: no cover - the Makefile installs scikit-learn
        raise ImportError("the digits data come from scikit-learn: pip install scikit-learn") from e
    d = load_digits()
    images = torch.tensor(d.images, dtype=torch.float32)[:, None] / 16.0   # (N, 1, 8, 8)
    return images, torch.tensor(d.target, dtype=torch.int64)


def stratified_split(labels: Tensor, fractions: tuple[float, ...], seed: int) -> list[Tensor]:
    """Split indices per class: part i gets round(fractions[i] * n_c) of class c; the last part the rest.

    Returns sorted index tensors, one per fraction plus the remainder. Deterministic in ``seed``.

    Example::

        test, val, train = stratified_split(labels, (0.2, 0.08), seed=0)
    """
    if any(f < 0 for f in fractions) or sum(fractions) >= 1:
        raise ValueError(f"fractions must be >= 0 and sum to < 1 (the rest is the last part), got {fractions}")
    g = torch.Generator().manual_seed(seed)
    parts: list[list[Tensor]] = [[] for _ in range(len(fractions) + 1)]
    for c in labels.unique(sorted=True).tolist():
        idx = (labels == c).nonzero().squeeze(1)
        idx = idx[torch.randperm(len(idx), generator=g)]
        start = 0
        for i, f in enumerate(fractions):
            n = round(f * len(idx))
            parts[i].append(idx[start:start + n])
            start += n
        parts[-1].append(idx[start:])
    return [torch.cat(p).sort().values for p in parts]


def random_shift(images: Tensor, max_shift: int, generator: torch.Generator) -> Tensor:
    """Shift each image by (dy, dx), each uniform in [-max_shift, max_shift], filling with zeros.

    Args:
        images: (B, C, H, W), background 0 (apply before normalising).
        max_shift: the largest shift in pixels; 0 returns the images unchanged.
        generator: the seeded source of the shifts (so a resumed run draws the same ones).
    Returns:
        (B, C, H, W).
    """
    if max_shift == 0:
        return images
    B, C, H, W = images.shape
    s = max_shift
    dy, dx = torch.randint(-s, s + 1, (2, B), generator=generator)
    padded = F.pad(images, (s, s, s, s))                                   # (B, C, H + 2s, W + 2s)
    rows = torch.arange(H)[None, :] + s - dy[:, None]                      # (B, H): source row of each output row
    cols = torch.arange(W)[None, :] + s - dx[:, None]                      # (B, W)
    b = torch.arange(B)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[b, rows[:, :, None], cols[:, None, :]]   # (B, H, W, C)
    return out.permute(0, 3, 1, 2).contiguous()


def upsample(images: Tensor, factor: int, mode: str = "nearest") -> Tensor:
    """(B, C, H, W) -> (B, C, factor H, factor W); factor 1 is the identity."""
    if factor == 1:
        return images
    return F.interpolate(images, scale_factor=factor, mode=mode,
                         **({} if mode == "nearest" else {"align_corners": False}))


@dataclass
class DigitsData:
    """The three splits (images (N, 1, 8, 8) in [0, 1], labels (N,) int64) and the normalisation."""
    train_x: Tensor
    train_y: Tensor
    val_x: Tensor
    val_y: Tensor
    test_x: Tensor
    test_y: Tensor
    mean: float                        # of the train images' pixels (in [0, 1] units)
    std: float
    seed: int
    test_fraction: float
    val_fraction: float
    train_idx: Tensor                  # positions of each split's images in load_digits() order
    val_idx: Tensor
    test_idx: Tensor

    def normalize(self, images: Tensor) -> Tensor:
        """Standardise with the train statistics: (x - mean) / std."""
        return (images - self.mean) / self.std

    def info(self) -> dict:
        """JSON-ready: enough to rebuild (and check) the same split."""
        return {"name": "sklearn-digits", "seed": self.seed, "test_fraction": self.test_fraction,
                "val_fraction": self.val_fraction, "sizes": {"train": len(self.train_y), "val": len(self.val_y),
                                                             "test": len(self.test_y)},
                "mean": self.mean, "std": self.std}

    def check_info(self, info: dict) -> None:
        """Raise a ValueError if ``info`` (from a checkpoint) describes another split than this one."""
        mine = self.info()
        diff = {k: (info[k], mine[k]) for k in ("sizes", "mean", "std") if k in info and info[k] != mine[k]}
        if diff:
            raise ValueError(f"the checkpoint's digits split differs from this one (checkpoint, here): {diff}; "
                             "its test images would not be the held-out ones: use the same scikit-learn and seed")


def load_digits_data(seed: int = 0, *, test_fraction: float = 0.2, val_fraction: float = 0.1) -> DigitsData:
    """The digits split per class into test, validation (``val_fraction`` of the non-test part) and train.

    Example::

        data = load_digits_data(seed=0)
        len(data.train_y), len(data.val_y), len(data.test_y)      # (1295, 143, 359)
    """
    images, labels = _raw_digits()
    if not 0 < test_fraction < 1 or not 0 <= val_fraction < 1:
        raise ValueError(f"need 0 < test_fraction < 1 and 0 <= val_fraction < 1, got {test_fraction}, {val_fraction}")
    test, val, train = stratified_split(labels, (test_fraction, val_fraction * (1 - test_fraction)), seed)
    tx = images[train]
    return DigitsData(train_x=tx, train_y=labels[train], val_x=images[val], val_y=labels[val],
                      test_x=images[test], test_y=labels[test], mean=float(tx.mean()), std=float(tx.std()),
                      seed=seed, test_fraction=test_fraction, val_fraction=val_fraction,
                      train_idx=train, val_idx=val, test_idx=test)
