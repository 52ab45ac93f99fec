// The compiled CPU attention kernel: what the forward and backward passes share.
//
// Layout (the package's one convention): q (B, H, L, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv),
// out (B, H, L, Dv); query head h reads kv head h / (H / Hkv). Inputs may have any strides: where
// the last dim is contiguous and the sequence stride is at least the row width (the GEMMs take it
// as a leading dimension), as in (B, L, H, D) views, they are read without a copy; anything else is
// copied once per call at the boundary (bindings.cpp, readable).
//
// The mask reaches the kernel in two forms that can be combined (AND):
//   spans  (Bm, L, K, 2) int64: per query row, K half-open key intervals [lo, hi) it may attend
//          (causal, window, padding, contiguous documents and their & combinations; Mask.row_spans);
//   bits   (Bb, Hb, L, W64) int64 words: a bit-packed dense mask (bit j % 64 of word j / 64),
//          for masks with no interval form; read only where the spans leave a row partial.
// Rows are what the kernel skips by: a query tile visits only the key range its rows' spans cover,
// and within a key chunk each row is EMPTY (skipped), FULL (no mask work) or masked in registers.
//
// Biases: a dense tensor (Bb, Hb, L|1, S|1) with any strides (stride 0 = broadcast), or a relative
// table T (Bt, Ht, Lt, W) read as T[b, h, i (or 0), clamp(j - i + c0, 0, W - 1)]: ALiBi and T5 (a
// function of j - i only, Lt = 1) and Shaw's key term (one row per query, Lt = L) all fit, and the
// table is O(n), never (B, H, L, S).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "microkernel.h"
#include "vecmath.h"

namespace attnlab {

// A scratch buffer of n zeroed elements. std::vector<T>(n) zeroes a bfloat16 vector one 2-byte store at a time, a
// loop GCC does not turn into a memset: ~50 us for a (256, 512) tile buffer, per thread and call, on the AMD Zen 4
// -- most of a bfloat16 decoding step. This one allocates without constructing (DefaultInit) and zeroes the bytes.
template <typename T>
struct DefaultInit : std::allocator<T> {
  template <typename U> struct rebind { using other = DefaultInit<U>; };
  template <typename U> void construct(U* p) { ::new (static_cast<void*>(p)) U; }
  template <typename U, typename... Args> void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

template <typename T>
class Zeroed : public std::vector<T, DefaultInit<T>> {
  static_assert(std::is_trivially_copyable_v<T>, "zeroed as bytes");

 public:
  explicit Zeroed(int64_t n = 0) : std::vector<T, DefaultInit<T>>(static_cast<size_t>(n)) {
    if (n > 0) std::memset(this->data(), 0, static_cast<size_t>(n) * sizeof(T));
  }
};

// Row states inside one (query tile x key chunk) block.
enum RowKind : int8_t { kEmpty = 0, kRange = 1, kMasked = 2, kFull = 3 };

// ---------------------------------------------------------------------------------------------
// GEMM on tiles: row-major C (M x N, ldc) = alpha * op(A) op(B) + beta * C, with A, B in the input
// type and C in the accumulation type (float for float and bfloat16, double for double). Resolved
// at load time to the BLAS inside libtorch_cpu (MKL's sgemm_/dgemm_/cblas_gemm_bf16bf16f32) and
// to a plain loop where a symbol is missing (gemm.cpp says which ran: blas_name()).
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
          const double* B, int64_t ldb, double beta, double* C, int64_t ldc);
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const at::BFloat16* A,
          int64_t lda, const at::BFloat16* B, int64_t ldb, float beta, float* C, int64_t ldc);
std::string blas_name();

// While alive, this thread's MKL calls run on one MKL thread. Each thread of the kernel's parallel
// region calls GEMMs on its own tiles; left to itself, MKL threads a call made outside a parallel
// region (a problem with one work unit) but not one made inside it, and its threaded and
// single-threaded paths sum in different orders: the fp32 results then moved with the thread
// count (8e-7 in outputs at D = 65, 1.4e-6 in gradients). Pinned, they are the same bits at any
// thread count (tests/test_native.py). A no-op where MKL's mkl_set_num_threads_local is absent (gemm.cpp).
class OneBlasThread {
 public:
  OneBlasThread();
  ~OneBlasThread();
  OneBlasThread(const OneBlasThread&) = delete;
  OneBlasThread& operator=(const OneBlasThread&) = delete;

 private:
  int previous_ = 0;
};

