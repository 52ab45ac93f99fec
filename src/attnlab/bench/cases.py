"""Benchmark cases: one (mask kind, n, dtype, mode) problem, and every form its mask takes.

Each mask kind is built four ways that must agree: the attnlab structured mask (and bias), the
dense bool mask / float bias given to torch SDPA, the ``mask_mod`` / ``score_mod`` given to
FlexAttention, and an exact count of the allowed (query, key) pairs for the useful-FLOP count.
All problems are self-attention (L = S = n).

Example::

    case = Case(mask="window", n=1024, dtype="float32", mode="fwd")
    mask, bias = attnlab_mask(case)                 # masks.window(256, 0), None
    useful_flops(case)                              # 4 * B * H * D * allowed_pairs(case)
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from .. import masks
from ..positional.alibi import AlibiBias, alibi_slopes

__all__ = ["MASK_KINDS", "MODES", "DTYPES", "Case", "make_inputs", "padding_lengths", "document_ids",
           "attnlab_mask", "dense_mask", "sdpa_kwargs", "flex_mods", "allowed_pairs",
           "useful_flops"]

# What each mask kind means; printed under the table and stored in the JSON metadata.
MASK_KINDS = {
    "none": "no mask: every query sees every key",
    "causal": "causal: query i sees keys j <= i",
    "padding": "key padding: example b sees keys j < len_b; len = (3n/4,) for B=1, else n, 3n/4, n/2, n/4, n, ...",
    "window": "causal sliding window of W past keys: query i sees i-W <= j <= i (masks.window(W, 0))",
    "documents": "packed documents: n split into --docs equal-length documents (masks.documents(ids)); "
                 "attention stays within a document, not causal",
    "alibi": "ALiBi bias -slope_h * |i - j| (positional.alibi_slopes: 2^(-8h/H) when H is a power of 2) and causal, "
             "as the library's AlibiBias (computed per tile by tiled, read from an O(n) table by native, kept "
             "across calls)",
    "dense": "causal and key padding (len as for padding) given to attnlab as a (B, 1, n, n) bool tensor, "
             "masks.dense, as Hugging Face models build their masks: no interval form to read",
}
MODES = {"fwd": "forward only, under torch.no_grad()",
         "fwdbwd": "forward + out.backward(grad), q, k, v require grad"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# FlashAttention's convention: the backward pass does 2.5x the forward's matmul work.
FWDBWD_FACTOR = 3.5


@dataclass(frozen=True)
class Case:
    """One benchmark problem: self-attention of n tokens, q, k, v of shape (batch, heads, n, head_dim)."""
    mask: str                  # a key of MASK_KINDS
    n: int
    dtype: str                 # a key of DTYPES
    mode: str                  # a key of MODES
    batch: int = 1
    heads: int = 8
    head_dim: int = 64
    window: int = 256          # W of the "window" mask
    docs: int = 8              # number of packed documents of the "documents" mask

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def label(self) -> str:
        return f"{self.mask} n={self.n} {self.dtype} {self.mode}"

    def to_dict(self) -> dict:
        return asdict(self)


def make_inputs(case: Case, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v (B, H, n, D) in the case's dtype; requiring grad for fwdbwd."""
    g = torch.Generator().manual_seed(seed)
    shape = (case.batch, case.heads, case.n, case.head_dim)
    qkv = [torch.randn(shape, generator=g).to(case.torch_dtype) for _ in range(3)]
    if case.mode == "fwdbwd":
        qkv = [t.requires_grad_() for t in qkv]
    return qkv[0], qkv[1], qkv[2]


