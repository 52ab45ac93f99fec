// Python bindings: argument checks at the boundary (TORCH_CHECK names the values and the fix),
// then one call into the forward or backward kernel. The Python side
// (attnlab/functional/backends/native.py) prepares the mask spans/bits and the bias table.
// torch/python.h (pybind11 with torch's type casters), not torch/extension.h: the latter adds all of the C++
// frontend (nn, optim, data), which tripled this file's compile time and is not used here.
#include <torch/python.h>

#include "amx.h"
#include "kept.h"
#include "microkernel.h"
#include "native.h"

namespace attnlab {

template <typename scalar_t>
void run_forward(const Problem<typename Acc<scalar_t>::type>&, const at::Tensor&, const at::Tensor&,
                 const at::Tensor&, at::Tensor&, at::Tensor&);
template <typename scalar_t>
void run_backward(const Problem<typename Acc<scalar_t>::type>&, const at::Tensor&, const at::Tensor&,
                  const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, at::Tensor&,
                  at::Tensor&, at::Tensor&, at::Tensor*);

namespace {

at::ScalarType acc_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(),
              "native attention runs on the CPU; got q on ", q.device(), ": use backend='tiled' or 'triton' on GPUs");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v must be 4-D (B, H, L, D)");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
              "q, k, v must share a dtype, got ", q.scalar_type(), ", ", k.scalar_type(), ", ", v.scalar_type());
  auto t = q.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kDouble || t == at::kBFloat16 || t == at::kHalf,
              "native attention takes float32, float64, bfloat16 or float16, got ", t,
              ": cast the inputs or use backend='tiled'");
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "q has ", q.size(1), " heads, k has ", k.size(1),
              ": q heads must be a multiple of k heads");
}

// x (B, H, N, W) as the kernel reads it: row n of head (b, h) at x + b s0 + h s1 + n s2, W elements
// with stride 1, and s2 handed to BLAS as a leading dimension, which its contract wants >= W (and
// >= 1) even for one row -- MKL otherwise prints "Parameter 8 was incorrect" and leaves C as it
// was. So: the same view where those hold, with canonical strides on size-1 dims (whose strides
// are never stepped but may be anything: a (1, 31) transpose is "contiguous" with s2 = 1 < W);
// one contiguous copy, made here once per call, where they do not (a sequence expanded with
// stride 0, overlapping rows, a last dim with stride != 1). Leading strides may be anything,
// 0 (expanded batch or heads) included: they only offset a matrix.
at::Tensor readable(const at::Tensor& x) {
  const int64_t N = x.size(2), W = x.size(3), row = std::max<int64_t>(W, 1);
  const bool last_ok = W <= 1 || x.stride(3) == 1;
  const bool rows_ok = N <= 1 || x.stride(2) >= row;
  at::Tensor y = last_ok && rows_ok ? x : x.contiguous();
  std::vector<int64_t> st = y.strides().vec();
  if (W <= 1) st[3] = 1;
  if (N <= 1) st[2] = row;
  return st == y.strides().vec() ? y : y.as_strided(y.sizes(), st);
}

// float16 is computed as float32: the inputs are converted here once per call (O(n D) against the
// kernel's O(n^2 D)); out, lse and the gradients come back in float32, and the Python side rounds out
// once, so that its backward's rowsum(dO o O) reads the unrounded output as the float32 computation's
// does: fp16 results are the fp32 computation's, rounded (tests/test_native.py). On the one CPU where
// fp16 was measured (AMD EPYC Zen 3) no fp16 GEMM this kernel could call was faster than its fp32 one
// (MKL's cblas_gemm_f16f16f32 170 GFLOP/s, sgemm_ 190; docs/design.md, "float16"), and rounding the
// probabilities and dS to fp16 would add error the reference does not have.
//
// The float32 copies are written into buffers kept per thread, one per operand, and reused by the next call
// they fit (kept.cpp: why; fp16 decoding on the Zen 3 took 28.1-30.7 ms with fresh copies, 5.6 ms with kept
// ones, and 14.4 ms in torch's SDPA).
at::Tensor computed(const at::Tensor& x, Kept slot) {
  if (x.scalar_type() != at::kHalf) return x;
  at::Tensor y = kept_buffer(slot, 1, x.numel(), at::kFloat).view(x.sizes());   // contiguous
  y.copy_(x);
  return y;
}

