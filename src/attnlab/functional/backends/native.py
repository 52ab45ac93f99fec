"""The native backend: attnlab's compiled CPU kernel (``src/attnlab/csrc``), exact, O(n) memory.

The same algorithm as ``tiled`` (FlashAttention-2 forward with online softmax and per-row LSE,
and its backward), written in C++ so that one call is one parallel region over (batch, head,
query tile) with no Python in the loop: fused (query tile x key chunk) blocks whose scores stay in
cache, BLAS on the tiles, vectorized exp (``at::vec``). Masks reach it as per-row key intervals
(``Mask.row_spans``) -- each query tile visits only the keys its rows may attend, rows are skipped,
full or masked one by one -- and, for masks with no interval form, as a bit-packed dense mask.
Biases reach it as a tensor or as a small table (``StructuredBias.table``: ALiBi and T5 as one
value per offset, Shaw's key term as 2k + 1 values per row), never (B, H, L, S).

This file is the thin Python side: it prepares those arguments and registers the backend;
``native_ops.py`` is the kernel as torch sees it (custom ops, autograd, the direct call). ``tiled``
stays the readable explanation of the algorithm.
"""
from __future__ import annotations

import operator

from typing import Optional

import torch
from torch import Tensor

from ..tiles import bit_spans, old_tile_names, pack_bits
from ..bias import StructuredBias
from ..mask_plan import planned
from ..masks import Mask, intersect_spans, parts
from ..memory import check_fits_in_memory, check_weights_fit
from ..registry import register_backend
from ..request import AttentionRequest, Bias
from .native_ops import ISA, WHY_ISA as _WHY_ISA, backward_op, kernel as _native, run_forward
from .native_stack import stack_factor, stack_mask_args, stack_rows, unstack_rows
from .reference import accum_dtype, dense_bias, safe_softmax

__all__ = ["native_attention", "native_forward", "native_block_backward", "info", "why_unavailable",
           "default_tiles", "on_tiles", "on_amx", "release_buffers"]

# One module per instruction-set level (native_build.py, loaded by native_ops.py); when none loads, every other
# backend still works.
_WHY_NOT: Optional[str] = None if _native is not None else _WHY_ISA

# float16 is computed as float32: converted once per call at the boundary (csrc/bindings.cpp, `computed`), the
# output returned in float32 and rounded outside the autograd Function (its backward then reads the unrounded output)
_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def why_unavailable() -> Optional[str]:
    """None when the kernel is built and importable, else why not and how to build it."""
    return _WHY_NOT


def info() -> str:
    """Which kernel build runs here and why (its instruction-set level), its vector capability and the GEMM
    used per dtype.

    >>> info()     # on an AVX512-BF16 CPU, nothing forced
    'native: build avx512_bf16 (the best build this CPU runs); at::vec AVX512; float32: sgemm_ ...'
    """
    if _native is None:
        return f"native: unavailable: {_WHY_NOT}"
    amx = ("; bfloat16 on AMX tiles (oneDNN brgemm) where D and Dv are multiples of 16"
           if ISA == "amx" else "")
    return (f"native: build {ISA} ({_WHY_ISA}); at::vec {_native.capability()}; {_native.blas()}{amx}; "
            "float16: computed as float32")


def release_buffers() -> int:
    """Frees the buffers the kernel keeps on this thread between calls -- the packed K and V of its tiles and the
    float32 copies of float16 inputs, each at most 64 MiB (csrc/kept.cpp: kept because a fresh buffer pays its
    page faults on every call) -- and returns the bytes they held. The next call allocates them again.

    >>> release_buffers()      # after a bfloat16 call with 8 heads of 4096 keys, D = 64, on the AVX-512 tiles
    8388608
    """
    return 0 if _native is None else int(_native.release_buffers())


def on_amx(D: int, Dv: int, tile_k: Optional[int] = None) -> bool:
    """Does a bfloat16 call with head dims D, Dv (and key chunk ``tile_k``, default: the AMX tiles') run its
    products on AMX tiles (csrc/amx.cpp)? The kernel's own test (``uses_amx``), asked, not restated. A constant
    to torch.compile, which cannot trace into the extension; the sizes may be a graph's symbolic ones (below).

    >>> on_amx(64, 64), on_amx(40, 64)      # on an Intel Xeon with AMX
    (True, False)
    """
    return _amx_answer(*_ints(D, Dv, tile_k if tile_k is not None else AMX_TILES[1]))