def padding_lengths(case: Case) -> Tensor:
    """(B,) key lengths: 3n/4 for one example, else cycling n, 3n/4, n/2, n/4."""
    n = case.n
    if case.batch == 1:
        return torch.tensor([max(1, 3 * n // 4)])
    return torch.tensor([max(1, n * (4 - b % 4) // 4) for b in range(case.batch)])


def document_ids(case: Case) -> Tensor:
    """(n,) document id of every token: ``docs`` contiguous documents of (near-)equal length."""
    return torch.arange(case.n) * case.docs // case.n


def attnlab_mask(case: Case):
    """(mask, bias) to pass to ``attnlab.attention`` for this case: structured, but for the "dense" kind."""
    kind = case.mask
    if kind == "none":
        return None, None
    if kind == "causal":
        return masks.causal(), None
    if kind == "padding":
        return masks.padding(padding_lengths(case)), None
    if kind == "window":
        return masks.window(case.window, 0), None
    if kind == "documents":
        return masks.documents(document_ids(case)), None
    if kind == "alibi":
        # the library's own bias, as ALiBi(H).bias() gives it in a model: its per-offset table is kept across
        # the timed calls, as across a model's layers and steps (functional/bias.py, ``kept``)
        return masks.causal(), AlibiBias(alibi_slopes(case.heads).float())
    if kind == "dense":
        structured = masks.causal() & masks.padding(padding_lengths(case))
        return masks.dense(structured.dense(case.n, case.n)), None          # (B|1, 1, n, n) bool
    raise ValueError(f"unknown mask kind {kind!r}; choose from {list(MASK_KINDS)}")


def dense_mask(case: Case) -> Optional[Tensor]:
    """The case's mask as a bool tensor broadcastable to (B, H, n, n), or None for "none"."""
    mask, _ = attnlab_mask(case)
    return None if mask is None else mask.dense(case.n, case.n)


def sdpa_kwargs(case: Case) -> dict:
    """Keyword arguments that make ``F.scaled_dot_product_attention`` compute this case.

    The dense mask is built here, once, outside the timed region: torch SDPA is *given* the mask.
    """
    if case.mask == "none":
        return {}
    if case.mask == "causal":
        return {"is_causal": True}                          # L == S: SDPA's top-left causal is ours
    allowed = dense_mask(case)                               # (B|1, 1, n, n)
    if case.mask != "alibi":
        return {"attn_mask": allowed}
    _, bias = attnlab_mask(case)
    b = bias.dense(case.n, case.n).masked_fill(~allowed, float("-inf"))   # (1, H, n, n)
    return {"attn_mask": b.to(case.torch_dtype)}


def flex_mods(case: Case) -> tuple[Optional[Callable], Optional[Callable]]:
    """(mask_mod, score_mod) reproducing the case for FlexAttention; None where not needed."""
    kind = case.mask
    if kind == "none":
        return None, None
    if kind in ("causal", "alibi"):
        def mask_mod(b, h, q_idx, kv_idx):
            return kv_idx <= q_idx
    elif kind == "padding":
        lengths = padding_lengths(case)

        def mask_mod(b, h, q_idx, kv_idx):
            return kv_idx < lengths[b]
    elif kind == "dense":
        lengths = padding_lengths(case)

        def mask_mod(b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx) & (kv_idx < lengths[b])
    elif kind == "window":
        W = case.window

        def mask_mod(b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx) & (q_idx - kv_idx <= W)
    elif kind == "documents":
        ids = document_ids(case)

        def mask_mod(b, h, q_idx, kv_idx):
            return ids[q_idx] == ids[kv_idx]
    else:
        raise ValueError(f"unknown mask kind {kind!r}; choose from {list(MASK_KINDS)}")
    score_mod = None
    if kind == "alibi":
        slopes = alibi_slopes(case.heads).float()

        def score_mod(score, b, h, q_idx, kv_idx):
            # flex applies score_mod to the already-scaled score, as attnlab adds its bias
            return score - slopes[h] * (q_idx - kv_idx).abs()
    return mask_mod, score_mod


def allowed_pairs(case: Case) -> int:
    """Number of (example, query, key) triples that may attend, summed over the batch (exact)."""
    n, B = case.n, case.batch
    kind = case.mask
    if kind == "none":
        return B * n * n
    if kind in ("causal", "alibi"):
        return B * n * (n + 1) // 2
    if kind == "padding":
        return n * int(padding_lengths(case).sum())
    if kind == "dense":             # causal and padding: row i < len sees i + 1 keys, the others len
        return sum(m * (m + 1) // 2 + (n - m) * m for m in padding_lengths(case).tolist())
    if kind == "window":
        W = min(case.window, n - 1)
        # rows i < W see i + 1 keys, rows i >= W see W + 1
        return B * (W * (W + 1) // 2 + (n - W) * (W + 1))
    if kind == "documents":
        return B * int((torch.bincount(document_ids(case)) ** 2).sum())
    raise ValueError(f"unknown mask kind {kind!r}; choose from {list(MASK_KINDS)}")


def useful_flops(case: Case) -> int:
    """FLOPs of the work the mask allows: 4 * H * D per allowed pair (QK^T and PV), x3.5 for fwd+bwd.

    Work a kernel spends on masked-out pairs is not counted, so a kernel that skips empty tiles
    and one that computes everything and masks afterwards are compared on the same scale.
    """
    fwd = 4 * case.heads * case.head_dim * allowed_pairs(case)
    return int(fwd * FWDBWD_FACTOR) if case.mode == "fwdbwd" else fwd
