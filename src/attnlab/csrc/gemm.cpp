// GEMM on tiles through the BLAS that libtorch_cpu already carries.
//
// Why not at::matmul: one call per (query tile x key chunk) would allocate a tensor and open a
// parallel region of its own -- the overhead this kernel exists to remove. Why dlsym: the x86-64
// CPU wheels of torch link MKL statically and export its Fortran/CBLAS symbols (sgemm_, dgemm_,
// cblas_gemm_bf16bf16f32: checked with `nm -D libtorch_cpu.so` for torch 2.13); other builds may
// not, so each symbol is looked up once and a plain loop stands in where it is missing (correct,
// slower; blas_name() reports which ran, and `attnlab.functional.backends.native.info()` shows it).
// Every GEMM runs on one MKL thread (OneBlasThread): the kernel's own parallel region is the parallelism.
#include "microkernel.h"
#include "native.h"

#include <dlfcn.h>

namespace attnlab {
namespace {

using sgemm_t = void (*)(const char*, const char*, const int*, const int*, const int*, const float*,
                         const float*, const int*, const float*, const int*, const float*, float*, const int*);
using dgemm_t = void (*)(const char*, const char*, const int*, const int*, const int*, const double*,
                         const double*, const int*, const double*, const int*, const double*, double*, const int*);
// MKL: cblas_gemm_bf16bf16f32(layout, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc)
using bgemm_t = void (*)(int, int, int, int, int, int, float, const uint16_t*, int, const uint16_t*, int, float,
                         float*, int);
// MKL_Set_Num_Threads_Local, what mkl_service.h names mkl_set_num_threads_local for C (the lower-case
// symbol is the Fortran entry, which takes a pointer): returns the previous setting
using set_threads_t = int (*)(int);
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

struct Blas {
  sgemm_t s = nullptr;
  dgemm_t d = nullptr;
  bgemm_t b = nullptr;
  set_threads_t set_threads = nullptr;
  Blas() {
    set_threads = reinterpret_cast<set_threads_t>(dlsym(RTLD_DEFAULT, "MKL_Set_Num_Threads_Local"));
    s = reinterpret_cast<sgemm_t>(dlsym(RTLD_DEFAULT, "sgemm_"));
    d = reinterpret_cast<dgemm_t>(dlsym(RTLD_DEFAULT, "dgemm_"));
    b = reinterpret_cast<bgemm_t>(dlsym(RTLD_DEFAULT, "cblas_gemm_bf16bf16f32"));
  }
};

const Blas& blas() {
  static const Blas instance;   // resolved once, read-only afterwards
  return instance;
}

// Row-major op(X)[r, c] for a stored row-major X with leading dimension ld.
template <typename T>
inline T at_(const T* X, int64_t ld, bool t, int64_t r, int64_t c) {
  return t ? X[c * ld + r] : X[r * ld + c];
}

template <typename T, typename C>
void loop_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, C alpha, const T* A, int64_t lda, const T* B,
               int64_t ldb, C beta, C* Cm, int64_t ldc) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      C acc = 0;
      for (int64_t k = 0; k < K; ++k)
        acc += static_cast<C>(at_(A, lda, ta, m, k)) * static_cast<C>(at_(B, ldb, tb, k, n));
      Cm[m * ldc + n] = alpha * acc + (beta == C(0) ? C(0) : beta * Cm[m * ldc + n]);
    }
}

}  // namespace

OneBlasThread::OneBlasThread() {
  if (auto f = blas().set_threads) previous_ = f(1);
}

OneBlasThread::~OneBlasThread() {
  if (auto f = blas().set_threads) f(previous_);    // 0: back to MKL's global setting
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands, keep the flags.
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (auto f = blas().s) {
    const char tA = tb ? 'T' : 'N', tB = ta ? 'T' : 'N';
    const int m = N, n = M, k = K, la = ldb, lb = lda, lc = ldc;
    f(&tA, &tB, &m, &n, &k, &alpha, B, &la, A, &lb, &beta, C, &lc);
    return;
  }
  loop_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
          const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (auto f = blas().d) {
    const char tA = tb ? 'T' : 'N', tB = ta ? 'T' : 'N';
    const int m = N, n = M, k = K, la = ldb, lb = lda, lc = ldc;
    f(&tA, &tB, &m, &n, &k, &alpha, B, &la, A, &lb, &beta, C, &lc);
    return;
  }
  loop_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const at::BFloat16* A, int64_t lda,
          const at::BFloat16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (auto f = blas().b) {
    f(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, M, N, K, alpha,
      reinterpret_cast<const uint16_t*>(A), lda, reinterpret_cast<const uint16_t*>(B), ldb, beta, C, ldc);
    return;
  }
  loop_gemm<at::BFloat16, float>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

std::string blas_name() {
  std::string out;
  out += blas().s ? "float32: sgemm_ (libtorch_cpu's MKL)" : "float32: plain loop (no sgemm_ symbol)";
  out += blas().d ? "; float64: dgemm_" : "; float64: plain loop";
  out += blas().b ? "; bfloat16: cblas_gemm_bf16bf16f32" : "; bfloat16: plain loop";
  if (tiles_built()) out += " (AVX512-BF16 tiles, vdpbf16ps, where D and Dv are multiples of 16)";
  return out;
}

}  // namespace attnlab