// While alive, this thread's float arithmetic flushes subnormal results to zero (MXCSR's FTZ bit; the old state comes
// back after). On the Xeon with AMX every vector product or multiply that made a subnormal took a microcode assist,
// and attention makes them wherever weights fall far below a row's max: ALiBi's far keys, a rescaled accumulator,
// products of tiny weights with values below 1 (fp32 forward with ALiBi + causal at n = 4096 took six times the
// causal forward's time; docs/benchmarks.md, "Issue #27: float16 on the Xeon with AMX, and subnormal weights"). A
// weight below 2^-126 beside a row's largest, 1, lies far below fp32's rounding of their sum; AMX's bf16 products
// flush them anyway. Subnormal inputs are still read as they are (no DAZ). A no-op off x86.
class FlushSubnormals {
 public:
#if defined(__SSE__) || defined(__x86_64__)
  FlushSubnormals() : previous_(_mm_getcsr()) { _mm_setcsr(previous_ | _MM_FLUSH_ZERO_ON); }
  ~FlushSubnormals() { _mm_setcsr(previous_); }
#endif
  FlushSubnormals(const FlushSubnormals&) = delete;
  FlushSubnormals& operator=(const FlushSubnormals&) = delete;

 private:
  unsigned int previous_ = 0;
};

template <typename T> struct Acc { using type = T; };
template <> struct Acc<at::BFloat16> { using type = float; };

// ---------------------------------------------------------------------------------------------
// Counter-based dropout: the same hash as attnlab.functional.dropout.keep_at, so the kernel keeps
// exactly the entries the reference keeps for a seed, under any tiling, and the backward pass
// regenerates the mask instead of storing it.
struct Dropout {
  double p = 0.0;
  uint64_t seed = 0, threshold = 0;
  double inv_keep = 1.0;
  static uint64_t mix(uint64_t x) {
    constexpr uint64_t M32 = 0xFFFFFFFFull, MUL = 0x45D9F3Bull;
    x ^= x >> 16;
    x = (x * MUL) & M32;
    x ^= x >> 16;
    x = (x * MUL) & M32;
    return x ^ (x >> 16);
  }
  // keep(bh, i, j): bh = b * H + h, i the query row, j the key
  uint64_t row_state(uint64_t bh, uint64_t i) const {
    constexpr uint64_t M32 = 0xFFFFFFFFull;
    uint64_t x = mix((bh + (seed & M32) * 0x9E37ull) & M32);
    return mix((x ^ (i * 0x85EBull)) & M32);
  }
  bool keep(uint64_t row, uint64_t j) const {
    return mix((row ^ (j * 0xC2B2AE3ull)) & 0xFFFFFFFFull) >= threshold;
  }
};

// ---------------------------------------------------------------------------------------------
// Everything about one call that is not a per-thread buffer.
template <typename acc_t>
struct Problem {
  int64_t B, H, Hkv, G, L, S, D, Dv;
  int64_t BQ, BK;                          // query tile rows, key chunk columns
  double scale, softcap;                   // softcap 0: none
  // mask
  const int64_t* spans = nullptr;          // (Bm, L, K, 2) contiguous
  int64_t spans_sb = 0, K = 0;
  const uint64_t* bits = nullptr;          // (Bb, Hb, L, W64) contiguous words
  int64_t bits_sb = 0, bits_sh = 0, W64 = 0;
  // bias: 0 none, 1 dense, 2 relative table
  int bias_kind = 0;
  const acc_t* bias = nullptr;
  int64_t bsb = 0, bsh = 0, bsl = 0, bss = 0;     // dense strides; table: b, h, row strides
  int64_t tW = 0, tc0 = 0;                        // table width and offset
  Dropout drop;

  int64_t n_qtiles() const { return (L + BQ - 1) / BQ; }

  // The K intervals [lo, hi) of query row i of batch b (spans given), a broadcast batch read at 0.
  const int64_t* row_spans(int64_t b, int64_t i) const {
    return spans + (spans_sb ? b : 0) * spans_sb + i * K * 2;
  }

  // The words of query row i of (b, h), broadcast dims read at 0.
  const uint64_t* row_words(int64_t b, int64_t h, int64_t i) const {
    return bits + (bits_sb ? b : 0) * bits_sb + (bits_sh ? h : 0) * bits_sh + i * W64;
  }
};

// A word with at most this many unset keys masks them one by one (mask_unset_bits).
constexpr int kFewUnset = 8;

// Bits [lo, hi) of a 64-bit word set (0 <= lo < hi <= 64).
inline uint64_t bits_between(int64_t lo, int64_t hi) {
  return hi - lo == 64 ? ~uint64_t(0) : ((uint64_t(1) << (hi - lo)) - 1) << lo;
}

