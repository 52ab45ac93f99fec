// Tile GEMMs on AVX-512: every product of attention's forward and backward passes, in float32 and
// bfloat16, as one register-blocked micro-kernel (6 rows x 4 vectors of 16 lanes = 24 accumulators).
//
// Why not MKL here: cblas_gemm_bf16bf16f32 (and oneDNN's brgemm without AMX) ran at about fp32
// on the AMD Zen 4 (no AMX)
// speed on these tile shapes (64..256 rows, D = 64), and sgemm_ re-packs K for every query tile
// (~15% of the fp32 forward in a profile). vdpbf16ps does 32 multiply-adds per 512-bit vector --
// twice fp32's FMA -- when its operands hold "pairs": two bfloat16 adjacent along the reduction
// dimension in each 32-bit word. float32 is the same kernel with one element per word and an FMA.
//   C[r, lanes] (+)= alpha * sum_p A[r, p] . B[p, lanes]      (A[r, p], B[p, n]: one pair each)
// A's word is broadcast to all 16 lanes; B is a vector of 16 pairs. A row-major bfloat16 row already
// holds its pairs along the row (Q, dO, P, dS rows); everything else is packed:
//   groups: 16 keys at a time, [X/2][16] words, word (p, n) = (K[16g+n][2p], K[16g+n][2p+1])
//   pairs:  [rows / 2][X] words, word (i, c) = (X[2i][c], X[2i+1][c])
// K and V are packed once per call (O(S D)); dO and Q once per query tile; P and dS per block,
// with a vector conversion. Keys are padded with zeros to a multiple of 16. In float32 a "pair" is
// one element, so rows need no packing: only K (and V, for dP) are packed into groups of 16 keys.
#include "microkernel.h"

#include "kept.h"

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
#define ATTNLAB_TILES 1
#endif

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

namespace attnlab {

bool tiles_built() {
#ifdef ATTNLAB_TILES
  return true;
#else
  return false;
#endif
}

namespace {

inline uint32_t load_word(const void* p) {
  uint32_t w;
  std::memcpy(&w, p, sizeof(w));             // unaligned-safe; one mov
  return w;
}

inline uint32_t pair(at::BFloat16 lo, at::BFloat16 hi) {
  return static_cast<uint32_t>(lo.x) | (static_cast<uint32_t>(hi.x) << 16);
}

// One kv head of x (S rows, X columns) as groups of 16 rows: out[g][p][n] = (x[16g+n][2p], x[16g+n][2p+1]).
void pack_groups(const at::BFloat16* x, int64_t ld, int64_t S, int64_t X, int64_t S16, uint32_t* out) {
  const int64_t P = X / 2;
  for (int64_t g = 0; g < S16 / 16; ++g)        // writes in order; the 16 rows read stay in L1
    for (int64_t p = 0; p < P; ++p) {
      uint32_t* o = out + (g * P + p) * 16;
      for (int64_t n = 0; n < 16; ++n) {
        const int64_t j = 16 * g + n;
        o[n] = j < S ? load_word(x + j * ld + 2 * p) : 0u;
      }
    }
}

}  // namespace

void pair_rows(const at::BFloat16* x, int64_t ld, int64_t n, int64_t X, uint32_t* out) {
  const at::BFloat16 zero(0.0f);
  for (int64_t i = 0; i < n; i += 2) {
    const at::BFloat16* r0 = x + i * ld;
    const at::BFloat16* r1 = i + 1 < n ? r0 + ld : nullptr;
    uint32_t* o = out + (i / 2) * X;
    for (int64_t c = 0; c < X; ++c) o[c] = pair(r0[c], r1 ? r1[c] : zero);
  }
}

void pair_keys(const at::BFloat16* x, int64_t ld, int64_t S, int64_t X, int64_t S16, uint32_t* out) {
  pair_rows(x, ld, S, X, out);
  std::fill(out + (S + 1) / 2 * X, out + S16 / 2 * X, 0u);
}

PackedKV pack_kv(const at::BFloat16* k, const int64_t* ks, const at::BFloat16* v, const int64_t* vs, int64_t B,
                 int64_t Hkv, int64_t S, int64_t D, int64_t Dv, bool backward) {
  PackedKV pk;
  pk.S16 = (S + 15) / 16 * 16;
  auto words = [](const at::Tensor& t) { return reinterpret_cast<uint32_t*>(t.data_ptr<int32_t>()); };
  pk.k_groups = kept_buffer(Kept::k_groups, B * Hkv, pk.S16 * D / 2, at::kInt);
  pk.v_pairs = kept_buffer(Kept::v_pairs, B * Hkv, pk.S16 * Dv / 2, at::kInt);
  if (backward) {
    pk.v_groups = kept_buffer(Kept::v_groups, B * Hkv, pk.S16 * Dv / 2, at::kInt);
    pk.k_pairs = kept_buffer(Kept::k_pairs, B * Hkv, pk.S16 * D / 2, at::kInt);
  }
  at::parallel_for(0, B * Hkv, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / Hkv, h = bh % Hkv;
      const at::BFloat16* kb = k + b * ks[0] + h * ks[1];
      const at::BFloat16* vb = v + b * vs[0] + h * vs[1];
      pack_groups(kb, ks[2], S, D, pk.S16, words(pk.k_groups) + bh * pk.S16 * D / 2);
      pair_keys(vb, vs[2], S, Dv, pk.S16, words(pk.v_pairs) + bh * pk.S16 * Dv / 2);
      if (backward) {
        pack_groups(vb, vs[2], S, Dv, pk.S16, words(pk.v_groups) + bh * pk.S16 * Dv / 2);
        pair_keys(kb, ks[2], S, D, pk.S16, words(pk.k_pairs) + bh * pk.S16 * D / 2);
      }
    }
  });
  return pk;
}

