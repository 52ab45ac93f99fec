"""Hugging Face transformers models on attnlab kernels: ``attn_implementation="attnlab"``.

``register()`` adds two functions to transformers' registries (transformers is imported only
then):

* an **attention function** (``transformers.AttentionInterface``): every attention layer of a
  model calls it with (B, H, L, D) queries and (B, Hkv, S, D) keys/values; it runs
  ``attnlab.attention`` (GQA without repeating the keys) and returns (B, L, H, Dv);
* a **mask function** (``transformers.masking_utils.AttentionMaskInterface``): without one,
  transformers hands a custom attention function *no mask at all* (padding and sliding windows
  silently ignored). Ours turns HF's mask request into attnlab *structured* masks (causal,
  sliding window, left/right padding, packed sequences from ``position_ids``), so the tiled
  kernels skip empty tiles; whatever it cannot read exactly becomes a dense mask
  (``hf_masks.py``).

Keyword arguments transformers passes to attention functions: ``scaling``, ``dropout``,
``is_causal``, ``sliding_window`` (already in the mask), ``position_bias`` (T5-style additive
bias), ``output_attentions`` (weights returned), ``cu_seq_lens_q/k`` (packed sequences, one
row), ``softcap`` (passed on when ``attnlab.attention`` takes it) are supported; ``s_aux`` /
``sinks`` (attention sinks), ``head_mask`` and any keyword not listed here raise a ValueError
naming it.

Example::

    from attnlab.integrations.transformers import register
    register()                                    # once; idempotent
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="attnlab")
    out = model.generate(ids, attention_mask=am)  # left-padded batches, KV cache, windows
"""
from __future__ import annotations

import functools
import inspect
from typing import Optional

import torch
from torch import Tensor

from ..functional import attention, available_backends, masks
from .hf_masks import HFMask, convert

__all__ = ["register", "implementation_name", "attention_forward", "mask_function", "HFMask"]

# Soft-capping arrived in attention() with issue #17; older versions refuse it by name.
_TAKES_SOFTCAP = "softcap" in inspect.signature(attention).parameters
# Keywords transformers passes through every layer that do not change attention's result here:
# the mask already carries position_ids' packing and the window; the rest are bookkeeping.
_NO_EFFECT = {"position_ids", "sliding_window", "max_length_q", "max_length_k", "num_items_in_batch",
              "output_hidden_states", "output_router_logits", "use_cache", "return_dict", "cache_position",
              "layer_idx", "kwargs"}
# Keywords of features attnlab does not compute; refused when they are set (None / False pass).
_REFUSED = {
    "s_aux": "attention sinks (an extra per-head logit in the softmax) are not supported by attnlab",
    "sinks": "attention sinks (an extra per-head logit in the softmax) are not supported by attnlab",
    "head_mask": "per-head output masks are not supported by attnlab; prune the heads instead",
    "seq_idx": "seq_idx (state-space model sequence ids) has no meaning for attention",
}


def _mask_of(attention_mask, query: Tensor, key: Tensor, is_causal: bool, sliding_window):
    """HF's ``attention_mask`` argument -> (attnlab mask or None, additive bias or None, keys to keep)."""
    L, S = query.shape[2], key.shape[2]
    if isinstance(attention_mask, HFMask):
        return attention_mask.mask, None, attention_mask.keep
    if attention_mask is None:
        # No mask function ran (paged caches, or a mask function that skipped): transformers' sdpa
        # rule, is_causal only for L > 1 and aligned top-left, i.e. on the first L keys.
        if not (is_causal and L > 1):
            return None, None, None
        m = masks.causal() if sliding_window is None else masks.window(sliding_window - 1, 0)
        return m, None, min(L, S)
    if isinstance(attention_mask, Tensor) and attention_mask.dim() == 4:
        if attention_mask.dtype == torch.bool:
            return attention_mask, None, None                # (B|1, 1|H, L, S), True = may attend
        if attention_mask.dtype.is_floating_point:
            return None, attention_mask.to(query.dtype), None  # HF's additive 0 / finfo.min mask
    raise ValueError(f"attnlab attention got attention_mask of type {type(attention_mask).__name__}"
                     f"{'' if not isinstance(attention_mask, Tensor) else f' shape {tuple(attention_mask.shape)}'}"
                     f"{'' if not isinstance(attention_mask, Tensor) else f' dtype {attention_mask.dtype}'}"
                     f": expected the attnlab mask function's output (register() registers it), None, or a "
                     f"4-D bool / float mask (B, 1, L, S)")


