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
#include "scores.h"

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

// Pointers and strides of one backward call.
template <typename scalar_t>
struct BackwardIO {
  const scalar_t *q, *k, *v;
  const int64_t *qs, *ks, *vs;                // (batch, head, row) strides
  const Grads<scalar_t>& g;
  const PackedKV* pk;                         // packed K and V, or nullptr (the BLAS path)
};

// One thread's share of the backward pass: its scratch, allocated once per call, and one (b, h) at a
// time. Per query tile: plan (start_tile: dO's rows and the tile's operand layouts); per key chunk of
// it: plan (plan_rows), products (scores: S = Q K^T), softmax (probabilities: P = exp(S - lse), then
// dropped), products (value_products: dV, dP), the softmax's gradient (score_grads: dS and the bias
// gradient), products (query_key_products: dQ, dK); then the write-back of dQ (finish_tile) and, on
// AMX, of dK and dV (finish_head).
template <typename scalar_t>
class BackwardHead {
 public:
  using acc_t = typename Acc<scalar_t>::type;
  using Vec = at::vec::Vectorized<acc_t>;
  static constexpr bool kSame = std::is_same_v<scalar_t, acc_t>;
  static constexpr bool kBf16 = std::is_same_v<scalar_t, at::BFloat16>, kF32 = std::is_same_v<scalar_t, float>;

  BackwardHead(const Problem<acc_t>& pb, const BackwardIO<scalar_t>& io)
      : pb_(pb), io_(io), g_(io.g), amx_(io.pk != nullptr && io.pk->amx), tiles16_(io.pk != nullptr && !amx_),
        rows_(std::min(pb.BQ, pb.L)), S16_(io.pk != nullptr ? io.pk->S16 : 0),
        half_(kBf16 && io.pk != nullptr ? (rows_ + 1) / 2 : 0), BQe_(2 * half_),
        // Row stride of the (BQ, BK) blocks: on AMX 16 past BK, so that rows 2 KB apart (BK = 512 floats) do not
        // share L1 sets (as in the forward; brgemm writes them and the softmax reads them a row at a time).
        lds_(amx_ ? pb.BK + 16 : pb.BK), scale_(static_cast<acc_t>(pb.scale)),
        s_(rows_ * lds_), dp_(rows_ * lds_), th_(pb.softcap != 0.0 ? rows_ * lds_ : 0),
        pd_(pb.drop.p > 0.0 ? rows_ * lds_ : 0), conv_(kSame ? 0 : rows_ * lds_), dq_(rows_ * pb.D),
        dout_t_(rows_ * pb.Dv), rp_(rows_),
        opair_(half_ * pb.Dv), qpair_(half_ * pb.D), ppair_(half_ * pb.BK), dspair_(half_ * pb.BK),
        dout_cols_(amx_ ? pb.Dv * BQe_ : 0), q_cols_(amx_ ? pb.D * BQe_ : 0), dv_cols_(amx_ ? pb.Dv * S16_ : 0),
        dk_cols_(amx_ ? pb.D * S16_ : 0) {}

  // The gradients of (b, h) = divmod(bh, H): its query tiles in order, each over the key chunks its rows
  // may attend.
  void run(int64_t bh) {
    start_head(bh);
    for (int64_t t = 0; t < pb_.n_qtiles(); ++t) {
      start_tile(t);
      const KeyWalk w = key_walk(pb_, b_, r0_, nr_, tiles16_, amx_);
      for (int64_t c0 = w.klo; c0 < w.khi; c0 += pb_.BK) {
        const int64_t c1 = std::min(c0 + pb_.BK, w.khi), nk = c1 - c0;
        const int64_t ncols = io_.pk != nullptr ? (nk + 15) / 16 * 16 : nk;   // columns computed (0 past nk)
        const int64_t ka = std::max<int64_t>(w.kfirst - c0, 0);              // the tile's first key in the chunk
        bool all_full;
        if (!plan_rows(pb_, b_, h_, r0_, nr_, c0, c1, rp_, all_full)) continue;
        const RowBounds bounds = row_bounds(rp_, all_full);
        scores(c0, nk, ncols, bounds);
        probabilities(c0, nk, ncols);
        value_products(dropped(c0, ncols), c0, ka, nk, ncols, bounds);
        score_grads(c0, ncols);
        query_key_products(c0, ka, nk, ncols, bounds);
      }
      finish_tile();
    }
    finish_head();
  }

