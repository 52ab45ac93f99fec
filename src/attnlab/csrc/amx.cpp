// bfloat16 products on AMX through oneDNN's brgemm micro-kernel (at::native::cpublas::brgemm, exported
// by torch and used by torch's own CPU flash attention).
//
// Why: on a CPU with AMX (Intel Xeon, Sapphire Rapids on) one core multiplies bf16 tiles at ~500
// GFLOP/s in brgemm (64 x 64 x 64 calls, measured here), where the AVX512-BF16 micro-kernel of
// microkernel.cpp reaches about a seventh of that. So on AMX the products are cheap, and what
// remains of the kernel is the softmax between them (forward.cpp fuses it into few passes).
//
// Layout: brgemm computes C (m x n, fp32) (+)= A (m x k, bf16 rows) B (k x n), with B in the VNNI
// layout: word (p, c) of row stride ldb holds (B[2p][c], B[2p+1][c]). That is exactly pair_rows'
// output (microkernel.h), so V as pairs of keys serves O += P V, K as pairs serves dQ += dS K, and
// pair_rows of P and dS serves dV^T += dO^T P and dK^T += Q^T dS. For S = Q K^T and dP = dO V^T
// the B operand is K^T (D x S): word (p, j) = (K[j][2p], K[j][2p+1]), packed here once per call
// with ldb = S16 + 16, so a key chunk starting anywhere is the column offset c0 (oneDNN's own pack
// refused strides that wide: "could not create a BRGeMM ukernel packing B object").
//
// brgemm objects are created per shape and cached inside torch; each thread's AMX tile
// configuration is set by its first call and released (AmxRelease) at the end of its chunk of work.
#include "amx.h"

#include <ATen/cpu/Utils.h>
#include <ATen/native/CPUBlas.h>

#include <atomic>
#include <algorithm>
#include <cstring>
#include <limits>

#include "kept.h"
#include "native.h"

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
#define ATTNLAB_AMX_VECTORS 1
#endif

