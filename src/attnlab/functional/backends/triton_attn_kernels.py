"""Triton kernels of the ``triton`` backend: shared tile helpers and the forward pass.

Imported lazily by ``triton_attn`` (never at ``import attnlab``): Triton decides when a kernel
is *decorated* whether it is compiled for the GPU or run by its CPU interpreter, so
``TRITON_INTERPRET=1`` must be set before this module is first imported.

Every program owns one (query tile, batch, head) -- or, in the dk/dv kernel, one (key tile,
batch, kv head) -- and walks only the tiles the host listed for it (``triton_attn_plan``): a
CSR-style table ``PTR`` / ``RUNS`` of runs (first tile, one past the last, flag, bitmap slot) of
consecutive tiles. flag 2 = FULL and inside the sequence: the run is computed with no masking
code at all; flag 1 = PARTIAL or on the ragged edge: the mask is evaluated.

Scores are in base 2 (q k^T times scale * log2(e), biases times log2(e)) so the softmax uses
exp2; the saved statistic is lse2 = lse / ln 2, as in the tiled backend.
"""
from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["INTERPRETED", "device", "attn_fwd", "allowed", "bias_tile", "bias_grad", "keep", "mm", "cast", "tile",
           "query_program", "LOG2E"]



@triton.jit
def _probe():
    pass


#: Whether these kernels run in Triton's CPU interpreter (decided when this module was imported).
INTERPRETED = not isinstance(_probe, triton.runtime.jit.JITFunction)

LOG2E = tl.constexpr(1.4426950408889634)
NEG_INF = tl.constexpr(float("-inf"))

# Mask flags (a constexpr bit field): which structured parts the kernel evaluates on flagged tiles.
LO, HI, PAD, DOC, DENSE, LAYOUT, BITS = 1, 2, 4, 8, 16, 32, 64


def device(fn):
    """``triton.jit`` for a helper called from the kernels; a plain function under the interpreter.

    The interpreter re-patches ``triton.language`` on every call of a jit helper (~5 ms each, most
    of a small kernel's time); a plain function runs inside the kernel's already patched scope.
    """
    return fn if INTERPRETED else triton.jit(fn)


@device
def _mm_gpu(a, b, IEEE: tl.constexpr):
    """a @ b accumulated in fp32; full fp32 products for fp32 inputs (no TF32 rounding)."""
    if IEEE:
        out = tl.dot(a, b, input_precision="ieee")
    else:
        out = tl.dot(a, b)
    return out


def _mm_interpreted(a, b, IEEE):
    """The interpreter's tl.dot multiplies bfloat16 *storage* as integers (Triton 3.9; its debugging
    guide: no bfloat16 arithmetic; triton-lang/triton#11584): widen the operands to fp32 first,
    which is exact, as are the GPU's bf16 products accumulated in fp32."""
    return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")


mm = _mm_interpreted if INTERPRETED else _mm_gpu


@device
def _cast_gpu(x, dtype: tl.constexpr):
    return x.to(dtype)


