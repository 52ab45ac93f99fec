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
#include "scores.h"

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
  scale_row(row, a, e, prescale);                 // the scale, where the GEMM had no alpha (AMX)
  row_logits(pb, b, h, i, c0, kind, a, e, row, static_cast<acc_t*>(nullptr));
  // running max over the allowed columns only
  acc_t mx = ninf;
  {
    int64_t j = a;
    Vec vmx(ninf), vmx1(ninf);           // two chains: vmaxps's latency, not its throughput, bounds one
    for (; j + 2 * VW <= e; j += 2 * VW) {
      vmx = at::vec::maximum(vmx, Vec::loadu(row + j));
      vmx1 = at::vec::maximum(vmx1, Vec::loadu(row + j + VW));
    }
    for (; j + VW <= e; j += VW) vmx = at::vec::maximum(vmx, Vec::loadu(row + j));
    mx = hmax(at::vec::maximum(vmx, vmx1));
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
      Vec p = vexp_from(Vec::loadu(row + j), vm);
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

// A bfloat16 row on AMX or the AVX-512 tiles: softmax_row's result written straight as bfloat16 probabilities
// into `pr` (ncols, zeros outside the row's keys), the GEMM's missing scale applied on the way (AMX; the tiles'
// products applied it: scale 1). Two passes over the scores: their max, then exp(scale * s - m) with its sum and
// its rounding to bfloat16 in one. A plain row (no bias, softcap or per-key mask; scale > 0, which keeps the
// order of the scores) takes them over the raw scores; any other row first gets its logits in place (the scale,
// softcap, bias, mask: row_logits). With dropout (applied after the sum) a row runs softmax_row and is rounded
// after.
void softmax_row_bf16(const Problem<float>& pb, int64_t b, int64_t h, int64_t r0, int64_t r, int64_t c0,
                      int64_t ncols, const RowPlan& rp, float* row, float* m, float* l, float* o, float scale,
                      at::BFloat16* pr) {
  const int8_t kind = rp.kind[r];
  const at::BFloat16 zero(0.0f);
  if (kind == kEmpty || pb.drop.p != 0.0) {
    softmax_row(pb, b, h, r0, r, c0, ncols, rp, row, m, l, o, scale);
    at::vec::convert(row, pr, ncols);
    return;
  }
  const int64_t a = rp.a[r], e = rp.e[r];
  if (!raw_logits(pb, kind) || !(scale > 0.0f)) {
    scale_row(row, a, e, scale);
    row_logits(pb, b, h, r0 + r, c0, kind, a, e, row, static_cast<float*>(nullptr));
    scale = 1.0f;
  }
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

// Pointers and (batch, head, row) strides of one forward call.
template <typename scalar_t>
struct ForwardIO {
  using acc_t = typename Acc<scalar_t>::type;
  const scalar_t *q, *k, *v;
  scalar_t* out;
  acc_t* lse;                                           // (B, H, L)
  const int64_t *qs, *ks, *vs, *os;
  const PackedKV* pk;                                   // packed K and V, or nullptr (the BLAS path)
};

// One thread's share of the forward pass: its scratch, allocated once per call, and one query tile
// at a time, in four phases per key chunk: plan (plan_rows), products (scores: S = Q K^T), softmax
// update (softmax: m, l, o rescaled, P), products again (accumulate: O += P V); then write_back.
//
// On the micro-kernel (float32, bfloat16; microkernel.h) K comes packed in groups of 16 keys (and V
// in key pairs for bfloat16), so key chunks start on a multiple of 16 and S = Q K^T spans whole
// groups (ncols); O += P V reads only the tile's keys [kfirst, khi).
// On AMX (bfloat16; amx.h) K^T is packed as columns, so a chunk may start at any even key (V is read
// as key pairs); brgemm has no alpha, so the scale is applied in the softmax pass.
template <typename scalar_t>
class ForwardTiles {
 public:
  using acc_t = typename Acc<scalar_t>::type;

  ForwardTiles(const Problem<acc_t>& pb, const ForwardIO<scalar_t>& io)
      : pb_(pb), io_(io), tiles16_(io.pk != nullptr && !io.pk->amx), amx_(io.pk != nullptr && io.pk->amx),
        // Row stride of the score and probability blocks: on AMX 16 past BK, so that rows 2 KB apart (BK =
        // 512 floats) do not share L1 sets; brgemm writes and the softmax reads them a row at a time.
        lds_(amx_ ? pb.BK + 16 : pb.BK), rows_(std::min(pb.BQ, pb.L)),
        s_(rows_ * lds_), p_in_(std::is_same_v<scalar_t, acc_t> ? 0 : rows_ * lds_), o_(rows_ * pb.Dv), m_(rows_),
        l_(rows_), rp_(rows_) {}

  // The query tile `unit` (over B x H x query tiles): every key chunk its rows may attend, then its rows
  // of out and lse.
  void run(int64_t unit) {
    start(unit);
    const KeyWalk w = key_walk(pb_, b_, r0_, nr_, tiles16_, amx_);
    for (int64_t c0 = w.klo; c0 < w.khi; c0 += pb_.BK) {
      const int64_t c1 = std::min(c0 + pb_.BK, w.khi), nk = c1 - c0;
      const int64_t ncols = tiles16_ ? (nk + 15) / 16 * 16 : amx_ ? (nk + 1) / 2 * 2 : nk;
      bool all_full;
      if (!plan_rows(pb_, b_, h_, r0_, nr_, c0, c1, rp_, all_full)) continue;       // an EMPTY block
      const RowBounds bounds = row_bounds(rp_, all_full);
      scores(c0, nk, ncols, bounds);
      softmax(c0, ncols);
      accumulate(c0, std::max<int64_t>(w.kfirst - c0, 0), nk, ncols, bounds);
    }
    write_back();
  }

 private:
  // Plan: the tile's coordinates and operands; its accumulators cleared.
  void start(int64_t unit) {
    const int64_t nq = pb_.n_qtiles();
    b_ = unit / (pb_.H * nq);
    h_ = (unit / nq) % pb_.H;
    r0_ = unit % nq * pb_.BQ;
    nr_ = std::min(pb_.BQ, pb_.L - r0_);
    const int64_t hk = h_ / pb_.G;
    bhk_ = b_ * pb_.Hkv + hk;
    qt_ = io_.q + b_ * io_.qs[0] + h_ * io_.qs[1] + r0_ * io_.qs[2];
    kb_ = io_.k + b_ * io_.ks[0] + hk * io_.ks[1];
    vb_ = io_.v + b_ * io_.vs[0] + hk * io_.vs[1];
    std::fill(o_.begin(), o_.begin() + nr_ * pb_.Dv, acc_t(0));
    std::fill(m_.begin(), m_.begin() + nr_, -std::numeric_limits<acc_t>::infinity());
    std::fill(l_.begin(), l_.begin() + nr_, acc_t(0));
  }

  // S = Q K^T over the chunk's keys [c0, c0 + ncols) (scaled, except on AMX); on the micro-kernel's tiles only
  // what each row block's bounds hold (the softmax reads a row within its [a, e) only).
  void scores(int64_t c0, int64_t nk, int64_t ncols, RowBounds bounds) {
    chunk_scores(pb_, io_.pk, qt_, io_.qs[2], kb_, io_.ks[2], bhk_, nr_, c0, nk, ncols, s_.data(), lds_, bounds);
  }

  // The online softmax over the chunk, row by row: m, l and o's rows updated, S turned into P (bfloat16 on the
  // tiles and AMX: rounded by softmax_row_bf16 into p_in_; the BLAS path's accumulate rounds it).
  void softmax(int64_t c0, int64_t ncols) {
    for (int64_t r = 0; r < nr_; ++r) {
      acc_t* row = s_.data() + r * lds_;
      if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
        if (amx_ || tiles16_) {     // the tiles' products applied the scale (alpha); brgemm did not
          softmax_row_bf16(pb_, b_, h_, r0_, r, c0, ncols, rp_, row, m_.data(), l_.data(), o_.data(),
                           amx_ ? qk_alpha(pb_) : 1.0f, p_in_.data() + r * lds_);
          continue;
        }
      }
      softmax_row(pb_, b_, h_, r0_, r, c0, ncols, rp_, row, m_.data(), l_.data(), o_.data(), acc_t(1));
    }
  }

  // O += P V over the chunk (ka: the tile's first key in it; P is 0 outside each row's keys, which the tiles skip
  // by the bounds).
  void accumulate(int64_t c0, int64_t ka, int64_t nk, int64_t ncols, RowBounds bounds) {
    const PackedKV* pk = io_.pk;
    if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
      if (amx_) {      // over the chunk's key pairs (see pack_for_amx)
        amx_gemm(nr_, pb_.Dv, ncols, p_in_.data(), lds_, amx_head(pk->v_pairs, bhk_, pk->S16, pb_.Dv) + c0 / 2 * pb_.Dv,
                 pb_.Dv, o_.data(), pb_.Dv, true);
        return;
      }
      if (tiles16_) {
        bf16_rows_by_pairs(p_in_.data(), lds_, nr_, pk->v_pairs, bhk_, pk->S16, pb_.Dv, c0, ka, nk, 1.0f, o_.data(),
                           pb_.Dv, bounds);
        return;
      }
    } else if constexpr (std::is_same_v<scalar_t, float>) {
      if (tiles16_) {
        fp32_rows_by_rows(s_.data(), lds_, nr_, vb_ + c0 * io_.vs[2], io_.vs[2], pb_.Dv, ka, nk, 1.0f, o_.data(),
                          pb_.Dv, bounds);
        return;
      }
    }
    const scalar_t* p = as_input(s_.data(), p_in_.data(), nr_ * lds_);
    gemm(false, false, nr_, pb_.Dv, nk, acc_t(1), p, lds_, vb_ + c0 * io_.vs[2], io_.vs[2], acc_t(1), o_.data(),
         pb_.Dv);
  }

  // Write-back: out = o / l and lse = m + log l; rows that saw nothing get 0 and -inf. Each is rounded
  // once, from double: the backward rebuilds P from lse and delta from out, so their rounding errors
  // reach every gradient (fp32, L = S = 17: out's alone gave dbias 2.7e-6, lse's 1.6e-6, against the fp32
  // reference's 1.2e-6 in all; m + log l in float rounded twice, to 1 ulp).
  void write_back() {
    for (int64_t r = 0; r < nr_; ++r) {
      scalar_t* orow = io_.out + b_ * io_.os[0] + h_ * io_.os[1] + (r0_ + r) * io_.os[2];
      const acc_t* acc = o_.data() + r * pb_.Dv;
      const bool seen = l_[r] > acc_t(0);
      const double l = seen ? static_cast<double>(l_[r]) : 1.0;
      for (int64_t d = 0; d < pb_.Dv; ++d)                    // an unseen row: 0, or NaN where acc is NaN
        orow[d] = static_cast<scalar_t>(seen ? acc[d] / l : acc[d] * 0.0);
      io_.lse[(b_ * pb_.H + h_) * pb_.L + r0_ + r] =
          seen ? static_cast<acc_t>(static_cast<double>(m_[r]) + std::log(l))
               : -std::numeric_limits<acc_t>::infinity();
    }
  }

  const Problem<acc_t>& pb_;
  const ForwardIO<scalar_t>& io_;
  const bool tiles16_, amx_;
  const int64_t lds_;
  const int64_t rows_;             // a tile's rows at most: BQ, or L where fewer (a decoding step's buffers are small)
  std::vector<acc_t> s_;           // (rows, BK) logits, then probabilities (row stride lds_)
  Zeroed<scalar_t> p_in_;          // P rounded for the product with V
  std::vector<acc_t> o_;           // (rows, Dv) unnormalized output
  std::vector<acc_t> m_, l_;       // running max and sum per row
  RowPlan rp_;
  // the current tile
  int64_t b_ = 0, h_ = 0, bhk_ = 0, r0_ = 0, nr_ = 0;
  const scalar_t *qt_ = nullptr, *kb_ = nullptr, *vb_ = nullptr;
};