namespace {

// One float32 tensor (B, Hkv, S, X) as groups of 16 keys: out[bh][g][x][n] = t[b, h, 16 g + n, x].
at::Tensor pack_groups(const float* t, const int64_t* ts, int64_t B, int64_t Hkv, int64_t S, int64_t X, Kept slot) {
  const int64_t S16 = (S + 15) / 16 * 16;
  auto out = kept_buffer(slot, B * Hkv, S16 * X, at::kFloat);
  float* o = out.data_ptr<float>();
  at::parallel_for(0, B * Hkv, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      const float* tb = t + (bh / Hkv) * ts[0] + (bh % Hkv) * ts[1];
      float* ob = o + bh * S16 * X;
      for (int64_t g = 0; g < S16 / 16; ++g)    // key 16 g + n -> lane n of row x of group g; writes in order
        for (int64_t x = 0; x < X; ++x)
          for (int64_t n = 0; n < 16; ++n) {
            const int64_t j = 16 * g + n;
            ob[(g * X + x) * 16 + n] = j < S ? tb[j * ts[2] + x] : 0.0f;
          }
    }
  });
  return out;
}

}  // namespace

PackedKV pack_kv(const float* k, const int64_t* ks, const float* v, const int64_t* vs, int64_t B, int64_t Hkv,
                 int64_t S, int64_t D, int64_t Dv, bool backward) {
  PackedKV pk;
  pk.S16 = (S + 15) / 16 * 16;
  pk.k_groups = pack_groups(k, ks, B, Hkv, S, D, Kept::k_groups);
  if (backward) pk.v_groups = pack_groups(v, vs, B, Hkv, S, Dv, Kept::v_groups);
  return pk;
}

