// FlashAttention-2 backward on the CPU: one parallel region over (batch, head).
//
// Each (b, h) owns its dK and dV slices (per query head; GQA groups are summed by the caller) and
// walks its query tiles in order, so no two threads ever write the same memory and the result
// does not depend on the thread count. Per (query tile x key chunk) block, with the saved LSE:
//   P  = exp(S - lse)                      the probabilities, recomputed (never stored)
//   dV += (P o Z / keep)^T dO              Z the dropout keep mask, regenerated from its hash
//   dP = dO V^T o Z / keep
//   dS = P o (dP - delta)                  delta_i = sum_d dO_id O_id (computed by the caller)
//   dQ += scale dS K,  dK += scale dS^T Q  (dS times 1 - tanh^2 under a softcap)
// and the bias gradient dS is written (dense) or summed along the diagonals (relative table).
// float32 and bfloat16 run the five products on the micro-kernel of microkernel.h where D and Dv
// are multiples of 16 (dV += P^T dO reads P by columns: no transposed copy). On AMX (bfloat16,
// amx.h) they run on brgemm, which reads its first operand by rows: there dK and dV are
// accumulated transposed, dK^T += Q^T dS and dV^T += dO^T P (Q^T, dO^T copied once per query tile;
// dS, P as pairs of rows), and turned into rows once per (b, h); brgemm has no alpha, so the scale
// is applied to dQ once per tile and to dK once per (b, h).
#include "amx.h"
#include "microkernel.h"
#include "native.h"

