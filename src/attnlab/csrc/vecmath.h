// The softmax's vector math, shared by every build: the exp (exp2_clamped, vexp_from) and horizontal max / sum.
// What each instruction set gets: AVX-512 (the avx512 and avx512_bf16 builds) and AVX2 (the avx2 build) their own
// exp2_clamped; at::vec's exp_u20 anywhere else.
#pragma once

#include <ATen/cpu/vec/vec.h>

#include <cmath>
#include <cstdint>

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif

namespace attnlab {

// 2^x for the softmax's arguments (x <= 0 up to rounding), -inf and NaN, in ~10 vector instructions: x is split
// as n + f with n = round(x) and |f| <= 1/2, 2^f = 1 + f q(f) with q of degree 4, and 2^n applied by the
// exponent. q's coefficients: a weighted least-squares fit of (2^f - 1) / f on [-1/2, 1/2] iterated towards
// the minimax relative error (Lawson), rounded to float: 1.9e-7 relative at most over 200,001 points, against
// ~2.4e-6 for at::vec's exp_u20, which takes ~19 instructions with its own range checks (docs/benchmarks.md,
// "the softmax's exp on AMX" and "the softmax's exp on AVX2"). vmaxps and vminps return their second
// operand, x, when one is NaN, so NaN stays NaN through the clamps and the polynomial.
constexpr float kLog2e = 1.4426950408889634f;   // exp(y) = 2^(log2(e) y)
constexpr float kExp2Q[5] = {0.001326472731307149f, 0.009671512991189957f, 0.05550733581185341f,
                             0.24022242426872253f, 0.6931470036506653f};

// 2^f = 1 + f q(f) for |f| <= 1/2, on this build's vectors (at::vec's fmadd is one vfmadd per vector).
inline at::vec::Vectorized<float> exp2_fraction(const at::vec::Vectorized<float>& f) {
  using Vec = at::vec::Vectorized<float>;
  Vec q = at::vec::fmadd(Vec(kExp2Q[0]), f, Vec(kExp2Q[1]));
  for (int c = 2; c < 5; ++c) q = at::vec::fmadd(q, f, Vec(kExp2Q[c]));
  return at::vec::fmadd(q, f, Vec(1.0f));
}

#if defined(CPU_CAPABILITY_AVX512)
// AVX-512: vscalefps applies 2^n (inf from x >= 128); below x = -126 the result is 0 (a -inf score weighs exactly
// 0), as in the AVX2 build: no subnormal results (a probability below 2^-126 next to a row sum >= 1), which cost a
// microcode assist in every product that reads them on the Xeon with AMX (native.h, FlushSubnormals). x is clamped
// at -160 first, so that the polynomial never sees a huge |f|. A NaN compares unordered: it stays NaN.
inline __m512 exp2_clamped(__m512 x) {
  const __mmask16 normal = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ);
  x = _mm512_max_ps(_mm512_set1_ps(-160.0f), x);
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm512_maskz_scalef_ps(normal, exp2_fraction(_mm512_sub_ps(x, n)), n);
}
#elif defined(CPU_CAPABILITY_AVX2)
// AVX2 (no vscalefps): 2^n built in the exponent bits, (n + 127) << 23, with x clamped to [-127, 128] (n = 128
// gives inf), and 0 below x = -126 as on AVX-512 (-inf included; no subnormal results). A NaN's n converts to
// INT_MIN, whose bits make 1.0f times a NaN polynomial: NaN, kept by the unordered compare.
inline __m256 exp2_clamped(__m256 x) {
  const __m256 normal = _mm256_cmp_ps(x, _mm256_set1_ps(-126.0f), _CMP_NLT_UQ);
  x = _mm256_min_ps(_mm256_set1_ps(128.0f), _mm256_max_ps(_mm256_set1_ps(-127.0f), x));
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(normal, _mm256_mul_ps(exp2_fraction(_mm256_sub_ps(x, n)), _mm256_castsi256_ps(bits)));
}
#endif

// exp(x - m) on vectors, the softmax's probabilities (m: the row's max or its lse, so x - m <= 0 up to rounding):
// float: exp2_clamped((x - m) log2(e)); x - m first, exact where x is near m (Sterbenz), so a row of large
// logits loses nothing to rounding m log2(e). Its error stays below the fp32 reference's own (the conformance
// suite checks this), it gives 0 for -inf and keeps NaN. double: Sleef's 1-ulp exp.
template <typename T>
inline at::vec::Vectorized<T> vexp_from(const at::vec::Vectorized<T>& x, const at::vec::Vectorized<T>& m) {
  return (x - m).exp();
}
template <>
inline at::vec::Vectorized<float> vexp_from(const at::vec::Vectorized<float>& x, const at::vec::Vectorized<float>& m) {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  return exp2_clamped((x - m) * at::vec::Vectorized<float>(kLog2e));     // this build's width
#else
  return (x - m).exp_u20();
#endif
}

// out[j] = exp(x[j] - m) for j in [a, e) (out may be x): vexp_from on whole vectors, std::exp on the tail. The
// backward's probabilities; the extension's exp_from (tests/test_native_exp.py) runs it as they do.
template <typename T>
inline void exp_range(const T* x, T* out, int64_t a, int64_t e, T m) {
  using Vec = at::vec::Vectorized<T>;
  const Vec vm(m);
  int64_t j = a;
  for (; j + Vec::size() <= e; j += Vec::size()) vexp_from(Vec::loadu(x + j), vm).store(out + j);
  for (; j < e; ++j) out[j] = std::exp(x[j] - m);
}

// Horizontal max / sum of a vector (a NaN lane wins the max, so NaN inputs reach the output).
template <typename T>
inline T nan_max(T a, T b) { return (std::isnan(b) || b > a) ? b : a; }

template <typename T>
inline T hmax(const at::vec::Vectorized<T>& v) {
  T buf[at::vec::Vectorized<T>::size()];
  v.store(buf);
  T m = buf[0];
  for (int64_t i = 1; i < at::vec::Vectorized<T>::size(); ++i) m = nan_max(m, buf[i]);
  return m;
}

template <typename T>
inline T hsum(const at::vec::Vectorized<T>& v) {
  T buf[at::vec::Vectorized<T>::size()];
  v.store(buf);
  T s = 0;
  for (int64_t i = 0; i < at::vec::Vectorized<T>::size(); ++i) s += buf[i];
  return s;
}

}  // namespace attnlab
