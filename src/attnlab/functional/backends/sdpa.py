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

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..bias import StructuredBias
from ..mask_plan import planned
from ..masks import CausalMask, Mask
from ..memory import check_fits_in_memory, check_weights_fit, nbytes
from ..registry import register_backend
from ..request import AttentionRequest, Bias
from .reference import accum_dtype, attention_probs, dense_bias, reference_attention


# NaN in -> NaN out as on every exact backend (tests/test_nan_agreement.py). Below this many keys torch's CPU
# flash kernel (2.13) returns 0, not NaN, for a query row holding a NaN (its short-row path drops the NaN from
# the max; float64 from 8 keys): below it a plain request (no mask or bias but causal with L == S, no dropout)
# still runs SDPA after one O((L + S) D) check that q and k are finite -- the check, not the whole reference
# formula, is what a decode step pays (issue #29) -- and anything else there runs the reference formula (a
# few keys: cheap). And SDPA adds an attn_mask as 0 / -inf, so a NaN score at a masked key leaks into its row
# (NaN + -inf = NaN): with a mask or bias and a NaN/inf in q or k (the same check), the reference runs too.
NAN_SAFE_S = 16


def finite(q: Tensor, k: Tensor) -> bool:
    """True when q and k hold no NaN/inf, or cannot be looked at: meta tensors (no data), vmap's batched
    tensors and torch.compile's graphs (no data-dependent branching there: SDPA runs, as before the check
    existed, and a NaN at a masked key may reach its row).

    One sum and one read of each: a NaN or an infinity anywhere makes its tensor's sum non-finite (inf - inf
    is NaN), and so, rarely, does a sum of huge finite values that overflows -- then the caller takes the
    reference formula, exact and only slower. Two ``isfinite().all()`` cost more than SDPA's own call
    on a small request, and adding the two sums as tensors costs a third op (~3 us; issue #29, ``bench
    --lm``'s overheads table measures the call)."""
    if q.is_meta or torch.compiler.is_compiling() or _is_batched(q) or _is_batched(k):
        return True
    return math.isfinite(q.sum().item()) and math.isfinite(k.sum().item())


_is_batched = getattr(getattr(torch._C, "_functorch", None), "is_batchedtensor", lambda t: False)


def _unsupported(req: AttentionRequest) -> Optional[str]:
    if req.softcap is not None:
        return (f"torch's SDPA has no score capping (softcap={req.softcap}): its fused kernels apply the "
                f"softmax to scale * q k^T + mask directly; use tiled, sparse or reference")
    b = req.bias
    if isinstance(b, Tensor) and b.dtype != req.q.dtype:
        return (f"SDPA needs the additive mask in q's dtype ({req.q.dtype}); casting the {b.dtype} bias "
                f"would change its values")
    if isinstance(b, StructuredBias) and req.q.dtype in (torch.bfloat16, torch.float16):
        # The same rule for a structured bias (issue #26): its values (ALiBi's -m |i - j|, a T5 table) are
        # computed in its parameters' dtype; rounded to bf16 they cost 0.28 of error at L = 512 (slopes 0.3)
        # where every other backend adds them in fp32 (0.013). A bias already in q's dtype loses nothing.
        have = b.values_dtype(req.shape.L, req.shape.S)
        if have != req.q.dtype:
            return (f"SDPA needs the additive mask in q's dtype ({req.q.dtype}); rounding the {have} values of "
                    f"{b!r} would change them; use tiled, native or reference, which add it in float32")
    return None