// Per row of a (query tile x key chunk) block: its kind and the columns [a, e) (chunk-relative)
// that hold all its allowed keys.
struct RowPlan {
  std::vector<int8_t> kind;
  std::vector<int32_t> a, e;
  explicit RowPlan(int64_t n = 0) : kind(n), a(n), e(n) {}
};

// What the micro-kernel's products may skip of a planned block: nothing where every row is FULL, else the columns
// outside each row's [a, e) (microkernel.h, RowBounds).
inline RowBounds row_bounds(const RowPlan& rp, bool all_full) {
  return all_full ? RowBounds{} : RowBounds{rp.a.data(), rp.e.data()};
}

// Key range [lo, hi) that rows r0..r1 of (b) may attend (hi <= lo: nothing).
template <typename acc_t>
inline void tile_key_range(const Problem<acc_t>& pb, int64_t b, int64_t r0, int64_t r1, int64_t& lo, int64_t& hi) {
  if (pb.spans == nullptr) { lo = 0; hi = pb.S; return; }
  lo = pb.S; hi = 0;
  for (int64_t i = r0; i < r1; ++i) {
    const int64_t* iv = pb.row_spans(b, i);
    for (int64_t k = 0; k < pb.K; ++k) {
      int64_t l = std::max<int64_t>(iv[2 * k], 0), h = std::min<int64_t>(iv[2 * k + 1], pb.S);
      if (l < h) { lo = std::min(lo, l); hi = std::max(hi, h); }
    }
  }
}

// The key chunks one query tile walks: from klo to khi in steps of BK, klo rounded down to where the
// packed operands' groups start (16 keys on the micro-kernel's tiles, key pairs on AMX); kfirst is the
// tile's own first key (products on packed operands may start before it, with weight 0 there).
struct KeyWalk {
  int64_t klo, khi, kfirst;
};

template <typename acc_t>
inline KeyWalk key_walk(const Problem<acc_t>& pb, int64_t b, int64_t r0, int64_t nr, bool tiles16, bool amx) {
  KeyWalk w{};
  tile_key_range(pb, b, r0, r0 + nr, w.klo, w.khi);
  w.kfirst = w.klo;
  if (tiles16) w.klo = w.klo / 16 * 16;
  if (amx) w.klo = w.klo / 2 * 2;
  return w;
}

// Classify the rows of one block; returns false when every row is EMPTY (skip the block) and sets
// all_full when no row needs mask work.
template <typename acc_t>
inline bool plan_rows(const Problem<acc_t>& pb, int64_t b, int64_t h, int64_t r0, int64_t nr, int64_t c0,
                      int64_t c1, RowPlan& rp, bool& all_full) {
  bool any = false;
  all_full = true;
  for (int64_t r = 0; r < nr; ++r) {
    const int64_t i = r0 + r;
    int64_t a = c1, e = c0, nk = 0;
    bool full = false;
    if (pb.spans == nullptr) {
      a = c0; e = c1; nk = 1; full = true;
    } else {
      const int64_t* iv = pb.row_spans(b, i);
      for (int64_t k = 0; k < pb.K; ++k) {
        int64_t l = std::max(iv[2 * k], c0), hh = std::min(iv[2 * k + 1], c1);
        if (l < hh) {
          a = std::min(a, l); e = std::max(e, hh); ++nk;
          if (l == c0 && hh == c1) full = true;
        }
      }
    }
    int8_t kind;
    if (a >= e) kind = kEmpty;
    else if (full) kind = kFull;
    else if (nk == 1) kind = kRange;        // one interval: [a, e) is exact
    else kind = kMasked;                    // several: test each key against the spans
    if (kind != kEmpty && pb.bits != nullptr) {
      // A dense mask refines the row: are all, or none, of its bits in [a, e) set? A word at a time (its bits
      // in [a, e) against a mask of them): a row inside its range (tiles.bit_spans) reads all its bits, and
      // one by one that was 20 ms of a 140 ms forward at n = 4096 (causal key padding given densely, Zen 3).
      const uint64_t* words = pb.row_words(b, h, i);
      bool all = true, none = true;
      for (int64_t j = a; j < e && (all || none);) {
        const int64_t w = j >> 6, lo = j & 63, hi = std::min<int64_t>(64, e - (w << 6));   // bits [lo, hi) of word w
        const uint64_t want = bits_between(lo, hi);
        const uint64_t got = words[w] & want;
        all = all && got == want;
        none = none && got == 0;
        j = (w << 6) + hi;
      }
      if (none) kind = kEmpty;
      else if (!all) kind = kMasked;
    }
    rp.kind[r] = kind;
    rp.a[r] = static_cast<int32_t>(a - c0);
    rp.e[r] = static_cast<int32_t>(e - c0);
    any = any || kind != kEmpty;
    all_full = all_full && kind == kFull;
  }
  return any;
}