def _cast_interpreted(x, dtype):
    """x.to(dtype), rounding fp32 -> bf16 to nearest even as the GPU does: Triton 3.9's
    interpreter truncates instead, which doubles the rounding error of every bf16 result."""
    if dtype != tl.bfloat16:
        return x.to(dtype)
    u = x.to(tl.uint32, bitcast=True)
    u = u + 0x7FFF + ((u >> 16) & 1)
    return (u >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


#: x.to(dtype) with round-to-nearest-even, also in the interpreter.
cast = _cast_interpreted if INTERPRETED else _cast_gpu


@device
def tile(base, rows, cols, s_r, s_c, n_rows, n_cols):
    """The (len(rows), len(cols)) tile base[rows * s_r + cols * s_c], zero outside (n_rows, n_cols):
    a q / k / v / dO tile, or its transpose with rows and columns swapped."""
    return tl.load(base + rows[:, None] * s_r + cols[None, :] * s_c,
                   mask=(rows < n_rows)[:, None] & (cols < n_cols)[None, :], other=0.0)


@device
def query_program(H, G, BM: tl.constexpr):
    """(b * H + h, b, h, kv head, b as int64, query rows) of a (query tile, b * H + h) program."""
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    return bh, b, h, h // G, b.to(tl.int64), tl.program_id(0) * BM + tl.arange(0, BM)


@device
def rsum(x, axis: tl.constexpr):
    """tl.sum(x, axis) for fp32 x. Spelled as tl.reduce so the interpreter runs it even when triton
    was imported before TRITON_INTERPRET was set (tl.sum / tl.max / tl.zeros are @jit functions
    of triton.language, compiled-or-interpreted from that first import on)."""
    return tl.reduce(x, axis, tl.standard._sum_combine)


@device
def rmax(x, axis: tl.constexpr):
    """tl.max(x, axis) for fp32 x (see ``rsum``)."""
    return tl.reduce(x, axis, tl.standard._elementwise_max)


@device
def allowed(mi, nj, b, h, slot, L, S, PADS, DOCS, DENSEM, LAY, BITMAP, MP,
            MFLAGS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """Bool tile: which (query mi, key nj) pairs may attend, sequence bounds included.

    mi, nj: query rows and key columns as broadcastable 2-D index tensors, (BM, 1) and (1, BN)
    or transposed, so the same code serves (BM, BN) and (BN, BM) tiles. MP holds the int64
    parameters: [0] window left, [1] window right, [2] document batch stride, [3:7] dense mask
    strides (b, h, l, s), [7:10] layout strides (h, I, J), [10] layout block, [11] layout row
    offset, [12:15] bitmap strides (slot, b, h).
    """
    pos = mi + (S - L)                                       # query positions, bottom-right aligned
    rows = mi < L
    cols = nj < S
    ok = rows & cols
    if MFLAGS & 1:
        ok = ok & (nj >= pos - tl.load(MP + 0))
    if MFLAGS & 2:
        ok = ok & (nj <= pos + tl.load(MP + 1))
    if MFLAGS & 4:
        ok = ok & (nj < tl.load(PADS + b))
    if MFLAGS & 8:
        ids = DOCS + b * tl.load(MP + 2)
        has = rows & (pos >= 0)                              # rows before position 0 see nothing
        qid = tl.load(ids + pos, mask=has, other=0)
        kid = tl.load(ids + nj, mask=cols, other=0)
        ok = ok & has & (qid == kid)
    if MFLAGS & 16:
        ptr = (DENSEM + b * tl.load(MP + 3) + h * tl.load(MP + 4)
               + mi * tl.load(MP + 5) + nj * tl.load(MP + 6))
        ok = ok & (tl.load(ptr, mask=ok, other=0) != 0)
    if MFLAGS & 32:
        blk = tl.load(MP + 10)
        r = mi + tl.load(MP + 11)                            # layout row index space
        ok = ok & (r >= 0)
        ptr = LAY + h * tl.load(MP + 7) + (r // blk) * tl.load(MP + 8) + (nj // blk) * tl.load(MP + 9)
        ok = ok & (tl.load(ptr, mask=ok, other=0) != 0)
    if MFLAGS & 64:
        if slot >= 0:                                        # a host-built bitmap of a PARTIAL tile
            ptr = (BITMAP + slot * tl.load(MP + 12) + b * tl.load(MP + 13) + h * tl.load(MP + 14)
                   + (mi % BM) * BN + (nj % BN))
            ok = ok & (tl.load(ptr) != 0)
    return ok


@device
def bias_tile(BIAS, BP, b, h, mi, nj, L, S, KIND: tl.constexpr):
    """fp32 additive bias at (mi, nj).

    KIND 1: a tensor read at BP = [offset, stride b, h, l, s] (a relative table has l = -1);
    KIND 2: ALiBi computed in place, -slope[h] * |p - j| with the fp32 slopes at BIAS (head
    stride BP[2]), the same fp32 operations as ``AlibiBias.tile``.
    """
    if KIND == 2:
        slope = tl.load(BIAS + h * tl.load(BP + 2))
        out = -slope * tl.abs(mi + (S - L) - nj).to(tl.float32)
    else:
        ptr = (BIAS + tl.load(BP) + b * tl.load(BP + 1) + h * tl.load(BP + 2)
               + mi * tl.load(BP + 3) + nj * tl.load(BP + 4))
        out = tl.load(ptr, mask=(mi < L) & (nj < S), other=0.0).to(tl.float32)
    return out


@device
def bias_grad(DB, GP, b, h, mi, nj, L, S, ds, ATOMIC: tl.constexpr):
    """Write (or atomically add) the logits gradient ds at (mi, nj) into the bias gradient buffer."""
    ptr = (DB + tl.load(GP) + b * tl.load(GP + 1) + h * tl.load(GP + 2)
           + mi * tl.load(GP + 3) + nj * tl.load(GP + 4))
    if ATOMIC:
        tl.atomic_add(ptr, ds, mask=(mi < L) & (nj < S))
    else:
        tl.store(ptr, ds, mask=(mi < L) & (nj < S))


@device
def _mix(x):
    """attnlab.functional.dropout._mix in uint32 arithmetic (products wrap mod 2^32)."""
    x = x ^ (x >> 16)
    x = x * 0x45D9F3B
    x = x ^ (x >> 16)
    x = x * 0x45D9F3B
    return x ^ (x >> 16)


@device
def keep(SEEDS, bh, mi, nj, threshold):
    """Dropout keep mask at (mi, nj), bit-identical to ``dropout.keep_at`` (SEEDS[bh]: its first mix)."""
    x = tl.load(SEEDS + bh).to(tl.uint32)
    x = _mix(x ^ (mi.to(tl.uint32) * 0x85EB))
    x = _mix(x ^ (nj.to(tl.uint32) * 0xC2B2AE3))
    return x.to(tl.int64) >= threshold


@device
def _fwd_span(acc, l_i, m_i, q, k_base, v_base, sk2, sk3, sv2, sv3, offs_m, offs_d, offs_dv, b, h, bh,
              k0, k1, slot, L, S, D, DV, qk_scale, PADS, DOCS, DENSEM, LAY, BITMAP, MP, BIAS, BP,
              SEEDS, threshold, inv_keep, BM: tl.constexpr, BN: tl.constexpr, MFLAGS: tl.constexpr,
              BIAS_KIND: tl.constexpr, DROPOUT: tl.constexpr, IEEE: tl.constexpr, masked):
    """Online softmax over key tiles k0 .. k1 - 1 of one query tile; masked: evaluate the mask."""
    for kt in range(k0, k1):
        offs_n = kt * BN + tl.arange(0, BN)
        kT = tile(k_base, offs_d, offs_n, sk3, sk2, D, S)                              # (BD, BN)
        s = mm(q, kT, IEEE) * qk_scale                                                  # (BM, BN)
        if BIAS_KIND != 0:
            s += bias_tile(BIAS, BP, b, h, offs_m[:, None], offs_n[None, :], L, S, BIAS_KIND) * LOG2E
        if masked:                                           # uniform over the run: no divergence
            ok = allowed(offs_m[:, None], offs_n[None, :], b, h, slot, L, S, PADS, DOCS, DENSEM, LAY, BITMAP,
                         MP, MFLAGS, BM, BN)
            s = tl.where(ok, s, NEG_INF)
        m_new = tl.maximum(m_i, rmax(s, 1))
        # A row that has seen only -inf so far subtracts 0, so exp2 gives 0 rather than NaN.
        m_use = tl.where(m_new == NEG_INF, 0.0, m_new)
        p = tl.exp2(s - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + rsum(p, 1)
        if DROPOUT:
            p = tl.where(keep(SEEDS, bh, offs_m[:, None], offs_n[None, :], threshold), p * inv_keep, 0.0)
        v = tile(v_base, offs_n, offs_dv, sv2, sv3, S, DV)                             # (BN, BDV)
        acc = acc * alpha[:, None] + mm(cast(p, v.dtype), v, IEEE)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def attn_fwd(Q, K, V, O, LSE,
             sq0, sq1, sq2, sq3, sk0, sk1, sk2, sk3, sv0, sv1, sv2, sv3, so0, so1, so2, so3,
             PTR, RUNS, tile_b, PADS, DOCS, DENSEM, LAY, BITMAP, MP, BIAS, BP, SEEDS, threshold, inv_keep,
             H, G, L, S, D, DV, qk_scale,
             BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
             MFLAGS: tl.constexpr, BIAS_KIND: tl.constexpr, DROPOUT: tl.constexpr, IEEE: tl.constexpr):
    """One (query tile, batch * head) program: online softmax over the key-tile runs listed for it.

    Writes O (B, H, L, Dv) in O's dtype and LSE (B, H, L) = log2 sum exp2 of the base-2 logits
    (-inf on rows with nothing to attend to, whose output is 0).
    """
    bh, b, h, hk, b64, offs_m = query_program(H, G, BM)
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    q = tile(Q + b64 * sq0 + h * sq1, offs_m, offs_d, sq2, sq3, L, D)                  # (BM, BD)
    k_base = K + b64 * sk0 + hk * sk1
    v_base = V + b64 * sv0 + hk * sv1
    m_i = tl.full([BM], NEG_INF, tl.float32)                 # running max (base 2)
    l_i = tl.full([BM], 0.0, tl.float32)                     # running sum
    acc = tl.full([BM, BDV], 0.0, tl.float32)                # unnormalized output
    row = b * tile_b + tl.program_id(0)
    for r in range(tl.load(PTR + row), tl.load(PTR + row + 1)):
        k0 = tl.load(RUNS + 4 * r)
        k1 = tl.load(RUNS + 4 * r + 1)
        # One call site (one pipelined loop, one set of shared-memory buffers) for both kinds of run.
        acc, l_i, m_i = _fwd_span(acc, l_i, m_i, q, k_base, v_base, sk2, sk3, sv2, sv3, offs_m, offs_d, offs_dv,
                                  b, h, bh, k0, k1, tl.load(RUNS + 4 * r + 3), L, S, D, DV, qk_scale,
                                  PADS, DOCS, DENSEM, LAY, BITMAP, MP, BIAS, BP, SEEDS, threshold, inv_keep,
                                  BM, BN, MFLAGS, BIAS_KIND, DROPOUT, IEEE, tl.load(RUNS + 4 * r + 2) == 1)
    has = l_i > 0.0
    out = acc / tl.where(has, l_i, 1.0)[:, None]             # rows with l == 0 -> 0
    tl.store(O + b64 * so0 + h * so1 + offs_m[:, None] * so2 + offs_dv[None, :] * so3,
             cast(out, O.dtype.element_ty), mask=(offs_m < L)[:, None] & (offs_dv < DV)[None, :])
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), NEG_INF)
    tl.store(LSE + bh.to(tl.int64) * L + offs_m, lse, mask=offs_m < L)
