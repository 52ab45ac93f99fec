// bfloat16 tile GEMMs on AVX512-BF16: the two products of the forward pass, S = Q K^T and
// O += P V, as register-blocked micro-kernels over vdpbf16ps.
//
// Why not MKL here: cblas_gemm_bf16bf16f32 (and oneDNN's brgemm without AMX) ran at about fp32
// speed on these tile shapes (64..256 rows, D = 64), because each call re-packs its operands. The
// instruction itself does 32 multiply-adds per 512-bit vector -- twice fp32's FMA -- if its second
// operand is laid out in "VNNI" pairs: lane n of a vector holds two bfloat16 that are adjacent
// along the reduction dimension. K and V are packed that way once per call (O(S D), not per tile):
//
//   K (S, D) -> groups of 16 keys, each [D/2][16] 32-bit words: word (p, n) = (K[16g+n][2p], K[16g+n][2p+1])
//   V (S, Dv) -> key pairs, each [Dv] words:                     word (q, d) = (V[2q][d], V[2q+1][d])
//
// The first operand is a row of Q (pairs along D) or of P (pairs along keys): a row-major bfloat16
// row already holds its pairs as 32-bit words, broadcast to all lanes. Keys are padded with zeros
// to a multiple of 16, so a tile's columns never read past the packed buffer.
#include "dpbf16.h"

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#define ATTNLAB_DPBF16 1
#endif

#include <cstring>

namespace attnlab {

bool dpbf16_built() {
#ifdef ATTNLAB_DPBF16
  return true;
#else
  return false;
#endif
}

namespace {

inline uint32_t word(const at::BFloat16* row, int64_t p) {
  uint32_t w;
  std::memcpy(&w, row + 2 * p, sizeof(w));   // (row[2p], row[2p+1]); unaligned-safe
  return w;
}

inline uint32_t pair(at::BFloat16 lo, at::BFloat16 hi) {
  return static_cast<uint32_t>(lo.x) | (static_cast<uint32_t>(hi.x) << 16);
}

}  // namespace

PackedKV pack_kv(const at::BFloat16* k, const int64_t* ks, const at::BFloat16* v, const int64_t* vs, int64_t B,
                 int64_t Hkv, int64_t S, int64_t D, int64_t Dv) {
  PackedKV pk;
  pk.S16 = (S + 15) / 16 * 16;
  pk.D = D;
  pk.Dv = Dv;
  const auto opts = at::TensorOptions().dtype(at::kInt);
  pk.k = at::empty({B * Hkv, pk.S16 * D / 2}, opts);    // (B Hkv, S16/16, D/2, 16) words
  pk.v = at::empty({B * Hkv, pk.S16 / 2 * Dv}, opts);   // (B Hkv, S16/2, Dv) words
  uint32_t* kp = reinterpret_cast<uint32_t*>(pk.k.data_ptr<int32_t>());
  uint32_t* vp = reinterpret_cast<uint32_t*>(pk.v.data_ptr<int32_t>());
  const int64_t P = D / 2, groups = pk.S16 / 16;
  at::parallel_for(0, B * Hkv * groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t bh = unit / groups, g = unit % groups, b = bh / Hkv, h = bh % Hkv;
      uint32_t* kg = kp + bh * pk.S16 * P + g * 16 * P;
      uint32_t* vg = vp + bh * (pk.S16 / 2) * Dv + g * 8 * Dv;
      for (int64_t n = 0; n < 16; ++n) {
        const int64_t j = 16 * g + n;
        if (j < S) {
          const at::BFloat16* kr = k + b * ks[0] + h * ks[1] + j * ks[2];
          for (int64_t p = 0; p < P; ++p) kg[p * 16 + n] = word(kr, p);
        } else {
          for (int64_t p = 0; p < P; ++p) kg[p * 16 + n] = 0;
        }
      }
      const at::BFloat16 zero(0.0f);
      for (int64_t q = 0; q < 8; ++q) {
        const int64_t j = 16 * g + 2 * q;
        const at::BFloat16* v0 = j < S ? v + b * vs[0] + h * vs[1] + j * vs[2] : nullptr;
        const at::BFloat16* v1 = j + 1 < S ? v + b * vs[0] + h * vs[1] + (j + 1) * vs[2] : nullptr;
        for (int64_t d = 0; d < Dv; ++d)
          vg[q * Dv + d] = pair(v0 ? v0[d] : zero, v1 ? v1[d] : zero);
      }
    }
  });
  return pk;
}

