"""Attention kernels. Every backend takes and returns (B, H, L, D) tensors.

Shape legend
    B    batch                 L   query length
    H    query heads           S   key/value length
    Hkv  key/value heads       D   head dim (Dv: value head dim)
         (H % Hkv == 0: MHA if equal, MQA if Hkv == 1, else GQA)

mask: bool, True = may attend, broadcastable to (B, H, L, S), or a structured mask from
``attnlab.functional.masks``. causal: bottom-right aligned (query i sees keys j <= i + S - L),
so KV-cache decoding (L < S) needs no special case. Rows with nothing to attend to return 0.
Softmax accumulates in float32 (float64 for float64 inputs); outputs come back in q's dtype.
"""
from . import masks
from .api import attention, choose_backend, explain
from .backends.favor import FavorFeatures, favor_attention
from .backends.linear import EluFeatures, linear_attention
from .backends.linear_recurrent import LinearAttentionState, absorb, step
from .backends.sparse import SparseStats, sparse_attention
from .bias import FunctionBias, StructuredBias
from .registry import available_backends, get_backend, register_backend
from .scope import current_backend, use_backend
from .ring import ring_attention  # context parallel over torch.distributed; shard/unshard in .ring_layout

__all__ = ["attention", "explain", "available_backends", "get_backend", "register_backend",
           "choose_backend", "use_backend", "current_backend", "masks", "StructuredBias", "FunctionBias",
           # approximate (linear) attention and its recurrent form; the sparse kernel with its counter
           "linear_attention", "favor_attention", "FavorFeatures", "EluFeatures",
           "LinearAttentionState", "absorb", "step", "sparse_attention", "SparseStats",
           # context parallel attention over torch.distributed
           "ring_attention"]