namespace attnlab {
namespace {

template <typename scalar_t>
struct Grads {
  using acc_t = typename Acc<scalar_t>::type;
  const scalar_t* dout; int64_t ds[3];        // (B, H, L, Dv)
  const acc_t* lse;                           // (B, H, L) natural
  const acc_t* delta;                         // (B, H, L)
  acc_t* dq;                                  // (B, H, L, D) contiguous
  acc_t* dk;                                  // (B, H, S, D) contiguous, per query head
  acc_t* dv;                                  // (B, H, S, Dv) contiguous, per query head
  acc_t* dbias = nullptr;                     // dense: (B, H, L, S) contiguous; table: (B, H, Lt, W)
  int64_t dbias_sl = 0;                       // table: row stride (0 when Lt = 1)
};

template <typename scalar_t>
void backward_kernel(const Problem<typename Acc<scalar_t>::type>& pb, const scalar_t* q, const int64_t* qs,
                     const scalar_t* k, const int64_t* ks, const scalar_t* v, const int64_t* vs,
                     const Grads<scalar_t>& g, const PackedKV* pk) {
  using acc_t = typename Acc<scalar_t>::type;
  using Vec = at::vec::Vectorized<acc_t>;
  const int64_t VW = Vec::size();
  const int64_t nq = pb.n_qtiles();
  const acc_t alpha_qk = qk_alpha(pb);
  const acc_t scale = static_cast<acc_t>(pb.scale);
  constexpr bool same = std::is_same_v<scalar_t, acc_t>;
  constexpr bool bf16 = std::is_same_v<scalar_t, at::BFloat16>, f32 = std::is_same_v<scalar_t, float>;
  const bool amx = pk != nullptr && pk->amx, tiles16 = pk != nullptr && !amx;
  const int64_t S16 = pk != nullptr ? pk->S16 : 0, half = bf16 && pk != nullptr ? (pb.BQ + 1) / 2 : 0;
  const int64_t BQe = 2 * half;                                    // AMX: query rows rounded up to pairs

  at::parallel_for(0, pb.B * pb.H, 1, [&](int64_t begin, int64_t end) {
    const OneBlasThread one_blas_thread;                 // same sums at any thread count
    const AmxRelease amx_release(amx);
    std::vector<acc_t> s(pb.BQ * pb.BK), dp(pb.BQ * pb.BK);     // (BQ, BK) P and dP -> dS
    std::vector<acc_t> th(pb.softcap != 0.0 ? pb.BQ * pb.BK : 0);  // (BQ, BK) tanh of the softcap
    std::vector<acc_t> pd(pb.drop.p > 0.0 ? pb.BQ * pb.BK : 0);    // (BQ, BK) P with dropout
    std::vector<scalar_t> conv(same ? 0 : pb.BQ * pb.BK);          // a (BQ, BK) buffer rounded for a GEMM
    std::vector<acc_t> dq(pb.BQ * pb.D);                           // (BQ, D) this tile's dQ
    std::vector<scalar_t> dout_t(pb.BQ * pb.Dv);                   // (BQ, Dv) dO rows, contiguous
    RowPlan rp(pb.BQ);
    // bf16 tiles' operands: dO, Q, P, dS as pairs of rows
    std::vector<uint32_t> opair(half * pb.Dv), qpair(half * pb.D), ppair(half * pb.BK), dspair(half * pb.BK);
    // AMX: dO^T and Q^T of the tile (Dv x BQe, D x BQe), and this (b, h)'s dV^T, dK^T (Dv x S16, D x S16)
    std::vector<scalar_t> dout_cols(amx ? pb.Dv * BQe : 0), q_cols(amx ? pb.D * BQe : 0);
    std::vector<acc_t> dv_cols(amx ? pb.Dv * S16 : 0), dk_cols(amx ? pb.D * S16 : 0);

    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / pb.H, h = bh % pb.H, hk = h / pb.G;
      const scalar_t* kb = k + b * ks[0] + hk * ks[1];
      const scalar_t* vb = v + b * vs[0] + hk * vs[1];
      acc_t* dkb = g.dk + bh * pb.S * pb.D;
      acc_t* dvb = g.dv + bh * pb.S * pb.Dv;
      const int64_t bhk = b * pb.Hkv + hk;
      std::fill(dv_cols.begin(), dv_cols.end(), acc_t(0));
      std::fill(dk_cols.begin(), dk_cols.end(), acc_t(0));
      for (int64_t t = 0; t < nq; ++t) {
        const int64_t r0 = t * pb.BQ, nr = std::min(pb.BQ, pb.L - r0);
        const scalar_t* qt = q + b * qs[0] + h * qs[1] + r0 * qs[2];
        for (int64_t r = 0; r < nr; ++r)
          std::copy_n(g.dout + b * g.ds[0] + h * g.ds[1] + (r0 + r) * g.ds[2], pb.Dv, dout_t.data() + r * pb.Dv);
        const acc_t* lse = g.lse + bh * pb.L + r0;
        const acc_t* delta = g.delta + bh * pb.L + r0;
        std::fill(dq.begin(), dq.begin() + nr * pb.D, acc_t(0));
        if constexpr (bf16) {
          if (tiles16) {
            pair_rows(dout_t.data(), pb.Dv, nr, pb.Dv, opair.data());
            pair_rows(qt, qs[2], nr, pb.D, qpair.data());
          }
          if (amx) {
            transpose_rows(dout_t.data(), pb.Dv, nr, BQe, pb.Dv, dout_cols.data(), BQe);
            transpose_rows(qt, qs[2], nr, BQe, pb.D, q_cols.data(), BQe);
          }
        }
        const int64_t nre = (nr + 1) / 2 * 2;                     // AMX: the rows' pairs

        int64_t klo, khi;
        tile_key_range(pb, pb.spans_sb ? b : 0, r0, r0 + nr, klo, khi);
        const int64_t kfirst = klo;
        if (tiles16) klo = klo / 16 * 16;                        // the tiles' key groups start on 16
        if (amx) klo = klo / 2 * 2;                              // AMX: key pairs
        for (int64_t c0 = klo; c0 < khi; c0 += pb.BK) {
          const int64_t c1 = std::min(c0 + pb.BK, khi), nk = c1 - c0;
          const int64_t ncols = pk != nullptr ? (nk + 15) / 16 * 16 : nk;   // columns computed (0 past nk)
          const int64_t ka = std::max<int64_t>(kfirst - c0, 0);      // this tile's first key in the chunk
          bool all_full;
          if (!plan_rows(pb, b, h, r0, nr, c0, c1, rp, all_full)) continue;
          if constexpr (!std::is_same_v<scalar_t, double>) {
            if (tiles16)
              rows_by_groups(qt, qs[2], nr, pk->k_groups, bhk, S16, pb.D, c0, ncols, alpha_qk, s.data(), pb.BK);
          }
          if constexpr (bf16) {
            if (amx)
              amx_gemm(nr, ncols, pb.D, qt, qs[2], amx_head(pk->k_cols, bhk, pk->ld_cols, pb.D) + c0, pk->ld_cols,
                       s.data(), pb.BK, false);
          }
          if (pk == nullptr)
            gemm(false, true, nr, nk, pb.D, alpha_qk, qt, qs[2], kb + c0 * ks[2], ks[2], acc_t(0), s.data(), pb.BK);
          // P = exp(S - lse) over each row's allowed columns; zeros elsewhere (NaN rows stay NaN)
          for (int64_t r = 0; r < nr; ++r) {
            acc_t* row = s.data() + r * pb.BK;
            const int8_t kind = rp.kind[r];
            const acc_t lse_r = lse[r];
            if (kind == kEmpty || lse_r == -std::numeric_limits<acc_t>::infinity()) {
              std::fill(row, row + ncols, acc_t(0));
              rp.kind[r] = kEmpty;
              continue;
            }
            const int64_t a = rp.a[r], e = rp.e[r];
            if (std::isnan(lse_r)) {                                   // exp_u20 would hide a NaN
              std::fill(row, row + nk, lse_r);
              std::fill(row + nk, row + ncols, acc_t(0));
              continue;
            }
            if (amx) {                                               // the scale brgemm did not apply
              const Vec vs(scale);
              int64_t j = a;
              for (; j + VW <= e; j += VW) (Vec::loadu(row + j) * vs).store(row + j);
              for (; j < e; ++j) row[j] *= scale;
            }
            row_logits(pb, b, h, r0 + r, c0, kind, a, e, row, th.empty() ? nullptr : th.data() + r * pb.BK);
            const Vec vl(lse_r);
            int64_t j = a;
            for (; j + VW <= e; j += VW) vexp(Vec::loadu(row + j) - vl).store(row + j);
            for (; j < e; ++j) row[j] = std::exp(row[j] - lse_r);
            std::fill(row, row + a, acc_t(0));
            std::fill(row + e, row + ncols, acc_t(0));
          }
          // P with dropout applied (what multiplied V in the forward pass)
          const acc_t* pv = s.data();
          if (pb.drop.p > 0.0) {
            const acc_t inv = static_cast<acc_t>(pb.drop.inv_keep);
            for (int64_t r = 0; r < nr; ++r) {
              const uint64_t st = pb.drop.row_state(static_cast<uint64_t>(bh), static_cast<uint64_t>(r0 + r));
              for (int64_t j = 0; j < ncols; ++j)
                pd[r * pb.BK + j] = pb.drop.keep(st, static_cast<uint64_t>(c0 + j)) ? s[r * pb.BK + j] * inv : acc_t(0);
            }
            pv = pd.data();
          }
          if (tiles16) {     // dV[c0 + ka : c1] += Pd^T dO (fp32 reads the rows as they are);  dP = dO V^T
            if constexpr (f32) {
              fp32_columns_by_rows(pv, pb.BK, ka, nk, dout_t.data(), pb.Dv, pb.Dv, nr, 1.0f, dvb + (c0 + ka) * pb.Dv,
                                   pb.Dv);
            } else if constexpr (bf16) {
              pair_rows(pv, pb.BK, nr, ncols, ppair.data());
              bf16_columns_by_pairs(ppair.data(), ncols, ka, nk, opair.data(), pb.Dv, nr, 1.0f, dvb + (c0 + ka) * pb.Dv,
                                    pb.Dv);
            }
            if constexpr (!std::is_same_v<scalar_t, double>)
              rows_by_groups(dout_t.data(), pb.Dv, nr, pk->v_groups, bhk, S16, pb.Dv, c0, ncols, 1.0f, dp.data(), pb.BK);
          }
          if constexpr (bf16) {
            if (amx) {     // dV^T[:, c0 + ka : c1] += dO^T Pd;  dP = dO V^T
              pair_rows(pv, pb.BK, nr, ncols, ppair.data());
              amx_gemm(pb.Dv, nk - ka, nre, dout_cols.data(), BQe, ppair.data() + ka, ncols, dv_cols.data() + c0 + ka,
                       S16, true);
              amx_gemm(nr, ncols, pb.Dv, dout_t.data(), pb.Dv, amx_head(pk->v_cols, bhk, pk->ld_cols, pb.Dv) + c0,
                       pk->ld_cols, dp.data(), pb.BK, false);
            }
          }
          if (pk == nullptr) {
            // dV[c0:c1] += Pd^T dO
            gemm(true, false, nk, pb.Dv, nr, acc_t(1), as_input(pv, conv.data(), nr * pb.BK), pb.BK, dout_t.data(),
                 pb.Dv, acc_t(1), dvb + c0 * pb.Dv, pb.Dv);
            // dP = dO V^T
            gemm(false, true, nr, nk, pb.Dv, acc_t(1), dout_t.data(), pb.Dv, vb + c0 * vs[2], vs[2], acc_t(0),
                 dp.data(), pb.BK);
          }
          // dS = P o (dP o Z / keep - delta), then the softcap's derivative; bias gradients
          for (int64_t r = 0; r < nr; ++r) {
            acc_t* dsr = dp.data() + r * pb.BK;
            const acc_t* pr = s.data() + r * pb.BK;
            if (rp.kind[r] == kEmpty) { std::fill(dsr, dsr + ncols, acc_t(0)); continue; }
            const int64_t a = rp.a[r], e = rp.e[r], i = r0 + r;
            if (pb.drop.p > 0.0) {
              const uint64_t st = pb.drop.row_state(static_cast<uint64_t>(bh), static_cast<uint64_t>(i));
              const acc_t inv = static_cast<acc_t>(pb.drop.inv_keep);
              for (int64_t j = a; j < e; ++j)
                dsr[j] = pb.drop.keep(st, static_cast<uint64_t>(c0 + j)) ? dsr[j] * inv : acc_t(0);
            }
            const Vec vd(delta[r]);
            int64_t j = a;
            for (; j + VW <= e; j += VW) (Vec::loadu(pr + j) * (Vec::loadu(dsr + j) - vd)).store(dsr + j);
            for (; j < e; ++j) dsr[j] = pr[j] * (dsr[j] - delta[r]);
            std::fill(dsr, dsr + a, acc_t(0));
            std::fill(dsr + e, dsr + ncols, acc_t(0));
            if (g.dbias != nullptr && pb.bias_kind == 1) {          // dense: dbias[b, h, i, c0 + j] = dS
              acc_t* out = g.dbias + (bh * pb.L + i) * pb.S + c0;
              std::copy(dsr + a, dsr + e, out + a);
            } else if (g.dbias != nullptr && pb.bias_kind == 2) {   // table: dT[idx(j - i)] += dS
              acc_t* trow = g.dbias + bh * (g.dbias_sl ? pb.L * g.dbias_sl : pb.tW) + i * g.dbias_sl;
              for (int64_t jj = a; jj < e; ++jj) {
                int64_t idx = std::min<int64_t>(std::max<int64_t>(c0 + jj - i + pb.tc0, 0), pb.tW - 1);
                trow[idx] += dsr[jj];
              }
            }
            if (!th.empty()) {                                     // d softcap(x) / dx = 1 - tanh^2
              const acc_t* tr = th.data() + r * pb.BK;
              for (int64_t jj = a; jj < e; ++jj) dsr[jj] *= acc_t(1) - tr[jj] * tr[jj];
            }
          }
          const scalar_t* dsi = as_input(dp.data(), conv.data(), nr * pb.BK);
          if constexpr (f32) {
            if (tiles16) {   // dQ += scale dS K;  dK[c0 + ka : c1] += scale dS^T Q (keys [kfirst, c1) only)
              fp32_rows_by_rows(dp.data(), pb.BK, nr, kb + c0 * ks[2], ks[2], pb.D, ka, nk, scale, dq.data(), pb.D);
              fp32_columns_by_rows(dp.data(), pb.BK, ka, nk, qt, qs[2], pb.D, nr, scale, dkb + (c0 + ka) * pb.D, pb.D);
              continue;
            }
          } else if constexpr (bf16) {
            if (amx) {       // dQ += dS K (scaled per tile);  dK^T[:, c0 + ka : c1] += Q^T dS (scaled per (b, h))
              amx_gemm(nr, pb.D, ncols, dsi, pb.BK, amx_head(pk->k_pairs, bhk, S16, pb.D) + c0 / 2 * pb.D, pb.D,
                       dq.data(), pb.D, true);
              pair_rows(dp.data(), pb.BK, nr, ncols, dspair.data());
              amx_gemm(pb.D, nk - ka, nre, q_cols.data(), BQe, dspair.data() + ka, ncols, dk_cols.data() + c0 + ka, S16,
                       true);
              continue;
            }
            if (tiles16) {   // dQ += scale dS K;  dK[c0 + ka : c1] += scale dS^T Q (keys [kfirst, c1) only)
              bf16_rows_by_pairs(dsi, pb.BK, nr, pk->k_pairs, bhk, S16, pb.D, c0, ka, nk, scale, dq.data(), pb.D);
              pair_rows(dp.data(), pb.BK, nr, ncols, dspair.data());
              bf16_columns_by_pairs(dspair.data(), ncols, ka, nk, qpair.data(), pb.D, nr, scale, dkb + (c0 + ka) * pb.D,
                                    pb.D);
              continue;
            }
          }
          // dQ += scale dS K;  dK[c0:c1] += scale dS^T Q
          gemm(false, false, nr, pb.D, nk, scale, dsi, pb.BK, kb + c0 * ks[2], ks[2], acc_t(1), dq.data(), pb.D);
          gemm(true, false, nk, pb.D, nr, scale, dsi, pb.BK, qt, qs[2], acc_t(1), dkb + c0 * pb.D, pb.D);
        }
        if (amx)
          for (int64_t x = 0; x < nr * pb.D; ++x) dq[x] *= scale;
        std::copy_n(dq.data(), nr * pb.D, g.dq + (bh * pb.L + r0) * pb.D);
      }
      if (amx) {                       // dK = scale (dK^T)^T, dV = (dV^T)^T
        for (int64_t x = 0; x < pb.D; ++x)
          for (int64_t j = 0; j < pb.S; ++j) dkb[j * pb.D + x] = scale * dk_cols[x * S16 + j];
        for (int64_t x = 0; x < pb.Dv; ++x)
          for (int64_t j = 0; j < pb.S; ++j) dvb[j * pb.Dv + x] = dv_cols[x * S16 + j];
      }
    }
  });
}

}  // namespace

