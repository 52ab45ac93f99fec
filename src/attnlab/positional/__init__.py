"""Positional encodings: pure functions plus thin modules, one scheme per file.

Three ways a scheme reaches attention, named by the module's ``kind``:
- ``"absolute"``: a vector per position added to the inputs (sinusoidal, learned);
- ``"rotary"``: q and k rotated by their positions (RoPE);
- ``"bias"`` / ``"relative"``: a structured additive bias evaluated per tile (ALiBi, T5, Shaw),
  never a (B, H, L, S) tensor on the tiled backend; Shaw may also add a value term.

Every scheme takes absolute positions, so a KV cache (new queries at past_len + i) needs no
special case. ``make_positional(name, ...)`` builds one by name for ``attnlab.nn``.

Example::

    pe = sinusoidal(128, 64)                                   # (128, 64)
    out = attention(q, k, v, causal=True, bias=ALiBi(8).bias())
"""
from __future__ import annotations

from typing import Callable

from torch import nn

from .absolute import (LearnedEncoding, LearnedEncoding2D, SinusoidalEncoding, max_abs_rotation_error,
                       sinusoidal, sinusoidal_2d)
from .alibi import ALiBi, AlibiBias, alibi_slopes
from .rope import RoPE
from .shaw import ShawKeyBias, ShawRelative
from .t5 import T5Bias, T5BucketBias, t5_bucket

__all__ = ["sinusoidal", "sinusoidal_2d", "SinusoidalEncoding", "LearnedEncoding", "LearnedEncoding2D",
           "RoPE", "ALiBi", "AlibiBias", "alibi_slopes", "T5Bias", "T5BucketBias", "t5_bucket",
           "ShawRelative", "ShawKeyBias", "max_abs_rotation_error", "POSITIONAL", "make_positional"]

for _cls, _kind in ((SinusoidalEncoding, "absolute"), (LearnedEncoding, "absolute"), (RoPE, "rotary")):
    _cls.kind = _kind

# name -> factory(d_model, n_heads, head_dim, causal, options) -> module with a ``kind``
POSITIONAL: dict[str, Callable[..., nn.Module]] = {
    "sinusoidal": lambda d, h, hd, causal, o: SinusoidalEncoding(d, base=o.get("base", 10000.0)),
    "learned": lambda d, h, hd, causal, o: LearnedEncoding(o.get("max_len", 2048), d),
    "rope": lambda d, h, hd, causal, o: RoPE(hd, base=o.get("base", 10000.0),
                                             interleaved=o.get("interleaved", True),
                                             rotary_dim=o.get("rotary_dim")),
    "alibi": lambda d, h, hd, causal, o: ALiBi(h),
    "t5": lambda d, h, hd, causal, o: T5Bias(h, bidirectional=not causal, num_buckets=o.get("num_buckets", 32),
                                             max_distance=o.get("max_distance", 128)),
    "shaw": lambda d, h, hd, causal, o: ShawRelative(hd, o.get("max_distance", 16), values=o.get("values", True)),
}


def make_positional(name: str, *, d_model: int, n_heads: int, head_dim: int, causal: bool,
                    options: dict | None = None) -> nn.Module:
    """Build the scheme ``name`` (one of POSITIONAL) for a layer of this shape."""
    if name not in POSITIONAL:
        raise ValueError(f"unknown positional scheme {name!r}; choose from {sorted(POSITIONAL)} or None")
    return POSITIONAL[name](d_model, n_heads, head_dim, causal, dict(options or {}))
