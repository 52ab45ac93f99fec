"""Triton kernels of the ``triton`` backend: the FlashAttention-2 backward pass.

Two kernels, both recomputing each tile's probabilities P = exp2(s - lse2) from the saved
log-sum-exp instead of storing them (Dao 2023, arXiv:2307.08691):

* ``attn_bwd_dkdv``: one program per (key tile, batch, kv head) walks the query tiles that see
  its keys (the column table) for each of the G query heads sharing the kv head, accumulating
  dk and dv in registers: no atomics, so dk and dv are deterministic.
* ``attn_bwd_dq``: one program per (query tile, batch, head) walks its key tiles (the row
  table) for dq, and writes the bias gradient dS there (each (b, h, i, j) once: a plain store
  for a full-shaped or deterministic buffer, an atomic add for a broadcast bias).

D_i = dO_i . O_i comes in precomputed from the float32 output (see ``triton_attn``).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .triton_attn_kernels import LOG2E, allowed, bias_grad, bias_tile, cast, device, keep, mm, query_program, tile

__all__ = ["attn_bwd_dkdv", "attn_bwd_dq"]

NEG_INF = tl.constexpr(float("-inf"))
POS_INF = tl.constexpr(float("inf"))


@device
def _probs(a, b_, b, h, mi, nj, lse, slot, L, S, qk_scale, PADS, DOCS, DENSEM, LAY, BITMAP, MP, BIAS, BP,
           BM: tl.constexpr, BN: tl.constexpr, MFLAGS: tl.constexpr, BIAS_KIND: tl.constexpr,
           IEEE: tl.constexpr, masked):
    """Exact probabilities of one tile, recomputed from lse (+inf on empty rows -> 0); masked:
    evaluate the mask (a run of PARTIAL or ragged-edge tiles).

    a @ b_ gives the scores in the orientation of (mi, nj): q @ k^T as (BM, BN) with mi (BM, 1),
    or k @ q^T as (BN, BM) with mi (1, BM); lse broadcasts like mi.
    """
    s = mm(a, b_, IEEE) * qk_scale
    if BIAS_KIND != 0:
        s += bias_tile(BIAS, BP, b, h, mi, nj, L, S, BIAS_KIND) * LOG2E
    if masked:
        ok = allowed(mi, nj, b, h, slot, L, S, PADS, DOCS, DENSEM, LAY, BITMAP, MP, MFLAGS, BM, BN)
        s = tl.where(ok, s, NEG_INF)
    return tl.exp2(s - lse)


@device
def _row_stats(LSE, DELTA, bh, offs_m, L):
    """lse2 (+inf where the row attends to nothing, so its P is exactly 0) and D_i of a query tile."""
    lse = tl.load(LSE + bh.to(tl.int64) * L + offs_m, mask=offs_m < L, other=POS_INF)
    lse = tl.where(lse == NEG_INF, POS_INF, lse)
    delta = tl.load(DELTA + bh.to(tl.int64) * L + offs_m, mask=offs_m < L, other=0.0)
    return lse, delta


@device
def _dkdv_span(dk, dv, k, v, q_base, do_base, sq2, sq3, sd2, sd3, offs_n, offs_d, offs_dv, b, h, bh, m0, m1, slot,
               LSE, DELTA, L, S, D, DV, qk_scale, PADS, DOCS, DENSEM, LAY, BITMAP, MP, BIAS, BP, SEEDS, threshold,
               inv_keep, BM: tl.constexpr, BN: tl.constexpr, MFLAGS: tl.constexpr, BIAS_KIND: tl.constexpr,
               DROPOUT: tl.constexpr, IEEE: tl.constexpr, masked):
    """dk, dv contributions of query tiles m0 .. m1 - 1 of one query head, on (BN, BM) tiles."""
    for mt in range(m0, m1):
        offs_m = mt * BM + tl.arange(0, BM)
        qT = tile(q_base, offs_d, offs_m, sq3, sq2, D, L)                               # (BD, BM)
        do = tile(do_base, offs_m, offs_dv, sd2, sd3, L, DV)                            # (BM, BDV)
        lse, delta = _row_stats(LSE, DELTA, bh, offs_m, L)
        pT = _probs(k, qT, b, h, offs_m[None, :], offs_n[:, None], lse[None, :], slot, L, S, qk_scale,
                    PADS, DOCS, DENSEM, LAY, BITMAP, MP, BIAS, BP, BM, BN, MFLAGS, BIAS_KIND, IEEE, masked)
        dpT = mm(v, tl.trans(do), IEEE)                                                 # (BN, BM)
        pdT = pT
        if DROPOUT:
            kept = keep(SEEDS, bh, offs_m[None, :], offs_n[:, None], threshold)
            pdT = tl.where(kept, pT * inv_keep, 0.0)
            dpT = tl.where(kept, dpT * inv_keep, 0.0)
        dv += mm(cast(pdT, do.dtype), do, IEEE)
        dsT = pT * (dpT - delta[None, :])                     # gradient of the natural-log logits
        dk += mm(cast(dsT, qT.dtype), tl.trans(qT), IEEE)
    return dk, dv


@triton.jit
def attn_bwd_dkdv(Q, K, V, DO, DKP, DVP, LSE, DELTA,
                  sq0, sq1, sq2, sq3, sk0, sk1, sk2, sk3, sv0, sv1, sv2, sv3, sd0, sd1, sd2, sd3,
                  PTR, RUNS, tile_b, PADS, DOCS, DENSEM, LAY, BITMAP, MP, BIAS, BP, SEEDS, threshold, inv_keep,
                  H, G, L, S, D, DV, qk_scale, sm_scale,
                  BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
                  MFLAGS: tl.constexpr, BIAS_KIND: tl.constexpr, DROPOUT: tl.constexpr, IEEE: tl.constexpr):
    """dk, dv of one key tile of one kv head (B, Hkv, S, D|Dv), written in k's / v's dtype.

    Works on transposed (BN, BM) tiles (k q^T), as the FlashAttention-2 Triton tutorial does, so
    only loaded operands are ever transposed. DKP and DVP are contiguous (B, Hkv, S, D) and
    (B, Hkv, S, Dv); DO has strides sd*.
    """
    kt = tl.program_id(0)
    bhk = tl.program_id(1)
    Hkv = H // G
    b = bhk // Hkv
    hk = bhk % Hkv
    b64 = b.to(tl.int64)
    offs_n = kt * BN + tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    cols = (offs_n < S)[:, None]
    k = tile(K + b64 * sk0 + hk * sk1, offs_n, offs_d, sk2, sk3, S, D)                 # (BN, BD)
    v = tile(V + b64 * sv0 + hk * sv1, offs_n, offs_dv, sv2, sv3, S, DV)               # (BN, BDV)
    dk = tl.full([BN, BD], 0.0, tl.float32)
    dv = tl.full([BN, BDV], 0.0, tl.float32)
    col = b * tile_b + kt
    start = tl.load(PTR + col)
    end = tl.load(PTR + col + 1)
    for g in range(0, G):                                    # the query heads sharing this kv head
        h = hk * G + g
        bh = b * H + h
        q_base = Q + b64 * sq0 + h * sq1
        do_base = DO + b64 * sd0 + h * sd1
        for r in range(start, end):
            m0 = tl.load(RUNS + 4 * r)
            m1 = tl.load(RUNS + 4 * r + 1)
            dk, dv = _dkdv_span(dk, dv, k, v, q_base, do_base, sq2, sq3, sd2, sd3, offs_n, offs_d, offs_dv,
                                b, h, bh, m0, m1, tl.load(RUNS + 4 * r + 3), LSE, DELTA, L, S, D, DV, qk_scale,
                                PADS, DOCS, DENSEM, LAY, BITMAP, MP, BIAS, BP, SEEDS, threshold, inv_keep,
                                BM, BN, MFLAGS, BIAS_KIND, DROPOUT, IEEE, tl.load(RUNS + 4 * r + 2) == 1)
    dk = dk * sm_scale
    tl.store(DKP + (bhk.to(tl.int64) * S + offs_n[:, None]) * D + offs_d[None, :],
             cast(dk, DKP.dtype.element_ty), mask=cols & (offs_d < D)[None, :])
    tl.store(DVP + (bhk.to(tl.int64) * S + offs_n[:, None]) * DV + offs_dv[None, :],
             cast(dv, DVP.dtype.element_ty), mask=cols & (offs_dv < DV)[None, :])


@device
def _dq_span(dq, q, do, lse, delta, k_base, v_base, sk2, sk3, sv2, sv3, offs_m, offs_d, offs_dv, b, h, bh, k0, k1,
             slot, DB, GP, L, S, D, DV, qk_scale, PADS, DOCS, DENSEM, LAY, BITMAP, MP, BIAS, BP, SEEDS, threshold,
             inv_keep, BM: tl.constexpr, BN: tl.constexpr, MFLAGS: tl.constexpr, BIAS_KIND: tl.constexpr,
             BIAS_GRAD: tl.constexpr, DROPOUT: tl.constexpr, IEEE: tl.constexpr, masked):
    """dq contributions of key tiles k0 .. k1 - 1 (and their bias gradient), on (BM, BN) tiles."""
    for kt in range(k0, k1):
        offs_n = kt * BN + tl.arange(0, BN)
        kT = tile(k_base, offs_d, offs_n, sk3, sk2, D, S)                              # (BD, BN)
        vT = tile(v_base, offs_dv, offs_n, sv3, sv2, DV, S)                            # (BDV, BN)
        p = _probs(q, kT, b, h, offs_m[:, None], offs_n[None, :], lse[:, None], slot, L, S, qk_scale,
                   PADS, DOCS, DENSEM, LAY, BITMAP, MP, BIAS, BP, BM, BN, MFLAGS, BIAS_KIND, IEEE, masked)
        dp = mm(do, vT, IEEE)                                                           # (BM, BN)
        if DROPOUT:
            dp = tl.where(keep(SEEDS, bh, offs_m[:, None], offs_n[None, :], threshold), dp * inv_keep, 0.0)
        ds = p * (dp - delta[:, None])
        if BIAS_GRAD != 0:
            bias_grad(DB, GP, b, h, offs_m[:, None], offs_n[None, :], L, S, ds, BIAS_GRAD == 2)
        dq += mm(cast(ds, kT.dtype), tl.trans(kT), IEEE)
    return dq


@triton.jit
def attn_bwd_dq(Q, K, V, DO, DQ, LSE, DELTA, DB, GP,
                sq0, sq1, sq2, sq3, sk0, sk1, sk2, sk3, sv0, sv1, sv2, sv3, sd0, sd1, sd2, sd3,
                PTR, RUNS, tile_b, PADS, DOCS, DENSEM, LAY, BITMAP, MP, BIAS, BP, SEEDS, threshold, inv_keep,
                H, G, L, S, D, DV, qk_scale, sm_scale,
                BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
                MFLAGS: tl.constexpr, BIAS_KIND: tl.constexpr, BIAS_GRAD: tl.constexpr,
                DROPOUT: tl.constexpr, IEEE: tl.constexpr):
    """dq of one query tile (B, H, L, D) in q's dtype (DQ contiguous); with BIAS_GRAD (1 store,
    2 atomic add) also the bias gradient dS through ``bias_grad``."""
    bh, b, h, hk, b64, offs_m = query_program(H, G, BM)
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    q = tile(Q + b64 * sq0 + h * sq1, offs_m, offs_d, sq2, sq3, L, D)                  # (BM, BD)
    do = tile(DO + b64 * sd0 + h * sd1, offs_m, offs_dv, sd2, sd3, L, DV)              # (BM, BDV)
    lse, delta = _row_stats(LSE, DELTA, bh, offs_m, L)
    k_base = K + b64 * sk0 + hk * sk1
    v_base = V + b64 * sv0 + hk * sv1
    dq = tl.full([BM, BD], 0.0, tl.float32)
    row = b * tile_b + tl.program_id(0)
    for r in range(tl.load(PTR + row), tl.load(PTR + row + 1)):
        k0 = tl.load(RUNS + 4 * r)
        k1 = tl.load(RUNS + 4 * r + 1)
        dq = _dq_span(dq, q, do, lse, delta, k_base, v_base, sk2, sk3, sv2, sv3, offs_m, offs_d, offs_dv, b, h,
                      bh, k0, k1, tl.load(RUNS + 4 * r + 3), DB, GP, L, S, D, DV, qk_scale, PADS, DOCS, DENSEM,
                      LAY, BITMAP, MP, BIAS, BP, SEEDS, threshold, inv_keep,
                      BM, BN, MFLAGS, BIAS_KIND, BIAS_GRAD, DROPOUT, IEEE, tl.load(RUNS + 4 * r + 2) == 1)
    dq = dq * sm_scale
    tl.store(DQ + (bh.to(tl.int64) * L + offs_m[:, None]) * D + offs_d[None, :],
             cast(dq, DQ.dtype.element_ty), mask=(offs_m < L)[:, None] & (offs_d < D)[None, :])