// Problem from the Python-side arguments (the tensors must outlive the call: they are borrowed).
template <typename acc_t>
Problem<acc_t> make_problem(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const c10::optional<at::Tensor>& spans, const c10::optional<at::Tensor>& bits,
                            int64_t bias_kind, const c10::optional<at::Tensor>& bias, int64_t tW, int64_t tc0,
                            double scale, double softcap, double dropout_p, int64_t seed, int64_t BQ, int64_t BK) {
  Problem<acc_t> pb;
  pb.B = q.size(0); pb.H = q.size(1); pb.Hkv = k.size(1); pb.G = pb.H / pb.Hkv;
  pb.L = q.size(2); pb.S = k.size(2); pb.D = q.size(3); pb.Dv = v.size(3);
  TORCH_CHECK(BQ > 0 && BK > 0, "tile sizes must be positive, got tile_q=", BQ, " tile_k=", BK);
  pb.BQ = BQ; pb.BK = BK;
  pb.scale = scale; pb.softcap = softcap;
  if (spans && spans->defined()) {
    const auto& s = *spans;
    TORCH_CHECK(s.scalar_type() == at::kLong && s.dim() == 4 && s.is_contiguous() && s.size(1) == pb.L &&
                s.size(3) == 2 && (s.size(0) == 1 || s.size(0) == pb.B),
                "spans must be a contiguous int64 (B|1, L, K, 2) tensor, got ", s.sizes());
    pb.spans = s.data_ptr<int64_t>();
    pb.spans_sb = s.size(0) == 1 ? 0 : s.stride(0);
    pb.K = s.size(2);
  }
  if (bits && bits->defined()) {
    const auto& m = *bits;
    TORCH_CHECK(m.scalar_type() == at::kLong && m.dim() == 4 && m.is_contiguous() && m.size(2) == pb.L &&
                m.size(3) == (pb.S + 63) / 64,
                "bits must be a contiguous int64 (B|1, H|1, L, ceil(S/64)) tensor, got ", m.sizes());
    pb.bits = reinterpret_cast<const uint64_t*>(m.data_ptr<int64_t>());
    pb.bits_sb = m.size(0) == 1 ? 0 : m.stride(0);
    pb.bits_sh = m.size(1) == 1 ? 0 : m.stride(1);
    pb.W64 = m.size(3);
  }
  pb.bias_kind = static_cast<int>(bias_kind);
  if (bias_kind != 0) {
    TORCH_CHECK(bias && bias->defined() && bias->dim() == 4 && bias->scalar_type() == acc_type(q.scalar_type()),
                "bias must be a 4-D ", acc_type(q.scalar_type()), " tensor");
    const auto& t = *bias;
    pb.bias = t.data_ptr<acc_t>();
    pb.bsb = t.size(0) == 1 ? 0 : t.stride(0);
    pb.bsh = t.size(1) == 1 ? 0 : t.stride(1);
    pb.bsl = t.size(2) == 1 ? 0 : t.stride(2);
    pb.bss = t.size(3) == 1 ? 0 : t.stride(3);
    if (bias_kind == 2) {
      TORCH_CHECK(t.stride(3) == 1 && t.size(3) == tW, "a relative table must be contiguous in its last dim of size ", tW);
      pb.tW = tW; pb.tc0 = tc0;
    }
  }
  TORCH_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, "dropout_p must be in [0, 1), got ", dropout_p);
  pb.drop.p = dropout_p;
  pb.drop.seed = static_cast<uint64_t>(seed);
  pb.drop.threshold = static_cast<uint64_t>(dropout_p * 4294967296.0);
  pb.drop.inv_keep = dropout_p > 0.0 ? 1.0 / (1.0 - dropout_p) : 1.0;
  return pb;
}