// Keys [j, end) (absolute) of one row whose bit in `words` is unset get -inf in s (s[0] is key c0), a 64-bit
// word at a time. A word with few unset keys sets them one by one (its trailing zeros); a whole word with many,
// in float (fp32, bf16 and fp16 accumulate in it), a vector of keys at a time: each lane's bit tested and -inf
// blended in, without a branch per vector. One by one, a random half of the keys masked cost 10-12% of the
// forward, the loop's exit mispredicting; a vector per 8 keys with a skip for a vector with none masked cost
// 4-7% where 1 in 8 are (the skip mispredicting) (Zen 3, n = 1024 and 2048).
template <typename acc_t>
inline void mask_unset_bits(const uint64_t* words, int64_t c0, int64_t j, int64_t end, acc_t* s) {
  const acc_t ninf = -std::numeric_limits<acc_t>::infinity();
  while (j < end) {
    const int64_t w = j >> 6, lo = j & 63, hi = std::min<int64_t>(64, end - (w << 6));   // bits [lo, hi) of word w
    j = (w << 6) + hi;
    uint64_t off = ~words[w] & bits_between(lo, hi);
    if (off == 0) continue;
    if constexpr (std::is_same_v<acc_t, float>) {
      if (hi - lo == 64 && __builtin_popcountll(off) > kFewUnset) {
        using Vec = at::vec::Vectorized<float>;
        using IVec = at::vec::Vectorized<int32_t>;
        constexpr int64_t W = Vec::size();                   // 8 (AVX2) or 16 (AVX-512): a lane per key
        static_assert(64 % W == 0 && IVec::size() == W, "a word holds whole vectors, a lane per key");
        alignas(64) static const int32_t lane_bit[16] = {1 << 0, 1 << 1, 1 << 2,  1 << 3,  1 << 4,  1 << 5,
                                                         1 << 6, 1 << 7, 1 << 8,  1 << 9,  1 << 10, 1 << 11,
                                                         1 << 12, 1 << 13, 1 << 14, 1 << 15};
        const IVec lanes = IVec::loadu(lane_bit), zero(0);
        const Vec minus_inf(ninf);
        acc_t* row = s + ((w << 6) - c0);
        for (int64_t g = 0; g < 64; g += W) {
          const auto set = static_cast<int32_t>((words[w] >> g) & ((uint64_t(1) << W) - 1));
          const IVec masked = (IVec(set) & lanes) == zero;                     // all ones where unset
          Vec::blendv(Vec::loadu(row + g), minus_inf, at::vec::cast<float>(masked)).store(row + g);
        }
        continue;
      }
    }
    for (; off != 0; off &= off - 1) s[(w << 6) + __builtin_ctzll(off) - c0] = ninf;     // its lowest unset key
  }
}

// row[a:e) *= scale, where a product had no alpha to apply it (AMX's brgemm); nothing when scale is 1.
template <typename acc_t>
inline void scale_row(acc_t* row, int64_t a, int64_t e, acc_t scale) {
  if (scale == acc_t(1)) return;
  using Vec = at::vec::Vectorized<acc_t>;
  const Vec vs(scale);
  int64_t j = a;
  for (; j + Vec::size() <= e; j += Vec::size()) (Vec::loadu(row + j) * vs).store(row + j);
  for (; j < e; ++j) row[j] *= scale;
}

// Whether a row's logits are its scaled scores as they are (no softcap, bias or per-key mask: row_logits would
// change nothing), so one pass may fold the scale into the exp (softmax_row_bf16, the backward's probabilities).
template <typename acc_t>
inline bool raw_logits(const Problem<acc_t>& pb, int8_t kind) {
  return kind != kMasked && pb.softcap == 0.0 && pb.bias_kind == 0;
}

