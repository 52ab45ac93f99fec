"""ViT: a Vision Transformer (Dosovitskiy et al. 2021) built from ``attnlab.nn`` encoder blocks.

    images (B, C, H, W) --patchify--> (B, N, C p p) --linear--> (B, N, d) + 2-D positions
        [--prepend CLS--> (B, 1 + N, d)] --n_layers pre-norm blocks + final norm--> (B, T, d)
        --CLS token, or mean over patches--> head --> logits (B, n_classes)

N = (H / p)(W / p) patches in row-major order (r * W/p + c); T = N (+ 1 with a CLS token).
The patch embedding is a linear map of the flattened patch, which is exactly a Conv2d with
kernel = stride = p (ViT's "hybrid-free" patch embedding); ``patchify`` flattens each patch as
(c, p1, p2), the order of a Conv2d weight. Positions: the fixed 2-D sin-cos of MAE
(``sinusoidal_2d``) or a learned 2-D table (``LearnedEncoding2D``), added to patches only (the
CLS token is itself a parameter, so it needs none).

Introspection: ``forward(..., capture=list)`` records each layer's ``Intermediates``;
``attention_rollout`` (Abnar & Zuidema 2020) composes them through the layers; ``attention_maps``
and ``rollout_map`` turn them into per-patch maps of an image.

Example::

    model = ViT(ViTConfig(image_size=(8, 8), patch_size=2, n_classes=10))
    logits = model(images)                        # images (B, 1, 8, 8) -> (B, 10)
    maps = model.attention_maps(images)           # (B, layers, heads, 4, 4), each map sums to 1
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from ..nn import BlockConfig
from ..nn.blocks import EncoderStack as BlockStack
from ..positional import LearnedEncoding2D, sinusoidal_2d
from ..presets import from_preset

__all__ = ["ViTConfig", "ViT", "VIT_PRESETS", "patchify", "unpatchify", "attention_rollout"]

VIT_PRESETS: dict[str, dict] = {
    # digits (8x8, sklearn): 2x2 patches, 16 tokens (see attnlab.data.digits for the measured choice)
    "digits": dict(image_size=(8, 8), channels=1, patch_size=2, d_model=64, n_layers=4, n_heads=4, n_classes=10),
    # ViT-Ti/16 (Touvron et al. 2021, DeiT-Ti) at ImageNet size: 14x14 = 196 patches
    "ti16": dict(image_size=(224, 224), channels=3, patch_size=16, d_model=192, n_layers=12, n_heads=3,
                 n_classes=1000),
}


def _pair(size) -> tuple[int, int]:
    if isinstance(size, int):
        return (size, size)
    h, w = size                                   # a tuple, or a list after a JSON round trip
    return (int(h), int(w))


@dataclass
class ViTConfig:
    image_size: tuple[int, int] = (8, 8)      # (H, W) of the input images; an int means square
    channels: int = 1                         # input channels C (1 grey, 3 RGB)
    patch_size: int = 2                       # square patches p x p; 16 at ImageNet sizes ("an image is 16x16 words")
    n_classes: Optional[int] = 10             # None: no head (a feature extractor, e.g. the captioner's)
    d_model: int = 64                         # token width d
    n_layers: int = 4
    n_heads: int = 4
    d_ff: Optional[int] = None                # MLP hidden width; None = 4 d
    pooling: str = "cls"                      # cls: classify the CLS token | mean: average the patch tokens
    positional: str = "sinusoidal"            # sinusoidal (fixed 2-D sin-cos, MAE) | learned (2-D table)
    dropout: float = 0.0                      # residual and attention dropout (training only)
    norm: str = "layer"                       # layer | rms
    mlp: str = "gelu"                         # gelu | swiglu
    bias: bool = True
    backend: str = "auto"                     # attention backend by name

    def __post_init__(self):
        self.image_size = _pair(self.image_size)
        H, W = self.image_size
        p = self.patch_size
        if p < 1 or H < 1 or W < 1 or H % p or W % p:
            sizes = [d for d in range(1, min(H, W) + 1) if not H % d and not W % d]
            raise ValueError(f"image_size {H}x{W} is not divisible into {p}x{p} patches; pick a patch_size "
                             f"dividing both sides: one of {sizes}")
        if self.channels < 1:
            raise ValueError(f"channels must be >= 1, got {self.channels}")
        if self.pooling not in ("cls", "mean"):
            raise ValueError(f"pooling must be 'cls' or 'mean', got {self.pooling!r}")
        if self.positional not in ("sinusoidal", "learned"):
            raise ValueError(f"ViT positional must be 'sinusoidal' or 'learned' (2-D), got {self.positional!r}")
        if self.n_classes is not None and self.n_classes < 1:
            raise ValueError(f"n_classes must be >= 1 or None (no head), got {self.n_classes}")

    @classmethod
    def preset(cls, name: str, **overrides) -> "ViTConfig":
        return from_preset(cls, VIT_PRESETS, name, overrides, what="ViT")

    @property
    def grid(self) -> tuple[int, int]:
        """Patches per column and per row: (H / p, W / p)."""
        return self.image_size[0] // self.patch_size, self.image_size[1] // self.patch_size

    @property
    def n_patches(self) -> int:
        return self.grid[0] * self.grid[1]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["image_size"] = list(self.image_size)
        return d

    def block(self) -> BlockConfig:
        return BlockConfig(d_model=self.d_model, n_heads=self.n_heads, d_ff=self.d_ff, norm=self.norm,
                           norm_first=True, mlp=self.mlp, dropout=self.dropout, attn_dropout=self.dropout,
                           bias=self.bias, backend=self.backend)


def patchify(images: Tensor, patch: int) -> Tensor:
    """Cut images into non-overlapping p x p patches, row-major: (B, C, H, W) -> (B, N, C p p).

    Each patch is flattened as (c, p1, p2), the layout of a Conv2d(C, d, p, stride=p) weight.

    Example::

        x = torch.arange(16.).reshape(1, 1, 4, 4)
        patchify(x, 2)[0, 0]                      # tensor([0., 1., 4., 5.]): the top-left 2x2 patch
    """
    if not isinstance(images, Tensor) or images.dim() != 4:
        raise ValueError(f"images must be (B, C, H, W), got {tuple(getattr(images, 'shape', ()))}")
    H, W = images.shape[-2:]
    if patch < 1 or H % patch or W % patch:
        raise ValueError(f"a {H}x{W} image does not split into {patch}x{patch} patches; crop or pad it to a "
                         f"multiple of {patch} on both sides")
    return rearrange(images, "b c (h p1) (w p2) -> b (h w) (c p1 p2)", p1=patch, p2=patch)


def unpatchify(patches: Tensor, patch: int, size: Sequence[int]) -> Tensor:
    """The inverse of ``patchify``: (B, N, C p p) -> (B, C, H, W) for size = (H, W).

    Example::

        x = torch.randn(2, 3, 8, 12)
        assert torch.equal(unpatchify(patchify(x, 4), 4, (8, 12)), x)
    """
    H, W = _pair(size)
    if patches.dim() != 3 or H % patch or W % patch:
        raise ValueError(f"need patches (B, N, C*{patch}*{patch}) and a size divisible by {patch}, got "
                         f"{tuple(patches.shape)} and {H}x{W}")
    gh, gw = H // patch, W // patch
    N, F_ = patches.shape[1:]
    if N != gh * gw or F_ % (patch * patch):
        raise ValueError(f"{N} patches of width {F_} do not tile a {H}x{W} image with {patch}x{patch} patches "
                         f"(expected {gh * gw} patches of width C*{patch * patch})")
    return rearrange(patches, "b (h w) (c p1 p2) -> b c (h p1) (w p2)", h=gh, w=gw, p1=patch, p2=patch)


def attention_rollout(weights: Sequence[Tensor], *, residual: bool = True) -> Tensor:
    """Attention rollout (Abnar & Zuidema 2020): how much each output token draws on each input token.

    Per layer, average the heads, add the identity for the residual connection (W + I, i.e.
    0.5 W + 0.5 I after renormalising rows), then multiply through the layers:
    R = A_L ... A_2 A_1. Every row of R sums to 1.

    Args:
        weights: per layer, attention weights (B, H, T, T) (e.g. ``Intermediates.weights``), first layer first.
        residual: add the identity (the paper's choice); False multiplies the raw head averages.
    Returns:
        (B, T, T): row i = the distribution over input tokens behind output token i.

    Example::

        cap = []; model(images, capture=cap)
        R = attention_rollout([c.weights for c in cap])       # (B, T, T)
    """
    if len(weights) == 0:
        raise ValueError("attention_rollout needs the weights of at least one layer")
    T = weights[0].shape[-1]
    eye = torch.eye(T, device=weights[0].device)
    rollout = None
    for n, w in enumerate(weights):
        if w.dim() != 4 or w.shape[-2:] != (T, T):
            raise ValueError(f"layer {n}: weights must be (B, H, {T}, {T}) self-attention, got {tuple(w.shape)}")
        a = w.double().mean(dim=1)                                         # (B, T, T): heads averaged
        if residual:
            a = a + eye
            a = a / a.sum(dim=-1, keepdim=True)
        rollout = a if rollout is None else a @ rollout                    # (B, T, T)
    return rollout.float()


class ViT(nn.Module):
    """Vision Transformer: ``forward(images) -> logits``, ``features`` for other models, attention maps."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.cfg = cfg
        p, C, d = cfg.patch_size, cfg.channels, cfg.d_model
        self.patch_embed = nn.Linear(C * p * p, d)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d)) if cfg.pooling == "cls" else None
        gh, gw = cfg.grid
        if cfg.positional == "learned":
            self.pos_enc = LearnedEncoding2D(gh, gw, d)
        else:                                   # fixed: a buffer, recomputed rather than saved
            self.register_buffer("pos_table", sinusoidal_2d(gh, gw, d), persistent=False)   # (N, d)
            self.pos_enc = None
        self.drop = nn.Dropout(cfg.dropout)
        self.encoder = BlockStack(cfg.block(), cfg.n_layers)     # ends with the pre-norm stack's final norm
        self.head = nn.Linear(d, cfg.n_classes) if cfg.n_classes is not None else None
        # PyTorch's default Linear init (Kaiming-uniform, std 1/sqrt(3 fan_in)), not GPT-2's N(0, 0.02):
        # measured on digits, 0.02 leaves attention uniform and the residual branches tiny, and the
        # model sat near chance for ~400 steps where the default reached 91% (docs/benchmarks.md).
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def check_images(self, images: Tensor) -> None:
        """Raise a ValueError naming the expected and the given shape, and the fix."""
        C, (H, W) = self.cfg.channels, self.cfg.image_size
        if not isinstance(images, Tensor) or not images.is_floating_point():
            raise TypeError(f"images must be a float tensor (B, {C}, {H}, {W}), got "
                            f"{getattr(images, 'dtype', type(images).__name__)}")
        if images.dim() != 4:
            raise ValueError(f"images must be (B, C, H, W) = (B, {C}, {H}, {W}), got {tuple(images.shape)}; "
                             "add a batch dimension (images[None]) or a channel one (images[:, None])")
        if images.shape[1] != C:
            raise ValueError(f"this ViT expects {C} channel(s), got {images.shape[1]} (images {tuple(images.shape)}); "
                             f"convert the images (e.g. RGB <-> grey) or build ViTConfig(channels={images.shape[1]})")
        if tuple(images.shape[-2:]) != (H, W):
            raise ValueError(f"this ViT expects {H}x{W} images, got {images.shape[-2]}x{images.shape[-1]} "
                             f"(images {tuple(images.shape)}); resize them (F.interpolate) or build "
                             f"ViTConfig(image_size={tuple(images.shape[-2:])}) with a patch size dividing it")

    def tokens(self, images: Tensor) -> Tensor:
        """Embedded patches with positions, CLS first if any: (B, T, d), T = N (+ 1)."""
        self.check_images(images)
        x = self.patch_embed(patchify(images, self.cfg.patch_size))       # (B, N, d)
        x = self.pos_enc(x) if self.pos_enc is not None else x + self.pos_table.to(x.dtype)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1).to(x.dtype), x], dim=1)   # (B, 1 + N, d)
        return self.drop(x)

    def encode(self, images: Tensor, *, capture: Optional[list] = None) -> Tensor:
        """All encoded tokens (B, T, d), CLS first if ``pooling == "cls"``; capture: per-layer Intermediates."""
        return self.encoder(self.tokens(images), capture=capture)

    def features(self, images: Tensor, *, capture: Optional[list] = None) -> Tensor:
        """Encoded patch tokens only (B, N, d), row-major over the patch grid (the captioner's memory)."""
        h = self.encode(images, capture=capture)                           # (B, T, d)
        return h[:, 1:] if self.cls_token is not None else h               # (B, N, d)

    def pool(self, h: Tensor) -> Tensor:
        """(B, T, d) encoded tokens -> (B, d): the CLS token, or the mean of the patch tokens."""
        return h[:, 0] if self.cls_token is not None else h.mean(dim=1)

    def forward(self, images: Tensor, *, capture: Optional[list] = None) -> Tensor:
        """Class logits (B, n_classes) for images (B, C, H, W)."""
        if self.head is None:
            raise ValueError("this ViT has no classification head (n_classes=None); use features(images)")
        return self.head(self.pool(self.encode(images, capture=capture)))  # (B, n_classes)

    def loss(self, images: Tensor, labels: Tensor) -> Tensor:
        """Mean cross-entropy of the class logits against labels (B,) int64."""
        return F.cross_entropy(self(images).float(), labels)

    # -- attention maps ----------------------------------------------------------------------------
    def _patch_rows(self, w: Tensor) -> Tensor:
        """(..., T, T) weights -> (..., N): what the pooled output attends to, renormalised over patches.

        CLS pooling: the CLS row's patch columns (its self-attention mass dropped); mean pooling:
        the mean over all query rows. Renormalised so every map is a distribution over patches.
        """
        rows = w[..., 0, 1:] if self.cls_token is not None else w.mean(dim=-2)   # (..., N)
        return rows / rows.sum(dim=-1, keepdim=True).clamp_min(1e-12)

    @torch.no_grad()
    def attention_maps(self, images: Tensor) -> Tensor:
        """Per-layer, per-head attention over the patch grid: (B, layers, heads, H/p, W/p), each summing to 1."""
        cap: list = []
        self.encode(images, capture=cap)
        w = torch.stack([c.weights for c in cap], dim=1)                   # (B, layers, heads, T, T)
        return self._patch_rows(w.float()).unflatten(-1, self.cfg.grid)

    @torch.no_grad()
    def rollout_map(self, images: Tensor, *, residual: bool = True) -> Tensor:
        """Attention rollout of the pooled output over the patch grid: (B, H/p, W/p), summing to 1."""
        cap: list = []
        self.encode(images, capture=cap)
        R = attention_rollout([c.weights for c in cap], residual=residual)  # (B, T, T)
        return self._patch_rows(R).unflatten(-1, self.cfg.grid)