def _check_memory(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Mask], bias: Optional[Bias], dropout_p: float,
                  return_weights: bool, is_causal: bool) -> None:
    """MemoryError before any work when what this backend materializes cannot fit (issue #26): the dense
    mask and bias with SDPA's float copy, the math path's (B, H, L, S) scores, the returned weights.

    Lower bounds, counting only buffers alive at once (measured at n = 16384 fp32, B = H = 1: 5 bytes
    per pair with a window mask, 9 on the math path, 16 with a mask and an ALiBi bias).
    """
    if torch.compiler.is_compiling():
        return
    B, H, L, D = q.shape
    S = k.shape[2]
    if return_weights:                                               # attention_probs' 3 copies, after the forward
        check_weights_fit("the sdpa backend", B, H, L, S, accum_dtype(q.dtype), q.device, copies=3)
    e, parts, need, dense = q.element_size(), [], 0, (1, 1)
    if not is_causal and (mask is not None or bias is not None):
        if bias is not None:
            b = bias if isinstance(bias, Tensor) else bias.tile_values(0, min(L, 1), 0, min(S, 1), L, S)
            dense = (b.shape[0], b.shape[1])
            if isinstance(bias, StructuredBias) and (mask is not None or b.dtype != q.dtype):
                need += nbytes((*dense, L, S), b.dtype)              # its dense values, before cast / masking
        if mask is not None:                                          # the dense mask (and ~mask to fill a bias)
            need += (2 if bias is not None else 1) * nbytes((1, 1, L, S), torch.bool)
        need += nbytes((*dense, L, S), q.dtype)                      # the additive float mask SDPA reads
        parts.append(f"the dense ({dense[0]}, {dense[1]}, {L}, {S}) mask{' and bias' if bias is not None else ''} "
                     f"in {q.dtype}")
    why_math = ("dropout" if dropout_p > 0.0 else "Dv != D" if v.shape[-1] != D else
                "an input whose last stride is not 1" if any(t.stride(-1) != 1 for t in (q, k, v)) else None)
    if why_math is not None:
        need += 2 * B * H * L * S * e                                # scores and weights
        parts.append(f"the (B, H, L, S) = ({B}, {H}, {L}, {S}) scores of SDPA's math path ({why_math})")
    if parts:
        check_fits_in_memory("the sdpa backend materializes " + " and ".join(parts), need, q.device,
                             "use backend='tiled' or 'native' (masks, biases, dropout and Dv != D in O(L + S) "
                             "memory), or 'auto'")


def rows_overlap(stride: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Do a tensor's rows (its last dim) overlap in memory -- a row stride between 0 and the row width, as in a
    signal's ``unfold`` -- with more than one row of more than one element? torch's CPU SDPA misreads such an input:
    with a row stride of 1 (torch 2.13.0; the last stride 1 too) its flash kernel returned outputs off by up to
    10^13 and, given bf16 gradients, failed in oneDNN ('could not construct a memory descriptor'); strides 40 and
    79 at D = 80 came out right, but no torch kernel documents overlapping rows. A stride of 0 (rows expanded) it
    reads right. scripts/layout_fuzz.py's 'sliding' layout found it."""
    return shape[-2] > 1 and shape[-1] > 1 and 0 < stride[-2] < shape[-1]


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
    _check_memory(q, k, v, mask, bias, dropout_p, return_weights, is_causal)
    plain = is_causal or (mask is None and bias is None)
    if S < NAN_SAFE_S:
        short_safe = plain and dropout_p == 0.0 and finite(q, k)
    if (S < NAN_SAFE_S and not short_safe) or (not plain and not finite(q, k)):
        return reference_attention(q, k, v, mask=mask, bias=bias, scale=scale, dropout_p=dropout_p,
                                   dropout_seed=dropout_seed, return_weights=return_weights)
    attn_mask = None
    if not is_causal:
        b = dense_bias(bias, L, S)
        allowed = None if mask is None else \
            planned(mask, ("dense", L, S, str(q.device)), lambda: mask.dense(L, S).to(q.device))   # read-only
        if b is not None:
            b = b.to(q.dtype)
            attn_mask = b if allowed is None else b.masked_fill(~allowed, float("-inf"))
        else:
            attn_mask = allowed
    q, k, v = (t.contiguous() if rows_overlap(t.stride(), t.shape) else t for t in (q, k, v))   # one copy: see there
    kw = dict(attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale)
    # enable_gqa only where the heads differ, decided by an `if`: torch.compile(dynamic=True) guards on the
    # branch, whereas `enable_gqa=H != Hkv` would pass a SymBool, which SDPA refuses (issue #26)
    if q.shape[1] != k.shape[1]:
        kw["enable_gqa"] = True
    out = F.scaled_dot_product_attention(q, k, v, **kw)
    if return_weights:
        with torch.no_grad():
            probs = attention_probs(q, k, mask=mask, bias=bias, scale=scale)
        return out, probs
    return out