template <typename scalar_t>
void run_backward(const Problem<typename Acc<scalar_t>::type>& pb, const at::Tensor& q, const at::Tensor& k,
                  const at::Tensor& v, const at::Tensor& dout, const at::Tensor& lse, const at::Tensor& delta,
                  at::Tensor& dq, at::Tensor& dk, at::Tensor& dv, at::Tensor* dbias) {
  using acc_t = typename Acc<scalar_t>::type;
  const int64_t qs[3] = {q.stride(0), q.stride(1), q.stride(2)}, ks[3] = {k.stride(0), k.stride(1), k.stride(2)};
  const int64_t vs[3] = {v.stride(0), v.stride(1), v.stride(2)};
  Grads<scalar_t> g;
  g.dout = dout.data_ptr<scalar_t>();
  g.ds[0] = dout.stride(0); g.ds[1] = dout.stride(1); g.ds[2] = dout.stride(2);
  g.lse = lse.data_ptr<acc_t>();
  g.delta = delta.data_ptr<acc_t>();
  g.dq = dq.data_ptr<acc_t>();
  g.dk = dk.data_ptr<acc_t>();
  g.dv = dv.data_ptr<acc_t>();
  if (dbias != nullptr) {
    g.dbias = dbias->data_ptr<acc_t>();
    g.dbias_sl = (pb.bias_kind == 2 && dbias->size(2) > 1) ? pb.tW : 0;
  }
  PackedKV packed;
  const PackedKV* pk = nullptr;
  if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
    if (pack_for_amx(pb, k.data_ptr<scalar_t>(), ks, v.data_ptr<scalar_t>(), vs, true, packed)) pk = &packed;
  }
  if constexpr (!std::is_same_v<scalar_t, double>) {
    if (pk == nullptr && uses_tiles(pb)) {
      packed = pack_kv(k.data_ptr<scalar_t>(), ks, v.data_ptr<scalar_t>(), vs, pb.B, pb.Hkv, pb.S, pb.D, pb.Dv, true);
      pk = &packed;
    }
  }
  backward_kernel<scalar_t>(pb, q.data_ptr<scalar_t>(), qs, k.data_ptr<scalar_t>(), ks, v.data_ptr<scalar_t>(), vs, g,
                            pk);
}

template void run_backward<float>(const Problem<float>&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                  const at::Tensor&, const at::Tensor&, const at::Tensor&, at::Tensor&, at::Tensor&,
                                  at::Tensor&, at::Tensor*);
template void run_backward<double>(const Problem<double>&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   const at::Tensor&, const at::Tensor&, const at::Tensor&, at::Tensor&, at::Tensor&,
                                   at::Tensor&, at::Tensor*);
template void run_backward<at::BFloat16>(const Problem<float>&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         at::Tensor&, at::Tensor&, at::Tensor&, at::Tensor*);

}  // namespace attnlab
