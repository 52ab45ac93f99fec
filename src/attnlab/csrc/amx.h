// bfloat16 products on AMX: oneDNN's brgemm micro-kernel (torch's at::native::cpublas), where the CPU
// has AMX tiles (Intel Xeon since Sapphire Rapids). amx.cpp says why and how operands are laid out.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "microkernel.h"

namespace attnlab {

// Whether this CPU runs AMX bf16 tiles through cpublas (AMX present, the OS lets this process use
// it, oneDNN can pack for it). Asked once.
bool amx_supported();
// Turn the AMX path on or off for this process (native_build.py: on for the `amx` level, off when a
// lower level is forced); returns whether it is on. Off unless this build has the micro-kernel's
// tiles too (the avx512_bf16 build): the AMX path shares their packing.
bool set_amx(bool on);
bool amx_on();
// Tests only: turn the AMX path on with a plain loop in brgemm's place (amx_gemm), so a CPU without AMX runs every
// other line of this path -- packing, the fused softmax, the key pairs past a tile -- against the conformance
// suites (slow: a scalar GEMM). set_amx ends it. Off unless this build has the tiles; returns whether it is on.
bool emulate_amx(bool on);
bool amx_is_emulated();

// Whether a bfloat16 call takes AMX: on, D and Dv multiples of 16, key chunks a multiple of 16.
template <typename Problem>
inline bool uses_amx(const Problem& pb) {
  return amx_on() && pb.D % 16 == 0 && pb.Dv % 16 == 0 && pb.BK % 16 == 0;
}

// K (and V, for the backward) of one call packed for brgemm, once (O(S D)); keys padded with zeros to
// pk.S16 (a multiple of 16 past S + 15). Adds to pack_kv's `pairs` (which brgemm reads as they are):
//   k_cols: K^T in brgemm's VNNI layout, [D/2][ld_cols] words per kv head, word (p, j) = (K[j][2p], K[j][2p+1])
//   v_cols: the same of V (backward: dP = dO V^T)
// Sets pk.amx. `finite`: whether K and V hold no inf or NaN (amx.cpp: why the caller asks).
PackedKV amx_pack_kv(const at::BFloat16* k, const int64_t* ks, const at::BFloat16* v, const int64_t* vs, int64_t B,
                     int64_t Hkv, int64_t S, int64_t D, int64_t Dv, bool backward, bool& finite);

// One kv head's words in a packed (B Hkv, ld X / 2) tensor (ld: S16 for pairs, ld_cols for columns).
inline const uint32_t* amx_head(const at::Tensor& t, int64_t bh, int64_t ld, int64_t X) {
  return reinterpret_cast<const uint32_t*>(t.data_ptr<int32_t>()) + bh * ld * X / 2;
}

// Packs a bfloat16 call for AMX where it takes that path (uses_amx), returning whether it does. Chunks start
// on an even key and the backward reads whole groups of 16, so a product can reach a key just outside a
// tile's keys with weight 0: fine unless K or V holds a NaN or inf there (0 * NaN), so a masked call with
// a non-finite K or V returns false (the caller takes the tiles). Unmasked chunks never leave [0, S).
template <typename Problem>
bool pack_for_amx(const Problem& pb, const at::BFloat16* k, const int64_t* ks, const at::BFloat16* v,
                  const int64_t* vs, bool backward, PackedKV& out) {
  if (!uses_amx(pb)) return false;
  bool finite = true;
  out = amx_pack_kv(k, ks, v, vs, pb.B, pb.Hkv, pb.S, pb.D, pb.Dv, backward, finite);
  return finite || pb.spans == nullptr;
}

// c (m x n; row stride ldc) (+)= a (m x kk bfloat16; row stride lda) b (kk x n), b in VNNI words
// [kk/2][ldb] (pair_rows' layout, or a column offset into k_cols / v_cols). kk even.
void amx_gemm(int64_t m, int64_t n, int64_t kk, const at::BFloat16* a, int64_t lda, const uint32_t* b, int64_t ldb,
              float* c, int64_t ldc, bool accumulate);

// The softmax pass of one bfloat16 row on this path and on the AVX-512 tiles (forward.cpp, scale 1 there): the
// max of row[a:e) (NaN may or may not win: a NaN score makes its probability NaN either way), and p =
// exp(scale * row - m) on [a, e) rounded to bfloat16 into out[a:e), returning the fp32 sum of p. In the
// avx512_bf16 build, AVX-512 with its own exp (vecmath.h exp2_clamped: a degree-5 polynomial and vscalefps, 1.9e-7
// relative) and one-instruction rounding (vcvtne2ps2bf16); the other builds run neither path (stubs that refuse).
float row_max(const float* row, int64_t a, int64_t e);
float row_exp_bf16(const float* row, int64_t a, int64_t e, float scale, float m, at::BFloat16* out);
// The backward's probabilities on this path for a row with no bias, softcap or per-key mask: row[a:e) becomes
// exp(scale * row - lse) in place, the forward's exp fused with the scale brgemm did not apply.
void row_exp_inplace(float* row, int64_t a, int64_t e, float scale, float lse);

// Rows r of x (n rows, X columns, row stride ld) as columns: out (X x n_pad; row stride ldo) bfloat16,
// zero past n (the A operand of dK^T += Q^T dS and dV^T += dO^T P).
void transpose_rows(const at::BFloat16* x, int64_t ld, int64_t n, int64_t n_pad, int64_t X, at::BFloat16* out,
                    int64_t ldo);

// Releases this thread's AMX tile configuration when it goes out of scope (after a parallel chunk's
// last brgemm; what torch's CPU flash attention does too).
class AmxRelease {
 public:
  explicit AmxRelease(bool active) : active_(active) {}
  ~AmxRelease();
  AmxRelease(const AmxRelease&) = delete;
  AmxRelease& operator=(const AmxRelease&) = delete;

 private:
  bool active_;
};

}  // namespace attnlab
