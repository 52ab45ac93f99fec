// Why buffers are kept: a fresh buffer of megabytes per call pays its page faults on every call once
// malloc returns the memory between calls (glibc maps large blocks and unmaps them on free), and dearly
// on a VM whose host takes freed pages back (free-page reporting; measure/machine.py, reclaim_note).
// On the AMD EPYC Zen 3, such a guest, float16 decoding (L = 1, S = 16384 keys, H = 8) took 28.1-30.7 ms
// with fresh float32 copies and 5.6 ms with kept ones (docs/benchmarks.md, "Issue #27: small requests");
// on the Zen 4 the packed K and V of a call with 64-256 queries over 4096-16384 keys, the same
// ("Issue #27: kept packed K and V").
//
// A kept buffer is reused by the next call on the same thread whose buffer for that slot fits, while
// nothing else holds it (its storage's use count is 1: a tensor handed out earlier and still alive keeps
// it from being written over). Only the thread that calls the kernel allocates them (packing runs before
// the parallel region hands the packed tensors to its workers), so a process holds at most one set per
// calling thread: at most kKeptBytes per slot, freed by release_kept() or when the thread exits.
#include "kept.h"

#include <array>

namespace attnlab {

namespace {

// Above this a buffer is fresh on every call: keeping one that size would hold memory long after the call
// for little gain against the call's own O(L S D) work.
constexpr int64_t kKeptBytes = int64_t(64) << 20;

using Slots = std::array<at::Tensor, static_cast<size_t>(Kept::count)>;   // uint8 storage per slot

Slots& slots() {
  thread_local Slots kept;
  return kept;
}

}  // namespace

at::Tensor kept_buffer(Kept slot, int64_t rows, int64_t cols, at::ScalarType dtype) {
  const auto opts = at::TensorOptions().dtype(dtype);
  const int64_t bytes = rows * cols * static_cast<int64_t>(c10::elementSize(dtype));
  if (bytes > kKeptBytes) return at::empty({rows, cols}, opts);
  at::Tensor& buf = slots().at(static_cast<size_t>(slot));
  if (!buf.defined() || buf.numel() < bytes || buf.storage().use_count() != 1)
    buf = at::empty({bytes}, opts.dtype(at::kByte));
  // the first `bytes` bytes as (rows, cols) of dtype: the storage is the allocator's (64-byte aligned)
  return at::empty({0}, opts).set_(buf.storage(), 0, {rows, cols}, {cols, 1});
}

int64_t release_kept() {
  int64_t bytes = 0;
  for (at::Tensor& buf : slots()) {
    if (buf.defined()) bytes += buf.numel();
    buf.reset();
  }
  return bytes;
}

}  // namespace attnlab