std::vector<at::Tensor> forward(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                const c10::optional<at::Tensor>& spans, const c10::optional<at::Tensor>& bits,
                                int64_t bias_kind, const c10::optional<at::Tensor>& bias, int64_t tW, int64_t tc0,
                                double scale, double softcap, double dropout_p, int64_t seed, int64_t BQ, int64_t BK) {
  check_inputs(q_in, k_in, v_in);
  const at::Tensor q = readable(computed(q_in, Kept::q)), k = readable(computed(k_in, Kept::k)),
                   v = readable(computed(v_in, Kept::v));
  auto out = at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
  auto lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(acc_type(q.scalar_type())));
  switch (q.scalar_type()) {
    case at::kFloat:
      run_forward<float>(make_problem<float>(q, k, v, spans, bits, bias_kind, bias, tW, tc0, scale, softcap, dropout_p,
                                             seed, BQ, BK), q, k, v, out, lse);
      break;
    case at::kDouble:
      run_forward<double>(make_problem<double>(q, k, v, spans, bits, bias_kind, bias, tW, tc0, scale, softcap,
                                               dropout_p, seed, BQ, BK), q, k, v, out, lse);
      break;
    default:
      run_forward<at::BFloat16>(make_problem<float>(q, k, v, spans, bits, bias_kind, bias, tW, tc0, scale, softcap,
                                                    dropout_p, seed, BQ, BK), q, k, v, out, lse);
  }
  return {out, lse};
}

// Returns dq (B, H, L, D), dk (B, H, S, D), dv (B, H, S, Dv) in the accumulation type (dk/dv per
// query head: the caller sums GQA groups) and the bias gradient (dense (B, H, L, S) or table
// (B, H, Lt, W)) when want_dbias.
std::vector<at::Tensor> backward(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                 const at::Tensor& dout_in,
                                 const at::Tensor& lse, const at::Tensor& delta,
                                 const c10::optional<at::Tensor>& spans, const c10::optional<at::Tensor>& bits,
                                 int64_t bias_kind, const c10::optional<at::Tensor>& bias, int64_t tW, int64_t tc0,
                                 double scale, double softcap, double dropout_p, int64_t seed, int64_t BQ, int64_t BK,
                                 bool want_dbias) {
  check_inputs(q_in, k_in, v_in);
  const std::vector<int64_t> out_shape{q_in.size(0), q_in.size(1), q_in.size(2), v_in.size(3)};
  TORCH_CHECK(dout_in.sizes() == at::IntArrayRef(out_shape) && dout_in.scalar_type() == q_in.scalar_type(),
              "dout must have out's shape ", at::IntArrayRef(out_shape), " and dtype ", q_in.scalar_type(), ", got ",
              dout_in.sizes(), " ", dout_in.scalar_type());
  const at::Tensor q = readable(computed(q_in, Kept::q)), k = readable(computed(k_in, Kept::k)),
                   v = readable(computed(v_in, Kept::v)), dout = readable(computed(dout_in, Kept::dout));
  const auto acc = q.options().dtype(acc_type(q.scalar_type()));
  TORCH_CHECK(lse.is_contiguous() && delta.is_contiguous() && lse.scalar_type() == acc.dtype().toScalarType(),
              "lse and delta must be contiguous accumulation-type tensors");
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), S = k.size(2);
  auto dq = at::empty({B, H, L, q.size(3)}, acc);
  auto dk = at::zeros({B, H, S, k.size(3)}, acc);
  auto dv = at::zeros({B, H, S, v.size(3)}, acc);
  at::Tensor dbias;
  if (want_dbias && bias_kind == 1) dbias = at::zeros({B, H, L, S}, acc);
  if (want_dbias && bias_kind == 2) dbias = at::zeros({B, H, bias->size(2), tW}, acc);
  at::Tensor* db = dbias.defined() ? &dbias : nullptr;
  switch (q.scalar_type()) {
    case at::kFloat:
      run_backward<float>(make_problem<float>(q, k, v, spans, bits, bias_kind, bias, tW, tc0, scale, softcap, dropout_p,
                                              seed, BQ, BK), q, k, v, dout, lse, delta, dq, dk, dv, db);
      break;
    case at::kDouble:
      run_backward<double>(make_problem<double>(q, k, v, spans, bits, bias_kind, bias, tW, tc0, scale, softcap,
                                                dropout_p, seed, BQ, BK), q, k, v, dout, lse, delta, dq, dk, dv, db);
      break;
    default:
      run_backward<at::BFloat16>(make_problem<float>(q, k, v, spans, bits, bias_kind, bias, tW, tc0, scale, softcap,
                                                     dropout_p, seed, BQ, BK), q, k, v, dout, lse, delta, dq, dk, dv, db);
  }
  return {dq, dk, dv, dbias};
}