def _documents_from_cu(cu_q: Tensor, cu_k: Tensor, B: int, L: int, S: int) -> masks.Mask:
    """flash-attention's packed layout (one row, sequence starts ``cu_seq_lens``) as document ids."""
    if B != 1 or L != S or not torch.equal(cu_q.cpu(), cu_k.cpu()) or int(cu_q[-1]) != S:
        raise ValueError(f"cu_seq_lens_q={cu_q.tolist()} / cu_seq_lens_k={cu_k.tolist()} with B={B}, L={L}, S={S}: "
                         f"attnlab reads cu_seq_lens only for one packed row of self-attention (B=1, equal "
                         f"query and key boundaries ending at L = S); pass position_ids instead")
    ids = torch.searchsorted(cu_q.cpu().long(), torch.arange(S), right=True) - 1       # (S,)
    return masks.documents(ids)


def attention_forward(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask,
                      dropout: float = 0.0, scaling: Optional[float] = None, is_causal: Optional[bool] = None,
                      *, backend: str = "auto", **kwargs) -> tuple[Tensor, Optional[Tensor]]:
    """transformers' attention-function signature over ``attnlab.attention``.

    Args:
        module: the calling attention layer (read for ``is_causal`` when no mask came).
        query: (B, H, L, D); key: (B, Hkv, S, D); value: (B, Hkv, S, Dv); H % Hkv == 0.
        attention_mask: ``HFMask`` from ``mask_function``, None, or a 4-D bool (True = attend)
            or additive float mask.
        dropout: attention dropout probability (0 in eval); scaling: multiplies q k^T.
        backend: attnlab backend ("auto" or a name from ``available_backends()``).
        **kwargs: see the module docstring.
    Returns:
        (out (B, L, H, Dv), weights (B, H, L, S) if ``output_attentions`` else None).
    Example:
        out, _ = attention_forward(layer, q, k, v, HFMask(masks.causal()), scaling=0.125)
    """
    for name, why in _REFUSED.items():
        if kwargs.get(name) is not None:
            raise ValueError(f"attnlab attention: keyword {name}= is set; {why}. Use another "
                             f"attn_implementation for this model (e.g. 'eager')")
    known = _NO_EFFECT | set(_REFUSED) | {"softcap", "position_bias", "output_attentions", "cu_seq_lens_q",
                                           "cu_seq_lens_k"}
    unknown = sorted(k for k, v in kwargs.items() if k not in known and v is not None and v is not False)
    if unknown:
        raise ValueError(f"attnlab attention: unsupported keyword(s) {unknown} from the model; supported: "
                         f"scaling, dropout, is_causal, softcap, position_bias, output_attentions, "
                         f"cu_seq_lens_q/k, and ignored bookkeeping {sorted(_NO_EFFECT)}")
    B, H, L, _ = query.shape
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    mask, bias, keep = _mask_of(attention_mask, query, key, bool(causal), kwargs.get("sliding_window"))
    S_all = key.shape[2]
    if keep is not None and keep < S_all:            # keys no query can reach (StaticCache tail)
        key, value = key[:, :, :keep], value[:, :, :keep]                            # (B, Hkv, keep, D)
    S = key.shape[2]
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None or cu_k is not None:
        docs = _documents_from_cu(cu_q if cu_q is not None else cu_k, cu_k if cu_k is not None else cu_q, B, L, S)
        mask = docs if mask is None else (masks.dense(mask) if isinstance(mask, Tensor) else mask) & docs
    position_bias = kwargs.get("position_bias")
    if position_bias is not None:
        position_bias = position_bias[..., :S].to(query.dtype)                      # (B|1, H, L, S)
        bias = position_bias if bias is None else bias + position_bias
    extra = {}
    if kwargs.get("softcap") is not None:
        if not _TAKES_SOFTCAP:
            raise ValueError(f"attnlab attention: softcap={kwargs['softcap']} (logit soft-capping) is not supported "
                             f"by this attnlab version; use attn_implementation='eager' for this model")
        extra["softcap"] = kwargs["softcap"]
    want_weights = bool(kwargs.get("output_attentions"))
    res = attention(query, key, value, mask=mask, bias=bias, scale=scaling, dropout_p=float(dropout),
                    backend=backend, return_weights=want_weights, **extra)
    out, weights = res if want_weights else (res, None)                             # (B, H, L, Dv)
    if weights is not None and S < S_all:            # the cut-off keys had weight 0
        weights = torch.nn.functional.pad(weights, (0, S_all - S))                     # (B, H, L, S_all)
    return out.transpose(1, 2).contiguous(), weights                               # (B, L, H, Dv)