 private:
  // Plan: the head's operands; AMX's transposed dK and dV cleared.
  void start_head(int64_t bh) {
    bh_ = bh;
    b_ = bh / pb_.H;
    h_ = bh % pb_.H;
    const int64_t hk = h_ / pb_.G;
    bhk_ = b_ * pb_.Hkv + hk;
    kb_ = io_.k + b_ * io_.ks[0] + hk * io_.ks[1];
    vb_ = io_.v + b_ * io_.vs[0] + hk * io_.vs[1];
    dkb_ = g_.dk + bh * pb_.S * pb_.D;
    dvb_ = g_.dv + bh * pb_.S * pb_.Dv;
    std::fill(dv_cols_.begin(), dv_cols_.end(), acc_t(0));
    std::fill(dk_cols_.begin(), dk_cols_.end(), acc_t(0));
  }

  // Plan: query tile t's rows of dO (contiguous), its lse and delta, dQ cleared, and the operands' layouts
  // its products read (bfloat16 tiles: dO and Q as pairs of rows; AMX: dO^T and Q^T).
  void start_tile(int64_t t) {
    r0_ = t * pb_.BQ;
    nr_ = std::min(pb_.BQ, pb_.L - r0_);
    nre_ = (nr_ + 1) / 2 * 2;                                   // AMX: the rows' pairs
    qt_ = io_.q + b_ * io_.qs[0] + h_ * io_.qs[1] + r0_ * io_.qs[2];
    for (int64_t r = 0; r < nr_; ++r)
      std::copy_n(g_.dout + b_ * g_.ds[0] + h_ * g_.ds[1] + (r0_ + r) * g_.ds[2], pb_.Dv, dout_t_.data() + r * pb_.Dv);
    lse_ = g_.lse + bh_ * pb_.L + r0_;
    delta_ = g_.delta + bh_ * pb_.L + r0_;
    std::fill(dq_.begin(), dq_.begin() + nr_ * pb_.D, acc_t(0));
    if constexpr (kBf16) {
      if (tiles16_) {
        pair_rows(dout_t_.data(), pb_.Dv, nr_, pb_.Dv, opair_.data());
        pair_rows(qt_, io_.qs[2], nr_, pb_.D, qpair_.data());
      }
      if (amx_) {
        transpose_rows(dout_t_.data(), pb_.Dv, nr_, BQe_, pb_.Dv, dout_cols_.data(), BQe_);
        transpose_rows(qt_, io_.qs[2], nr_, BQe_, pb_.D, q_cols_.data(), BQe_);
      }
    }
  }

  // S = Q K^T over the chunk's keys [c0, c0 + ncols) (scaled, except on AMX); on the micro-kernel's tiles only
  // what each row block's bounds hold (probabilities reads a row within its [a, e) only).
  void scores(int64_t c0, int64_t nk, int64_t ncols, RowBounds bounds) {
    chunk_scores(pb_, io_.pk, qt_, io_.qs[2], kb_, io_.ks[2], bhk_, nr_, c0, nk, ncols, s_.data(), lds_, bounds);
  }

  // P = exp(S - lse) over each row's allowed columns; zeros elsewhere (NaN rows stay NaN).
  void probabilities(int64_t c0, int64_t nk, int64_t ncols) {
    nan_rows_ = false;
    for (int64_t r = 0; r < nr_; ++r) {
      acc_t* row = s_.data() + r * lds_;
      const int8_t kind = rp_.kind[r];
      const acc_t lse_r = lse_[r];
      if (kind == kEmpty || lse_r == -std::numeric_limits<acc_t>::infinity()) {
        std::fill(row, row + ncols, acc_t(0));
        rp_.kind[r] = kEmpty;
        continue;
      }
      const int64_t a = rp_.a[r], e = rp_.e[r];
      if (std::isnan(lse_r)) {                                   // a NaN row: NaN over all its keys
        nan_rows_ = true;
        std::fill(row, row + nk, lse_r);
        std::fill(row + nk, row + ncols, acc_t(0));
        continue;
      }
      bool fused = false;                                        // plain row on AMX: scale and exp in one pass
      if constexpr (std::is_same_v<acc_t, float>) {
        fused = amx_ && raw_logits(pb_, kind);
        if (fused) row_exp_inplace(row, a, e, scale_, lse_r);
      }
      if (!fused) {
        if (amx_) scale_row(row, a, e, scale_);                   // the scale brgemm did not apply
        row_logits(pb_, b_, h_, r0_ + r, c0, kind, a, e, row, th_.empty() ? nullptr : th_.data() + r * lds_);
        exp_range(row, row, a, e, lse_r);
      }
      std::fill(row, row + a, acc_t(0));
      std::fill(row + e, row + ncols, acc_t(0));
    }
  }

