// FlashAttention-2 forward on the CPU: one parallel region over (batch, head, query tile).
//
// For each query tile (BQ rows) the kernel visits only the key range its rows may attend, in
// chunks of BK keys. Per chunk: one GEMM S = Q K^T into a (BQ, BK) buffer that stays in cache,
// the logits row by row (scale, softcap, bias, mask) over each row's exact allowed columns, the
// online softmax (running max m and sum l per row; Milakov & Gimelshein 2018), and one GEMM
// O += P V. The division by l is deferred to the end (Dao 2023), and the per-row log-sum-exp is
// saved for the backward pass and for ring attention's merge. The two GEMMs run on the AVX-512
// micro-kernel (microkernel.h) where it applies, else on the BLAS of gemm.cpp.
#include "amx.h"
#include "microkernel.h"
#include "native.h"

namespace attnlab {
namespace {

// One row of a block: logits, the online-softmax update of m[r], l[r] and o's row, and the row
// turned into probabilities (exp(s - m) on the allowed columns, 0 elsewhere up to ncols).
template <typename acc_t>
void softmax_row(const Problem<acc_t>& pb, int64_t b, int64_t h, int64_t r0, int64_t r, int64_t c0, int64_t ncols,
                 const RowPlan& rp, acc_t* row, acc_t* m, acc_t* l, acc_t* o, acc_t prescale) {
  using Vec = at::vec::Vectorized<acc_t>;
  const int64_t VW = Vec::size();
  const acc_t ninf = -std::numeric_limits<acc_t>::infinity();
  const int8_t kind = rp.kind[r];
  if (kind == kEmpty) { std::fill(row, row + ncols, acc_t(0)); return; }
  const int64_t a = rp.a[r], e = rp.e[r], i = r0 + r;
  if (prescale != acc_t(1)) {                     // the scale, where the GEMM had no alpha (AMX)
    const Vec vs(prescale);
    int64_t j = a;
    for (; j + VW <= e; j += VW) (Vec::loadu(row + j) * vs).store(row + j);
    for (; j < e; ++j) row[j] *= prescale;
  }
  row_logits(pb, b, h, i, c0, kind, a, e, row, static_cast<acc_t*>(nullptr));
  // running max over the allowed columns only
  acc_t mx = ninf;
  {
    int64_t j = a;
    Vec vmx(ninf);
    for (; j + VW <= e; j += VW) vmx = at::vec::maximum(vmx, Vec::loadu(row + j));
    mx = hmax(vmx);
    for (; j < e; ++j) mx = nan_max(mx, row[j]);
  }
  const acc_t m_new = nan_max(m[r], mx);
  if (m_new == ninf) { std::fill(row, row + ncols, acc_t(0)); return; }   // nothing allowed yet
  const acc_t corr = std::exp(m[r] - m_new);                        // 0 when m was -inf
  m[r] = m_new;
  // p = exp(s - m) on [a, e), zeros around it
  acc_t sum = 0;
  {
    const Vec vm(m_new);
    Vec vsum(acc_t(0));
    int64_t j = a;
    for (; j + VW <= e; j += VW) {
      Vec p = vexp(Vec::loadu(row + j) - vm);
      p.store(row + j);
      vsum = vsum + p;
    }
    sum = hsum(vsum);
    for (; j < e; ++j) { row[j] = std::exp(row[j] - m_new); sum += row[j]; }
  }
  std::fill(row, row + a, acc_t(0));
  std::fill(row + e, row + ncols, acc_t(0));
  l[r] = l[r] * corr + sum;
  if (corr != acc_t(1)) {
    acc_t* orow = o + r * pb.Dv;
    for (int64_t d = 0; d < pb.Dv; ++d) orow[d] *= corr;
  }
  if (pb.drop.p > 0.0) {    // dropout acts on the weights applied to V, not on the sum l
    const uint64_t st = pb.drop.row_state(static_cast<uint64_t>(b * pb.H + h), static_cast<uint64_t>(i));
    const acc_t inv = static_cast<acc_t>(pb.drop.inv_keep);
    for (int64_t j = a; j < e; ++j)
      row[j] = pb.drop.keep(st, static_cast<uint64_t>(c0 + j)) ? row[j] * inv : acc_t(0);
  }
}

// The AMX path's row: softmax_row's result written straight as bfloat16 probabilities into `pr`
// (ncols, zeros outside the row's keys), the GEMM's missing scale applied on the way. A plain row
// (no bias, softcap, dropout or per-key mask; scale > 0, which keeps the order of the scores) takes
// two passes over the raw scores: their max, then exp(scale * s - m) with its sum and its rounding
// to bfloat16 in one. Any other row runs softmax_row and is rounded after.
void softmax_row_bf16(const Problem<float>& pb, int64_t b, int64_t h, int64_t r0, int64_t r, int64_t c0,
                      int64_t ncols, const RowPlan& rp, float* row, float* m, float* l, float* o, float scale,
                      at::BFloat16* pr) {
  const int8_t kind = rp.kind[r];
  const at::BFloat16 zero(0.0f);
  const bool plain = kind != kEmpty && kind != kMasked && pb.softcap == 0.0 && pb.bias_kind == 0 &&
                     pb.drop.p == 0.0 && scale > 0.0f;
  if (!plain) {
    softmax_row(pb, b, h, r0, r, c0, ncols, rp, row, m, l, o, scale);
    at::vec::convert(row, pr, ncols);
    return;
  }
  const int64_t a = rp.a[r], e = rp.e[r];
  const float m_new = nan_max(m[r], row_max(row, a, e) * scale);
  if (m_new == -std::numeric_limits<float>::infinity()) {            // every score -inf (inf inputs)
    std::fill(pr, pr + ncols, zero);
    return;
  }
  const float corr = std::exp(m[r] - m_new);
  m[r] = m_new;
  std::fill(pr, pr + a, zero);
  const float sum = row_exp_bf16(row, a, e, scale, m_new, pr);
  std::fill(pr + e, pr + ncols, zero);
  l[r] = l[r] * corr + sum;
  if (corr != 1.0f) {
    float* orow = o + r * pb.Dv;
    for (int64_t d = 0; d < pb.Dv; ++d) orow[d] *= corr;
  }
}

template <typename scalar_t>
void forward_kernel(const Problem<typename Acc<scalar_t>::type>& pb, const scalar_t* q, const int64_t* qs,
                    const scalar_t* k, const int64_t* ks, const scalar_t* v, const int64_t* vs, scalar_t* out,
                    const int64_t* os, typename Acc<scalar_t>::type* lse, const PackedKV* pk) {
  using acc_t = typename Acc<scalar_t>::type;
  const int64_t nq = pb.n_qtiles();
  const acc_t ninf = -std::numeric_limits<acc_t>::infinity();
  const acc_t alpha_qk = qk_alpha(pb);
  // On the micro-kernel (float32, bfloat16; microkernel.h): K comes packed in groups of 16 keys (and V
  // in key pairs for bfloat16), so key chunks start on a multiple of 16 and S = Q K^T spans whole
  // groups (ncols); O += P V reads only the tile's keys [kfirst, khi).
  // On AMX (bfloat16; amx.h): K^T is packed as columns, so a chunk may start at any even key (V is read
  // as key pairs); brgemm has no alpha, so the scale is applied in the softmax pass.
  const bool tiles16 = pk != nullptr && !pk->amx, amx = pk != nullptr && pk->amx;
  // Row stride of the score and probability blocks: on AMX 16 past BK, so that rows 2 KB apart (BK = 512
  // floats) do not share L1 sets; brgemm writes and the softmax reads them a row at a time.
  const int64_t lds = amx ? pb.BK + 16 : pb.BK;

  at::parallel_for(0, pb.B * pb.H * nq, 1, [&](int64_t begin, int64_t end) {
    const OneBlasThread one_blas_thread;                 // same sums at any thread count
    const AmxRelease amx_release(amx);
    // Per-thread scratch, allocated once per call.
    std::vector<acc_t> s(pb.BQ * lds);                   // (BQ, BK) logits, then probabilities (row stride lds)
    std::vector<scalar_t> p_in(std::is_same_v<scalar_t, acc_t> ? 0 : pb.BQ * lds);   // P rounded for the GEMM
    std::vector<acc_t> o(pb.BQ * pb.Dv);                 // (BQ, Dv) unnormalized output
    std::vector<acc_t> m(pb.BQ), l(pb.BQ);               // running max and sum per row
    RowPlan rp(pb.BQ);

    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t b = unit / (pb.H * nq), h = (unit / nq) % pb.H, t = unit % nq;
      const int64_t hk = h / pb.G, bhk = b * pb.Hkv + hk;
      const int64_t r0 = t * pb.BQ, nr = std::min(pb.BQ, pb.L - r0);
      const scalar_t* qt = q + b * qs[0] + h * qs[1] + r0 * qs[2];
      const scalar_t* kb = k + b * ks[0] + hk * ks[1];
      const scalar_t* vb = v + b * vs[0] + hk * vs[1];
      std::fill(o.begin(), o.begin() + nr * pb.Dv, acc_t(0));
      std::fill(m.begin(), m.begin() + nr, ninf);
      std::fill(l.begin(), l.begin() + nr, acc_t(0));

      int64_t klo, khi;
      tile_key_range(pb, pb.spans_sb ? b : 0, r0, r0 + nr, klo, khi);
      const int64_t kfirst = klo;
      if (tiles16) klo = klo / 16 * 16;
      if (amx) klo = klo / 2 * 2;                          // key pairs
      for (int64_t c0 = klo; c0 < khi; c0 += pb.BK) {
        const int64_t c1 = std::min(c0 + pb.BK, khi), nk = c1 - c0;
        const int64_t ncols = tiles16 ? (nk + 15) / 16 * 16 : amx ? (nk + 1) / 2 * 2 : nk;
        bool all_full;
        if (!plan_rows(pb, b, h, r0, nr, c0, c1, rp, all_full)) continue;       // an EMPTY block
        if constexpr (!std::is_same_v<scalar_t, double>) {
          if (tiles16)
            rows_by_groups(qt, qs[2], nr, pk->k_groups, b * pb.Hkv + hk, pk->S16, pb.D, c0, ncols, alpha_qk, s.data(),
                           lds);
        }
        if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
          if (amx)
            amx_gemm(nr, ncols, pb.D, qt, qs[2], amx_head(pk->k_cols, bhk, pk->ld_cols, pb.D) + c0, pk->ld_cols, s.data(),
                     lds, false);
        }
        if (!tiles16 && !amx)
          gemm(false, true, nr, nk, pb.D, alpha_qk, qt, qs[2], kb + c0 * ks[2], ks[2], acc_t(0), s.data(), lds);

        for (int64_t r = 0; r < nr; ++r) {
          if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
            if (amx) {
              softmax_row_bf16(pb, b, h, r0, r, c0, ncols, rp, s.data() + r * lds, m.data(), l.data(), o.data(),
                               alpha_qk, p_in.data() + r * lds);
              continue;
            }
          }
          softmax_row(pb, b, h, r0, r, c0, ncols, rp, s.data() + r * lds, m.data(), l.data(), o.data(), acc_t(1));
          if (tiles16 && !std::is_same_v<scalar_t, acc_t>)
            at::vec::convert(s.data() + r * lds, p_in.data() + r * lds, ncols);
        }
        if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
          if (amx) {     // O += P V over the chunk's key pairs (P is 0 outside each row's keys; see pack_for_amx)
            amx_gemm(nr, pb.Dv, ncols, p_in.data(), lds, amx_head(pk->v_pairs, bhk, pk->S16, pb.Dv) + c0 / 2 * pb.Dv,
                     pb.Dv, o.data(), pb.Dv, true);
            continue;
          }
          if (tiles16) {
            bf16_rows_by_pairs(p_in.data(), lds, nr, pk->v_pairs, b * pb.Hkv + hk, pk->S16, pb.Dv, c0,
                                 std::max<int64_t>(kfirst - c0, 0), nk, 1.0f, o.data(), pb.Dv);
            continue;
          }
        } else if constexpr (std::is_same_v<scalar_t, float>) {
          if (tiles16) {
            fp32_rows_by_rows(s.data(), lds, nr, vb + c0 * vs[2], vs[2], pb.Dv, std::max<int64_t>(kfirst - c0, 0),
                              nk, 1.0f, o.data(), pb.Dv);
            continue;
          }
        }
        const scalar_t* p = as_input(s.data(), p_in.data(), nr * lds);
        gemm(false, false, nr, pb.Dv, nk, acc_t(1), p, lds, vb + c0 * vs[2], vs[2], acc_t(1), o.data(), pb.Dv);
      }
      // out = o / l; lse = m + log l; rows that saw nothing: 0 and -inf
      for (int64_t r = 0; r < nr; ++r) {
        scalar_t* orow = out + b * os[0] + h * os[1] + (r0 + r) * os[2];
        const acc_t* acc = o.data() + r * pb.Dv;
        const bool seen = l[r] > acc_t(0);
        const acc_t inv = seen ? acc_t(1) / l[r] : acc_t(0);
        for (int64_t d = 0; d < pb.Dv; ++d) orow[d] = static_cast<scalar_t>(acc[d] * inv);
        lse[(b * pb.H + h) * pb.L + r0 + r] =
            seen ? static_cast<acc_t>(m[r] + std::log(l[r])) : ninf;
      }
    }
  });
}

}  // namespace

