// Buffers kept per thread between calls: the float32 copies of float16 inputs (bindings.cpp) and the
// packed K and V (microkernel.cpp, amx.cpp). kept.cpp says why.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace attnlab {

// One slot per buffer a call needs at the same time.
enum class Kept : int { q, k, v, dout, k_groups, v_groups, v_pairs, k_pairs, k_cols, v_cols, count };

// A contiguous (rows, cols) tensor of `dtype`, contents undefined: this thread's buffer for `slot` when it
// fits and nothing else holds it, else a fresh one (kept for the next call when at most kKeptBytes).
// Example: at::Tensor groups = kept_buffer(Kept::k_groups, B * Hkv, S16 * D / 2, at::kInt);
at::Tensor kept_buffer(Kept slot, int64_t rows, int64_t cols, at::ScalarType dtype);

// Frees this thread's kept buffers; returns the bytes they held.
int64_t release_kept();

}  // namespace attnlab
