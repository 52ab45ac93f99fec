"""The favor backend: Performer's FAVOR+ positive orthogonal random features (Choromanski et al. 2021).

FAVOR+ *estimates* softmax attention without forming the (L, S) weights. With x = sqrt(scale) q
and y = sqrt(scale) k (= d^(-1/4) q, d^(-1/4) k at the default scale),

    phi(x) = exp(-|x|^2 / 2) / sqrt(m) * [exp(w_1·x), ..., exp(w_m·x)]
    E_w[phi(x)·phi(y)] = exp(x·y) = exp(scale q·k)               (w_r marginally N(0, I_d))

and the linear-attention engine (``linear.kernelized_attention``, the same chunked prefix-sum code
as elu + 1) does the rest, causal or not. The rows w_r are orthogonal within blocks of d (the Q
factor of a Gaussian matrix's QR decomposition, sign-corrected so it is Haar-distributed), each
rescaled by the norm of an independent d-dim Gaussian (chi_d), so each row is marginally Gaussian
and the estimate stays unbiased while its variance drops.

Stabilizers (REFERENCES.md section 7): phi is computed as exp(log phi - c) with c the per-row max
for queries and ONE constant shared by the keys of a head (the max over keys and features); both
cancel between numerator and normalizer. Causal, that key constant is a running max updated once
per fused segment of rows (``linear_core``: the state is rescaled when it grows), and the
recurrent form keeps a running max per token (``linear_recurrent``). No eps is added: every
weight is positive, so the output is a convex combination of values and only a normalizer of
exactly 0 (no key; or, for extreme inputs, every weight underflowing) needs care -- it gives 0.
Departure from the reference implementation, which adds eps = 1e-4 to the *stabilized* features:
there the output depends on the key constant, so in causal mode on future keys, and on how the
sequence is split into prompt and decoded tokens.

How to choose FAVOR+ and its number of features::

    out = attnlab.attention(q, k, v, causal=True, backend="favor")    # m = default_n_features(D), seed 0
    feats = FavorFeatures(dim=64, n_features=256, seed=1)
    out = favor_attention(q, k, v, feats, causal=True)                  # your m and seed
    feats.redraw()                                                      # fresh features, e.g. every 1000 steps
"""
from __future__ import annotations

import functools
import math
from typing import Optional

import torch
from torch import Tensor

from ..masks import Mask
from ..registry import register_backend
from ..request import AttentionRequest
from .linear import DEFAULT_CHUNK, FeatureMap, linear_attention, linear_unsupported, run_backend

__all__ = ["FavorFeatures", "favor_attention", "default_n_features", "DEFAULT_SEED"]

DEFAULT_SEED = 0
SCALINGS = ("chi", "sqrt_d")


def default_n_features(head_dim: int) -> int:
    """Performer's default m = d ln d (266 for d = 64), at least d."""
    return max(head_dim, int(head_dim * math.log(max(head_dim, 1))))