#ifdef ATTNLAB_TILES
namespace {

inline __m512bh as_bh(__m512i x) { return (__m512bh)x; }

// C[r, 16 g + n] (+)= alpha * sum_p A[r, p] . B[p, g, n] for MR rows and NG vectors of 16 lanes.
// A's words at a + r * a_row + p * a_pair (bytes); B's vectors at b + p * b_pair + g * b_group (words).
// With Keep, each B word is ANDed with `keep` first (an edge pair with one row outside the range).
template <bool Bf16, int MR, int NG, bool Acc, bool Keep>
inline void dp_block(const char* a, int64_t a_row, int64_t a_pair, const uint32_t* b, int64_t b_pair,
                     int64_t b_group, int64_t pairs, float alpha, float* c, int64_t ldc, uint32_t keep) {
  __m512 acc[MR][NG];
  for (int r = 0; r < MR; ++r)
    for (int g = 0; g < NG; ++g) acc[r][g] = _mm512_setzero_ps();
  const __m512i vkeep = _mm512_set1_epi32(static_cast<int>(keep));
  for (int64_t p = 0; p < pairs; ++p) {
    __m512i bv[NG];
    for (int g = 0; g < NG; ++g) {
      bv[g] = _mm512_loadu_si512(b + p * b_pair + g * b_group);
      if constexpr (Keep) bv[g] = _mm512_and_si512(bv[g], vkeep);
    }
    for (int r = 0; r < MR; ++r) {
      const __m512i av = _mm512_set1_epi32(static_cast<int>(load_word(a + r * a_row + p * a_pair)));
      if constexpr (Bf16) {
        for (int g = 0; g < NG; ++g) acc[r][g] = _mm512_dpbf16_ps(acc[r][g], as_bh(av), as_bh(bv[g]));
      } else {          // fp32: one element per word, one FMA
        for (int g = 0; g < NG; ++g)
          acc[r][g] = _mm512_fmadd_ps(_mm512_castsi512_ps(av), _mm512_castsi512_ps(bv[g]), acc[r][g]);
      }
    }
  }
  const __m512 va = _mm512_set1_ps(alpha);
  for (int r = 0; r < MR; ++r)
    for (int g = 0; g < NG; ++g) {
      float* dst = c + r * ldc + g * 16;
      const __m512 prev = Acc ? _mm512_loadu_ps(dst) : _mm512_setzero_ps();
      _mm512_storeu_ps(dst, _mm512_fmadd_ps(acc[r][g], va, prev));
    }
}

constexpr int kMR = 6;   // 6 rows x 4 vectors = 24 accumulators of the 32 zmm registers

template <bool Bf16, int NG, bool Acc, bool Keep>
void dp_rows(int64_t M, const char* a, int64_t a_row, int64_t a_pair, const uint32_t* b, int64_t b_pair,
             int64_t b_group, int64_t pairs, float alpha, float* c, int64_t ldc, uint32_t keep) {
  int64_t r = 0;
  for (; r + kMR <= M; r += kMR)
    dp_block<Bf16, kMR, NG, Acc, Keep>(a + r * a_row, a_row, a_pair, b, b_pair, b_group, pairs, alpha, c + r * ldc, ldc,
                                 keep);
#define ATTNLAB_TAIL(mr)                                                                                         \
  case mr:                                                                                                       \
    dp_block<Bf16, mr, NG, Acc, Keep>(a + r * a_row, a_row, a_pair, b, b_pair, b_group, pairs, alpha, c + r * ldc, ldc, \
                                keep);                                                                           \
    break;
  switch (M - r) {
    ATTNLAB_TAIL(5) ATTNLAB_TAIL(4) ATTNLAB_TAIL(3) ATTNLAB_TAIL(2) ATTNLAB_TAIL(1)
    default: break;
  }
#undef ATTNLAB_TAIL
}

// C (M, 16 N16; row stride ldc) (+)= alpha * A B over `pairs` pairs, N16 vectors of lanes in steps of 4.
template <bool Acc, bool Keep, bool Bf16 = true>
void dp_gemm(int64_t M, int64_t N16, int64_t pairs, const char* a, int64_t a_row, int64_t a_pair, const uint32_t* b,
             int64_t b_pair, int64_t b_group, float alpha, float* c, int64_t ldc, uint32_t keep = ~0u) {
  if (M <= 0 || pairs <= 0) return;
  int64_t g = 0;
  for (; g + 4 <= N16; g += 4)
    dp_rows<Bf16, 4, Acc, Keep>(M, a, a_row, a_pair, b + g * b_group, b_pair, b_group, pairs, alpha, c + g * 16, ldc, keep);
  const uint32_t* bg = b + g * b_group;
  switch (N16 - g) {
    case 3: dp_rows<Bf16, 3, Acc, Keep>(M, a, a_row, a_pair, bg, b_pair, b_group, pairs, alpha, c + g * 16, ldc, keep); break;
    case 2: dp_rows<Bf16, 2, Acc, Keep>(M, a, a_row, a_pair, bg, b_pair, b_group, pairs, alpha, c + g * 16, ldc, keep); break;
    case 1: dp_rows<Bf16, 1, Acc, Keep>(M, a, a_row, a_pair, bg, b_pair, b_group, pairs, alpha, c + g * 16, ldc, keep); break;
    default: break;
  }
}

const uint32_t* words(const at::Tensor& t) { return reinterpret_cast<const uint32_t*>(t.data_ptr()); }

// dp_block with its rows (1..kMR) and vectors of lanes (1..4) chosen at run time: a bounded block's.
template <bool Bf16, bool Acc, bool Keep, int MR, typename... Args>
void dp_block_ng(int64_t ng, Args... args) {
  switch (ng) {
    case 4: dp_block<Bf16, MR, 4, Acc, Keep>(args...); break;
    case 3: dp_block<Bf16, MR, 3, Acc, Keep>(args...); break;
    case 2: dp_block<Bf16, MR, 2, Acc, Keep>(args...); break;
    case 1: dp_block<Bf16, MR, 1, Acc, Keep>(args...); break;
    default: break;
  }
}

template <bool Bf16, bool Acc, bool Keep, typename... Args>
void dp_block_any(int64_t mr, int64_t ng, Args... args) {
  static_assert(kMR == 6, "one case per row count");
  switch (mr) {
    case 6: dp_block_ng<Bf16, Acc, Keep, 6>(ng, args...); break;
    case 5: dp_block_ng<Bf16, Acc, Keep, 5>(ng, args...); break;
    case 4: dp_block_ng<Bf16, Acc, Keep, 4>(ng, args...); break;
    case 3: dp_block_ng<Bf16, Acc, Keep, 3>(ng, args...); break;
    case 2: dp_block_ng<Bf16, Acc, Keep, 2>(ng, args...); break;
    case 1: dp_block_ng<Bf16, Acc, Keep, 1>(ng, args...); break;
    default: break;
  }
}

// The hull [lo, hi) of the bounds of rows r .. r + mr - 1 (lo >= hi: none of them needs a column).
inline std::pair<int64_t, int64_t> block_hull(const RowBounds& rb, int64_t r, int64_t mr) {
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = 0;
  for (int64_t i = r; i < r + mr; ++i)
    if (rb.a[i] < rb.e[i]) {
      lo = std::min<int64_t>(lo, rb.a[i]);
      hi = std::max<int64_t>(hi, rb.e[i]);
    }
  return {lo, hi};
}

// dp_gemm's C = alpha A B (no accumulation), each block of kMR rows writing only the vectors of 16 columns that
// meet its rows' bounds (columns counted from c's first). The same loop order as dp_gemm: 4 vectors of B at a time
// (one block of K stays in L1), every row block against them.
template <bool Bf16>
void dp_gemm_bounded(int64_t M, int64_t N16, int64_t pairs, const char* a, int64_t a_row, int64_t a_pair,
                     const uint32_t* b, int64_t b_pair, int64_t b_group, float alpha, float* c, int64_t ldc,
                     const RowBounds& rb) {
  for (int64_t g = 0; g < N16; g += 4) {
    const int64_t g1 = std::min<int64_t>(g + 4, N16);
    for (int64_t r = 0; r < M; r += kMR) {
      const int64_t mr = std::min<int64_t>(kMR, M - r);
      const auto [lo, hi] = block_hull(rb, r, mr);
      const int64_t v0 = std::max(g, lo / 16), v1 = std::min(g1, (hi + 15) / 16);
      if (v0 < v1)
        dp_block_any<Bf16, false, false>(mr, v1 - v0, a + r * a_row, a_row, a_pair, b + v0 * b_group, b_pair,
                                         b_group, pairs, alpha, c + r * ldc + v0 * 16, ldc, ~0u);
    }
  }
}

// run(r, mr, ka', kb') once per block of kMR rows, over its rows' hull within [ka, kb) (a block with none is
// skipped); without bounds, once for all nr rows over [ka, kb).
template <typename Run>
void by_row_blocks(int64_t nr, int64_t ka, int64_t kb, const RowBounds& rb, const Run& run) {
  if (rb.a == nullptr) {
    run(int64_t(0), nr, ka, kb);
    return;
  }
  for (int64_t r = 0; r < nr; r += kMR) {
    const int64_t mr = std::min<int64_t>(kMR, nr - r);
    const auto [lo, hi] = block_hull(rb, r, mr);
    const int64_t a = std::max(ka, lo), e = std::min(kb, hi);
    if (a < e) run(r, mr, a, e);
  }
}

// The rows [lo, hi) of nr whose bounds meet keys [k0, k1): the first and the last that do, and every row between
// (lo >= hi: none).
inline std::pair<int64_t, int64_t> rows_meeting(const RowBounds& rb, int64_t nr, int64_t k0, int64_t k1) {
  auto meets = [&](int64_t r) { return rb.a[r] < rb.e[r] && rb.a[r] < k1 && rb.e[r] > k0; };
  int64_t lo = 0, hi = nr;
  while (lo < nr && !meets(lo)) ++lo;
  while (hi > lo && !meets(hi - 1)) --hi;
  return {lo, hi};
}

// run(j, mk, r0, r1) once per block of kMR keys [j, j + mk) of [ka, kb), over the rows [r0, r1) that meet it (a
// block no row meets is skipped); without bounds, once for all of [ka, kb) over all nr rows.
template <typename Run>
void by_key_blocks(int64_t ka, int64_t kb, int64_t nr, const RowBounds& rb, const Run& run) {
  if (rb.a == nullptr) {
    run(ka, kb - ka, int64_t(0), nr);
    return;
  }
  for (int64_t j = ka; j < kb; j += kMR) {
    const int64_t mk = std::min<int64_t>(kMR, kb - j);
    const auto [r0, r1] = rows_meeting(rb, nr, j, j + mk);
    if (r0 < r1) run(j, mk, r0, r1);
  }
}

}  // namespace

