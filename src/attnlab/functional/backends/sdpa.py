"""The sdpa backend: torch.nn.functional.scaled_dot_product_attention, where it is exactly equivalent.

Two mismatches are handled here:

* SDPA's ``is_causal`` is top-left aligned (query i sees keys j <= i). attnlab's causal is
  bottom-right aligned, so ``is_causal`` is used only when L == S and causal is the whole mask;
  otherwise the mask is passed densely.
* SDPA (CPU, torch 2.13) runs its fused flash kernel with or without an ``attn_mask``, but with
  a mask it still computes every (query, key) pair -- nothing is skipped -- and the dense (L, S)
  mask (plus a float copy) must exist in memory. Dropout, Dv != D or a non-unit last stride send it
  to the math path, which materializes the (B, H, L, S) scores. ``auto`` therefore sends requests
  whose mask leaves tiles to skip, and structured biases, to the tiled backend.

Dropout uses torch's own RNG stream inside SDPA, so it does not reproduce the reference/tiled
keep mask for a given seed (it is the same distribution).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..masks import CausalMask, Mask
from ..registry import register_backend
from ..request import AttentionRequest, Bias
from .reference import attention_probs, dense_bias, reference_attention


# NaN in -> NaN out as on every exact backend (tests/test_nan_agreement.py). Below this many keys torch's CPU
# flash kernel (2.13) returns 0, not NaN, for a query row holding a NaN (its short-row path drops the NaN from
# the max; float64 from 8 keys): the reference formula runs there instead (a few keys: cheap). And SDPA adds
# an attn_mask as 0 / -inf, so a NaN score at a masked key leaks into its row (NaN + -inf = NaN): with a mask
# or bias and a NaN/inf in q or k (one O((L + S) D) check), the reference runs too.
NAN_SAFE_S = 16


def _finite(q: Tensor, k: Tensor) -> bool:
    """True when q and k hold no NaN/inf, or cannot be looked at: meta tensors (no data), vmap's batched
    tensors and torch.compile's graphs (no data-dependent branching there: SDPA runs, as before the check
    existed, and a NaN at a masked key may reach its row)."""
    if q.is_meta or torch.compiler.is_compiling() or _is_batched(q) or _is_batched(k):
        return True
    return bool(torch.isfinite(q).all()) and bool(torch.isfinite(k).all())


_is_batched = getattr(getattr(torch._C, "_functorch", None), "is_batchedtensor", lambda t: False)


def _unsupported(req: AttentionRequest) -> Optional[str]:
    if req.softcap is not None:
        return (f"torch's SDPA has no score capping (softcap={req.softcap}): its fused kernels apply the "
                f"softmax to scale * q k^T + mask directly; use tiled, sparse or reference")
    b = req.bias
    if isinstance(b, Tensor) and b.dtype != req.q.dtype:
        return (f"SDPA needs the additive mask in q's dtype ({req.q.dtype}); casting the {b.dtype} bias "
                f"would change its values")
    return None


def sdpa_kernel_kind(req: AttentionRequest) -> str:
    """Which SDPA kernel a request gets on CPU: 'flash' or 'math' (mirrors torch's own choice,
    ``torch._fused_sdp_choice``, which a test keeps in step)."""
    q, k, v = req.q, req.k, req.v
    if req.dropout_p > 0.0 or v.shape[-1] != q.shape[-1] or any(t.stride(-1) != 1 for t in (q, k, v)):
        return "math"
    return "flash"


@register_backend("sdpa", unsupported=_unsupported,
                  summary="torch SDPA: fused flash kernel over every pair (dense mask); math path for dropout, Dv != D")
def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, *, mask: Optional[Mask] = None,
                   bias: Optional[Bias] = None, scale: float, dropout_p: float = 0.0,
                   dropout_seed: Optional[int] = None, return_weights: bool = False,
                   softcap: Optional[float] = None):
    """Delegate to ``F.scaled_dot_product_attention``; same arguments and returns as the reference."""
    if softcap is not None:
        raise ValueError(f"backend 'sdpa' cannot compute softcap={softcap}: torch's SDPA has no score "
                         f"capping; use backend='tiled', 'sparse' or 'reference'")
    B, H, L, _ = q.shape
    S = k.shape[2]
    is_causal = isinstance(mask, CausalMask) and L == S and bias is None
    if S < NAN_SAFE_S or (not is_causal and (mask is not None or bias is not None) and not _finite(q, k)):
        return reference_attention(q, k, v, mask=mask, bias=bias, scale=scale, dropout_p=dropout_p,
                                   dropout_seed=dropout_seed, return_weights=return_weights)
    attn_mask = None
    if not is_causal:
        b = dense_bias(bias, L, S)
        allowed = mask.dense(L, S).to(q.device) if mask is not None else None
        if b is not None:
            b = b.to(q.dtype)
            attn_mask = b if allowed is None else b.masked_fill(~allowed, float("-inf"))
        else:
            attn_mask = allowed
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                         is_causal=is_causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    if return_weights:
        with torch.no_grad():
            probs = attention_probs(q, k, mask=mask, bias=bias, scale=scale)
        return out, probs
    return out