  // P with dropout applied (what multiplied V in the forward pass): P itself without dropout.
  const acc_t* dropped(int64_t c0, int64_t ncols) {
    if (pb_.drop.p == 0.0) return s_.data();
    const acc_t inv = static_cast<acc_t>(pb_.drop.inv_keep);
    for (int64_t r = 0; r < nr_; ++r) {
      const uint64_t st = pb_.drop.row_state(static_cast<uint64_t>(bh_), static_cast<uint64_t>(r0_ + r));
      for (int64_t j = 0; j < ncols; ++j)
        pd_[r * lds_ + j] = pb_.drop.keep(st, static_cast<uint64_t>(c0 + j)) ? s_[r * lds_ + j] * inv : acc_t(0);
    }
    return pd_.data();
  }

  // dV += Pd^T dO over the tile's keys in the chunk [c0 + ka, c0 + nk); dP = dO V^T. On the tiles both within
  // the bounds (score_grads reads a row within its [a, e) only), except dV where a NaN row's P is NaN past them.
  void value_products(const acc_t* pv, int64_t c0, int64_t ka, int64_t nk, int64_t ncols, RowBounds bounds) {
    const PackedKV* pk = io_.pk;
    if (tiles16_) {     // fp32 reads Pd's rows as they are; bfloat16 as pairs of rows
      const RowBounds p_bounds = nan_rows_ ? RowBounds{} : bounds;
      if constexpr (kF32) {
        fp32_columns_by_rows(pv, lds_, ka, nk, dout_t_.data(), pb_.Dv, pb_.Dv, nr_, 1.0f, dvb_ + (c0 + ka) * pb_.Dv,
                             pb_.Dv, p_bounds);
      } else if constexpr (kBf16) {
        pair_rows(pv, lds_, nr_, ncols, ppair_.data());
        bf16_columns_by_pairs(ppair_.data(), ncols, ka, nk, opair_.data(), pb_.Dv, nr_, 1.0f,
                              dvb_ + (c0 + ka) * pb_.Dv, pb_.Dv, p_bounds);
      }
      if constexpr (!std::is_same_v<scalar_t, double>)
        rows_by_groups(dout_t_.data(), pb_.Dv, nr_, pk->v_groups, bhk_, S16_, pb_.Dv, c0, ncols, 1.0f, dp_.data(),
                       lds_, bounds);
      return;
    }
    if constexpr (kBf16) {
      if (amx_) {       // dV^T[:, c0 + ka : c0 + nk] += dO^T Pd
        pair_rows(pv, lds_, nr_, ncols, ppair_.data());
        amx_gemm(pb_.Dv, nk - ka, nre_, dout_cols_.data(), BQe_, ppair_.data() + ka, ncols, dv_cols_.data() + c0 + ka,
                 S16_, true);
        amx_gemm(nr_, ncols, pb_.Dv, dout_t_.data(), pb_.Dv, amx_head(pk->v_cols, bhk_, pk->ld_cols, pb_.Dv) + c0,
                 pk->ld_cols, dp_.data(), lds_, false);
        return;
      }
    }
    gemm(true, false, nk, pb_.Dv, nr_, acc_t(1), as_input(pv, conv_.data(), nr_ * lds_), lds_, dout_t_.data(),
         pb_.Dv, acc_t(1), dvb_ + c0 * pb_.Dv, pb_.Dv);
    gemm(false, true, nr_, nk, pb_.Dv, acc_t(1), dout_t_.data(), pb_.Dv, vb_ + c0 * io_.vs[2], io_.vs[2], acc_t(0),
         dp_.data(), lds_);
  }

