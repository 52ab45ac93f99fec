"""``attention``: one entry point over every backend; ``explain``: why "auto" picks what it picks."""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from . import auto_rule
from . import backends as _backends  # noqa: F401  (registers the backends)
from .auto_memo import decided
from .auto_rule import SMALL_PROBLEM, candidates, rule_source, skippable
from .backends.native import native_forward
from .backends.native import why_unavailable as why_native_unavailable
from .backends.reference import reference_attention
from .backends.sdpa import NAN_SAFE_S, finite, rows_overlap
from .dropout import new_seed
from .masks import CausalMask, DenseMask
from .masks import causal as causal_mask_of
from .masks import parts as mask_parts
from .registry import Backend, get_backend
from .request import AttentionRequest, make_request
from .scope import current_backend

__all__ = ["attention", "explain", "choose_backend", "skippable"]


def _plain_small(q, k, v, causal, scale) -> Optional[tuple[str, bool, float, bool]]:
    """Is this a request ``make_request`` would accept and ``auto_rule.pick`` send to SDPA's flash kernel or to the
    compiled kernel with nothing for attnlab to add (no mask but causal with L == S, or with L == 1, where it masks
    nothing; no bias or dropout (GQA is SDPA's enable_gqa, the kernel's kv head per group); at most SMALL_PROBLEM
    scores per head)? Then (backend, is_causal, scale, enable_gqa), else None, and ``attention`` calls the backend
    directly: validating and choosing through the request costs as much as the whole attention of a 128-token
    head (tests/test_dispatch.py keeps this predicate and ``auto_rule.pick`` in step). SDPA's only where q and k
    are finite below NAN_SAFE_S keys (its short rows drop a NaN, backends/sdpa.py; the kernel's do not).

    Each shape and stride is read once: on a decode step this predicate is most of attnlab's cost over
    SDPA's own (a tensor attribute costs 0.15-0.5 us from Python; docs/benchmarks.md, issue #29)."""
    if not (type(q) is Tensor and type(k) is Tensor and type(v) is Tensor):
        return None
    qs, ks = q.shape, k.shape
    if len(qs) != 4 or len(ks) != 4 or v.shape != ks:          # v's shape is k's: Dv == D, same B, Hkv, S
        return None
    B, H, L, D = qs
    Bk, Hkv, S, Dk = ks
    qst, kst, vst = q.stride(), k.stride(), v.stride()
    dt = q.dtype
    if not (dt in _PLAIN_DTYPES and k.dtype == dt and v.dtype == dt and Bk == B and Dk == D
            and Hkv > 0 and H % Hkv == 0 and D > 0 and L > 0 and S > 0 and L * S <= SMALL_PROBLEM
            and (causal is False or (causal is True and (L == S or L == 1)))
            and (scale is None or (type(scale) is float and math.isfinite(scale)))
            and q.is_cpu and k.is_cpu and v.is_cpu
            and qst[-1] == 1 and kst[-1] == 1 and vst[-1] == 1
            # torch's SDPA misreads overlapping rows: the backend copies them
            and not (rows_overlap(qst, qs) or rows_overlap(kst, ks) or rows_overlap(vst, ks))):
        return None
    # L == 1 < S: bottom-right causal masks nothing
    plain = (causal is True and L == S, 1.0 / math.sqrt(D) if scale is None else scale, H != Hkv)
    # off AMX, where the kernel beats a slow half GEMM; fp32 on the Zen 4's tiles (not below 16 queries: SDPA);
    # fp32 GQA decoding on the Zen 4, where the kernel stacks a group's query heads into one head's rows
    half = dt is torch.bfloat16 or dt is torch.float16
    fp32_tiles = dt is torch.float32 and L >= auto_rule.FP32_KERNEL_MIN[0] and S >= auto_rule.FP32_KERNEL_MIN[1]
    fp32_gqa_step = dt is torch.float32 and L == 1 and H != Hkv
    if (half or fp32_tiles or fp32_gqa_step) and why_native_unavailable() is None:
        grad = (q.requires_grad or k.requires_grad or v.requires_grad) and torch.is_grad_enabled()
        square = causal is True and L == S
        why = (auto_rule.half_kernel(dt, L, S, square, grad, D, D, B * H) if half
               else auto_rule.fp32_small_kernel(L, S, square, grad, D, D) if fp32_tiles
               else auto_rule.gqa_decode_kernel(dt, L, S, H, Hkv, D, D, grad))
        if why is not None:
            return ("native",) + plain
    if S < NAN_SAFE_S and not finite(q, k):                  # SDPA's short rows drop a NaN (backends/sdpa.py)
        return None
    return ("sdpa",) + plain


_PLAIN_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def choose_backend(req: AttentionRequest, backend: str) -> Backend:
    """The backend to run: the named one (if it can honour ``req``) or auto's pick."""
    if backend == "auto":
        return get_backend(decided(req, auto_rule.pick)[0])      # decided once per kind of request (auto_memo.py)
    b = get_backend(backend)
    why = b.unsupported(req)
    if why is None and req.q.is_meta and backend in ("tiled", "sparse") and \
            any(isinstance(p, DenseMask) for p in mask_parts(req.mask)):
        raise ValueError(f"backend {backend!r} cannot run on meta tensors with a dense (tensor) mask: it reads the "
                         "mask's values to plan its tiles, and meta tensors have none; use backend='auto' or "
                         "'reference' to get the output's shape")
    if why is not None:
        can = [c.name for c, w in candidates(req) if c.unsupported(req) is None]
        raise ValueError(f"backend {backend!r} cannot compute this request: {why}. Backends that can: {can}")
    return b


