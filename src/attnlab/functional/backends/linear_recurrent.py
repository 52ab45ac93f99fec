"""Linear attention as an RNN: O(1) work and memory per generated token (Katharopoulos et al. 2020, sec. 3.4).

The causal form of linear attention keeps two running sums over the keys seen so far,

    S_t = S_{t-1} + phi(k_t) v_t^T      (B, Hkv, m, Dv)        z_t = z_{t-1} + phi(k_t)     (B, Hkv, m)
    o_t = S_t^T phi(q_t) / (phi(q_t)·z_t + eps)          (a normalizer of 0 gives 0)

so decoding one token costs O(m Dv) whatever the context length, and gives what the parallel
causal form (``linear_attention(..., causal=True)``) gives at that position. For FAVOR+ the sums
are kept scaled by exp(-c) with c the running max of the keys' log-features (``log_scale``); a
larger new key rescales the old sums, like the running max of online softmax, so the state never
overflows and never depends on keys not yet seen.

Example::

    state = LinearAttentionState.zeros(batch=1, kv_heads=8, head_dim=64, value_dim=64)
    state = absorb(state, k_prompt, v_prompt)              # the prompt's keys, (1, 8, P, 64)
    for t in range(steps):
        out_t, state = step(state, q_t, k_t, v_t)          # q_t (1, 8, 1, 64) -> out_t (1, 8, 1, 64)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

import torch
from torch import Tensor

from .linear import FeatureMap, check_feature_map, normalize, query_features
from .reference import accum_dtype

__all__ = ["LinearAttentionState", "absorb", "read", "step"]


@dataclass(frozen=True)
class LinearAttentionState:
    """The constant-size state of causal linear attention after ``n_keys`` keys.

    S: (B, Hkv, m, Dv) sum of phi(k_j) v_j^T, times exp(-log_scale);
    z: (B, Hkv, m) sum of phi(k_j), times exp(-log_scale);
    log_scale: (B, Hkv) the stabilizer (FAVOR+'s running key max; 0 for elu + 1);
    features: the feature map; scale: the features see sqrt(scale) q and sqrt(scale) k.
    """
    S: Tensor
    z: Tensor
    log_scale: Tensor
    features: FeatureMap
    scale: float
    n_keys: int = 0

    @classmethod
    def zeros(cls, batch: int, kv_heads: int, head_dim: int, value_dim: int, *,
              features: Optional[FeatureMap] = None, scale: Optional[float] = None,
              dtype: torch.dtype = torch.float32, device=None) -> "LinearAttentionState":
        """The empty state (no keys yet). ``dtype`` is the inputs' dtype; the sums use float32 or wider.

        Example:
            state = LinearAttentionState.zeros(2, 4, 64, 64, features=FavorFeatures(64, 256))
        """
        fmap = check_feature_map(features, head_dim)
        scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
        if not math.isfinite(scale) or scale < 0:
            raise ValueError(f"scale={scale}: must be a finite number >= 0 (features see sqrt(scale) * q)")
        m, cdt = fmap.n_features(head_dim), accum_dtype(dtype)
        init = float("-inf") if fmap.log_space else 0.0
        return cls(S=torch.zeros(batch, kv_heads, m, value_dim, dtype=cdt, device=device),
                   z=torch.zeros(batch, kv_heads, m, dtype=cdt, device=device),
                   log_scale=torch.full((batch, kv_heads), init, dtype=cdt, device=device),
                   features=fmap, scale=scale)


def _check(state: LinearAttentionState, name: str, t: Tensor, heads: Optional[int], dim: Optional[int],
           one_token: bool) -> None:
    """Raise if t is not (B, heads, T, dim) for this state; dim None = a q/k head dim the features accept."""
    if not isinstance(t, Tensor) or t.dim() != 4:
        raise ValueError(f"{name} must be a 4-D (B, heads, tokens, dim) tensor, got "
                         f"{tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__}")
    B, _, m, _ = state.S.shape
    if dim is None and state.features.n_features(t.shape[3]) != m:     # n_features raises on a wrong D
        raise ValueError(f"{name} has head dim {t.shape[3]}, which gives {state.features.n_features(t.shape[3])} "
                         f"features, but this state holds {m}")
    want_dim = t.shape[3] if dim is None else dim
    if t.shape[0] != B or (heads is not None and t.shape[1] != heads) or t.shape[3] != want_dim:
        want = f"({B}, {heads if heads is not None else 'H'}, {'1' if one_token else 'T'}, {want_dim})"
        raise ValueError(f"{name} has shape {tuple(t.shape)}; this state expects {want}")
    if one_token and t.shape[2] != 1:
        raise ValueError(f"{name} has {t.shape[2]} tokens; step() takes one token (length 1): "
                         f"use absorb() for a prompt, or linear_attention(causal=True) for a whole sequence")


def absorb(state: LinearAttentionState, k: Tensor, v: Tensor) -> LinearAttentionState:
    """Add keys k (B, Hkv, T, D) and values v (B, Hkv, T, Dv) to the sums; returns the new state."""
    Hkv, _, Dv = state.S.shape[1:]
    _check(state, "k", k, Hkv, None, False)
    _check(state, "v", v, Hkv, Dv, False)
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k has {k.shape[2]} tokens but v has {v.shape[2]}: one value per key")
    if k.shape[2] == 0:
        return state
    f = state.features.features_(k.to(state.S.dtype) * math.sqrt(state.scale))   # (B, Hkv, T, m): phi or log phi
    v = v.to(state.S.dtype)
    if not state.features.log_space:
        return replace(state, S=state.S + f.transpose(-2, -1) @ v, z=state.z + f.sum(-2),
                       n_keys=state.n_keys + k.shape[2])
    c_new = torch.maximum(state.log_scale, f.amax(dim=(-2, -1)))                 # (B, Hkv) running max
    old = torch.exp(state.log_scale - c_new)                                      # rescales the old sums; 0 when empty
    phi = torch.exp(f - c_new[..., None, None])                                   # (B, Hkv, T, m)
    return replace(state, S=state.S * old[..., None, None] + phi.transpose(-2, -1) @ v,
                   z=state.z * old[..., None] + phi.sum(-2), log_scale=c_new, n_keys=state.n_keys + k.shape[2])


def read(state: LinearAttentionState, q: Tensor) -> Tensor:
    """Every query of q (B, H, T, D) against all absorbed keys: (B, H, T, Dv) in q's dtype."""
    _check(state, "q", q, None, None, False)
    Hkv, H = state.S.shape[1], q.shape[1]
    if H % Hkv != 0:
        raise ValueError(f"q has {H} heads but the state has {Hkv} kv heads: q heads must be a multiple")
    x = (q.to(state.S.dtype) * math.sqrt(state.scale)).unflatten(1, (Hkv, H // Hkv))
    fq = query_features(state.features, x)                                        # (B, Hkv, G, T, m)
    num = fq @ state.S.unsqueeze(2)                                               # (B, Hkv, G, T, Dv)
    den = (fq @ state.z[:, :, None, :, None])[..., 0]                             # (B, Hkv, G, T)
    return normalize(num, den, state.features.eps).flatten(1, 2).to(q.dtype)


def step(state: LinearAttentionState, q_t: Tensor, k_t: Tensor, v_t: Tensor) -> tuple[Tensor, LinearAttentionState]:
    """One decoding step: absorb (k_t, v_t), then answer q_t; O(m Dv) per head.

    Args:
        state: the state after the previous tokens; q_t: (B, H, 1, D); k_t: (B, Hkv, 1, D);
            v_t: (B, Hkv, 1, Dv).
    Returns:
        (out_t (B, H, 1, Dv) in q_t's dtype, the new state). The old state is not modified.
    Example:
        out_t, state = step(state, q[:, :, t:t+1], k[:, :, t:t+1], v[:, :, t:t+1])
    """
    _check(state, "q_t", q_t, None, None, True)
    _check(state, "k_t", k_t, state.S.shape[1], q_t.shape[3], True)
    state = absorb(state, k_t, v_t)
    return read(state, q_t), state
