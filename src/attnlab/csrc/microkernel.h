// Tile GEMMs on AVX-512 for float32 (FMA) and bfloat16 (AVX512-BF16's vdpbf16ps): every product of
// the forward and backward passes as one register-blocked micro-kernel; microkernel.cpp says why
// and how operands are laid out.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <type_traits>

namespace attnlab {

// Whether this build has the tiles (the avx512_bf16 build: -march=x86-64-v4 -mavx512bf16; setup.py).
bool tiles_built();

// Whether a float32 or bfloat16 call takes the tiles: built, D and Dv whole vectors of 16 (lanes
// over D and Dv in O += P V, dQ, dK, dV), key chunks whole vectors of 16.
template <typename Problem>
inline bool uses_tiles(const Problem& pb) {
  return tiles_built() && pb.D % 16 == 0 && pb.Dv % 16 == 0 && pb.BK % 16 == 0;
}

// Packing K and V costs O(S D) per kv head, into buffers kept between calls (kept.h), and is paid back over
// the query rows that read each head (L G). On AMD Zen 4 (scripts/bench_decode.py, B=1 H=8 D=64, other calls
// between; docs/benchmarks.md, "Issue #27: kept packed K and V") bfloat16 gains from one row: 1 query over
// 1024-16384 keys took 0.17-3.8 ms packed against 0.73-7.9 on the BLAS path, 16 or 32 queries 1.26-1.87x torch
// SDPA against 1.08-1.29x. float32 (and float16, computed as float32) packs from 64 rows, as before the buffers
// were kept: at 16 and 32 rows without a mask the two paths tied (0.85-1.43x SDPA packed, 0.94-1.01x on the BLAS
// path, in runs that disagreed), at 1, 4 and 8 rows the BLAS path won every case (0.87-1.88x against 0.41-1.43x,
// with and without key padding).
template <typename scalar_t>
constexpr int64_t kPackFromRows = std::is_same_v<scalar_t, at::BFloat16> ? 1 : 64;
template <typename scalar_t, typename Problem>
inline bool packs_for_tiles(const Problem& pb) {
  return uses_tiles(pb) && pb.L * pb.G >= kPackFromRows<scalar_t>;
}

// bfloat16 K and V of one call, packed once (O(S D)); keys padded with zeros to S16, a multiple of 16.
// (float32 needs only `groups`, [X][16] floats per group: its `pairs` are plain rows.)
//   groups: 16 keys at a time, [X/2][16] words -- the second operand of S = Q K^T and dP = dO V^T
//   pairs:  2 keys at a time,  [X] words       -- the second operand of O += P V and dQ += dS K
struct PackedKV {
  at::Tensor k_groups, v_groups, v_pairs, k_pairs;   // (B Hkv, S16 X / 2) int32 words; undefined if unused
  at::Tensor k_cols, v_cols;                         // AMX only (amx.h): K^T, V^T as [X/2][ld_cols] words per head
  int64_t S16 = 0, ld_cols = 0;
  bool amx = false;                                  // packed for amx_gemm (amx_pack_kv), not the tiles
};

// Packs k (B, Hkv, S, D) and v (B, Hkv, S, Dv) given by pointer and strides (b, h, s). The forward
// needs k_groups (and v_pairs in bfloat16); `backward` adds v_groups (and k_pairs in bfloat16).
// float32 groups are (B Hkv, S16 X) floats, [X][16] per group of 16 keys.
PackedKV pack_kv(const at::BFloat16* k, const int64_t* ks, const at::BFloat16* v, const int64_t* vs, int64_t B,
                 int64_t Hkv, int64_t S, int64_t D, int64_t Dv, bool backward);
PackedKV pack_kv(const float* k, const int64_t* ks, const float* v, const int64_t* vs, int64_t B, int64_t Hkv,
                 int64_t S, int64_t D, int64_t Dv, bool backward);

// Rows r0..r0+n of x (row stride ld, X columns) as pairs of rows: out[(i / 2) X + c] = (x[i][c], x[i+1][c]);
// a missing last row reads as 0. `out` holds ceil(n / 2) X words.
void pair_rows(const at::BFloat16* x, int64_t ld, int64_t n, int64_t X, uint32_t* out);

// One kv head's S keys (rows of x) as pairs, zeros after them up to S16 keys: S16 / 2 X words, the `pairs`.
void pair_keys(const at::BFloat16* x, int64_t ld, int64_t S, int64_t X, int64_t S16, uint32_t* out);

// Same from fp32 rows rounded to bfloat16 (P and dS for dV and dK); X a multiple of 16.
void pair_rows(const float* x, int64_t ld, int64_t n, int64_t X, uint32_t* out);

// The columns of a (rows x key chunk) block that each row needs: row r's [a[r], e[r]), chunk-relative (a >= e:
// none). A product given them skips, for each block of the micro-kernel's rows (6), the columns outside those rows'
// hull: a band's slanted edges (a window's, the causal diagonal's), which a query tile's key range includes for
// the tile's other rows. For a W = 256 window in 64-row tiles that was a fifth of every product (320 keys computed
// per row for 257 allowed). Null: every column.
struct RowBounds {
  const int32_t* a = nullptr;
  const int32_t* e = nullptr;
};

// s (nr, ncols; row stride lds) = alpha * a (nr, X; row stride lda) B[c0 : c0 + ncols]^T, with B one kv
// head's `groups` (X = D for K, Dv for V). c0 and ncols multiples of 16.
// float32: the same against its [X][16]-float groups.
// With bounds, only each row block's vectors of 16 columns that meet its rows' hull are written; the rest of s
// keeps what it held (the caller reads a row only within its bounds).
void rows_by_groups(const at::BFloat16* a, int64_t lda, int64_t nr, const at::Tensor& groups, int64_t bh,
                    int64_t S16, int64_t X, int64_t c0, int64_t ncols, float alpha, float* s, int64_t lds,
                    RowBounds bounds = {});
void rows_by_groups(const float* a, int64_t lda, int64_t nr, const at::Tensor& groups, int64_t bh, int64_t S16,
                    int64_t X, int64_t c0, int64_t ncols, float alpha, float* s, int64_t lds, RowBounds bounds = {});

// o (nr, X; row stride ldo) += alpha * p[:, ka:kb] B[c0 + ka : c0 + kb], with B one kv head's `pairs`
// (X = Dv for V, D for K) and p nr rows of stride ldp whose column 0 is key c0. c0 a multiple of 16.
// Rows of B outside [c0 + ka, c0 + kb) are never part of the sum, even as 0 * B: a NaN there stays out.
// With bounds (p 0 outside them), each row block sums over its rows' hull within [ka, kb) only.
void bf16_rows_by_pairs(const at::BFloat16* p, int64_t ldp, int64_t nr, const at::Tensor& pairs, int64_t bh,
                        int64_t S16, int64_t X, int64_t c0, int64_t ka, int64_t kb, float alpha, float* o,
                        int64_t ldo, RowBounds bounds = {});

// c (kb - ka, X; row stride ldc) += alpha * a[:, ka:kb]^T b over nr rows, a an (nr, ncols) block given
// as pair_rows and b an (nr, X) block given as pair_rows; X a multiple of 16. dV += P^T dO, dK += scale dS^T Q.
// With bounds (a 0 outside them), each block of 6 keys sums over the rows whose bounds meet it only.
void bf16_columns_by_pairs(const uint32_t* a_pairs, int64_t ncols, int64_t ka, int64_t kb, const uint32_t* b_pairs,
                           int64_t X, int64_t nr, float alpha, float* c, int64_t ldc, RowBounds bounds = {});

// float32 on the same micro-kernel (one element per word, FMA instead of vdpbf16ps); rows need no packing.
// o (nr, X) += alpha * p[:, ka:kb] b[ka:kb], b row-major (row stride ldb) with X a multiple of 16 (bounds: as
// bf16_rows_by_pairs').
void fp32_rows_by_rows(const float* p, int64_t ldp, int64_t nr, const float* b, int64_t ldb, int64_t X, int64_t ka,
                       int64_t kb, float alpha, float* o, int64_t ldo, RowBounds bounds = {});

// c (kb - ka, X) += alpha * a[:, ka:kb]^T b over nr rows, a (nr, lda) and b (nr, X) row-major; X a multiple of 16
// (bounds: as bf16_columns_by_pairs').
void fp32_columns_by_rows(const float* a, int64_t lda, int64_t ka, int64_t kb, const float* b, int64_t ldb, int64_t X,
                          int64_t nr, float alpha, float* c, int64_t ldc, RowBounds bounds = {});

}  // namespace attnlab
