"""The linear backend: kernelized linear attention, phi(x) = elu(x) + 1 (Katharopoulos et al. 2020).

An *approximation* of softmax attention -- a different model, not an estimator of it -- so it is
registered with ``exact=False`` and ``backend="auto"`` never picks it. Softmax weights
exp(s q_i·k_j) are replaced by phi(q_i)·phi(k_j) with positive features phi, and

    out_i = sum_j (phi(q_i)·phi(k_j)) v_j / (sum_j phi(q_i)·phi(k_j) + eps)        eps = 1e-6

costs O(n m Dv) rather than O(n^2) (``linear_core``): non-causal through phi(K)^T V, causal through
chunked prefix sums fused by segments, whose backward recomputes each segment from its start
state instead of storing n prefix states. The
same code serves any positive feature map (``FeatureMap``); Performer's FAVOR+ random features are
one (``favor``). For O(1)-per-token decoding see ``linear_recurrent`` (``LinearAttentionState``).

Conventions:
* ``scale`` plays the role it has in softmax: the features see sqrt(scale) * q and sqrt(scale) * k
  (FAVOR+ needs exactly this to estimate exp(scale q·k)). With ``scale=1.0`` the elu + 1 model is
  the paper's formula as printed; the default scale 1/sqrt(D) gives it a softmax-like temperature.
* Masks: ``causal=True`` (bottom-right aligned: query i sees keys j <= i + S - L; rows with no key
  give 0) and key padding (``masks.padding``: padded keys are dropped from the sums) -- alone or
  combined. Window, document and dense masks give each query its own key set, which prefix sums
  cannot provide: ``unsupported`` names them (use the ``sparse`` or ``tiled`` backend).
* No bias and no dropout (linear attention never forms the weights). ``return_weights=True``
  builds this model's (B, H, L, S) weights densely, for inspection only.
* Features, state and sums in float32 (float64 for float64 inputs); output in q's dtype.

Example::

    out = attnlab.attention(q, k, v, causal=True, backend="linear")        # (B, H, L, Dv)
    out = linear_attention(q, k, v, causal=True, scale=1.0)               # the paper's exact formula
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..masks import CausalMask, Mask, PaddingMask, parts
from ..memory import check_weights_fit
from ..registry import register_backend
from ..request import AttentionRequest, make_request
from .linear_core import (DEFAULT_CHUNK, causal_linear_attention, full_kernel_product, key_features, normalize,
                          query_features)
from .reference import accum_dtype

__all__ = ["FeatureMap", "EluFeatures", "linear_attention", "kernelized_attention", "linear_unsupported",
           "EPS", "DEFAULT_CHUNK", "normalize", "query_features"]

EPS = 1e-6          # added to the elu + 1 normalizer (fast-transformers' value)


class FeatureMap:
    """A positive feature map phi: (..., D) -> (..., m).

    ``log_space = False``: ``__call__`` returns phi(x) itself (elu + 1).
    ``log_space = True``: it returns log phi(x) (FAVOR+), and the caller exponentiates after
    subtracting a stabilizer: a per-row max for queries, one shared constant for keys.
    ``eps`` is added to the normalizer sum_j phi(q_i)·phi(k_j); a normalizer of 0 gives output 0.
    """

    log_space: bool = False
    eps: float = EPS

    def n_features(self, head_dim: int) -> int:
        raise NotImplementedError

    def __call__(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def features_(self, x: Tensor) -> Tensor:
        """``self(x)``, allowed to overwrite x (a scratch tensor): saves an n x D allocation."""
        return self(x)


class EluFeatures(FeatureMap):
    """phi(x) = elu(x) + 1 > 0, elementwise, m = D (Katharopoulos et al. 2020)."""

    def n_features(self, head_dim: int) -> int:
        return head_dim

    def __call__(self, x: Tensor) -> Tensor:
        # in place is safe: elu's backward reads its input, not its output (one pass over n x D saved)
        return F.elu(x).add_(1.0)

    def features_(self, x: Tensor) -> Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            return self(x)
        return F.elu_(x).add_(1.0)            # no graph to keep: reuse x (big tensors cost page faults)

    def __repr__(self):
        return "EluFeatures()"


ELU = EluFeatures()


def linear_unsupported(mask: Optional[Mask], bias, dropout_p: float, scale: float,
                       name: str = "linear", softcap: Optional[float] = None) -> Optional[str]:
    """Why a linear-attention backend cannot compute this request (None if it can)."""
    if softcap is not None:
        return (f"{name} attention never forms the (L, S) scores, so it cannot soft-cap them "
                f"(softcap={softcap}); use an exact backend (tiled, sparse, reference)")
    if bias is not None:
        return (f"{name} attention never forms the (L, S) scores, so there is nothing to add a bias to; "
                f"use an exact backend (tiled, sdpa) for biased attention")
    if dropout_p > 0.0:
        return (f"{name} attention never forms the weights, so attention dropout does not apply "
                f"(dropout_p={dropout_p}); pass dropout_p=0 and apply dropout to the output instead")
    if scale < 0:
        return f"scale={scale} < 0: the features see sqrt(scale) * q and sqrt(scale) * k, so scale must be >= 0"
    for part in parts(mask):
        if not isinstance(part, (CausalMask, PaddingMask)):
            # compile(dynamic=True) makes a mask's ints symbolic, and dynamo cannot format those (issue #26)
            shown = type(part).__name__ if torch.compiler.is_compiling() else repr(part)
            return (f"mask {shown} is not supported: {name} attention handles causal=True and key padding "
                    f"(masks.padding) only, because its prefix sums give every query the same key set "
                    f"up to its position; use backend='sparse' or 'tiled' for window, document or dense masks")
    return None


def _unsupported(req: AttentionRequest) -> Optional[str]:
    return linear_unsupported(req.mask, req.bias, req.dropout_p, req.scale, softcap=req.softcap)


def split_mask(mask: Optional[Mask], S: int, device) -> tuple[bool, Optional[Tensor]]:
    """(causal, keep): whether the mask holds a causal part, and the (Bm, 1, S, 1) key-padding keep mask."""
    causal, keep = False, None
    for part in parts(mask):
        if isinstance(part, CausalMask):
            causal = True
        else:                                                     # PaddingMask (others are refused earlier)
            k = part.tile(0, 1, 0, S, 1, S)[:, 0, 0].to(device)[:, None, :, None]   # right or left padding
            keep = k if keep is None else keep & k                # (Bm, 1, S, 1)
    return causal, keep


def kernelized_attention(q: Tensor, k: Tensor, v: Tensor, fmap: FeatureMap, *, causal: bool,
                         keep: Optional[Tensor], scale: float, chunk: int = DEFAULT_CHUNK,
                         return_weights: bool = False):
    """Linear attention with feature map ``fmap`` on validated inputs (the shared engine).

    Args:
        q: (B, H, L, D); k: (B, Hkv, S, D); v: (B, Hkv, S, Dv).
        fmap: the feature map; causal: bottom-right aligned prefix sums;
        keep: (Bm, 1, S, 1) bool, False = padded key (dropped), or None;
        scale: >= 0, features see sqrt(scale) * q and sqrt(scale) * k; chunk: causal chunk size.
    Returns:
        out (B, H, L, Dv) in q's dtype; with return_weights also this model's weights (B, H, L, S).
    """
    B, H, L, _ = q.shape
    Hkv, S, Dv = k.shape[1], k.shape[2], v.shape[3]
    G = H // Hkv
    cdt = accum_dtype(q.dtype)
    if return_weights:                  # this model's dense weights, 2 copies, checked before the forward
        check_weights_fit(f"linear attention ({type(fmap).__name__})", B, H, L, S, cdt, q.device, copies=2)
    if S == 0 or L == 0:
        out = q.new_zeros(B, H, L, Dv)
        return (out, q.new_zeros(B, H, L, S, dtype=cdt)) if return_weights else out
    if causal:
        out = causal_linear_attention(q, k, v, fmap, keep=keep, scale=scale, chunk=chunk)   # (B, H, L, Dv)
        if not return_weights:
            return out
    root = math.sqrt(scale)
    with torch.set_grad_enabled(torch.is_grad_enabled() and not causal):
        fq = query_features(fmap, q.to(cdt) * root).unflatten(1, (Hkv, G))   # (B, Hkv, G, L, m)
        fk = key_features(fmap, k.to(cdt) * root, keep)[0]                   # (B, Hkv, S, m)
    if not causal:
        y = full_kernel_product(fq, fk, v.to(cdt))                # (B, Hkv, G, L, Dv + 1)
        out = normalize(y[..., :Dv], y[..., Dv], fmap.eps).flatten(1, 2).to(q.dtype)   # (B, H, L, Dv)
        if not return_weights:
            return out
    with torch.no_grad():                                         # this model's weights, densely
        a = fq @ fk.unsqueeze(2).transpose(-2, -1)                # (B, Hkv, G, L, S)
        if causal:
            a = a * CausalMask().dense(L, S).to(a.device)
        w = normalize(a, a.sum(-1), fmap.eps)
    return out, w.flatten(1, 2)                                   # (B, H, L, S)


def check_feature_map(features, head_dim: int) -> FeatureMap:
    """The feature map to use (elu + 1 when None), checked against the head dim."""
    if features is None:
        return ELU
    if not isinstance(features, FeatureMap):
        raise TypeError(f"features must be a FeatureMap (EluFeatures(), FavorFeatures(dim, m, seed)), "
                        f"got {type(features).__name__}")
    features.n_features(head_dim)                                 # raises if built for another D
    return features


def linear_attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, mask=None,
                     scale: Optional[float] = None, features: Optional[FeatureMap] = None,
                     chunk_size: int = DEFAULT_CHUNK, return_weights: bool = False):
    """Linear attention, phi(q)·phi(k) in place of exp(scale q·k) (approximate; O(n) cost).

    Args:
        q: (B, H, L, D); k: (B, Hkv, S, D); v: (B, Hkv, S, Dv); H % Hkv == 0.
        causal: bottom-right aligned (query i sees keys j <= i + S - L).
        mask: None, ``masks.padding(lengths)``, ``masks.causal()`` or their ``&``.
        scale: features see sqrt(scale) * q, sqrt(scale) * k; default 1/sqrt(D); 1.0 = the paper.
        features: a ``FeatureMap``; None = elu + 1; ``FavorFeatures(D, m, seed)`` = Performer FAVOR+.
        chunk_size: rows per chunk of the causal prefix sums.
        return_weights: also return this model's (B, H, L, S) weights (dense; for inspection).
    Returns:
        out (B, H, L, Dv) in q's dtype (or (out, weights)). Rows with no key are 0.
    Example:
        q, k, v = (torch.randn(2, 8, 4096, 64) for _ in range(3))
        out = linear_attention(q, k, v, causal=True)                          # elu + 1
        out = linear_attention(q, k, v, features=FavorFeatures(64, 256, seed=0))   # FAVOR+
    """
    req = make_request(q, k, v, mask=mask, causal=causal, scale=scale, return_weights=return_weights)
    why = linear_unsupported(req.mask, None, 0.0, req.scale)
    if why is not None:
        raise ValueError(f"linear_attention cannot compute this request: {why}")
    fmap = check_feature_map(features, q.shape[-1])
    is_causal, keep = split_mask(req.mask, k.shape[2], q.device)
    return kernelized_attention(req.q, req.k, req.v, fmap, causal=is_causal, keep=keep, scale=req.scale,
                                chunk=chunk_size, return_weights=return_weights)


def run_backend(fmap: FeatureMap, name: str, q, k, v, mask, bias, scale, dropout_p, return_weights,
                softcap=None):
    """The body of a registered linear-family backend (refuses what ``unsupported`` refuses)."""
    why = linear_unsupported(mask, bias, dropout_p, scale, name, softcap)
    if why is not None:
        raise ValueError(f"backend {name!r} cannot compute this request: {why}")
    is_causal, keep = split_mask(mask, k.shape[2], q.device)
    return kernelized_attention(q, k, v, fmap, causal=is_causal, keep=keep, scale=scale,
                                return_weights=return_weights)


@register_backend("linear", exact=False, unsupported=_unsupported,
                  summary="approximate: elu+1 kernelized linear attention, O(n) (causal via chunked prefix sums)")
def linear_backend(q: Tensor, k: Tensor, v: Tensor, *, mask: Optional[Mask] = None, bias=None, scale: float,
                   dropout_p: float = 0.0, dropout_seed: Optional[int] = None, return_weights: bool = False,
                   softcap: Optional[float] = None):
    """Registered backend "linear": elu + 1 features, the registry's signature."""
    return run_backend(ELU, "linear", q, k, v, mask, bias, scale, dropout_p, return_weights, softcap)
