"""attnlab: self-attention, exact and tested, fast on the hardware at hand, and visible.

    import attnlab as al
    out = al.attention(q, k, v, causal=True)          # q: (B, H, L, D)
    why = al.explain(q, k, v, mask=al.masks.window(128, 128))   # which backend, and why
"""
from .functional import FunctionBias, StructuredBias, attention, available_backends, explain, masks

__version__ = "0.1.0"
__all__ = ["attention", "explain", "available_backends", "masks", "StructuredBias", "FunctionBias"]