def mask_function(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset: int = 0,
                  mask_function=None, attention_mask: Optional[Tensor] = None, **kwargs) -> HFMask:
    """transformers' mask-interface signature: HF's mask request -> ``HFMask`` (see ``hf_masks.convert``)."""
    return convert(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask, **kwargs)


# Names transformers reads as its own, whatever is registered under them (transformers 5.24):
# modeling_utils.get_correct_attn_implementation runs its SDPA / flex checks on any name *containing*
# "sdpa" / "flex_attention" (Gemma2 then refuses to load "attnlab_sdpa", issue #26);
# utils.generic.is_flash_attention_requested treats any name containing "flash" as flash attention;
# "paged|x" is a prefix it strips, "org/repo" a Hub kernel (integrations.hub_kernels.is_kernel).
_MISREAD = [
    ("sdpa", "transformers treats every name containing 'sdpa' as its own SDPA"),
    ("flash", "transformers treats every name containing 'flash' as a flash-attention kernel"),
    ("flex_attention", "transformers treats every name containing 'flex_attention' as its FlexAttention"),
    ("|", "transformers reads 'prefix|name' as a prefixed implementation ('paged|...')"),
    ("/", "transformers reads 'org/repo' as a kernel to download from the Hub"),
]


def _misread(name: str) -> Optional[str]:
    """Why transformers would take ``name`` for one of its own implementations, or None."""
    if name == "eager":
        return "'eager' is transformers' own implementation"
    return next((why for part, why in _MISREAD if part in name), None)


def implementation_name(backend: str = "auto") -> str:
    """The name ``register(name, backend)`` is given for one backend: 'attnlab' for auto, else
    'attnlab_<backend>', with 'sdpa' spelled 'torchsdp' (transformers claims every name holding 'sdpa')."""
    return "attnlab" if backend == "auto" else f"attnlab_{backend.replace('sdpa', 'torchsdp')}"


def register(name: str = "attnlab", backend: str = "auto") -> str:
    """Register attnlab under ``attn_implementation=name`` (attention and mask functions); idempotent.

    Args:
        name: the implementation name models are built with.
        backend: the attnlab backend every attention runs on ("auto" picks per call).
    Returns:
        name.
    Example:
        register()
        model = transformers.LlamaForCausalLM(cfg)     # cfg._attn_implementation = "attnlab"
        model = transformers.AutoModel.from_config(cfg, attn_implementation="attnlab")
    """
    if backend != "auto" and backend not in available_backends():
        raise ValueError(f"unknown attnlab backend {backend!r}; choose 'auto' or one of {available_backends()}")
    if not isinstance(name, str) or not name:
        raise ValueError(f"name={name!r}: pick a new implementation name (a non-empty str, e.g. 'attnlab')")
    why = _misread(name)
    if why is not None:
        raise ValueError(f"name={name!r}: pick a new implementation name, e.g. {implementation_name(backend)!r} "
                         f"(implementation_name(backend) gives one per backend); {why}")
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as e:
        raise ImportError("attnlab.integrations.transformers needs the transformers package: "
                          "pip install transformers") from e
    AttentionInterface.register(name, functools.partial(attention_forward, backend=backend))
    AttentionMaskInterface.register(name, mask_function)
    return name
