"""The "auto" rule: which exact backend is fastest for a request on this CPU, and why, from figures
measured on each CPU class (each figure names its CPU) or from this machine's profile (``attnlab tune``).

``pick(req)`` is the rule itself; ``attention`` asks it once per kind of request through
``auto_memo.decided`` and ``explain`` quotes its reason. The thresholds and the figures they quote
live in ``auto_figures.py``, each naming the CPU it was measured on (docs/design.md, "auto").

Example::

    from attnlab.functional.request import make_request
    name, why = pick(make_request(q, k, v, causal=True))    # e.g. ("sdpa", "no mask or bias ...")
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from . import backends as _backends  # noqa: F401  (registers the backends)
from .auto_figures import (
    AVX2_CAUSAL_FWD_BELOW, AVX2_MEASURED, AVX2_TRAIN_FROM, BF16_CAUSAL_NATIVE_BELOW,
    BF16_DECODE_KEYS_FROM, BF16_MASKED_WHY, BF16_SMALL_FWD_FROM, FIGURES, FP16_FWD_FROM, FP16_TRAIN_FROM,
    FP32_FEW_QUERIES_FROM, FP32_SMALL_FROM, FP32_SMALL_MIN, GQA_FP32_DECODE_FROM, IN_GRAPH_WHY,
    MEASURED_OFF_AMX, MIN_SKIPPABLE, NATIVE_TRAIN_FROM, NO_BF16_GEMM, SMALL_CAUSAL_FWD_SCORES, SMALL_PROBLEM,
    SMALL_TRAIN_FROM, SPARSE_FROM, TILES_BF16_MIN_SKIPPABLE, TILES_MEASURED, ZEN4)
from .auto_figures_amx import (
    AMX_BF16_MASKED_QUERIES, AMX_BF16_MIN_SKIPPABLE, AMX_CAUSAL_FROM, AMX_FP16_CAUSAL_FROM, AMX_FP16_MASKED_KEYS,
    AMX_FP16_PLAIN_FROM, AMX_FP32_PLAIN_FROM, AMX_FP32_SMALL_FROM, AMX_MEASURED, AMX_PLAIN_FROM, XEON_AMX)
from .backends.native import on_amx, on_tiles
from .backends.sdpa import sdpa_kernel_kind
from .backends.tiled_plan import skip_grid
from .bias import StructuredBias
from .cpu import cpu_class
from .mask_plan import planned
from .mask_base import Mask
from .masks import EMPTY, DenseMask
from .masks import parts as mask_parts
from .patterns import BlockLayoutMask
from .profile import TIE, current_plain_steps, current_profile, step_choice
from .registry import Backend, all_backends
from .request import AttentionRequest

__all__ = ["pick", "candidates", "rule_source", "skippable", "no_bf16_gemm", "half_kernel", "fp32_small_kernel",
           "gqa_decode_kernel", "SMALL_PROBLEM", "FP32_KERNEL_MIN"]


_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16"}


def no_bf16_gemm() -> bool:
    """Is this a CPU without AVX-512 (``NO_BF16_GEMM``), where torch's bf16 GEMM is a scalar fallback and
    the rules measured on the Zen 3 apply?"""
    return cpu_class() in NO_BF16_GEMM


def fp16_forward_native(L: int, S: int, causal: bool, measured: str) -> bool:
    """Does plain fp16 inference of L queries over S keys (causal: with a causal mask, L == S) go to the compiled
    kernel on a CPU without a fast fp16 GEMM, by the thresholds of the ``measured`` class (FP16_FWD_FROM: the Zen 3's,
    the Zen 4's)?"""
    scores, keys = FP16_FWD_FROM[measured]
    return L * S >= scores or (not causal and S >= keys)


def amx_fp16(L: int, S: int, causal: bool, needs_grad: bool) -> Optional[str]:
    """Why the compiled kernel (fp16 computed as fp32) beats SDPA (torch's AVX512-FP16 GEMM) on a plain fp16 request
    of L queries over S keys on a CPU with AMX, or None: with gradients at every size; forward from
    AMX_FP16_CAUSAL_FROM scores causal (L == S), without a mask from AMX_FP16_PLAIN_FROM's scores and queries."""
    if needs_grad:
        return AMX_MEASURED["fp16 training"]
    scores, queries = AMX_FP16_PLAIN_FROM
    wins = L * S >= AMX_FP16_CAUSAL_FROM if causal else (L * S >= scores and L >= queries)
    return AMX_MEASURED["fp16 forward"] if wins else None


def amx_bf16(L: int, S: int, causal: bool, needs_grad: bool, D: int, Dv: int) -> Optional[str]:
    """Why the compiled kernel's AMX build beats SDPA (torch's own AMX kernel) on a plain bf16 request of L queries over
    S keys on a CPU with AMX, or None: on AMX's tiles (D, Dv multiples of 16) with gradients at every size; forward with
    a causal mask (L == S) from AMX_CAUSAL_FROM scores, without one from AMX_PLAIN_FROM's (by head dim)."""
    if not on_amx(D, Dv):
        return None
    if needs_grad:
        return AMX_MEASURED["bf16" if L * S > SMALL_PROBLEM else "bf16 small training"]
    wins = L * S >= (AMX_CAUSAL_FROM if causal else _threshold(AMX_PLAIN_FROM, max(D, Dv)))
    return AMX_MEASURED["bf16 forward"] if wins else None


def amx_masked_forward_to_sdpa(dtype: torch.dtype, L: int, S: int) -> Optional[str]:
    """Why SDPA beats the compiled kernel on a forward with a mask or bias of L queries over S keys on a CPU with AMX,
    whatever the size, or None: bf16 with fewer than AMX_BF16_MASKED_QUERIES queries (its AMX path packs all of K and
    V on each call), fp16 over keys outside AMX_FP16_MASKED_KEYS (it converts all of K and V to fp32 on each call)."""
    if cpu_class() != "amx":
        return None
    if dtype == torch.bfloat16 and L < AMX_BF16_MASKED_QUERIES:
        return AMX_MEASURED["bf16 masked few queries"]
    fewest, most, per_query = AMX_FP16_MASKED_KEYS
    if dtype == torch.float16 and not fewest <= S <= max(most, per_query * L):
        return AMX_MEASURED["fp16 masked many keys"]
    return None


def _threshold(table: tuple, x: int) -> int:
    """The threshold of ``table``'s first row ((at most this x, or None: any), threshold) that x falls in: the form of
    BF16_DECODE_KEYS_FROM (by queries) and AMX_PLAIN_FROM (by head dim)."""
    return next(threshold for most, threshold in table if most is None or x <= most)


def _off_amx() -> Optional[str]:
    """The measured class whose figures and thresholds hold on this CPU where auto sends masked and slow-GEMM
    requests to the compiled kernel ('avx2': the Zen 3's, 'avx512_bf16': the Zen 4's), None on a CPU with AMX."""
    return MEASURED_OFF_AMX.get(cpu_class())


def _measured() -> str:
    """The measured class whose figures (FIGURES) hold on this CPU: _off_amx()'s, or 'amx'."""
    return _off_amx() or "amx"


def half_kernel(dtype: torch.dtype, L: int, S: int, causal: bool, needs_grad: bool, D: int, Dv: int,
                heads: int = 1) -> Optional[str]:
    """Why the compiled kernel beats SDPA on a bf16 or fp16 request of L queries over S keys in ``heads`` query heads
    (B * H) on this CPU, or None: on AMX fp16 by ``amx_fp16`` and bf16 below SMALL_PROBLEM scores by ``amx_bf16``;
    off AMX where torch's GEMM of that dtype is slow -- fp16 everywhere there (no AVX512-FP16), bf16 on a CPU without
    AVX-512 (NO_BF16_GEMM) and, below SMALL_PROBLEM scores on the AVX-512 tiles, bf16's backward, its forward from
    BF16_SMALL_FWD_FROM queries and keys and, without a mask, its decoding over BF16_DECODE_KEYS_FROM keys (by the
    number of queries); a small causal forward of either from SMALL_CAUSAL_FWD_SCORES scores over all heads. With
    gradients the reason holds whatever the mask (``pick`` asks for a measured kind where it is the small bf16 one);
    without, for a plain request (no mask, or causal with L == S). ``attention``'s small-request shortcut asks it
    too."""
    measured = _off_amx()
    if measured is None:                             # AMX: fp16 by amx_fp16; bf16 by amx_bf16, above it _plain_native
        if dtype == torch.float16:
            return amx_fp16(L, S, causal, needs_grad)
        return amx_bf16(L, S, causal, needs_grad, D, Dv) if dtype == torch.bfloat16 and L * S <= SMALL_PROBLEM else None
    if dtype not in (torch.bfloat16, torch.float16):
        return None
    figures, LS = FIGURES[measured], L * S
    many_causal = causal and not needs_grad and heads * LS >= SMALL_CAUSAL_FWD_SCORES.get(measured, math.inf)
    if dtype == torch.float16:
        if needs_grad:
            return figures["fp16 training"] if LS >= FP16_TRAIN_FROM[measured] else None
        if fp16_forward_native(L, S, causal, measured):
            return figures["fp16 forward"]
        return figures["small causal forward"] if many_causal else None
    if measured in NO_BF16_GEMM:                     # the fallback: bf16 training at every size; forward, _plain_native
        return figures["bf16 training"] if needs_grad else None
    if LS > SMALL_PROBLEM:                           # above it: the tiles' rules (_plain_native)
        return None
    small = not needs_grad and min(L, S) < BF16_SMALL_FWD_FROM[causal]
    if small and not many_causal and (
            causal or S < _threshold(BF16_DECODE_KEYS_FROM, L)):
        return None                                  # before on_tiles: the shortcut's short decode steps
    if not on_tiles(D, Dv):
        return None
    if needs_grad:
        return figures["bf16 small training"]
    return figures["bf16 small forward" if not small else "small causal forward" if causal else "bf16 decode"]


#: the fewest (queries, keys) that any of ``fp32_small_kernel``'s rules takes (the shortcut's gate)
FP32_KERNEL_MIN = (FP32_FEW_QUERIES_FROM[0], min(FP32_SMALL_MIN, FP32_FEW_QUERIES_FROM[1]))


def fp32_small_kernel(L: int, S: int, causal: bool, needs_grad: bool, D: int, Dv: int) -> Optional[str]:
    """Why the compiled kernel beats SDPA on a plain fp32 request of L queries over S keys below SMALL_PROBLEM scores
    (no mask, or causal with L == S), or None: on the AVX-512 tiles off AMX (measured on the Zen 4) from
    FP32_SMALL_FROM scores where queries and keys both number at least FP32_SMALL_MIN, and a forward without a mask with
    fewer queries from FP32_FEW_QUERIES_FROM. ``attention``'s small-request shortcut asks it too. (Above
    SMALL_PROBLEM: ``_plain_native``'s tiles rule.)"""
    LS = L * S
    if _off_amx() is None:                           # AMX: causal only (AMX_FP32_SMALL_FROM)
        if not causal or not AMX_FP32_SMALL_FROM[needs_grad] <= LS <= SMALL_PROBLEM or not on_tiles(D, Dv):
            return None
        return AMX_MEASURED["fp32 small"]
    square = min(L, S) >= FP32_SMALL_MIN and LS >= FP32_SMALL_FROM[(causal, needs_grad)]
    few = (not causal and not needs_grad and FP32_FEW_QUERIES_FROM[0] <= L < FP32_SMALL_MIN
           and S >= FP32_FEW_QUERIES_FROM[1])
    if not (square or few) or LS > SMALL_PROBLEM or _off_amx() != "avx512_bf16" or not on_tiles(D, Dv):
        return None
    return FIGURES["avx512_bf16"]["fp32 small" if square else "fp32 few queries"]


def gqa_decode_kernel(dtype: torch.dtype, L: int, S: int, H: int, Hkv: int, D: int, Dv: int,
                      needs_grad: bool) -> Optional[str]:
    """Why the compiled kernel beats SDPA on a plain fp32 decoding step with grouped queries (L == 1, H > Hkv), or
    None: on the Zen 4's class, where the kernel stacks each group's query heads into one head's rows
    (backends/native_stack.py), with GQA_FP32_DECODE_FROM's group size, head dim and keys. (bf16 decoding, grouped
    or not, is ``half_kernel``'s.) ``attention``'s small-request shortcut asks it too."""
    if dtype != torch.float32 or L != 1 or H == Hkv or needs_grad or _off_amx() != "avx512_bf16":
        return None
    f = GQA_FP32_DECODE_FROM
    if H // Hkv >= f["group"] and D >= f["head_dim"] and S >= f["keys"]:
        return FIGURES["avx512_bf16"]["fp32 gqa decode"]
    return None


def _gqa_decode_kernel(req: AttentionRequest) -> Optional[str]:
    s = req.shape
    return gqa_decode_kernel(req.q.dtype, s.L, s.S, s.H, s.Hkv, s.D, s.Dv, req.needs_grad)


def candidates(req: AttentionRequest) -> list[tuple[Backend, Optional[str]]]:
    """Every registered backend with why auto cannot pick it for ``req`` (None: it can): it cannot compute
    the request, or it is approximate."""
    return [(b, b.unsupported(req) or (None if b.exact else "approximate: auto never picks it"))
            for b in all_backends()]


def skippable(req: AttentionRequest) -> Optional[float]:
    """Fraction of the tiled kernel's tiles (``tiled_plan.skip_grid``) the mask leaves empty (0 without a mask);
    None inside a torch.compile graph, which may not branch on the mask's contents (its padding lengths, its
    document ids, a dense mask's bits: the graph also serves the next call's mask): see ``IN_GRAPH``.

    Planned once per mask and (L, S, grid) (``mask_plan.planned``): classifying the tiles cost 0.15-0.36 ms
    per call at n = 1024, more than a tenth of the masked call it decides (issue #29)."""
    mask = req.mask
    if mask is None:
        return 0.0
    if torch.compiler.is_compiling():
        return None
    key = (req.shape.L, req.shape.S, *skip_grid(req.q.dtype, mask))
    return planned(mask, ("skippable", *key), lambda: float((mask.tile_kinds(*key) == EMPTY).float().mean()))


def pick(req: AttentionRequest) -> tuple[str, str]:
    """(backend name, reason) for the fastest exact backend that honours ``req``."""
    L, S = req.shape.L, req.shape.S
    if req.q.is_meta:
        return "reference", "meta tensors carry no data: the reference formula gives the output's shape and dtype"
    runnable = {b.name for b, why in candidates(req) if why is None}
    if "triton" in runnable:                       # only where triton and CUDA are there (never on the CPU)
        from .backends.triton_attn import prefer_triton
        why = prefer_triton(req)
        if why is not None:
            return "triton", why
    sdpa_ok = "sdpa" in runnable and sdpa_kernel_kind(req) == "flash"
    plain = req.bias is None and (req.mask is None or (req.is_causal_only and L == S))
    amx_bf16 = req.q.dtype == torch.bfloat16 and cpu_class() == "amx"
    if req.needs_grad and "native" in runnable:
        why = _half_kernel(req)
        if why is not None and (L * S > SMALL_PROBLEM or req.q.dtype == torch.float16 or no_bf16_gemm()
                                or _small_kinds(req)):           # the Zen 4's small bf16 training: measured kinds
            return "native", why
    if sdpa_ok and plain:
        tuned = _tuned(req, plain=True) if "native" in runnable else None
        if tuned is not None:
            return tuned
        why = _plain_native(req) if "native" in runnable else None
        if why is not None:
            return "native", why
        return "sdpa", ("no mask or bias (or causal with L == S): SDPA's fused flash kernel is the fastest exact "
                        "path" + _class_note(req))
    few = amx_masked_forward_to_sdpa(req.q.dtype, L, S) if sdpa_ok and not req.needs_grad else None
    if few is not None:
        return "sdpa", few
    elementwise = any(isinstance(p, DenseMask) for p in mask_parts(req.mask))
    if "sdpa" in runnable and L * S <= SMALL_PROBLEM:
        if sdpa_ok and "native" in runnable and _small_kinds(req):
            measured = _measured()
            figures = FIGURES[measured]
            if not req.needs_grad:
                return "native", figures["small dense" if elementwise else "small masked"]
            if isinstance(req.bias, StructuredBias) or L * S >= SMALL_TRAIN_FROM:
                return "native", _as_measured(req.q.dtype, figures["small training"])
            return "sdpa", _as_measured(req.q.dtype, figures["small training to sdpa"])
        return "sdpa", f"L*S = {L * S} <= {SMALL_PROBLEM}: too small for tiling to pay off"
    if sdpa_ok and elementwise and not isinstance(req.bias, StructuredBias):
        if req.bias is None and "native" in runnable:      # faster, few empty tiles or many, on every class
            if torch.compiler.is_compiling():
                return "sdpa", IN_GRAPH_WHY["dense kernel"]
            return "native", FIGURES[_measured()]["dense"]
        skip = skippable(req)
        if skip is None:
            return "sdpa", IN_GRAPH_WHY["dense"]
        if skip < MIN_SKIPPABLE:
            return "sdpa", (f"a dense mask with only {skip:.0%} empty tiles: SDPA's fused kernel applies it "
                            f"faster than tiling can skip")
    if ("sparse" in runnable and req.bias is None and L * S >= SPARSE_FROM
            and any(isinstance(p, BlockLayoutMask) for p in mask_parts(req.mask))):
        return "sparse", (f"a block layout ({req.mask!r}) at L*S = {L * S} >= {SPARSE_FROM}: its scattered "
                          f"blocks are faster gathered into one batched matmul than walked tile by tile "
                          f"(an AMD Zen 4 measurement whose command was not recorded)")
    masked_only = sdpa_ok and "native" in runnable and req.bias is None and not elementwise
    tuned = _tuned(req, plain=False) if masked_only else None
    if tuned is not None:
        return tuned
    amx_kernel = amx_bf16 and _on_amx(req)
    if (sdpa_ok and amx_bf16 and "native" in runnable and not isinstance(req.bias, StructuredBias)
            and not (amx_kernel and req.needs_grad)):
        skip = skippable(req)
        least = AMX_BF16_MIN_SKIPPABLE if amx_kernel else TILES_BF16_MIN_SKIPPABLE
        if skip is None and not amx_kernel:
            return "sdpa", IN_GRAPH_WHY["bf16 tiles"]
        if skip is not None and skip < least:       # in a graph, AMX tiles take it: they win from 3% empty
            return "sdpa", (f"bf16 inference with a mask that leaves {skip:.0%} of the tiles empty "
                            + BF16_MASKED_WHY[amx_kernel])
    exact_kernel = "native" if "native" in runnable else "tiled"    # the compiled one where it is built
    if exact_kernel in runnable and plain:             # no mask or bias, yet not SDPA's flash kernel
        why = ("dropout" if req.dropout_p > 0.0 else "Dv != D" if req.v.shape[-1] != req.q.shape[-1] else
               "an input whose last dim is not contiguous (stride != 1: expanded or transposed)")
        return exact_kernel, (f"SDPA would take its math path ({why}) and materialize the (B, H, L, S) scores; "
                              f"the {exact_kernel} kernel keeps O(L + S) memory")
    if "native" in runnable:
        measured = _masked_figures(req.q.dtype, amx_kernel, amx_bf16)
        return "native", ("a mask or bias is involved: SDPA would compute every pair and need the dense (L, S) "
                          "mask in memory; the compiled kernel visits only the keys each row may attend, reads "
                          f"structured biases from O(n) tables and keeps O(L + S) memory ({measured}: "
                          "docs/benchmarks.md)")
    if "tiled" in runnable:
        return "tiled", ("a mask or bias is involved: SDPA would compute every pair and need the dense "
                         "(L, S) mask in memory; the tiled kernel skips empty tiles, computes structured "
                         "masks and biases per tile and keeps O(L + S) memory")
    for name in ("sdpa", "reference"):
        if name in runnable:
            return name, "the only exact backend that honours this request"
    raise ValueError("no exact backend can compute this request: "
                     + "; ".join(f"{b.name}: {why}" for b, why in candidates(req) if why))


def _as_measured(dtype: torch.dtype, fp32_why: str) -> str:
    """A small-training reason, measured in fp32, as it applies to a request of ``dtype``: the figures themselves for
    fp32; for another dtype (bf16 off the tiles' head dims, fp16 below FP16_TRAIN_FROM scores, fp64), said to be
    fp32's, which decide where that dtype was not measured."""
    if dtype == torch.float32:
        return fp32_why
    name = str(dtype).removeprefix("torch.")
    return (f"{name} with gradients and a mask at this size was not measured on this CPU class, and the fp32 "
            f"figures decide: {fp32_why}")


def _masked_figures(dtype: torch.dtype, amx_kernel: bool, amx_bf16: bool) -> str:
    """What was measured of the compiled kernel against SDPA or FlexAttention with a mask or bias, on this CPU's
    class and dtype."""
    fp16 = dtype == torch.float16
    if no_bf16_gemm():
        return AVX2_MEASURED["fp16 masked" if fp16 else "masked"]
    measured = _off_amx()
    if fp16 and measured:
        return FIGURES[measured]["fp16 masked"]
    if fp16:
        return AMX_MEASURED["fp16 masked"]
    if amx_kernel:
        return (f"measured 4.4-10.6x the sdpa backend's bf16 forward with a W = 256 window and 3.7-8.3x with 8 "
                f"documents at n = 1024, 4096 ({XEON_AMX})")
    if amx_bf16:
        return (f"measured 1.65-5.9x the sdpa backend's bf16 speed with a W = 256 window and 2.4-3.6x with 8 "
                f"documents at n = 1024, 4096, off the AMX path ({XEON_AMX})")
    return (f"measured 1.92-2.14x FlexAttention's fp32 forward on a W = 256 window, 1.69x with 8 documents and "
            f"1.81x with ALiBi at n = 8192 ({ZEN4}; docs/benchmarks.md, 'Issue #27: row bounds')")


def _tuned(req: AttentionRequest, plain: bool) -> Optional[tuple[str, str]]:
    """('native' | 'sdpa', why) from this machine's profile (``attnlab tune``; functional/profile.py) for a
    plain request, or a mask without a bias, where the profile measured one of the kind: same dtype, head
    dims on the same kernel path as the profile's, above SMALL_PROBLEM scores (below it SDPA is fixed)."""
    prof = current_profile()
    dtype = _DTYPE_NAMES.get(req.q.dtype)
    D, Dv, LS = req.shape.D, req.shape.Dv, req.shape.L * req.shape.S
    if prof is None or dtype is None or LS <= SMALL_PROBLEM or _path(D, Dv) != _path(prof.D, prof.D):
        return None
    if plain:
        return step_choice(current_plain_steps(dtype, req.is_causal_only, req.needs_grad), LS)
    skip = skippable(req)
    return None if skip is None else prof.masked_choice(dtype, req.needs_grad, skip)


def _path(D: int, Dv: int) -> tuple[bool, bool]:
    """Which of the compiled kernel's paths head dims D, Dv take: (AVX-512 tiles, AMX tiles)."""
    return on_tiles(D, Dv), on_amx(D, Dv)


def _on_amx(req: AttentionRequest) -> bool:
    return on_amx(req.shape.D, req.shape.Dv)


def _on_tiles(req: AttentionRequest) -> bool:
    return on_tiles(req.shape.D, req.shape.Dv)


def _half_kernel(req: AttentionRequest) -> Optional[str]:
    s = req.shape
    return half_kernel(req.q.dtype, s.L, s.S, req.is_causal_only, req.needs_grad, s.D, s.Dv, s.B * s.H)


_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def rule_source(reason: str) -> str:
    """The line ``explain()`` adds to say where auto's choice came from: this machine's profile or the
    built-in rules of its CPU class (whose figures name the CPU they were measured on)."""
    prof = current_profile()
    if prof is not None and prof.source() in reason:
        return "rule source: " + prof.source()
    line = (f"rule source: the built-in rules for CPU class {cpu_class()!r} (each figure names the CPU it was "
            "measured on)")
    if prof is None:
        return line + "; no profile for this machine (`attnlab tune` measures one)"
    return line + (f"; {prof.source()} has no measurement for this request's kind, or measured a tie (the two "
                   f"within {TIE - 1:.0%}) that the built-in rule decides")


def _plain_native(req: AttentionRequest) -> Optional[str]:
    """Why the compiled kernel is faster than SDPA on this plain request, or None (see NATIVE_TRAIN_FROM)."""
    dtype, causal, LS = req.q.dtype, req.is_causal_only, req.shape.L * req.shape.S
    amx = cpu_class() == "amx"
    half = _half_kernel(req)
    if half is not None:
        return half
    if dtype == torch.float32 and LS <= SMALL_PROBLEM:            # below it every other rule says SDPA
        return (fp32_small_kernel(req.shape.L, req.shape.S, causal, req.needs_grad, req.shape.D, req.shape.Dv)
                or _gqa_decode_kernel(req))
    if amx and dtype == torch.bfloat16:               # both run bf16 on AMX tiles (below SMALL_PROBLEM: half_kernel)
        return amx_bf16(req.shape.L, req.shape.S, causal, req.needs_grad, req.shape.D, req.shape.Dv)
    tiles = dtype in (torch.float32, torch.bfloat16) and LS > SMALL_PROBLEM and _on_tiles(req)
    if tiles and amx:                                 # fp32: SDPA only for a smaller forward without a mask
        if causal or req.needs_grad:
            return AMX_MEASURED["fp32"]
        scores, (queries, keys) = AMX_FP32_PLAIN_FROM
        L, S = req.shape.L, req.shape.S
        return AMX_MEASURED["fp32 forward"] if LS >= scores or (L >= queries and S >= keys) else None
    if tiles:
        return (f"{_NAMES[dtype]} with D, Dv multiples of 16: the compiled kernel's AVX-512 tiles measured "
                f"{TILES_MEASURED[dtype]} (docs/benchmarks.md, auto grid)")
    if no_bf16_gemm():
        return _plain_native_avx2(dtype, causal, req.needs_grad, req.shape.L, req.shape.S)
    if dtype == torch.float32 and causal and LS > SMALL_PROBLEM:
        return ("fp32 causal: the compiled kernel measured 1.04-1.24x SDPA's forward and 1.09-1.35x its "
                f"forward+backward at n = 1024-8192 ({ZEN4}; docs/benchmarks.md, auto grid)")
    if dtype == torch.float32 and req.needs_grad and LS >= NATIVE_TRAIN_FROM:
        return ("fp32 with gradients from n = 4096: the compiled kernel's forward+backward measured 1.07x "
                f"SDPA's ({ZEN4}; docs/benchmarks.md, auto grid)")
    if dtype == torch.bfloat16 and causal and not req.needs_grad and SMALL_PROBLEM < LS < BF16_CAUSAL_NATIVE_BELOW:
        return ("bf16 causal forward below n = 8192 (head dims off the AVX-512 tiles): the compiled kernel "
                f"measured 1.05-1.18x SDPA's ({ZEN4}; docs/benchmarks.md, auto grid)")
    return None


def _plain_native_avx2(dtype: torch.dtype, causal: bool, needs_grad: bool, L: int, S: int) -> Optional[str]:
    """``_plain_native`` on a CPU without AVX-512 (fp16, and bf16 with gradients: ``half_kernel``)."""
    LS = L * S
    if LS <= SMALL_PROBLEM:
        return None
    if dtype == torch.float32 and causal and (needs_grad or LS < AVX2_CAUSAL_FWD_BELOW):
        return AVX2_MEASURED["fp32 causal"]
    if dtype == torch.float32 and needs_grad and LS >= AVX2_TRAIN_FROM:
        return AVX2_MEASURED["fp32 training"]
    if dtype == torch.bfloat16 and causal and not needs_grad and LS < BF16_CAUSAL_NATIVE_BELOW:
        return AVX2_MEASURED["bf16 causal"]
    return None


def _small_kinds(req: AttentionRequest) -> bool:
    """Is a request with a mask or bias below SMALL_PROBLEM scores of a kind measured for the compiled kernel on this
    CPU? On every measured class (the Zen 3, the Zen 4, the Xeon with AMX): masks whose every part has an interval
    form (``Mask.row_spans``: causal, window, padding, documents) or is a dense bool mask (read as bits, each row
    within its range; not inside a torch.compile graph, see IN_GRAPH_WHY), and no bias or a structured one. Not a
    dense bias, nor a block layout: not measured. (With gradients ``pick`` then weighs the size: SMALL_TRAIN_FROM;
    on AMX some forwards go to SDPA before it is asked: ``amx_masked_forward_to_sdpa``.)"""
    if isinstance(req.bias, Tensor):
        return False
    dense_ok = not torch.compiler.is_compiling()     # a graph packs a dense mask's bits again on every call
    if any(type(p).row_spans is Mask.row_spans and not (dense_ok and isinstance(p, DenseMask))
           for p in mask_parts(req.mask)):
        return False
    return True


def _class_note(req: AttentionRequest) -> str:
    """What was measured on this CPU's class where a plain request goes to SDPA ('' where nothing was)."""
    if no_bf16_gemm():
        # The two figures were measured on the fp32 and bf16 requests the class's rule sends to SDPA. Any other
        # (fp16; a request the kernel wins, which reaches SDPA only where the kernel is not built) gets none.
        dtype, LS, grad = req.q.dtype, req.shape.L * req.shape.S, req.needs_grad
        if (dtype not in _NAMES or LS <= SMALL_PROBLEM or (dtype == torch.bfloat16 and grad)
                or _plain_native_avx2(dtype, req.is_causal_only, grad, req.shape.L, req.shape.S) is not None):
            return ""
        return "; " + AVX2_MEASURED["training to sdpa" if grad else "forward to sdpa"]
    if cpu_class() != "amx":
        return ""
    if req.q.dtype == torch.bfloat16:
        return f"; {AMX_MEASURED['bf16 forward to sdpa' if _on_amx(req) else 'bf16 tiles']}"
    if req.q.dtype == torch.float16 and not req.needs_grad:
        return f"; {AMX_MEASURED['fp16 forward to sdpa']}"
    big = req.shape.L * req.shape.S > SMALL_PROBLEM
    if req.q.dtype == torch.float32 and _on_tiles(req):
        return f"; {AMX_MEASURED['fp32 forward to sdpa' if big else 'fp32 small to sdpa']}"
    return ""