// The softmax's exp as the kernel runs it, exp(x - m) by exp_range, on a 1-d float tensor (tests: the exp's
// accuracy and its -inf / NaN behaviour in each build). Elements past the last whole vector take std::exp.
at::Tensor exp_from(const at::Tensor& x, double m) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 1, "exp_from takes a 1-d float32 tensor, got ",
              x.scalar_type(), " with ", x.dim(), " dims");
  const at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty_like(xc);
  exp_range(xc.data_ptr<float>(), out.data_ptr<float>(), 0, xc.numel(), static_cast<float>(m));
  return out;
}

}  // namespace
}  // namespace attnlab

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "attnlab's compiled CPU attention kernel (FlashAttention-2 forward and backward)";
  m.def("forward", &attnlab::forward, "forward pass -> [out (B, H, L, Dv), lse (B, H, L)]");
  m.def("backward", &attnlab::backward, "backward pass -> [dq, dk, dv (per query head), dbias]");
  m.def("set_amx", &attnlab::set_amx, "use AMX (brgemm) for bfloat16 where the CPU has it; returns whether it is on");
  m.def("emulate_amx", &attnlab::emulate_amx, "tests only: the AMX path with a plain loop in brgemm's place, on any "
        "CPU this build runs; set_amx ends it; returns whether it is on");
  m.def("amx_emulated", &attnlab::amx_is_emulated, "whether the AMX path runs emulated (emulate_amx)");
  m.def("amx_supported", &attnlab::amx_supported, "whether this CPU runs bfloat16 brgemm on AMX tiles");
  m.def("release_buffers", &attnlab::release_kept, "frees the buffers this thread keeps between calls (float32 "
        "copies of float16 inputs, packed K and V); returns the bytes they held");
  m.def("blas", &attnlab::blas_name, "which GEMM each dtype uses");
  m.def("tiles_built", &attnlab::tiles_built, "whether float32 and bfloat16 run on the AVX-512 micro-kernel "
        "(where D and Dv are multiples of 16)");
  m.def("uses_tiles", [](int64_t D, int64_t Dv, int64_t BK) {
    struct Shape { int64_t D, Dv, BK; } shape{D, Dv, BK};
    return attnlab::uses_tiles(shape);               // the forward's and backward's own test
  }, "whether a float32 or bfloat16 call with head dims D, Dv and key chunk BK runs on the micro-kernel");
  m.def("uses_amx", [](int64_t D, int64_t Dv, int64_t BK) {
    struct Shape { int64_t D, Dv, BK; } shape{D, Dv, BK};
    return attnlab::uses_amx(shape);                 // the forward's and backward's own test
  }, "whether a bfloat16 call with head dims D, Dv and key chunk BK runs its products on AMX");
  m.def("exp_from", &attnlab::exp_from, "tests: the softmax's exp(x - m) as the kernel computes it (1-d float32 x)");
  m.def("capability", []() {
#if defined(CPU_CAPABILITY_AVX512)
    return std::string("AVX512");
#elif defined(CPU_CAPABILITY_AVX2)
    return std::string("AVX2");
#else
    return std::string("DEFAULT (scalar at::vec)");
#endif
  });
}