def on_tiles(D: int, Dv: int, tile_k: Optional[int] = None) -> bool:
    """Does a float32 or bfloat16 call with head dims D, Dv (and key chunk ``tile_k``, default: the
    default tiles') run on the AVX-512 micro-kernel (csrc/microkernel.cpp) rather than MKL's GEMMs? A constant
    to torch.compile, as ``on_amx``.

    It needs a build on a CPU with AVX512-BF16 and D, Dv and the key chunk multiples of 16: the
    kernel's own test (``uses_tiles``), asked, not restated. bfloat16 gains most: MKL's bf16 GEMM is
    no faster than fp32 on the AMD Zen 4 (docs/benchmarks.md, issue #14), the micro-kernel's ``vdpbf16ps``
    twice as fast.

    >>> on_tiles(64, 64), on_tiles(40, 64), on_tiles(64, 64, tile_k=120)   # on an AVX512-BF16 build
    (True, False, False)
    """
    return _tiles_answer(*_ints(D, Dv, tile_k if tile_k is not None else default_tiles(torch.float32, None)[1]))


# Inside a torch.compile graph with dynamic shapes the sizes are symbolic, and a constant's arguments must be
# Python ints: operator.index makes them so and torch.compile guards on them (int() would keep them symbolic;
# attention's small-request shortcut passes q.shape's head size).
def _ints(*sizes: int) -> tuple[int, ...]:
    return tuple(operator.index(n) for n in sizes)


@torch.compiler.assume_constant_result
def _amx_answer(D: int, Dv: int, tile_k: int) -> bool:
    return _native is not None and _native.uses_amx(D, Dv, tile_k)


@torch.compiler.assume_constant_result
def _tiles_answer(D: int, Dv: int, tile_k: int) -> bool:
    return _native is not None and _native.uses_tiles(D, Dv, tile_k)


def default_tiles(dtype: torch.dtype, spans: Optional[Tensor]) -> tuple[int, int]:
    """(tile_q, tile_k): query tile rows and key chunk columns.

    Measured at n = 8192, B=1 H=8 D=64 fp32 (docs/benchmarks.md, native tiles): rows that attend
    to many keys (no mask, causal, long documents) run fastest in tall 256-row tiles (bigger GEMMs);
    narrow bands (a W=256 window) in 64-row tiles, which waste little at the band's slanted edges
    (window 45 ms at 64 rows vs 70 ms at 256). The 512-key chunk keeps a (256, 512) fp32 score
    block (512 KB) in the L2 cache.
    """
    if spans is not None and not torch.compiler.is_compiling():      # (no data-dependent branch in a graph)
        width = (spans[..., 1] - spans[..., 0]).clamp(min=0).sum(-1).float().mean().item()
        if width < NARROW_ROWS:
            return 64, 512
    if dtype == torch.bfloat16 and ISA == "amx":
        return AMX_TILES
    return 256, 512


#: rows that attend to fewer keys than this on average get short (64-row) query tiles
NARROW_ROWS = 768
#: bf16 on AMX: 128-row tiles. Forward, n = 4096 H=8, median ratio to SDPA in one run (Intel Xeon with AMX, 2
#: threads): D = 64 0.93x at 128 rows against 0.87x at 256 and 0.88x at 64; D = 128 0.97x against 0.82x at
#: 256. brgemm's S = Q K^T writes a (rows, 512) fp32 block for only D products per entry: smaller blocks
#: stay nearer the core.
AMX_TILES = (128, 512)


# ---------------------------------------------------------------------------------------------
# Arguments: the mask as spans and bits, the bias as a tensor or a table.

def mask_args(mask: Optional[Mask], L: int, S: int) -> tuple[Optional[Tensor], Optional[Tensor]]:
    """(spans (Bm, L, K, 2) int64 or None, bits (Bb, Hb, L, ceil(S/64)) int64 or None).

    The parts of an ``&`` combination that have an interval form become spans (intersected); the
    rest is materialized once as a dense bool mask and bit-packed (1 bit per pair, read only on
    rows the spans leave partial), and each row's range of allowed keys in it joins the spans
    (``tiles.bit_spans``), so that the kernel skips what lies outside as for an interval form.
    Planned once per mask and (L, S) (``mask_plan.planned``): the kernel only reads them.
    """
    if mask is None:
        return None, None
    return planned(mask, ("native", L, S), lambda: _mask_args(mask, L, S))