// One parallel region over (batch, head, query tile).
template <typename scalar_t>
void forward_kernel(const Problem<typename Acc<scalar_t>::type>& pb, const ForwardIO<scalar_t>& io) {
  const bool amx = io.pk != nullptr && io.pk->amx;
  at::parallel_for(0, pb.B * pb.H * pb.n_qtiles(), 1, [&](int64_t begin, int64_t end) {
    const OneBlasThread one_blas_thread;                 // same sums at any thread count
    const FlushSubnormals flush_subnormals;              // no microcode assists (native.h)
    const AmxRelease amx_release(amx);
    ForwardTiles<scalar_t> tiles(pb, io);
    for (int64_t unit = begin; unit < end; ++unit) tiles.run(unit);
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
    if (pk == nullptr && packs_for_tiles<scalar_t>(pb)) {
      packed = pack_kv(k.data_ptr<scalar_t>(), ks, v.data_ptr<scalar_t>(), vs, pb.B, pb.Hkv, pb.S, pb.D, pb.Dv,
                       false);
      pk = &packed;
    }
  }
  const ForwardIO<scalar_t> io{q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
                               out.data_ptr<scalar_t>(), lse.data_ptr<typename Acc<scalar_t>::type>(), qs, ks, vs, os,
                               pk};
  forward_kernel<scalar_t>(pb, io);
}

template void run_forward<float>(const Problem<float>&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                 at::Tensor&, at::Tensor&);
template void run_forward<double>(const Problem<double>&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                  at::Tensor&, at::Tensor&);
template void run_forward<at::BFloat16>(const Problem<float>&, const at::Tensor&, const at::Tensor&,
                                        const at::Tensor&, at::Tensor&, at::Tensor&);

}  // namespace attnlab
