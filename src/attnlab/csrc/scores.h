// S = Q K^T for one (query tile x key chunk): the first product of both passes (forward.cpp, backward.cpp).
#pragma once

#include <type_traits>

#include "amx.h"
#include "microkernel.h"
#include "native.h"

namespace attnlab {

// The nr rows of q (row stride qs2) against the chunk's keys [c0, c0 + ncols) into s (row stride lds), on
// the path the call's K was packed for: the micro-kernel's 16-key groups (pk, not AMX), AMX's K^T columns
// (pk->amx: brgemm has no alpha, so the softmax applies the scale), else the BLAS on kb's nk rows (row
// stride ks2). Scaled by qk_alpha except on AMX. bhk: the (batch, kv head) index into the packed tensors.
// bounds: each row's columns (microkernel.h); the micro-kernel computes only those of its row blocks' hulls.
template <typename scalar_t, typename acc_t>
inline void chunk_scores(const Problem<acc_t>& pb, const PackedKV* pk, const scalar_t* q, int64_t qs2,
                         const scalar_t* kb, int64_t ks2, int64_t bhk, int64_t nr, int64_t c0, int64_t nk,
                         int64_t ncols, acc_t* s, int64_t lds, RowBounds bounds) {
  if constexpr (!std::is_same_v<scalar_t, double>) {
    if (pk != nullptr && !pk->amx) {
      rows_by_groups(q, qs2, nr, pk->k_groups, bhk, pk->S16, pb.D, c0, ncols, qk_alpha(pb), s, lds, bounds);
      return;
    }
  }
  if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
    if (pk != nullptr && pk->amx) {
      amx_gemm(nr, ncols, pb.D, q, qs2, amx_head(pk->k_cols, bhk, pk->ld_cols, pb.D) + c0, pk->ld_cols, s, lds,
               false);
      return;
    }
  }
  gemm(false, true, nr, nk, pb.D, qk_alpha(pb), q, qs2, kb + c0 * ks2, ks2, acc_t(0), s, lds);
}

}  // namespace attnlab