void pair_rows(const float* x, int64_t ld, int64_t n, int64_t X, uint32_t* out) {
  // cvtne2ps gives [16 bf16 of its 2nd operand | 16 of its 1st]; the permutation interleaves them
  alignas(64) static const int16_t order[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                                8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i idx = _mm512_load_si512(order);
  for (int64_t i = 0; i < n; i += 2) {
    const float* r0 = x + i * ld;
    const float* r1 = i + 1 < n ? r0 + ld : nullptr;
    uint32_t* o = out + (i / 2) * X;
    for (int64_t c = 0; c < X; c += 16) {
      const __m512 x0 = _mm512_loadu_ps(r0 + c), x1 = r1 ? _mm512_loadu_ps(r1 + c) : _mm512_setzero_ps();
      const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);
      _mm512_storeu_si512(o + c, _mm512_permutexvar_epi16(idx, both));
    }
  }
}

void rows_by_groups(const at::BFloat16* a, int64_t lda, int64_t nr, const at::Tensor& groups, int64_t bh,
                    int64_t S16, int64_t X, int64_t c0, int64_t ncols, float alpha, float* s, int64_t lds,
                    RowBounds bounds) {
  const uint32_t* gb = words(groups) + bh * S16 * X / 2 + c0 * X / 2;
  const char* ac = reinterpret_cast<const char*>(a);
  if (bounds.a != nullptr)
    dp_gemm_bounded<true>(nr, ncols / 16, X / 2, ac, 2 * lda, 4, gb, 16, 8 * X, alpha, s, lds, bounds);
  else
    dp_gemm<false, false>(nr, ncols / 16, X / 2, ac, 2 * lda, 4, gb, 16, 8 * X, alpha, s, lds);
}