def attention(q: Tensor, k: Tensor, v: Tensor, *, mask=None, causal: bool = False, bias=None,
              scale: Optional[float] = None, dropout_p: float = 0.0, backend: str = "auto",
              return_weights: bool = False, softcap: Optional[float] = None):
    """Scaled dot-product attention: softmax(scale * q k^T + bias, masked) v.

    Args:
        q: (B, H, L, D) queries; k: (B, Hkv, S, D) keys; v: (B, Hkv, S, Dv) values. H % Hkv == 0
            (MHA, GQA, MQA); query head h uses kv head h // (H // Hkv).
        mask: bool tensor broadcastable to (B, H, L, S), True = may attend, or an ``attnlab.masks``
            mask (causal, padding, window, documents, dense, combined with ``&``).
        causal: add a bottom-right aligned causal mask (query i sees keys j <= i + S - L).
        bias: additive float tensor broadcastable to (B, H, L, S) (may require grad) or a
            ``StructuredBias`` computed per tile.
        scale: multiplies q k^T; default 1 / sqrt(D).
        dropout_p: probability of dropping a weight (pass 0 at inference).
        backend: "auto" or a name from ``available_backends()``; "auto" inside ``with use_backend(name)``
            means that scope's backend.
        return_weights: also return the softmax weights (B, H, L, S) (before dropout).
        softcap: cap the scores as softcap * tanh(scale * q k^T / softcap) (Gemma 2) before the
            bias and the mask are applied; None = no capping. Not on sdpa, linear or favor.
    Returns:
        out (B, H, L, Dv) in q's dtype, or (out, weights). Rows with nothing to attend to are 0.
    Example:
        q, k, v = (torch.randn(2, 8, 128, 64) for _ in range(3))
        out = attention(q, k, v, causal=True)                      # (2, 8, 128, 64)
        out, w = attention(q, k, v, mask=masks.window(16, 0), return_weights=True)
    """
    if backend == "auto":
        backend = current_backend()                      # use_backend's choice, if a scope made one
    causal_mask = type(mask) is CausalMask                # masks.causal(), as nn modules pass it
    if (backend == "auto" and (mask is None or causal_mask) and bias is None and softcap is None
            and return_weights is False and type(dropout_p) in (float, int) and dropout_p == 0
            and type(causal) is bool):
        plain = _plain_small(q, k, v, causal or causal_mask, scale)
        if plain is not None:            # auto's own pick, called as its backend calls it, with no request
            name, is_causal, scale, gqa = plain
            if name == "native":         # masks.causal() is one shared object: its plans are kept (mask_plan.py)
                return native_forward(q, k, v, mask=causal_mask_of() if is_causal else None, scale=scale)[0]
            if gqa:
                return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=True)
            return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)
    req = make_request(q, k, v, mask=mask, causal=causal, bias=bias, scale=scale, dropout_p=dropout_p,
                       return_weights=return_weights, softcap=softcap)
    chosen = choose_backend(req, backend)
    L, S = req.shape.L, req.shape.S
    seed = new_seed() if req.dropout_p > 0.0 else None
    fn = chosen.fn
    if L == 0 or S == 0:
        fn = reference_attention     # empty output, or zeros: exact and trivially cheap
    return fn(req.q, req.k, req.v, mask=req.mask, bias=req.bias, scale=req.scale, dropout_p=req.dropout_p,
              dropout_seed=seed, return_weights=req.return_weights, softcap=req.softcap)


def explain(q: Tensor, k: Tensor, v: Tensor, **kwargs) -> str:
    """Which backend ``attention(q, k, v, **kwargs)`` would run, and why not the others.

    With ``backend="NAME"`` the first answer is about NAME (it runs, or why it cannot); what
    auto would pick follows.

    Example:
        why = explain(q, k, v, mask=masks.window(128, 128))   # 'auto -> tiled: ...'
        why = explain(q, k, v, backend="reference")           # 'reference (named) -> runs: ...'
    """
    named = kwargs.pop("backend", "auto")
    scoped = named == "auto" and current_backend() != "auto"
    named = current_backend() if named == "auto" else named
    req = make_request(q, k, v, **kwargs)
    name, reason = auto_rule.pick(req)
    B, H, Hkv, L, S, D, Dv = req.shape
    lines = [f"request: B={B} H={H} Hkv={Hkv} L={L} S={S} D={D} Dv={Dv} dtype={q.dtype} "
             f"mask={req.mask!r} bias={'none' if req.bias is None else type(req.bias).__name__} "
             f"dropout_p={req.dropout_p}" + (f" softcap={req.softcap}" if req.softcap is not None else "")]
    if named != "auto":
        b = get_backend(named)
        cannot = b.unsupported(req)
        how = "use_backend scope" if scoped else "named"
        lines.append(f"{named} ({how}) -> " + (f"cannot compute this request: {cannot}" if cannot else
                                               f"runs: {b.summary}" + ("" if b.exact else " (approximate)")))
    lines.append(f"auto -> {name}: {reason}")
    lines.append(rule_source(reason))
    for b, why in candidates(req):
        if b.name == name:
            continue
        if why is None:
            why = "exact, but slower for this request" + (
                (" (SDPA computes every pair, and needs the dense mask/bias)" if req.mask is not None or
                 req.bias is not None else " (its math path here materializes the (B, H, L, S) scores)")
                if b.name == "sdpa" else
                " (materializes the (B, H, L, S) scores)" if b.name == "reference" else
                " (picked only for scattered block layouts from n = 8192, a rule from an unrecorded measurement)"
                if b.name == "sparse" else
                " (auto prefers it only on CUDA with a mask or bias; rule not yet measured on a GPU)"
                if b.name == "triton" else "")
        lines.append(f"  not {b.name}: {why}")
    return "\n".join(lines)