template <typename scalar_t>
void run_forward(const Problem<typename Acc<scalar_t>::type>& pb, const at::Tensor& q, const at::Tensor& k,
                 const at::Tensor& v, at::Tensor& out, at::Tensor& lse) {
  const int64_t qs[3] = {q.stride(0), q.stride(1), q.stride(2)}, ks[3] = {k.stride(0), k.stride(1), k.stride(2)};
  const int64_t vs[3] = {v.stride(0), v.stride(1), v.stride(2)}, os[3] = {out.stride(0), out.stride(1), out.stride(2)};
  PackedKV packed;
  const PackedKV* pk = nullptr;
  if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
    if (pack_for_amx(pb, k.data_ptr<scalar_t>(), ks, v.data_ptr<scalar_t>(), vs, false, packed)) pk = &packed;
  }
  if constexpr (!std::is_same_v<scalar_t, double>) {
    if (pk == nullptr && uses_tiles(pb)) {
      packed = pack_kv(k.data_ptr<scalar_t>(), ks, v.data_ptr<scalar_t>(), vs, pb.B, pb.Hkv, pb.S, pb.D, pb.Dv,
                       false);
      pk = &packed;
    }
  }
  forward_kernel<scalar_t>(pb, q.data_ptr<scalar_t>(), qs, k.data_ptr<scalar_t>(), ks, v.data_ptr<scalar_t>(), vs,
                           out.data_ptr<scalar_t>(), os, lse.data_ptr<typename Acc<scalar_t>::type>(), pk);
}

template void run_forward<float>(const Problem<float>&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                 at::Tensor&, at::Tensor&);
template void run_forward<double>(const Problem<double>&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                  at::Tensor&, at::Tensor&);
template void run_forward<at::BFloat16>(const Problem<float>&, const at::Tensor&, const at::Tensor&,
                                        const at::Tensor&, at::Tensor&, at::Tensor&);

}  // namespace attnlab