def _mask_args(mask: Mask, L: int, S: int) -> tuple[Optional[Tensor], Optional[Tensor]]:
    spans, rest = None, []
    for part in parts(mask):
        s = part.row_spans(L, S)
        if s is None:
            rest.append(part)
        else:
            spans = s if spans is None else intersect_spans(spans, s)
    bits = None
    if rest:
        names = " & ".join(type(p).__name__ for p in rest)
        check_fits_in_memory(f"the native backend bit-packs {names} from its dense (L, S) = ({L}, {S}) form",
                             2 * L * S, torch.device("cpu"),                      # bool, and padded to 64 keys
                             "a mask with an interval form (causal, window, padding, documents) is read per row; "
                             "for a block layout use backend='sparse', which plans whole blocks")
        allowed = rest[0].dense(L, S)
        for part in rest[1:]:
            allowed = allowed & part.dense(L, S)
        bits = pack_bits(allowed.expand(-1, -1, L, S))                  # (Bb, Hb, L, W)
        if L > 0 and S > 0 and not torch.compiler.is_compiling():     # (inductor miscompiles its int32 -> int64)
            ranges = bit_spans(bits)                  # each row's range: the chunks outside it are skipped
            spans = ranges if spans is None else intersect_spans(spans, ranges)
    if spans is not None:
        spans = spans.contiguous()
    return spans, bits


def bias_args(bias: Optional[Bias], q: Tensor, L: int, S: int) -> tuple[int, Optional[Tensor], int, int]:
    """(kind, tensor, table width, table offset): kind 0 none, 1 a dense tensor, 2 a table."""
    acc = accum_dtype(q.dtype)
    if bias is None:
        return 0, None, 0, 0
    if isinstance(bias, Tensor):
        return 1, bias.to(acc), 0, 0
    form = bias.table(L, S)
    if form is None:
        raise ValueError(f"the native backend reads structured biases through a table "
                         f"(StructuredBias.table); {bias!r} has none: use backend='tiled'")
    table, c0 = form
    table = table.to(acc)
    if table.stride(-1) != 1:
        table = table.contiguous()
    return 2, table, table.shape[-1], c0


def native_forward(q: Tensor, k: Tensor, v: Tensor, *, mask: Optional[Mask] = None, bias: Optional[Bias] = None,
                   scale: float, softcap: Optional[float] = None, dropout_p: float = 0.0,
                   dropout_seed: Optional[int] = None, tile_q: Optional[int] = None,
                   tile_k: Optional[int] = None) -> tuple[Tensor, Tensor]:
    """(out (B, H, L, Dv), lse (B, H, L)): the kernel's output and natural log-sum-exp per row.

    Rows with nothing to attend to give 0 and lse = -inf. Differentiable in q, k, v and the bias
    (a tensor, or the parameters behind a structured bias's table). Ring attention merges blocks
    with the lse.
    """
    (B, H, L, _), S = q.shape, k.shape[2]
    # GQA decoding: a group's query heads stacked into one head's rows read K and V once (native_stack.py)
    kv_bytes = k.numel() * k.element_size() + v.numel() * v.element_size()
    g = stack_factor(B, H, k.shape[1], L, kv_bytes) if bias is None and not dropout_p else 1
    spans, bits, (dq, dk) = _planned_args(mask, q.dtype, L, S, g, H)
    kind, bias_t, tW, tc0 = bias_args(bias, q, L, S)
    args = (kind, tW, tc0, float(scale), float(softcap or 0.0), float(dropout_p), int(dropout_seed or 0),
            int(tile_q or dq), int(tile_k or dk))
    # q, k, v with any strides: the kernel copies only what it cannot read (csrc/bindings.cpp, readable)
    out, lse = run_forward(stack_rows(q, g) if g > 1 else q, k, v, bias_t, spans, bits, args)
    if g > 1:
        out, lse = unstack_rows(out, g), unstack_rows(lse, g)
    return out.to(q.dtype), lse           # fp16: rounded once, outside the Function (native_ops._computed)


def _planned_args(mask: Optional[Mask], dtype: torch.dtype, L: int, S: int, g: int = 1, H: int = 1):
    """(spans, bits, (tile_q, tile_k)): ``mask_args`` and ``default_tiles``, planned together once per mask, (L, S),
    dtype and the heads stacked per row block (g of H, ``native_stack``; one plan per call either way) with
    ``mask_plan.planned`` (one look-up costs 5-7 us). Reading the spans' mean width for the tiles is five tensor
    ops, 25-40 us a call."""
    def build():
        spans, bits = _mask_args(mask, L, S) if mask is not None else (None, None)
        if g > 1:
            spans, bits = stack_mask_args(spans, bits, g, H)
        return spans, bits, default_tiles(dtype, spans)
    return planned(mask, ("native+tiles", L, S, dtype) + ((g, H) if g > 1 else ()), build)


