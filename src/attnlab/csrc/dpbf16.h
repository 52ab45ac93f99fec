// bfloat16 tile GEMMs on AVX512-BF16 (vdpbf16ps) for the forward pass; dpbf16.cpp says why and
// how K and V are packed.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>

namespace attnlab {

// Whether this build has the AVX512-BF16 tiles (compiled with -march=native on a CPU that has them).
bool dpbf16_built();

// Whether a bfloat16 forward call takes the AVX512-BF16 tiles: built, D even (pairs along D),
// Dv and the key chunk whole vectors of 16.
template <typename Problem>
inline bool uses_dpbf16(const Problem& pb) {
  return dpbf16_built() && pb.D % 2 == 0 && pb.Dv % 16 == 0 && pb.BK % 16 == 0;
}

// K and V of one call in pair-interleaved ("VNNI") form, keys padded with zeros to S16 (a multiple of 16).
struct PackedKV {
  at::Tensor k, v;          // int32 words: (B Hkv, S16 D / 2) and (B Hkv, S16 / 2 Dv)
  int64_t S16 = 0, D = 0, Dv = 0;
};

// Packs k (B, Hkv, S, D) and v (B, Hkv, S, Dv) given by pointer and strides (b, h, s); D even.
PackedKV pack_kv(const at::BFloat16* k, const int64_t* ks, const at::BFloat16* v, const int64_t* vs, int64_t B,
                 int64_t Hkv, int64_t S, int64_t D, int64_t Dv);

// s (nr, ncols; row stride lds) = alpha * q (nr, D; row stride ldq) K[c0 : c0 + ncols]^T of kv head bh.
// c0 and ncols multiples of 16.
void dpbf16_qk(const at::BFloat16* q, int64_t ldq, int64_t nr, const PackedKV& pk, int64_t bh, int64_t c0,
               int64_t ncols, float alpha, float* s, int64_t lds);

// o (nr, Dv; row stride ldo) += p[:, ka:kb] V[c0 + ka : c0 + kb] of kv head bh (p: nr rows of stride
// ldp, column 0 = key c0). c0 a multiple of 16, Dv a multiple of 16. V rows outside [c0 + ka, c0 + kb)
// are never part of the sum, even as 0 * V: a NaN there stays out.
void dpbf16_pv(const at::BFloat16* p, int64_t ldp, int64_t nr, const PackedKV& pk, int64_t bh, int64_t c0,
               int64_t ka, int64_t kb, float* o, int64_t ldo);

}  // namespace attnlab
