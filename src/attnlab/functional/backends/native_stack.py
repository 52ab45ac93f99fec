"""GQA decoding on the compiled kernel: the query heads that share a kv head stacked into the rows of one head.

The kernel's unit of work is one query head's tile of rows, and each unit reads its kv head's K and V. With
grouped-query attention (H = G * Hkv query heads, Hkv kv heads) and one query per head -- a decoding step -- G
units read the same K and V for one row each: G times the memory traffic the step needs. Stacked, g of the G
heads of a group become one head of g rows (row j of stacked head h' holds the query of head h' * g + j), which
reads its K and V once: a view of q, no copy.

Exact as before: every row attends the keys it attended (the mask's row spans and bits are repeated per stacked
row), with the same products and softmax; the output and the log-sum-exp are put back in (B, H, 1) order. Not
for a bias or dropout: a bias is read by query position and head, and dropout's hash by (head, row), both of
which the stacked rows no longer are. The backward sees the stacked rows too (autograd maps the gradients back
through the views).

Example::

    g = stack_factor(1, 32, 8, 1, 8 << 20)         # 4 on 2 threads, 8 MiB of K and V: a group per unit
    qs = stack_rows(q, g)                          # (1, 8, 4, 128): a view of q (1, 32, 1, 128)
    out = unstack_rows(kernel_out, g)              # (1, 8, 4, 128) -> (1, 32, 1, 128)
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["STACK_FROM_BYTES", "stack_factor", "stack_rows", "unstack_rows", "stack_mask_args"]


@torch.compiler.assume_constant_result
def _threads() -> int:
    # a constant to torch.compile (torch.get_num_threads returns no tensor: an error under fullgraph=True)
    return torch.get_num_threads()


#: stack only where K and V hold at least this many bytes: below, the step reads them from the cache either way, and
#: stacking measured 0.83-1.05x at 128-512 keys with 2 kv heads of D = 64 (a few us of views on a 30-120 us call),
#: against 1.16-1.95x from 4 MiB (8 kv heads of D = 128 over 512-4096 keys, fp32; AMD Zen 4, 2 threads)
STACK_FROM_BYTES = 1 << 20


def stack_factor(B: int, H: int, Hkv: int, L: int, kv_bytes: int) -> int:
    """g: how many query heads of a GQA group to stack into one head's rows (1: none), for L queries per head over
    K and V of ``kv_bytes`` bytes in all.

    Only for one query per head (L == 1, a decoding step), where stacking is a view: with 4 queries, stacked by a
    copy, the copies of q and the output cost more than stacking saved in bf16 (0.83-0.93x at 512-4096 keys, B=1,
    on the AMD Zen 4). And only from STACK_FROM_BYTES of K and V (docs/benchmarks.md, "Issue #27: GQA decoding").
    The largest divisor g of G = H / Hkv that still leaves one unit of work per thread (B * H / g >= min(threads,
    B * H)): on 2 threads, 8 kv heads take every query head of their group, and MQA (one kv head) half of them.
    """
    G = H // Hkv
    if G == 1 or L != 1 or kv_bytes < STACK_FROM_BYTES:
        return 1
    units = min(_threads(), B * H)
    return max(g for g in range(1, G + 1) if G % g == 0 and B * (H // g) >= units)


def stack_rows(x: Tensor, g: int) -> Tensor:
    """(B, H, 1, *X) -> (B, H / g, g, *X), a view: row j of head h' is the row of head h' * g + j.
    Also for bits (Bb, H, 1, W)."""
    B, H, _, *X = x.shape
    return x.reshape(B, H // g, g, *X)


def unstack_rows(x: Tensor, g: int) -> Tensor:
    """The inverse of ``stack_rows``: (B, H / g, g, *X) -> (B, H, 1, *X) (out, and lse without *X)."""
    return x.reshape(x.shape[0], x.shape[1] * g, 1, *x.shape[3:])


def stack_mask_args(spans: Optional[Tensor], bits: Optional[Tensor], g: int,
                    H: int) -> tuple[Optional[Tensor], Optional[Tensor]]:
    """The kernel's mask arguments for stacked rows: spans (Bm, 1, K, 2) -> (Bm, g, K, 2), the query's intervals
    repeated for its g heads; bits (Bb, 1 | H, 1, W) -> (Bb, 1, g, W) or (Bb, H / g, g, W)."""
    if spans is not None:
        spans = spans.repeat_interleave(g, dim=1).contiguous()
    if bits is not None:
        if bits.shape[1] == 1:
            bits = bits.repeat_interleave(g, dim=2)
        elif bits.shape[1] == H:
            bits = stack_rows(bits, g)
        else:                                      # (a mask broadcasts to (B, H, L, S): never)
            raise ValueError(f"bits with {bits.shape[1]} heads: 1 or H = {H} expected")
        bits = bits.contiguous()
    return spans, bits