namespace attnlab {

namespace {

std::atomic<bool> amx_wanted{false};
std::atomic<bool> amx_emulated{false};   // emulate_amx: a plain loop in brgemm's place (tests only)

// Whether one bfloat16's bits are an inf or a NaN (exponent bits all ones).
inline uint32_t bf16_nonfinite(uint32_t bits) { return static_cast<uint32_t>((bits & 0x7F80u) == 0x7F80u); }

// One kv head of x (S rows, X columns) as columns: out[p * ldo + j] = (x[j][2p], x[j][2p+1]), 0 past S.
// Returns whether every element read is finite (bf16: exponent bits not all ones).
bool pack_columns(const at::BFloat16* x, int64_t ld, int64_t S, int64_t X, int64_t ldo, uint32_t* out) {
  const int64_t P = X / 2;
  uint32_t bad = 0;
  for (int64_t j = 0; j < S; ++j) {              // reads rows in order; writes P streams
    const at::BFloat16* row = x + j * ld;
    for (int64_t p = 0; p < P; ++p) {
      uint32_t w;
      std::memcpy(&w, row + 2 * p, sizeof(w));
      out[p * ldo + j] = w;
      bad |= bf16_nonfinite(w & 0xFFFFu) | bf16_nonfinite(w >> 16);
    }
  }
  for (int64_t p = 0; p < P; ++p) std::fill(out + p * ldo + S, out + (p + 1) * ldo, 0u);
  return bad == 0;
}

}  // namespace

bool amx_supported() {
  static const bool ok = [] {
    const auto caps = at::cpu::get_cpu_capabilities();          // cpuinfo's answers, by name
    auto has = [&](const char* name) {
      auto it = caps.find(name);
      return it != caps.end() && it->second.isBool() && it->second.toBool();
    };
    // init_amx asks the kernel for the tile state (arch_prctl); could_pack: oneDNN can pack for it
    return has("amx_tile") && has("amx_bf16") && at::cpu::init_amx() && at::native::cpublas::could_pack(at::kBFloat16);
  }();
  return ok;
}

bool set_amx(bool on) {
  amx_emulated = false;
  amx_wanted = on && tiles_built() && amx_supported();
  return amx_wanted;
}

bool emulate_amx(bool on) {
  amx_emulated = on && tiles_built();
  amx_wanted = amx_emulated.load();
  return amx_emulated;
}

bool amx_is_emulated() { return amx_emulated; }

bool amx_on() { return amx_wanted; }

PackedKV amx_pack_kv(const at::BFloat16* k, const int64_t* ks, const at::BFloat16* v, const int64_t* vs, int64_t B,
                     int64_t Hkv, int64_t S, int64_t D, int64_t Dv, bool backward, bool& finite) {
  PackedKV pk;
  pk.amx = true;
  // Keys padded to a multiple of 16, plus 16: the backward reads a chunk's whole groups of 16 from an even key.
  pk.S16 = (S + 15) / 16 * 16 + 16;
  pk.ld_cols = pk.S16 + 16;     // (S + 32 or so) not a multiple of 4 KB: rows of K^T 16 KB apart fell in one L1 set
  auto words = [](const at::Tensor& t) { return reinterpret_cast<uint32_t*>(t.data_ptr<int32_t>()); };
  pk.k_cols = kept_buffer(Kept::k_cols, B * Hkv, pk.ld_cols * D / 2, at::kInt);
  pk.v_pairs = kept_buffer(Kept::v_pairs, B * Hkv, pk.S16 * Dv / 2, at::kInt);
  if (backward) {
    pk.v_cols = kept_buffer(Kept::v_cols, B * Hkv, pk.ld_cols * Dv / 2, at::kInt);
    pk.k_pairs = kept_buffer(Kept::k_pairs, B * Hkv, pk.S16 * D / 2, at::kInt);
  }
  std::atomic<bool> all_finite{true};
  at::parallel_for(0, B * Hkv, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      const at::BFloat16* kb = k + (bh / Hkv) * ks[0] + (bh % Hkv) * ks[1];
      const at::BFloat16* vb = v + (bh / Hkv) * vs[0] + (bh % Hkv) * vs[1];
      bool ok = pack_columns(kb, ks[2], S, D, pk.ld_cols, words(pk.k_cols) + bh * pk.ld_cols * D / 2);
      if (backward) {
        ok = pack_columns(vb, vs[2], S, Dv, pk.ld_cols, words(pk.v_cols) + bh * pk.ld_cols * Dv / 2) && ok;
        pair_keys(kb, ks[2], S, D, pk.S16, words(pk.k_pairs) + bh * pk.S16 * D / 2);
      } else {                                                  // V's finiteness (the forward reads it as pairs)
        uint32_t bad = 0;
        for (int64_t j = 0; j < S; ++j) {
          const at::BFloat16* row = vb + j * vs[2];
          for (int64_t c = 0; c < Dv; ++c) bad |= bf16_nonfinite(row[c].x);
        }
        ok = ok && bad == 0;
      }
      pair_keys(vb, vs[2], S, Dv, pk.S16, words(pk.v_pairs) + bh * pk.S16 * Dv / 2);
      if (!ok) all_finite = false;
    }
  });
  finite = all_finite;
  return pk;
}

namespace {

// amx_gemm's product without AMX: c (m x n) (+)= a (m x kk) b, b's word (p, j) holding (b[2p][j], b[2p+1][j]) in its
// low and high halves; fp32 products and sums (exact products, as AMX's: a bf16 times a bf16 fits in fp32). A 0
// weight times a NaN or inf in b is NaN, as on the tiles, so the callers' care for keys past a tile is tested too.
void gemm_emulated(int64_t m, int64_t n, int64_t kk, const at::BFloat16* a, int64_t lda, const uint32_t* b,
                   int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  auto as_float = [](uint32_t bits) { float f; std::memcpy(&f, &bits, sizeof(f)); return f; };
  for (int64_t i = 0; i < m; ++i) {
    float* ci = c + i * ldc;
    if (!accumulate) std::fill(ci, ci + n, 0.0f);
    for (int64_t p = 0; p < kk / 2; ++p) {
      const float a0 = static_cast<float>(a[i * lda + 2 * p]), a1 = static_cast<float>(a[i * lda + 2 * p + 1]);
      const uint32_t* bp = b + p * ldb;
      for (int64_t j = 0; j < n; ++j)
        ci[j] += a0 * as_float(bp[j] << 16) + a1 * as_float(bp[j] & 0xFFFF0000u);
    }
  }
}

}  // namespace

void amx_gemm(int64_t m, int64_t n, int64_t kk, const at::BFloat16* a, int64_t lda, const uint32_t* b, int64_t ldb,
              float* c, int64_t ldc, bool accumulate) {
  if (amx_emulated) return gemm_emulated(m, n, kk, a, lda, b, ldb, c, ldc, accumulate);
  at::native::cpublas::brgemm(m, n, kk, lda, ldb, ldc, accumulate, a, reinterpret_cast<const at::BFloat16*>(b), c,
                              /*is_vnni=*/true);
}