def native_block_backward(q: Tensor, k: Tensor, v: Tensor, dout: Tensor, lse: Tensor, delta: Tensor, *,
                          mask: Optional[Mask], scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """One block's share of the gradients given the FINAL row statistics (ring attention's backward).

    q, dout: (B, H, L, D|Dv); k, v: (B, Hkv, S, D|Dv); lse, delta: (B, H, L) natural LSE of the whole
    row (-inf: a row with nothing to attend to) and rowsum(dO o O). Returns dq (B, H, L, D) and
    dk, dv summed over each GQA group (B, Hkv, S, D|Dv), in the accumulation dtype.
    """
    L, S = q.shape[2], k.shape[2]
    spans, bits, (bq, bk) = _planned_args(mask, q.dtype, L, S)
    acc = accum_dtype(q.dtype)
    dq, dk, dv, _ = backward_op(q, k, v, dout, lse.to(acc), delta.to(acc), spans, bits, 0, None, 0, 0, float(scale),
                                0.0, 0.0, 0, bq, bk, False)
    B, Hkv = k.shape[:2]
    H = q.shape[1]
    return dq, dk.reshape(B, Hkv, H // Hkv, S, -1).sum(2), dv.reshape(B, Hkv, H // Hkv, S, -1).sum(2)


def _unsupported(req: AttentionRequest) -> Optional[str]:
    if _native is None:
        return _WHY_NOT
    if req.q.device.type != "cpu":
        return f"it runs on the CPU, and q is on {req.q.device} (use 'tiled' or 'triton')"
    if req.q.dtype not in _DTYPES:
        return f"it takes float32, float64, bfloat16 and float16, not {req.q.dtype} (use 'tiled')"
    if isinstance(req.bias, StructuredBias):
        L, S = req.q.shape[2], req.k.shape[2]
        if not req.bias.has_table(L, S):
            return (f"it reads structured biases through a table (StructuredBias.table: a function of j - i, "
                    f"or Shaw's per-row offsets); {req.bias!r} has none (use 'tiled')")
    return None


@register_backend("native", unsupported=_unsupported, available=lambda: _native is not None,
                  summary="compiled CPU kernel (C++, FlashAttention-2 fwd/bwd): one parallel region, skips "
                          "masked rows and tiles, O(n) memory")
@old_tile_names
def native_attention(q: Tensor, k: Tensor, v: Tensor, *, mask: Optional[Mask] = None, bias: Optional[Bias] = None,
                     scale: float, softcap: Optional[float] = None, dropout_p: float = 0.0,
                     dropout_seed: Optional[int] = None, return_weights: bool = False,
                     tile_q: Optional[int] = None, tile_k: Optional[int] = None):
    """Exact attention in the compiled kernel.

    Args:
        q: (B, H, L, D); k: (B, Hkv, S, D); v: (B, Hkv, S, Dv), float32 / float64 / bfloat16 / float16 on the
            CPU (float16 computed as float32: the inputs converted once per call, the output rounded once).
        mask, bias, scale, softcap, dropout_p, dropout_seed, return_weights: as for the reference backend.
        tile_q, tile_k: tile sizes (defaults: ``default_tiles``).
    Returns:
        out (B, H, L, Dv); with return_weights also the (B, H, L, S) weights (the reference's softmax
        of the same logits).
    Example:
        q, k, v = (torch.randn(1, 8, 8192, 64) for _ in range(3))
        out = native_attention(q, k, v, mask=masks.window(256, 0), scale=0.125)
    """
    if return_weights:         # _weights' 3 copies of (B, H, L, S), checked before the forward (issue #26)
        check_weights_fit("the native backend", q.shape[0], q.shape[1], q.shape[2], k.shape[2],
                          accum_dtype(q.dtype), q.device, copies=3)
    out, lse = native_forward(q, k, v, mask=mask, bias=bias, scale=scale, softcap=softcap, dropout_p=dropout_p,
                              dropout_seed=dropout_seed, tile_q=tile_q, tile_k=tile_k)
    if not return_weights:
        return out
    with torch.no_grad():
        w = _weights(q, k, mask, bias, scale, softcap)
    return out, w


def _weights(q, k, mask, bias, scale, softcap) -> Tensor:
    """(B, H, L, S) weights: the reference's softmax of the same logits (0 on empty rows).

    Computed from the logits rather than as exp(logits - lse): the kernel's LSE is exact to
    an ulp of its magnitude, which exp() would turn into a relative error of ~1e-6 on every weight.
    """
    acc = accum_dtype(q.dtype)
    H, Hkv, L, S = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    kk = k.to(acc).repeat_interleave(H // Hkv, dim=1)                 # (B, H, S, D)
    s = (q.to(acc) @ kk.transpose(-2, -1)) * scale                    # (B, H, L, S)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    b = dense_bias(bias, L, S)
    if b is not None:
        s = s + b.to(acc)
    if mask is not None:
        s = s.masked_fill(~mask.dense(L, S).to(s.device), float("-inf"))
    return safe_softmax(s)