class FavorFeatures(FeatureMap):
    """Positive orthogonal random features for the softmax kernel, seeded and redrawable.

    Args:
        dim: head dim d the features apply to.
        n_features: m, the number of random features (error falls roughly as 1/sqrt(m)).
        seed: the draws come from ``torch.Generator().manual_seed(seed)``: the same seed gives
            the same sequence of draws (the first, then each ``redraw()``).
        orthogonal: orthogonal rows within blocks of d (FAVOR+); False = i.i.d. Gaussian rows.
        scaling: "chi" (row norms drawn from chi_d, rows marginally Gaussian: unbiased) or
            "sqrt_d" (every row of norm sqrt(d), the reference's ``scaling=1`` option).
    Example:
        feats = FavorFeatures(64, 256, seed=0)
        out = favor_attention(q, k, v, feats, causal=True)
        feats.redraw()                                     # new features from the same stream
    """

    log_space = True
    eps = 0.0

    def __init__(self, dim: int, n_features: int, seed: int = DEFAULT_SEED, *, orthogonal: bool = True,
                 scaling: str = "chi"):
        for name, val in (("dim", dim), ("n_features", n_features)):
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ValueError(f"FavorFeatures {name}={val!r}: must be a positive int")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"FavorFeatures seed={seed!r}: must be an int")
        if scaling not in SCALINGS:
            raise ValueError(f"FavorFeatures scaling={scaling!r}: choose from {SCALINGS}")
        self.dim, self.m, self.seed = dim, n_features, seed
        self.orthogonal, self.scaling = orthogonal, scaling
        self._gen = torch.Generator().manual_seed(seed)
        self.draws = 0
        self.matrix = self._draw()                               # (m, d) float64, rows w_r

    def _draw(self) -> Tensor:
        d, m, g = self.dim, self.m, self._gen
        if self.orthogonal:
            gauss = torch.randn(-(-m // d), d, d, generator=g, dtype=torch.float64)   # ceil(m / d) blocks
            qf, r = torch.linalg.qr(gauss)
            # Sign-correct so each block is Haar-distributed (Mezzadri 2007); its rows are orthonormal.
            qf = qf * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[:, None, :]
            w = qf.transpose(-2, -1).reshape(-1, d)[:m]          # (m, d), unit rows
        else:
            w = torch.randn(m, d, generator=g, dtype=torch.float64)
            w = w / w.norm(dim=1, keepdim=True)
        if self.scaling == "chi":
            norms = torch.randn(m, d, generator=g, dtype=torch.float64).norm(dim=1)   # chi_d
        else:
            norms = torch.full((m,), math.sqrt(d), dtype=torch.float64)
        self.draws += 1
        return w * norms[:, None]                                # (m, d)

    def redraw(self) -> "FavorFeatures":
        """Replace the features by the next draw of this object's generator; returns self."""
        self.matrix = self._draw()
        return self

    def n_features(self, head_dim: int) -> int:
        if head_dim != self.dim:
            raise ValueError(f"FavorFeatures were built for head dim {self.dim} but q has head dim {head_dim}: "
                             f"use FavorFeatures({head_dim}, {self.m}, seed)")
        return self.m

    def __call__(self, x: Tensor) -> Tensor:
        """log phi(x) = w·x - |x|^2 / 2 - log(m) / 2: (..., d) -> (..., m)."""
        w = self.matrix.to(device=x.device, dtype=x.dtype)
        half_norm = 0.5 * (x * x).sum(-1, keepdim=True) + 0.5 * math.log(self.m)   # (..., 1)
        return (x @ w.T).sub_(half_norm)                  # in place: matmul's backward does not read its output

    def kernel_estimate(self, x: Tensor, y: Tensor) -> Tensor:
        """phi(x)·phi(y), unstabilized: an unbiased estimate of exp(x·y). x: (..., d), y: (..., d)."""
        return (torch.exp(self(x)) * torch.exp(self(y))).sum(-1)

    def __repr__(self):
        return (f"FavorFeatures(dim={self.dim}, n_features={self.m}, seed={self.seed}, "
                f"orthogonal={self.orthogonal}, scaling={self.scaling!r}, draws={self.draws})")


@functools.lru_cache(maxsize=None)
def _default_features(head_dim: int) -> FavorFeatures:
    # Private: a caller who redraws must own the object (the backend's features stay fixed).
    return FavorFeatures(head_dim, default_n_features(head_dim), DEFAULT_SEED)


def favor_attention(q: Tensor, k: Tensor, v: Tensor, features: Optional[FavorFeatures] = None, *,
                    causal: bool = False, mask=None, scale: Optional[float] = None,
                    chunk_size: int = DEFAULT_CHUNK, return_weights: bool = False):
    """FAVOR+ attention: an unbiased random-feature estimate of softmax attention, O(n m Dv).

    Args:
        q: (B, H, L, D); k: (B, Hkv, S, D); v: (B, Hkv, S, Dv).
        features: ``FavorFeatures(D, m, seed)``; None = the backend's (m = D ln D, seed 0).
        causal, mask, scale, chunk_size, return_weights: as ``linear_attention``.
    Returns:
        out (B, H, L, Dv) in q's dtype (or (out, weights) with the estimated weights).
    Example:
        feats = FavorFeatures(64, 512, seed=3)
        out = favor_attention(q, k, v, feats, causal=True)      # (B, H, L, Dv)
    """
    if features is None and isinstance(q, Tensor) and q.dim() == 4:
        features = _default_features(q.shape[-1])
    # (a malformed q is left to linear_attention, whose validation names the problem)
    elif features is not None and not isinstance(features, FavorFeatures):
        raise TypeError(f"features must be FavorFeatures(dim, n_features, seed), got {type(features).__name__}")
    return linear_attention(q, k, v, causal=causal, mask=mask, scale=scale, features=features,
                            chunk_size=chunk_size, return_weights=return_weights)


def _unsupported(req: AttentionRequest) -> Optional[str]:
    return linear_unsupported(req.mask, req.bias, req.dropout_p, req.scale, "favor", req.softcap)


@register_backend("favor", exact=False, unsupported=_unsupported,
                  summary="approximate: Performer FAVOR+ random features (m = D ln D, seed 0), O(n)")
def favor_backend(q: Tensor, k: Tensor, v: Tensor, *, mask: Optional[Mask] = None, bias=None, scale: float,
                  dropout_p: float = 0.0, dropout_seed: Optional[int] = None, return_weights: bool = False,
                  softcap: Optional[float] = None):
    """Registered backend "favor": FAVOR+ with the default features for q's head dim."""
    return run_backend(_default_features(q.shape[-1]), "favor", q, k, v, mask, bias, scale, dropout_p,
                       return_weights, softcap)