#ifdef ATTNLAB_DPBF16
namespace {

inline __m512bh as_bh(__m512i x) { return (__m512bh)x; }

// S[r, 16 g + n] = alpha * sum_d Q[r, d] K[16 g + n, d] for MR rows and NG groups of 16 keys.
template <int MR, int NG>
inline void qk_block(const at::BFloat16* q, int64_t ldq, const uint32_t* kg, int64_t P, float alpha, float* s,
                     int64_t lds) {
  __m512 acc[MR][NG];
  for (int r = 0; r < MR; ++r)
    for (int g = 0; g < NG; ++g) acc[r][g] = _mm512_setzero_ps();
  for (int64_t p = 0; p < P; ++p) {
    __m512i b[NG];
    for (int g = 0; g < NG; ++g) b[g] = _mm512_loadu_si512(kg + g * 16 * P + p * 16);
    for (int r = 0; r < MR; ++r) {
      const __m512i a = _mm512_set1_epi32(static_cast<int>(word(q + r * ldq, p)));
      for (int g = 0; g < NG; ++g) acc[r][g] = _mm512_dpbf16_ps(acc[r][g], as_bh(a), as_bh(b[g]));
    }
  }
  const __m512 va = _mm512_set1_ps(alpha);
  for (int r = 0; r < MR; ++r)
    for (int g = 0; g < NG; ++g) _mm512_storeu_ps(s + r * lds + g * 16, _mm512_mul_ps(acc[r][g], va));
}

// O[r, 16 c + n] += sum_j P[r, j] V[j, 16 c + n] for MR rows and NC column groups, over Q key pairs.
// With Keep, each V word is ANDed with `keep` first: an edge pair whose other key lies outside the
// tile's key range is read as 0 there (P is 0 there too, but 0 * NaN would still be NaN).
template <int MR, int NC, bool Keep>
inline void pv_block(const at::BFloat16* p, int64_t ldp, const uint32_t* vq, int64_t Q, int64_t Dv, float* o,
                     int64_t ldo, uint32_t keep) {
  __m512 acc[MR][NC];
  const __m512i vkeep = _mm512_set1_epi32(static_cast<int>(keep));
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_loadu_ps(o + r * ldo + c * 16);
  for (int64_t j = 0; j < Q; ++j) {
    __m512i b[NC];
    for (int c = 0; c < NC; ++c) {
      b[c] = _mm512_loadu_si512(vq + j * Dv + c * 16);
      if constexpr (Keep) b[c] = _mm512_and_si512(b[c], vkeep);
    }
    for (int r = 0; r < MR; ++r) {
      const __m512i a = _mm512_set1_epi32(static_cast<int>(word(p + r * ldp, j)));
      for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], as_bh(a), as_bh(b[c]));
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NC; ++c) _mm512_storeu_ps(o + r * ldo + c * 16, acc[r][c]);
}

constexpr int kMR = 6;   // 6 rows x 4 vectors = 24 accumulators of the 32 zmm registers

template <int NG>
void qk_rows(const at::BFloat16* q, int64_t ldq, int64_t nr, const uint32_t* kg, int64_t P, float alpha, float* s,
             int64_t lds) {
  int64_t r = 0;
  for (; r + kMR <= nr; r += kMR) qk_block<kMR, NG>(q + r * ldq, ldq, kg, P, alpha, s + r * lds, lds);
  switch (nr - r) {
    case 5: qk_block<5, NG>(q + r * ldq, ldq, kg, P, alpha, s + r * lds, lds); break;
    case 4: qk_block<4, NG>(q + r * ldq, ldq, kg, P, alpha, s + r * lds, lds); break;
    case 3: qk_block<3, NG>(q + r * ldq, ldq, kg, P, alpha, s + r * lds, lds); break;
    case 2: qk_block<2, NG>(q + r * ldq, ldq, kg, P, alpha, s + r * lds, lds); break;
    case 1: qk_block<1, NG>(q + r * ldq, ldq, kg, P, alpha, s + r * lds, lds); break;
    default: break;
  }
}

template <int NC, bool Keep>
void pv_rows(const at::BFloat16* p, int64_t ldp, int64_t nr, const uint32_t* vq, int64_t Q, int64_t Dv, float* o,
             int64_t ldo, uint32_t keep) {
  int64_t r = 0;
  for (; r + kMR <= nr; r += kMR) pv_block<kMR, NC, Keep>(p + r * ldp, ldp, vq, Q, Dv, o + r * ldo, ldo, keep);
  switch (nr - r) {
    case 5: pv_block<5, NC, Keep>(p + r * ldp, ldp, vq, Q, Dv, o + r * ldo, ldo, keep); break;
    case 4: pv_block<4, NC, Keep>(p + r * ldp, ldp, vq, Q, Dv, o + r * ldo, ldo, keep); break;
    case 3: pv_block<3, NC, Keep>(p + r * ldp, ldp, vq, Q, Dv, o + r * ldo, ldo, keep); break;
    case 2: pv_block<2, NC, Keep>(p + r * ldp, ldp, vq, Q, Dv, o + r * ldo, ldo, keep); break;
    case 1: pv_block<1, NC, Keep>(p + r * ldp, ldp, vq, Q, Dv, o + r * ldo, ldo, keep); break;
    default: break;
  }
}