void bf16_rows_by_pairs(const at::BFloat16* p, int64_t ldp, int64_t nr, const at::Tensor& pairs, int64_t bh,
                        int64_t S16, int64_t X, int64_t c0, int64_t ka, int64_t kb, float alpha, float* o,
                        int64_t ldo, RowBounds bounds) {
  const uint32_t* vq = words(pairs) + bh * S16 * X / 2 + c0 / 2 * X;
  by_row_blocks(nr, ka, kb, bounds, [&](int64_t r, int64_t mr, int64_t k0, int64_t k1) {
    const char* pc = reinterpret_cast<const char*>(p + r * ldp);
    float* orow = o + r * ldo;
    // pair j covers keys 2j, 2j + 1: whole pairs inside [k0, k1), then the edge pairs masked
    const int64_t first = (k0 + 1) / 2, last = k1 / 2;
    dp_gemm<true, false>(mr, X / 16, last - first, pc + 4 * first, 2 * ldp, 4, vq + first * X, X, 16, alpha, orow,
                         ldo);
    if (k0 % 2)   // keep key k0, the high half of its pair
      dp_gemm<true, true>(mr, X / 16, 1, pc + 4 * (k0 / 2), 2 * ldp, 4, vq + k0 / 2 * X, X, 16, alpha, orow, ldo,
                          0xFFFF0000u);
    if (k1 % 2)   // keep key k1 - 1, the low half of its pair
      dp_gemm<true, true>(mr, X / 16, 1, pc + 4 * (k1 / 2), 2 * ldp, 4, vq + k1 / 2 * X, X, 16, alpha, orow, ldo,
                          0x0000FFFFu);
  });
}