  // dS = P o (dP o Z / keep - delta), in dP's place; the bias gradient; then the softcap's derivative.
  void score_grads(int64_t c0, int64_t ncols) {
    const int64_t VW = Vec::size();
    for (int64_t r = 0; r < nr_; ++r) {
      acc_t* dsr = dp_.data() + r * lds_;
      const acc_t* pr = s_.data() + r * lds_;
      if (rp_.kind[r] == kEmpty) { std::fill(dsr, dsr + ncols, acc_t(0)); continue; }
      const int64_t a = rp_.a[r], e = rp_.e[r], i = r0_ + r;
      if (pb_.drop.p > 0.0) {
        const uint64_t st = pb_.drop.row_state(static_cast<uint64_t>(bh_), static_cast<uint64_t>(i));
        const acc_t inv = static_cast<acc_t>(pb_.drop.inv_keep);
        for (int64_t j = a; j < e; ++j)
          dsr[j] = pb_.drop.keep(st, static_cast<uint64_t>(c0 + j)) ? dsr[j] * inv : acc_t(0);
      }
      const Vec vd(delta_[r]);
      int64_t j = a;
      for (; j + VW <= e; j += VW) (Vec::loadu(pr + j) * (Vec::loadu(dsr + j) - vd)).store(dsr + j);
      for (; j < e; ++j) dsr[j] = pr[j] * (dsr[j] - delta_[r]);
      std::fill(dsr, dsr + a, acc_t(0));
      std::fill(dsr + e, dsr + ncols, acc_t(0));
      if (g_.dbias != nullptr && pb_.bias_kind == 1) {          // dense: dbias[b, h, i, c0 + j] = dS
        acc_t* out = g_.dbias + (bh_ * pb_.L + i) * pb_.S + c0;
        std::copy(dsr + a, dsr + e, out + a);
      } else if (g_.dbias != nullptr && pb_.bias_kind == 2) {   // table: dT[idx(j - i)] += dS
        acc_t* trow = g_.dbias + bh_ * (g_.dbias_sl ? pb_.L * g_.dbias_sl : pb_.tW) + i * g_.dbias_sl;
        for (int64_t jj = a; jj < e; ++jj) {
          const int64_t idx = std::min<int64_t>(std::max<int64_t>(c0 + jj - i + pb_.tc0, 0), pb_.tW - 1);
          trow[idx] += dsr[jj];
        }
      }
      if (!th_.empty()) {                                     // d softcap(x) / dx = 1 - tanh^2
        const acc_t* tr = th_.data() + r * lds_;
        for (int64_t jj = a; jj < e; ++jj) dsr[jj] *= acc_t(1) - tr[jj] * tr[jj];
      }
    }
  }

  // dQ += scale dS K;  dK[c0 + ka : c0 + nk] += scale dS^T Q (the tile's keys only). dS is 0 outside each row's
  // keys, which the tiles skip by the bounds. On AMX dK is kept transposed and both scales wait for the write-back.
  void query_key_products(int64_t c0, int64_t ka, int64_t nk, int64_t ncols, RowBounds bounds) {
    const PackedKV* pk = io_.pk;
    const scalar_t* dsi = as_input(dp_.data(), conv_.data(), nr_ * lds_);
    if constexpr (kF32) {
      if (tiles16_) {
        fp32_rows_by_rows(dp_.data(), lds_, nr_, kb_ + c0 * io_.ks[2], io_.ks[2], pb_.D, ka, nk, scale_, dq_.data(),
                          pb_.D, bounds);
        fp32_columns_by_rows(dp_.data(), lds_, ka, nk, qt_, io_.qs[2], pb_.D, nr_, scale_, dkb_ + (c0 + ka) * pb_.D,
                             pb_.D, bounds);
        return;
      }
    } else if constexpr (kBf16) {
      if (amx_) {       // dK^T[:, c0 + ka : c0 + nk] += Q^T dS
        amx_gemm(nr_, pb_.D, ncols, dsi, lds_, amx_head(pk->k_pairs, bhk_, S16_, pb_.D) + c0 / 2 * pb_.D, pb_.D,
                 dq_.data(), pb_.D, true);
        pair_rows(dp_.data(), lds_, nr_, ncols, dspair_.data());
        amx_gemm(pb_.D, nk - ka, nre_, q_cols_.data(), BQe_, dspair_.data() + ka, ncols, dk_cols_.data() + c0 + ka,
                 S16_, true);
        return;
      }
      if (tiles16_) {
        bf16_rows_by_pairs(dsi, lds_, nr_, pk->k_pairs, bhk_, S16_, pb_.D, c0, ka, nk, scale_, dq_.data(), pb_.D,
                           bounds);
        pair_rows(dp_.data(), lds_, nr_, ncols, dspair_.data());
        bf16_columns_by_pairs(dspair_.data(), ncols, ka, nk, qpair_.data(), pb_.D, nr_, scale_,
                              dkb_ + (c0 + ka) * pb_.D, pb_.D, bounds);
        return;
      }
    }
    gemm(false, false, nr_, pb_.D, nk, scale_, dsi, lds_, kb_ + c0 * io_.ks[2], io_.ks[2], acc_t(1), dq_.data(),
         pb_.D);
    gemm(true, false, nk, pb_.D, nr_, scale_, dsi, lds_, qt_, io_.qs[2], acc_t(1), dkb_ + c0 * pb_.D, pb_.D);
  }

