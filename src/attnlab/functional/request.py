"""Validation of attention arguments, once, before any backend runs.

Every mistake is caught here with a message that names the values and the fix, so no backend
ever fails deep inside a matmul. The result is an ``AttentionRequest``: the same arguments in
one normalized form (bool masks and ``causal=True`` folded into one structured ``Mask``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Optional, Union

import torch
from torch import Tensor

from . import masks as M
from .bias import StructuredBias

__all__ = ["AttentionRequest", "AttentionShape", "make_request"]

Bias = Union[Tensor, StructuredBias]


class AttentionShape(NamedTuple):
    """The sizes of one attention call; read them by name (``req.shape.L``) or unpack all seven."""
    B: int                         # batch
    H: int                         # query heads
    Hkv: int                       # key/value heads (H % Hkv == 0)
    L: int                         # query length
    S: int                         # key/value length
    D: int                         # q/k head dim
    Dv: int                        # v head dim


@dataclass
class AttentionRequest:
    q: Tensor                      # (B, H, L, D)
    k: Tensor                      # (B, Hkv, S, D)
    v: Tensor                      # (B, Hkv, S, Dv)
    mask: Optional[M.Mask]         # everything that restricts pairs, causal included; None = all pairs
    bias: Optional[Bias]           # additive, (B|1, H|1, L|1, S|1) tensor or structured
    scale: float
    dropout_p: float
    return_weights: bool
    softcap: Optional[float] = None  # scores become softcap * tanh(scores / softcap) before bias and mask

    @property
    def shape(self) -> AttentionShape:
        """(B, H, Hkv, L, S, D, Dv), by name: ``req.shape.S``."""
        B, H, L, D = self.q.shape
        return AttentionShape(B, H, self.k.shape[1], L, self.k.shape[2], D, self.v.shape[3])

    @property
    def is_causal_only(self) -> bool:
        return isinstance(self.mask, M.CausalMask)

    @property
    def needs_grad(self) -> bool:
        """Whether autograd will want gradients: grad mode on and q, k, v or the bias (a structured bias's
        parameters) requiring them. Short-circuits: auto asks on every call (functional/auto_memo.py)."""
        if not torch.is_grad_enabled():
            return False
        b = self.bias
        return (self.q.requires_grad or self.k.requires_grad or self.v.requires_grad
                or (isinstance(b, Tensor) and b.requires_grad)
                or (isinstance(b, StructuredBias) and any(p.requires_grad for p in b.params)))


def _check_tensor(name: str, t) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 4:
        layout = "(B, H, L, D)" if name == "q" else "(B, Hkv, S, D)"
        raise ValueError(f"{name} has {t.dim()} dims {tuple(t.shape)}; attention takes 4-D {layout} tensors "
                         f"(use einops.rearrange(x, 'b l (h d) -> b h l d', h=...) to split heads)")
    if not t.dtype.is_floating_point:
        raise TypeError(f"{name} has dtype {t.dtype}; attention needs floating-point inputs")
    return t


def _check_shapes(q: Tensor, k: Tensor, v: Tensor) -> None:
    B, H, L, D = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"batch sizes differ: q {B}, k {k.shape[0]}, v {v.shape[0]}")
    Hkv = k.shape[1]
    if v.shape[1] != Hkv:
        raise ValueError(f"k has {Hkv} heads and v has {v.shape[1]}: k and v must have the same heads")
    if Hkv == 0 or H % Hkv != 0:
        raise ValueError(f"k has {Hkv} heads, q has {H}: q heads must be a multiple of k heads (GQA/MQA)")
    if k.shape[3] != D:
        raise ValueError(f"q head dim is {D} but k head dim is {k.shape[3]}: q and k must share D "
                         f"(v may differ)")
    if D == 0 or v.shape[3] == 0:
        # zero-width heads have no scores to speak of, and the tiled kernels cannot reshape them (issue #26)
        raise ValueError(f"q has head dim D={D} and v has Dv={v.shape[3]}; attention needs D >= 1 and Dv >= 1 "
                         f"(split the model width into heads of at least one channel)")
    if v.shape[2] != k.shape[2]:
        raise ValueError(f"k has length S={k.shape[2]} but v has {v.shape[2]}: one value per key")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"dtypes differ: q {q.dtype}, k {k.dtype}, v {v.dtype}; cast them to one dtype")
    if not (q.device == k.device == v.device):
        raise ValueError(f"devices differ: q {q.device}, k {k.device}, v {v.device}")


def _normalize_mask(mask, causal: bool, B: int, H: int, L: int, S: int) -> Optional[M.Mask]:
    if mask is not None and not isinstance(mask, M.Mask):
        if isinstance(mask, Tensor) and mask.dtype == torch.bool:
            mask = M.dense(mask)
        elif isinstance(mask, Tensor):
            raise TypeError(f"mask has dtype {mask.dtype}; masks are bool (True = may attend). "
                            f"For an additive float mask use bias=")
        else:
            raise TypeError(f"mask must be a bool tensor or an attnlab.masks mask, got {type(mask).__name__}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    # Bottom-right causal with one query row (a decoding step, S >= 1) allows every key: dropping
    # it keeps the request plain, so "auto" takes SDPA's unmasked path (measured 58 -> 26 us per call).
    if causal and not (L == 1 and S >= 1):
        mask = M.causal() if mask is None else M.causal() & mask
    if mask is not None:
        mask.check(B, H, L, S)
    return mask


def _check_bias(bias, q: Tensor, B: int, H: int, L: int, S: int) -> Optional[Bias]:
    if bias is None:
        return None
    if isinstance(bias, StructuredBias):
        bias.check(B, H, L, S)
        return bias
    if not isinstance(bias, Tensor):
        raise TypeError(f"bias must be a float tensor or a StructuredBias, got {type(bias).__name__}")
    if not bias.dtype.is_floating_point:
        raise TypeError(f"bias has dtype {bias.dtype}; it is added to the scores, so it must be floating point "
                        f"(a bool mask goes in mask=)")
    allowed = {q.dtype, torch.float32} if q.dtype in (torch.bfloat16, torch.float16) else {q.dtype}
    if bias.dtype not in allowed:
        raise TypeError(f"bias has dtype {bias.dtype} but q has {q.dtype}: use "
                        f"{' or '.join(sorted(str(d) for d in allowed))}")
    if bias.dim() > 4:
        raise ValueError(f"bias has {bias.dim()} dims {tuple(bias.shape)}; it must broadcast to (B, H, L, S)")
    full = (1,) * (4 - bias.dim()) + tuple(bias.shape)
    want = (B, H, L, S)
    if any(b not in (1, w) for b, w in zip(full, want)):
        raise ValueError(f"bias of shape {tuple(bias.shape)} does not broadcast to (B, H, L, S) = {want}: "
                         f"each dim must equal that size or 1")
    if bias.device != q.device:
        raise ValueError(f"bias is on {bias.device} but q is on {q.device}")
    return bias.reshape(full)


def make_request(q, k, v, *, mask=None, causal=False, bias=None, scale=None, dropout_p=0.0,
                 return_weights=False, softcap=None) -> AttentionRequest:
    """Validate the arguments of ``attention`` and fold them into one ``AttentionRequest``."""
    q, k, v = _check_tensor("q", q), _check_tensor("k", k), _check_tensor("v", v)
    _check_shapes(q, k, v)
    B, H, L, D = q.shape
    S = k.shape[2]
    mask = _normalize_mask(mask, causal, B, H, L, S)
    if isinstance(mask, M.Mask):
        mask = mask.to(q.device)
    bias = _check_bias(bias, q, B, H, L, S)
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise TypeError(f"scale must be a finite number or None (= 1/sqrt(D)), got {scale!r}")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"dropout_p must be a float in [0, 1), got {dropout_p!r}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p={dropout_p} is outside [0, 1): it is the probability of dropping a weight")
    if not isinstance(return_weights, bool):
        raise TypeError(f"return_weights must be a bool, got {type(return_weights).__name__}")
    if softcap is not None and (isinstance(softcap, bool) or not isinstance(softcap, (int, float))
                                or not math.isfinite(softcap) or softcap <= 0):
        raise ValueError(f"softcap={softcap!r}: must be a finite number > 0 (scores become "
                         f"softcap * tanh(scores / softcap), as in Gemma 2) or None for no capping")
    return AttentionRequest(q, k, v, mask, bias, float(scale), float(dropout_p), return_weights,
                            None if softcap is None else float(softcap))