void bf16_columns_by_pairs(const uint32_t* a_pairs, int64_t ncols, int64_t ka, int64_t kb, const uint32_t* b_pairs,
                           int64_t X, int64_t nr, float alpha, float* c, int64_t ldc, RowBounds bounds) {
  // A = a^T: its row j is column j of the pairs block (next row: next word), its step the next pair of rows
  by_key_blocks(ka, kb, nr, bounds, [&](int64_t j, int64_t mk, int64_t r0, int64_t r1) {
    const int64_t p0 = r0 / 2, p1 = (r1 + 1) / 2;                     // the pairs of rows holding [r0, r1)
    dp_gemm<true, false>(mk, X / 16, p1 - p0, reinterpret_cast<const char*>(a_pairs + p0 * ncols + j), 4,
                         4 * ncols, b_pairs + p0 * X, X, 16, alpha, c + (j - ka) * ldc, ldc);
  });
}

void rows_by_groups(const float* a, int64_t lda, int64_t nr, const at::Tensor& groups, int64_t bh, int64_t S16,
                    int64_t X, int64_t c0, int64_t ncols, float alpha, float* s, int64_t lds, RowBounds bounds) {
  const uint32_t* gb = words(groups) + bh * S16 * X + c0 * X;
  const char* ac = reinterpret_cast<const char*>(a);
  if (bounds.a != nullptr)
    dp_gemm_bounded<false>(nr, ncols / 16, X, ac, 4 * lda, 4, gb, 16, 16 * X, alpha, s, lds, bounds);
  else
    dp_gemm<false, false, false>(nr, ncols / 16, X, ac, 4 * lda, 4, gb, 16, 16 * X, alpha, s, lds);
}

void fp32_rows_by_rows(const float* p, int64_t ldp, int64_t nr, const float* b, int64_t ldb, int64_t X, int64_t ka,
                       int64_t kb, float alpha, float* o, int64_t ldo, RowBounds bounds) {
  by_row_blocks(nr, ka, kb, bounds, [&](int64_t r, int64_t mr, int64_t k0, int64_t k1) {
    dp_gemm<true, false, false>(mr, X / 16, k1 - k0, reinterpret_cast<const char*>(p + r * ldp + k0), 4 * ldp, 4,
                                reinterpret_cast<const uint32_t*>(b + k0 * ldb), ldb, 16, alpha, o + r * ldo, ldo);
  });
}

void fp32_columns_by_rows(const float* a, int64_t lda, int64_t ka, int64_t kb, const float* b, int64_t ldb, int64_t X,
                          int64_t nr, float alpha, float* c, int64_t ldc, RowBounds bounds) {
  by_key_blocks(ka, kb, nr, bounds, [&](int64_t j, int64_t mk, int64_t r0, int64_t r1) {
    dp_gemm<true, false, false>(mk, X / 16, r1 - r0, reinterpret_cast<const char*>(a + r0 * lda + j), 4, 4 * lda,
                                reinterpret_cast<const uint32_t*>(b + r0 * ldb), ldb, 16, alpha, c + (j - ka) * ldc,
                                ldc);
  });
}

#else   // built without AVX512-BF16: never called (tiles_built() is false)

namespace {
[[noreturn]] void not_built() { TORCH_CHECK(false, "attnlab: the AVX512-BF16 tiles were not built on this machine"); }
}  // namespace
void pair_rows(const float*, int64_t, int64_t, int64_t, uint32_t*) { not_built(); }
void rows_by_groups(const at::BFloat16*, int64_t, int64_t, const at::Tensor&, int64_t, int64_t, int64_t,
                    int64_t, int64_t, float, float*, int64_t, RowBounds) { not_built(); }
void bf16_rows_by_pairs(const at::BFloat16*, int64_t, int64_t, const at::Tensor&, int64_t, int64_t, int64_t,
                        int64_t, int64_t, int64_t, float, float*, int64_t, RowBounds) { not_built(); }
void bf16_columns_by_pairs(const uint32_t*, int64_t, int64_t, int64_t, const uint32_t*, int64_t, int64_t, float, float*,
                           int64_t, RowBounds) { not_built(); }
void rows_by_groups(const float*, int64_t, int64_t, const at::Tensor&, int64_t, int64_t, int64_t, int64_t, int64_t,
                    float, float*, int64_t, RowBounds) { not_built(); }
void fp32_rows_by_rows(const float*, int64_t, int64_t, const float*, int64_t, int64_t, int64_t, int64_t, float, float*,
                       int64_t, RowBounds) { not_built(); }
void fp32_columns_by_rows(const float*, int64_t, int64_t, int64_t, const float*, int64_t, int64_t, int64_t, float,
                          float*, int64_t, RowBounds) { not_built(); }

#endif

}  // namespace attnlab