// Q key pairs starting at pair j0 (P's columns 2 j0 ...), every column group of Dv.
template <bool Keep>
void pv_pairs(const at::BFloat16* p, int64_t ldp, int64_t nr, const uint32_t* vq, int64_t j0, int64_t Q, int64_t Dv,
              float* o, int64_t ldo, uint32_t keep) {
  if (Q <= 0) return;
  p += 2 * j0;
  vq += j0 * Dv;
  int64_t c = 0;
  const int64_t cols = Dv / 16;
  for (; c + 4 <= cols; c += 4) pv_rows<4, Keep>(p, ldp, nr, vq + c * 16, Q, Dv, o + c * 16, ldo, keep);
  switch (cols - c) {
    case 3: pv_rows<3, Keep>(p, ldp, nr, vq + c * 16, Q, Dv, o + c * 16, ldo, keep); break;
    case 2: pv_rows<2, Keep>(p, ldp, nr, vq + c * 16, Q, Dv, o + c * 16, ldo, keep); break;
    case 1: pv_rows<1, Keep>(p, ldp, nr, vq + c * 16, Q, Dv, o + c * 16, ldo, keep); break;
    default: break;
  }
}

}  // namespace

void dpbf16_qk(const at::BFloat16* q, int64_t ldq, int64_t nr, const PackedKV& pk, int64_t bh, int64_t c0,
               int64_t ncols, float alpha, float* s, int64_t lds) {
  const int64_t P = pk.D / 2;
  const uint32_t* kg = reinterpret_cast<const uint32_t*>(pk.k.data_ptr<int32_t>()) + bh * pk.S16 * P + c0 * P;
  int64_t g = 0;
  const int64_t groups = ncols / 16;
  for (; g + 4 <= groups; g += 4) qk_rows<4>(q, ldq, nr, kg + g * 16 * P, P, alpha, s + g * 16, lds);
  switch (groups - g) {
    case 3: qk_rows<3>(q, ldq, nr, kg + g * 16 * P, P, alpha, s + g * 16, lds); break;
    case 2: qk_rows<2>(q, ldq, nr, kg + g * 16 * P, P, alpha, s + g * 16, lds); break;
    case 1: qk_rows<1>(q, ldq, nr, kg + g * 16 * P, P, alpha, s + g * 16, lds); break;
    default: break;
  }
}

void dpbf16_pv(const at::BFloat16* p, int64_t ldp, int64_t nr, const PackedKV& pk, int64_t bh, int64_t c0,
               int64_t ka, int64_t kb, float* o, int64_t ldo) {
  const int64_t Dv = pk.Dv;
  const uint32_t* vq = reinterpret_cast<const uint32_t*>(pk.v.data_ptr<int32_t>()) + bh * (pk.S16 / 2) * Dv +
                       c0 / 2 * Dv;
  // whole pairs inside [ka, kb); an odd ka or kb leaves an edge pair with one key outside
  const int64_t first = (ka + 1) / 2, last = kb / 2;
  if (ka % 2) pv_pairs<true>(p, ldp, nr, vq, ka / 2, 1, Dv, o, ldo, 0xFFFF0000u);   // keep key ka (the high half)
  pv_pairs<false>(p, ldp, nr, vq, first, last - first, Dv, o, ldo, 0u);
  if (kb % 2) pv_pairs<true>(p, ldp, nr, vq, kb / 2, 1, Dv, o, ldo, 0x0000FFFFu);   // keep key kb - 1 (the low half)
}

#else   // built without AVX512-BF16: never called (dpbf16_built() is false)

void dpbf16_qk(const at::BFloat16*, int64_t, int64_t, const PackedKV&, int64_t, int64_t, int64_t, float, float*,
               int64_t) {
  TORCH_CHECK(false, "attnlab: the AVX512-BF16 tile kernel was not built on this machine");
}
void dpbf16_pv(const at::BFloat16*, int64_t, int64_t, const PackedKV&, int64_t, int64_t, int64_t, int64_t, float*,
               int64_t) {
  TORCH_CHECK(false, "attnlab: the AVX512-BF16 tile kernel was not built on this machine");
}

#endif

}  // namespace attnlab
