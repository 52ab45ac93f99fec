"""Hugging Face mask requests -> attnlab structured masks.

transformers builds a model's masks by calling the registered mask function with a *mask
function* (a closure over ``causal_mask_function``, ``sliding_window_overlay(w)``,
``packed_sequence_mask_function(ids)``, ... combined by ``and_masks``), the 2-D padding mask
``attention_mask`` (B, kv_offset + S) and the absolute positions of the first query
(``q_offset``) and key (``kv_offset``). ``convert`` reads that closure and returns an
``HFMask``: an attnlab mask plus how many keys to keep. Anything it cannot read exactly
(custom ``or``/``and`` overlays, chunked attention, vision token groups) becomes a dense mask
built by transformers' own ``sdpa_mask``, so the result is always HF's mask.

Positions: query row i sits at absolute position ``q_offset + i``, key column j at
``kv_offset + j``. HF's causal is ``kv <= q``; attnlab's is bottom-right (``j <= i + S - L``).
They agree when ``q_offset - kv_offset == S - L`` (no cache, DynamicCache, sliding-window
caches). A StaticCache has ``kv_offset = 0`` and S = the cache size: the keys past the last
query can never be attended, so ``keep`` cuts them off (as HF's sdpa path does) and the rest is
bottom-right aligned again.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from ..functional import masks

__all__ = ["HFMask", "convert"]


@dataclass
class HFMask:
    """What the attnlab mask function hands to the attention function.

    mask: attnlab mask for the first ``keep`` keys, or None (every key may be attended).
    keep: use only keys [0, keep) of the layer's key/value states; None = all of them.
    structured: False when the mask is a dense fallback (HF's mask could not be read exactly).
    """
    mask: Optional[masks.Mask]
    keep: Optional[int] = None
    structured: bool = True
    # generate() builds the masks ahead of the forward for compileable (static) caches and the
    # model then asks again with that object as its "2-D" mask; ndim = 4 tells HF it is prepared.
    ndim = 4


def _cells(fn: Callable) -> dict:
    """A closure's free variables by name ({} for plain functions)."""
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is None or not cells:
        return {}
    return {name: c.cell_contents for name, c in zip(code.co_freevars, cells)}


def _terms(fn: Callable, mu) -> Optional[list[tuple]]:
    """The ANDed constraints of an HF mask function, or None if one of them is not known.

    Terms (on absolute positions q, kv): ("causal",) kv <= q; ("left", w) kv > q - w;
    ("band", w) |q - kv| <= w; ("docs", ids (B, n)) same packed sequence; ("remapped", terms)
    terms evaluated on position_ids (exact inside one packed sequence only, so it needs a
    "docs" term beside it). The padding mask comes separately (``attention_mask``).
    """
    if fn is mu.causal_mask_function:
        return [("causal",)]
    if fn is mu.bidirectional_mask_function:
        return []
    owner = getattr(fn, "__qualname__", "").split(".<locals>.")[0]
    cells = _cells(fn)
    if owner == "and_masks" and "mask_functions" in cells:
        out: list[tuple] = []
        for part in cells["mask_functions"]:
            t = _terms(part, mu)
            if t is None:
                return None
            out += t
        return out
    if owner == "sliding_window_overlay" and isinstance(cells.get("sliding_window"), int):
        return [("left", cells["sliding_window"])]
    if owner == "sliding_window_bidirectional_overlay" and isinstance(cells.get("sliding_window"), int):
        return [("band", cells["sliding_window"])]
    if owner == "packed_sequence_mask_function" and isinstance(cells.get("packed_sequence_mask"), Tensor):
        return [("docs", cells["packed_sequence_mask"])]
    if owner == "remap_positions_for_packed_sequence" and "mask_function" in cells:
        inner = _terms(cells["mask_function"], mu)
        return None if inner is None else [("remapped", inner)]
    return None


def _padding(pm: Tensor) -> Optional[masks.Mask]:
    """A (B, S) bool padding mask (True = real key) as right/left ``masks.padding`` if it is one,
    else a (B, 1, 1, S) dense key mask; None if every key is real."""
    pm = pm.bool().cpu()
    if bool(pm.all()):
        return None
    B, S = pm.shape
    n = pm.sum(1)                                                        # (B,)
    j = torch.arange(S)[None, :]                                         # (1, S)
    if torch.equal(pm, j < n[:, None]):
        return masks.padding(n, side="right")
    if torch.equal(pm, j >= (S - n)[:, None]):
        return masks.padding(n, side="left")
    return masks.dense(pm[:, None, None, :])


def _structured(terms: list[tuple], pm: Optional[Tensor], L: int, S: int, d0: int) -> Optional[HFMask]:
    """Exact attnlab form of ``terms`` (+ padding ``pm`` (B, S)) with q - kv = i - j + d0, or None."""
    lo, hi = -math.inf, math.inf          # bounds on q - kv
    docs: list[Tensor] = []
    flat = []
    for t in terms:
        if t[0] == "remapped":            # exact inside one packed sequence: needs a docs term
            if not any(u[0] == "docs" for u in terms):
                return None
            flat += t[1]
        else:
            flat.append(t)
    for t in flat:
        if t[0] == "causal":
            lo = max(lo, 0)
        elif t[0] == "left":
            hi = min(hi, t[1] - 1)
        elif t[0] == "band":
            lo, hi = max(lo, -t[1]), min(hi, t[1])
        elif t[0] == "docs":
            docs.append(t[1])
        else:
            return None
    if lo > hi:
        return None
    keep = S
    if lo > -math.inf:                    # keys past the last query's reach are never attended
        keep = min(S, L - 1 + d0 - int(lo) + 1)
        if keep < 0:
            return None
    if (lo > -math.inf or hi < math.inf) and d0 != keep - L:
        return None                       # not bottom-right aligned: attnlab's windows cannot say it
    parts: list[masks.Mask] = []
    if lo == 0 and hi == math.inf:
        parts.append(masks.causal())
    elif lo > -math.inf or hi < math.inf:
        if lo > 0:
            return None
        parts.append(masks.window(None if hi == math.inf else int(hi), -int(lo) if lo > -math.inf else None))
    for ids in docs:
        if ids.shape[-1] != keep or L != keep or d0 != 0:
            return None
        parts.append(masks.documents(ids))
    pad = None if pm is None else _padding(pm[:, :keep])
    if pad is not None:
        parts.append(pad)
    mask = None
    for part in parts:
        mask = part if mask is None else mask & part
    # a padding mask with holes stays an element-wise (B, 1, 1, S) key mask: exact, but not skippable
    return HFMask(mask, None if keep == S else keep, structured=not isinstance(pad, masks.DenseMask))


def convert(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset: int = 0,
            mask_function: Optional[Callable] = None, attention_mask: Optional[Tensor] = None,
            **kwargs) -> HFMask:
    """transformers' mask-interface call -> ``HFMask`` (structured where HF's mask is).

    Args (as transformers passes them to a registered mask function):
        batch_size, q_length, kv_length: B, L, S of the attention that will use the mask.
        q_offset, kv_offset: absolute position of query row 0 and key column 0.
        mask_function: HF's index-based mask function (causal by default).
        attention_mask: (B, >= kv_offset + S) bool or 0/1 padding mask, True = real token.
        **kwargs: use_vmap, device and the rest are read only by the dense fallback.
    Example:
        convert(2, 5, 5, attention_mask=torch.tensor([[0, 1, 1, 1, 1], [1] * 5]))
        # HFMask(mask=(causal() & padding([4, 5], side='left')), keep=None, structured=True)
    """
    from transformers import masking_utils as mu

    if isinstance(attention_mask, HFMask):         # already converted (generate() with a static cache)
        return attention_mask
    if mask_function is None:
        mask_function = mu.causal_mask_function
    if isinstance(q_offset, Tensor):      # StaticCache passes a tensor (to avoid graph breaks)
        q_offset = int(q_offset)
    pm = None
    if attention_mask is not None:
        need = kv_offset + kv_length
        pm = attention_mask.bool()
        if pm.shape[-1] < need:           # HF pads the 2-D mask with "not a token" up to the cache size
            pm = torch.nn.functional.pad(pm, (0, need - pm.shape[-1]), value=False)
        pm = pm[:, kv_offset:need]                                           # (B, S)
    terms = _terms(mask_function, mu)
    if terms is not None:
        out = _structured(terms, pm, q_length, kv_length, q_offset - kv_offset)
        if out is not None:
            return out
    dense = mu.sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                         kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                         allow_is_causal_skip=False, allow_is_bidirectional_skip=False,
                         use_vmap=kwargs.get("use_vmap", False), device=kwargs.get("device", "cpu"))
    return HFMask(None if dense is None else masks.dense(dense), None, structured=False)  # (B, 1, L, S)