// ---------------------------------------------------------------------------------------------
// Logits of one row, in place over columns [a, e) of the chunk starting at key c0:
//   s = scale * q.k  ->  softcap * tanh(s / softcap)  ->  + bias  ->  -inf if masked.
// `s` arrives holding scale * q.k (the GEMM's alpha).
// When `tanh_out` is given the softcap's tanh is kept there (the backward's derivative).
template <typename acc_t>
inline void row_logits(const Problem<acc_t>& pb, int64_t b, int64_t h, int64_t i, int64_t c0, int8_t kind,
                       int64_t a, int64_t e, acc_t* s, acc_t* tanh_out) {
  using Vec = at::vec::Vectorized<acc_t>;
  const int64_t W = Vec::size();
  const bool plain = pb.softcap == 0.0 && pb.bias_kind == 0;
  if (!plain) {
    if (pb.softcap != 0.0) {
      const Vec inv(static_cast<acc_t>(1.0 / pb.softcap)), cap(static_cast<acc_t>(pb.softcap));
      int64_t j = a;
      for (; j + W <= e; j += W) {
        Vec t = (Vec::loadu(s + j) * inv).tanh();
        if (tanh_out) t.store(tanh_out + j);
        (t * cap).store(s + j);
      }
      for (; j < e; ++j) {
        acc_t t = std::tanh(s[j] / static_cast<acc_t>(pb.softcap));
        if (tanh_out) tanh_out[j] = t;
        s[j] = t * static_cast<acc_t>(pb.softcap);
      }
    }
    if (pb.bias_kind == 1) {
      const acc_t* row = pb.bias + b * pb.bsb + h * pb.bsh + i * pb.bsl;
      if (pb.bss == 1) {
        int64_t j = a;
        for (; j + W <= e; j += W) (Vec::loadu(s + j) + Vec::loadu(row + c0 + j)).store(s + j);
        for (; j < e; ++j) s[j] += row[c0 + j];
      } else {
        for (int64_t j = a; j < e; ++j) s[j] += row[(c0 + j) * pb.bss];
      }
    } else if (pb.bias_kind == 2) {
      const acc_t* row = pb.bias + b * pb.bsb + h * pb.bsh + i * pb.bsl;
      const int64_t first = c0 + a - i + pb.tc0, last = c0 + e - 1 - i + pb.tc0;   // table indices
      if (first >= 0 && last < pb.tW) {
        const acc_t* t = row + first;
        int64_t j = a;
        for (; j + W <= e; j += W) (Vec::loadu(s + j) + Vec::loadu(t + (j - a))).store(s + j);
        for (; j < e; ++j) s[j] += t[j - a];
      } else {
        for (int64_t j = a; j < e; ++j) {
          int64_t idx = std::min<int64_t>(std::max<int64_t>(c0 + j - i + pb.tc0, 0), pb.tW - 1);
          s[j] += row[idx];
        }
      }
    }
  }
  if (kind == kMasked) {
    // [a, e) holds the row's allowed keys of the chunk: with one interval exactly its part of the chunk, with
    // several their hull, whose keys are tested against each. Then a dense part's unset bits, a word at a time:
    // key by key this loop cost 4-5x the attention itself on a random dense mask (Zen 3, n = 512).
    const acc_t ninf = -std::numeric_limits<acc_t>::infinity();
    if (pb.spans != nullptr && pb.K > 1) {
      const int64_t* iv = pb.row_spans(b, i);
      for (int64_t j = a; j < e; ++j) {
        bool in = false;
        for (int64_t k = 0; k < pb.K && !in; ++k) in = iv[2 * k] <= c0 + j && c0 + j < iv[2 * k + 1];
        if (!in) s[j] = ninf;
      }
    }
    if (pb.bits != nullptr) mask_unset_bits(pb.row_words(b, h, i), c0, c0 + a, c0 + e, s);
  }
}

// alpha of the QK^T GEMM: the scale.
template <typename acc_t>
inline acc_t qk_alpha(const Problem<acc_t>& pb) {
  return static_cast<acc_t>(pb.scale);
}

// Bias row pointer (dense: its (b, h, i) row; table: its (b, h, i) row), for the backward's gradient.
template <typename acc_t>
inline int64_t bias_row_offset(const Problem<acc_t>& pb, int64_t b, int64_t h, int64_t i) {
  return b * pb.bsb + h * pb.bsh + i * pb.bsl;
}

// Copy (and round) an accumulation-type buffer into the input type for the next GEMM.
template <typename scalar_t, typename acc_t>
inline const scalar_t* as_input(const acc_t* src, scalar_t* scratch, int64_t n) {
  if constexpr (std::is_same_v<scalar_t, acc_t>) {
    return src;
  } else {
    at::vec::convert(src, scratch, n);
    return scratch;
  }
}

}  // namespace attnlab
