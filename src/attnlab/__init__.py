"""attnlab: self-attention, exact and tested, fast on the hardware at hand, and visible.

    import attnlab as al
    out = al.attention(q, k, v, causal=True)          # q: (B, H, L, D)
    why = al.explain(q, k, v, mask=al.masks.window(128, 128))   # which backend, and why
    with al.use_backend("native"): ...                 # every call left on "auto" runs the compiled kernel
    mha = al.nn.AttentionLayer(al.nn.AttentionConfig(d_model=64, n_heads=4, positional="rope"))
"""
from __future__ import annotations

import importlib

from .functional import (FunctionBias, StructuredBias, attention, available_backends, explain, masks,
                         use_backend)

__version__ = "0.1.0"
__all__ = ["attention", "explain", "available_backends", "use_backend", "masks", "StructuredBias", "FunctionBias",
           "nn", "positional", "models"]

_SUBPACKAGES = ("nn", "positional", "models")


def __getattr__(name: str):
    # Modules and encodings load on first use: `import attnlab` stays as light as the kernels.
    if name in _SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'attnlab' has no attribute {name!r}")