  // Write-back of the tile's dQ (scaled here on AMX).
  void finish_tile() {
    if (amx_)
      for (int64_t x = 0; x < nr_ * pb_.D; ++x) dq_[x] *= scale_;
    std::copy_n(dq_.data(), nr_ * pb_.D, g_.dq + (bh_ * pb_.L + r0_) * pb_.D);
  }

  // Write-back of the head's dK and dV on AMX: dK = scale (dK^T)^T, dV = (dV^T)^T (elsewhere they were
  // accumulated in place).
  void finish_head() {
    if (!amx_) return;
    for (int64_t x = 0; x < pb_.D; ++x)
      for (int64_t j = 0; j < pb_.S; ++j) dkb_[j * pb_.D + x] = scale_ * dk_cols_[x * S16_ + j];
    for (int64_t x = 0; x < pb_.Dv; ++x)
      for (int64_t j = 0; j < pb_.S; ++j) dvb_[j * pb_.Dv + x] = dv_cols_[x * S16_ + j];
  }

  const Problem<acc_t>& pb_;
  const BackwardIO<scalar_t>& io_;
  const Grads<scalar_t>& g_;
  const bool amx_, tiles16_;
  const int64_t rows_;                             // a tile's rows at most: BQ, or L where fewer
  const int64_t S16_, half_, BQe_, lds_;           // BQe_: AMX's query rows rounded up to pairs
  const acc_t scale_;
  std::vector<acc_t> s_, dp_;                      // (rows, BK) P and dP -> dS (row stride lds_)
  std::vector<acc_t> th_;                          // (rows, BK) tanh of the softcap
  std::vector<acc_t> pd_;                          // (rows, BK) P with dropout
  Zeroed<scalar_t> conv_;                          // a (rows, BK) buffer rounded for a GEMM
  std::vector<acc_t> dq_;                          // (rows, D) this tile's dQ
  Zeroed<scalar_t> dout_t_;                        // (rows, Dv) dO rows, contiguous
  RowPlan rp_;
  bool nan_rows_ = false;                          // this chunk has a row whose lse is NaN (probabilities)
  std::vector<uint32_t> opair_, qpair_, ppair_, dspair_;   // bfloat16 tiles: dO, Q, P, dS as pairs of rows
  // AMX: dO^T and Q^T of the tile (Dv x BQe, D x BQe), and this (b, h)'s dV^T, dK^T (Dv x S16, D x S16)
  Zeroed<scalar_t> dout_cols_, q_cols_;
  std::vector<acc_t> dv_cols_, dk_cols_;
  // the current head and tile
  int64_t bh_ = 0, b_ = 0, h_ = 0, bhk_ = 0, r0_ = 0, nr_ = 0, nre_ = 0;
  const scalar_t *kb_ = nullptr, *vb_ = nullptr, *qt_ = nullptr;
  acc_t *dkb_ = nullptr, *dvb_ = nullptr;
  const acc_t *lse_ = nullptr, *delta_ = nullptr;
};

// One parallel region over (batch, head).
template <typename scalar_t>
void backward_kernel(const Problem<typename Acc<scalar_t>::type>& pb, const BackwardIO<scalar_t>& io) {
  const bool amx = io.pk != nullptr && io.pk->amx;
  at::parallel_for(0, pb.B * pb.H, 1, [&](int64_t begin, int64_t end) {
    const OneBlasThread one_blas_thread;                 // same sums at any thread count
    const FlushSubnormals flush_subnormals;              // no microcode assists (native.h)
    const AmxRelease amx_release(amx);
    BackwardHead<scalar_t> head(pb, io);
    for (int64_t bh = begin; bh < end; ++bh) head.run(bh);
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
    if (pk == nullptr && packs_for_tiles<scalar_t>(pb)) {
      packed = pack_kv(k.data_ptr<scalar_t>(), ks, v.data_ptr<scalar_t>(), vs, pb.B, pb.Hkv, pb.S, pb.D, pb.Dv, true);
      pk = &packed;
    }
  }
  const BackwardIO<scalar_t> io{q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(), qs, ks, vs, g, pk};
  backward_kernel<scalar_t>(pb, io);
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
