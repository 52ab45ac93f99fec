"""The reference backend: the textbook formula, written to be read, not to be fast.

    out = softmax(cap(scale * Q K^T) + bias, masked) V        cap(s) = softcap * tanh(s / softcap), optional

It materializes the (B, H, L, S) scores, so memory grows as L * S. Run in float64 it is the
oracle every other backend is tested against.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..dropout import keep_mask
from ..masks import Mask
from ..memory import check_fits_in_memory, nbytes
from ..registry import register_backend
from ..request import Bias

__all__ = ["reference_attention", "attention_probs", "dense_bias", "accum_dtype", "softcap_scores"]


def accum_dtype(dtype: torch.dtype) -> torch.dtype:
    """Softmax runs in float32 for half types and in float64 for float64 inputs."""
    return torch.promote_types(dtype, torch.float32)


def dense_bias(bias: Optional[Bias], L: int, S: int) -> Optional[Tensor]:
    """The bias as a tensor broadcastable to (B, H, L, S) (structured biases are materialized)."""
    if bias is None or isinstance(bias, Tensor):
        return bias
    return bias.dense(L, S)


def safe_softmax(logits: Tensor) -> Tensor:
    """Softmax over the last dim; a row of all -inf (nothing to attend to) gives zeros, not NaN."""
    if logits.shape[-1] == 0:                                          # S = 0: nothing to normalize
        return logits
    m = logits.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))      # -inf rows: subtract 0 instead
    e = torch.exp(logits - m)
    total = e.sum(dim=-1, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))


def softcap_scores(s: Tensor, softcap: Optional[float]) -> Tensor:
    """softcap * tanh(s / softcap) (Gemma 2's score capping), or s itself when softcap is None."""
    return s if softcap is None else torch.tanh(s / softcap) * softcap


def check_scores_fit(B: int, H: int, L: int, S: int, dtype: torch.dtype, device: torch.device) -> None:
    """MemoryError, before allocating, when the (B, H, L, S) scores (~3 copies: scores, logits, weights)
    exceed the memory the device has available: e.g. n = 2**20 would ask for terabytes."""
    if torch.compiler.is_compiling():           # nothing to check in a graph; dynamo cannot format SymInts
        return
    check_fits_in_memory(f"the reference backend materializes the (B, H, L, S) = ({B}, {H}, {L}, {S}) scores",
                         3 * nbytes((B, H, L, S), accum_dtype(dtype)), device,
                         "use backend='tiled' or 'native' (O(L + S) memory), or 'auto'")


def attention_probs(q: Tensor, k: Tensor, *, mask: Optional[Mask], bias: Optional[Bias], scale: float,
                    softcap: Optional[float] = None) -> Tensor:
    """The attention weights P = softmax(cap(scale * q k^T) + bias, masked): (B, H, L, S), in float32/64."""
    B, H, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    check_scores_fit(B, H, L, S, q.dtype, q.device)
    # query head h uses kv head h // (H/Hkv)
    k = k.repeat_interleave(H // Hkv, dim=1)                           # (B, H, S, D)
    scores = (q @ k.transpose(-2, -1)) * scale                         # (B, H, L, S), in the input dtype
    logits = softcap_scores(scores.to(accum_dtype(q.dtype)), softcap)  # softmax in fp32 (fp64 for fp64)
    b = dense_bias(bias, L, S)
    if b is not None:
        logits = logits + b.to(logits.dtype)
    if mask is not None:
        logits = logits.masked_fill(~mask.dense(L, S).to(q.device), float("-inf"))
    return safe_softmax(logits)                                        # (B, H, L, S)


@register_backend("reference", summary="textbook math; materializes (B, H, L, S) scores; the fp64 test oracle")
def reference_attention(q: Tensor, k: Tensor, v: Tensor, *, mask: Optional[Mask] = None,
                        bias: Optional[Bias] = None, scale: float, dropout_p: float = 0.0,
                        dropout_seed: Optional[int] = None, return_weights: bool = False,
                        softcap: Optional[float] = None):
    """softmax(cap(scale * q k^T) + bias, masked) v, computed the obvious way.

    Args:
        q: (B, H, L, D); k: (B, Hkv, S, D); v: (B, Hkv, S, Dv).
        mask: structured mask (True = may attend) or None.
        bias: additive (B|1, H|1, L|1, S|1) tensor or a StructuredBias.
        softcap: if given, scores become softcap * tanh(scores / softcap) before bias and mask.
    Returns:
        out (B, H, L, Dv) in q's dtype; with return_weights, also the weights (B, H, L, S)
        (softmax probabilities before dropout).
    Example:
        q = k = v = torch.randn(1, 2, 5, 8, dtype=torch.float64)
        out = reference_attention(q, k, v, mask=causal(), scale=8 ** -0.5)
    """
    B, H, L, _ = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    probs = attention_probs(q, k, mask=mask, bias=bias, scale=scale, softcap=softcap)   # (B, H, L, S)
    p = probs
    if dropout_p > 0.0:
        keep = keep_mask(dropout_seed, dropout_p, B, H, 0, L, 0, S, device=q.device)
        p = p * keep / (1.0 - dropout_p)
    v = v.repeat_interleave(H // Hkv, dim=1)                           # (B, H, S, Dv)
    out = (p.to(v.dtype) @ v)                                          # (B, H, L, Dv)
    return (out, probs) if return_weights else out