#ifdef ATTNLAB_AMX_VECTORS

float row_max(const float* row, int64_t a, int64_t e) {
  const __m512 lowest = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 v0 = lowest, v1 = lowest;
  int64_t j = a;
  for (; j + 32 <= e; j += 32) {             // two chains: vmaxps's latency, not its throughput, bounds one
    v0 = _mm512_max_ps(v0, _mm512_loadu_ps(row + j));
    v1 = _mm512_max_ps(v1, _mm512_loadu_ps(row + j + 16));
  }
  for (; j < e; j += 16) {                   // the tail (a causal row's diagonal chunk), masked
    const __mmask16 k = static_cast<__mmask16>((1u << std::min<int64_t>(16, e - j)) - 1u);
    v0 = _mm512_max_ps(v0, _mm512_mask_loadu_ps(lowest, k, row + j));
  }
  return _mm512_reduce_max_ps(_mm512_max_ps(v0, v1));
}

float row_exp_bf16(const float* row, int64_t a, int64_t e, float scale, float m, at::BFloat16* out) {
  constexpr int64_t VW = 16;
  // exp(scale s - m) = 2^(log2(e) scale s - log2(e) m): one fma per element to the exponent
  const __m512 vs = _mm512_set1_ps(scale * kLog2e), vneg = _mm512_set1_ps(-m * kLog2e);
  __m512 vsum = _mm512_setzero_ps();
  int64_t j = a;
  for (; j + 2 * VW <= e; j += 2 * VW) {
    const __m512 p0 = exp2_clamped(_mm512_fmadd_ps(_mm512_loadu_ps(row + j), vs, vneg));
    const __m512 p1 = exp2_clamped(_mm512_fmadd_ps(_mm512_loadu_ps(row + j + VW), vs, vneg));
    vsum = _mm512_add_ps(vsum, _mm512_add_ps(p0, p1));
    _mm512_storeu_si512(out + j, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));    // [p0 | p1], rounded to nearest even
  }
  for (; j < e; j += VW) {                   // the tail, masked: no scalar exp (a causal row ends anywhere)
    const __mmask16 k = static_cast<__mmask16>((1u << std::min<int64_t>(VW, e - j)) - 1u);
    const __m512 p = _mm512_maskz_mov_ps(k, exp2_clamped(_mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, row + j), vs,
                                                                              vneg)));
    vsum = _mm512_add_ps(vsum, p);
    _mm256_mask_storeu_epi16(out + j, k, (__m256i)_mm512_cvtneps_pbh(p));
  }
  return _mm512_reduce_add_ps(vsum);
}

void row_exp_inplace(float* row, int64_t a, int64_t e, float scale, float lse) {
  const __m512 vs = _mm512_set1_ps(scale * kLog2e), vneg = _mm512_set1_ps(-lse * kLog2e);
  int64_t j = a;
  for (; j + 16 <= e; j += 16)
    _mm512_storeu_ps(row + j, exp2_clamped(_mm512_fmadd_ps(_mm512_loadu_ps(row + j), vs, vneg)));
  if (j < e) {                               // the tail, masked
    const __mmask16 k = static_cast<__mmask16>((1u << (e - j)) - 1u);
    _mm512_mask_storeu_ps(row + j, k, exp2_clamped(_mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, row + j), vs, vneg)));
  }
}

#else   // built without AVX512-BF16: never called (amx_on() needs tiles_built())

namespace {
[[noreturn]] void not_built() { TORCH_CHECK(false, "attnlab: the AMX path was not built for this instruction set"); }
}  // namespace
float row_max(const float*, int64_t, int64_t) { not_built(); }
float row_exp_bf16(const float*, int64_t, int64_t, float, float, at::BFloat16*) { not_built(); }
void row_exp_inplace(float*, int64_t, int64_t, float, float) { not_built(); }

#endif

void transpose_rows(const at::BFloat16* x, int64_t ld, int64_t n, int64_t n_pad, int64_t X, at::BFloat16* out,
                    int64_t ldo) {
  for (int64_t c = 0; c < X; ++c) {
    at::BFloat16* o = out + c * ldo;
    for (int64_t r = 0; r < n; ++r) o[r] = x[r * ld + c];
    for (int64_t r = n; r < n_pad; ++r) o[r] = at::BFloat16(0.0f);
  }
}

AmxRelease::~AmxRelease() {
  if (active_ && !amx_emulated) at::native::cpublas::brgemm_release(/*is_vnni=*/true);
}

}  // namespace attnlab
