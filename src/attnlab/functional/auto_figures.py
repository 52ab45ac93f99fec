"""The thresholds ``auto`` decides by and the figures its reasons quote, each naming the CPU it was measured on
(issue #27: a rule measured on one CPU class can be wrong several-fold on another). ``auto_rule`` is the rule that
reads them; docs/benchmarks.md holds the runs, with their commands.

Example::

    from attnlab.functional.auto_figures import AVX2_MEASURED, SMALL_PROBLEM
    AVX2_MEASURED["fp32 causal"]         # 'fp32 causal: the compiled kernel measured 1.05-1.26x ... (AMD EPYC ...)'
"""
from __future__ import annotations

import torch

from .auto_figures_amx import AMX_BF16_MIN_SKIPPABLE, AMX_MEASURED

# Up to this many score entries per head, the tiled kernel's per-tile Python overhead costs more
# than skipping saves, and SDPA with the dense mask is faster. The crossover was measured on the AMD Zen 4
# by a script that is not in the repository (docs/benchmarks.md): a threshold, not a quoted figure.
SMALL_PROBLEM = 512 * 512
# Plain requests (no mask, or causal with L == S) -- the auto grids of docs/benchmarks.md ("auto against
# the fastest exact backend", B=1 H=8 D=64, the idle AMD Zen 4, 2 threads; commands in
# docs/benchmarks.md "Issue #14, second/third round"):
# * fp32 and bf16 with D and Dv multiples of 16, where the compiled kernel runs its AVX-512
#   micro-kernel (csrc/microkernel.cpp): it beat SDPA's flash kernel forward and backward, with and
#   without a causal mask, at every n above 512^2 (TILES_MEASURED: the "one table" of n = 1024-16384,
#   10-repeat medians up to 4096). The rules below are for other head dims, where its GEMMs are MKL's:
# * fp32 causal: the compiled kernel beat SDPA's flash kernel at every n (forward 1.24x, 1.10x, 1.11x,
#   1.04x at n = 1024, 2048, 4096, 8192; forward+backward 1.35x, 1.18x, 1.09x up to 4096);
# * fp32 without a mask: SDPA is faster forward (native 0.90-0.93x at n <= 2048, level above), the
#   compiled kernel with gradients from n = 4096 (1.07x there; 1.01x, 1.04x at 1024, 2048);
# * bf16 (MKL's bf16 GEMM, no faster than fp32 on the Zen 4): the compiled kernel's forward wins only on
#   causal below n = 8192 (1.05x, 1.18x, 1.07x; 0.93x at 8192); without a mask, and with gradients,
#   SDPA (native 0.75-0.96x).
NATIVE_TRAIN_FROM = 4096 * 4096
BF16_CAUSAL_NATIVE_BELOW = 8192 * 8192
# Every ratio above was measured on one CPU class, and a rule measured on one class can be wrong several-fold on
# another (issue #27): each figure auto quotes names the CPU it was measured on.
ZEN4 = "AMD Zen 4, AVX512-BF16 without AMX, 2 threads"
# Measured again with the one build on 5 Dec 2026 (docs/benchmarks.md, "Issue #27: the avx512_bf16 class with the
# one build"; 1-2 Dec 2026 before, with -march=native: fp32 1.11-1.20x, 1.11-1.42x, 1.29-1.36x, 1.28-1.68x; bf16
# 1.69-2.26x, 1.84-2.05x, 1.67-1.89x, 1.78-1.96x).
TILES_MEASURED = {
    torch.float32: ("1.06-1.17x SDPA's forward without a mask and 1.10-1.53x with a causal one at n = 1024-16384, "
                    f"1.27-1.30x and 1.34-1.71x its forward+backward at n = 1024-4096 ({ZEN4})"),
    torch.bfloat16: ("2.17-2.24x SDPA's forward without a mask and 2.28-2.69x with a causal one at n = 1024-16384, "
                     f"1.76-1.90x and 1.99-2.17x its forward+backward at n = 1024-4096 ({ZEN4})"),
}
# On a CPU without AVX-512 (class avx2, and "other") torch has no fast bf16 GEMM: oneDNN's bf16 matmul needs
# AVX-512, and the fallback ran at 0.9-1.4 GFLOP/s where MKL's cblas_gemm_bf16bf16f32, which the compiled kernel
# and SDPA's forward call, ran at 118-184 (ZEN3 below, 4 Dec 2026). SDPA's bf16 backward runs on the fallback;
# the compiled kernel's does not. Measured there (docs/benchmarks.md, "Issue #27: auto on an AMD EPYC Zen 3
# with AVX2" and the sections after it, B=1 H=8, D = 64 and 128, n = 1024-16384):
# * bf16 with gradients: the compiled kernel 5.3-7.9x SDPA's forward+backward without a mask or causal, 6.7-246x
#   with a mask or bias, at n = 1024-16384, D = 64 and 128 (1.2-8.3x at n = 64-512);
# * fp32 causal: the kernel 1.05-1.26x SDPA's forward at n = 1024-2048, a tie at 4096 (1.00x), then 0.94x, 0.81x
#   at 8192, 16384 in one run, 0.97x, 0.97x in a second and 1.00x, 0.98x in a third (AVX2_CAUSAL_FWD_BELOW: SDPA
#   by a little from 4096); with gradients 1.03-1.36x at n = 1024-16384;
# * fp32 without a mask, with gradients: the kernel from n = 2048 (AVX2_TRAIN_FROM; 1.01-1.06x at 2048 in six
#   runs and 3072, 0.96-1.05x at 4096, 1.02-1.06x at 8192, 1.02-1.04x at 16384, D = 64 and 128); below 2048 a tie
#   (0.95-1.05x at n = 1024 in eight runs, 0.97-1.05x at 576-1536), left to SDPA;
# * the Zen 4's other thresholds held: no mask, SDPA forward (0.80-0.98x); bf16 causal forward, the kernel
#   below n = 8192 (BF16_CAUSAL_NATIVE_BELOW: 1.14x, 1.04x at 1024, 4096; 0.90x at 8192).
ZEN3 = "AMD EPYC Zen 3, AVX2 without AVX-512, 2 threads"
NO_BF16_GEMM = ("avx2", "other")
# fp16: torch's fp16 GEMM needs AVX512-FP16 (oneDNN), which the Zen 4 lacks as the Zen 3 does: 1.0-3.2 GFLOP/s at
# 256^3-1024^3 on the Zen 4, where its bf16 GEMM ran at 358-427 (5 Dec 2026). So every class off AMX has no fast
# fp16 GEMM (MEASURED_OFF_AMX below); the Xeon with AMX has one (auto_figures_amx).


AVX2_CAUSAL_FWD_BELOW = 4096 * 4096
AVX2_TRAIN_FROM = 2048 * 2048
# Plain fp16 inference goes to the kernel by measured class, as (from this many scores, or without a mask from this
# many keys). On a CPU without AVX-512 torch's fp16 GEMM is a scalar fallback too (1.3 GFLOP/s on the Zen 3), SDPA's
# fp16 forward ran at half its fp32 speed there, and the compiled kernel computes fp16 as fp32 (csrc/bindings.cpp,
# `computed`): the Zen 3's class from n = 48 (n = 96 until the kernel was called directly, backends/native_ops.py's
# _direct) and from 256 keys whatever the queries (SDPA's fp16 cost grows with the keys, 0.97 ms for 1 query over
# 1024), and with gradients at every size (AVX2_MEASURED below; docs/benchmarks.md, "Issue #27: float16 in the
# compiled kernel" and "Issue #27: small requests"). On the Zen 4, where attention's small-request shortcut calls the
# kernel, from 16 keys without a mask whatever the queries, and causal from n = 48 (at 16-32 with the kernel auto
# measured 0.63-0.96x torch SDPA, on SDPA 0.78-0.89x) (ZEN4_MEASURED["fp16 forward"]; the Zen 3's thresholds until
# then: docs/benchmarks.md, "Issue #27: auto's shortcut to the kernel").
FP16_FWD_FROM = {"avx2": (48 * 48, 256), "avx512_bf16": (48 * 48, 16)}


# Below SMALL_PROBLEM, with a structured mask or bias, the compiled kernel called directly (backends/native_ops.py,
# _direct) beat the sdpa backend at every size measured there, forward from n = 64 (L = 1 decoding too):
# AVX2_MEASURED["small masked"]. So did a dense bool mask once the kernel read each row's range and masked a word
# at a time (scripts/bench_dense_masks.py; docs/benchmarks.md, "Issue #27: dense masks"): AVX2_MEASURED["small dense"].
# fp32 training with a mask from n = 64 (SMALL_TRAIN_FROM: median 1.10x, 0.91-1.32x, at n = 64-80 over 65 rows of
# seven runs, 1.05-1.54x at 88-112; below, at 16-56, median 0.89x, 0.81-1.16x, in five runs), and with a structured bias
# (ALiBi, read from a table) at every size, 1.24-1.66x at n = 16-128 in five runs, where the sdpa backend builds the
# dense bias: AVX2_MEASURED["small training"] (docs/benchmarks.md, "Issue #27: fp32 training below 128^2").
# (128^2 until 5 Dec 2026: two earlier runs had found n = 64 a tie, 0.91-1.09x; n = 72-112 had not been measured.)
# The Zen 4's crossover too (ZEN4_MEASURED["small training"]), and the Xeon with AMX's (AMX_MEASURED["small training"]).
SMALL_TRAIN_FROM = 64 * 64
AVX2_MEASURED = {
    "bf16 training": ("bf16 with gradients on a CPU without AVX-512, where torch's bf16 GEMM (which SDPA's backward "
                      "calls) is a scalar fallback: the compiled kernel measured 5.3-7.9x SDPA's forward+backward "
                      "without a mask or with a causal one and 6.7-246x with a mask or bias at n = 1024-16384, D = 64 "
                      f"and 128, and 1.2-8.3x at n = 64-512 ({ZEN3})"),
    "fp32 causal": ("fp32 causal: the compiled kernel measured 1.05-1.26x SDPA's forward at n = 1024-2048 and "
                    f"1.03-1.36x its forward+backward at n = 1024-16384, D = 64 and 128 ({ZEN3})"),
    "fp32 training": ("fp32 with gradients from n = 2048: the compiled kernel measured 1.01-1.06x SDPA's "
                      "forward+backward without a mask at n = 2048 (six runs) and 3072, 0.96-1.05x at 4096, "
                      f"1.02-1.06x at 8192 and 1.02-1.04x at 16384 (D = 64 and 128) ({ZEN3})"),
    "bf16 causal": ("bf16 causal forward below n = 8192: the compiled kernel measured 1.14x, 1.04x SDPA's at "
                    f"n = 1024, 4096 (0.90x at 8192) ({ZEN3})"),
    "training to sdpa": ("fp32 with gradients below n = 2048, a tie: the compiled kernel measured 0.95-1.05x SDPA's "
                         "forward+backward without a mask at n = 1024 in eight runs and 0.97-1.05x at 576-1536 "
                         f"({ZEN3})"),
    "forward to sdpa": ("forward on a CPU with AVX2 and no AVX-512: the compiled kernel measured 0.80-0.98x SDPA's "
                        "without a mask at n = 1024-16384, and with a causal one 1.00-1.03x at n = 4096 and 0.81-1.00x "
                        f"at 8192 and 16384, D = 64 and 128 ({ZEN3})"),
    "fp16 training": ("fp16 with gradients on a CPU without AVX-512, where torch's fp16 GEMM (which SDPA's backward "
                      "calls) is a scalar fallback: the compiled kernel, which computes fp16 as fp32, measured "
                      "2.1-13x SDPA's forward+backward without a mask or with a causal one at n = 64-8192, D = 64, "
                      f"and 10.0-10.6x at n = 4096, D = 128 ({ZEN3})"),
    "fp16 forward": ("fp16 forward on a CPU without AVX-512: the compiled kernel, which computes fp16 as fp32, "
                     "measured 1.1-3.0x SDPA's without a mask or with a causal one at n = 48-16384, D = 64, "
                     "1.4-1.5x at n = 4096, D = 128 (0.60-0.65x at n = 32), and 1.5-3.0x with 1 or 16 queries "
                     f"over 256-4096 keys ({ZEN3})"),
    "fp16 masked": ("measured 2.0-2.1x torch SDPA's fp16 forward (given the dense mask or bias) with key padding, "
                    "2.9-3.5x with ALiBi, 4.9-44x with a W = 256 window and 8.1-12x with 8 documents at "
                    f"n = 1024-16384, D = 64 ({ZEN3})"),
    "small masked": ("a structured mask or bias below 512^2 scores on a CPU without AVX-512: the compiled kernel "
                     "measured 1.2-5.4x the sdpa backend's fp32 forward, 1.3-4.8x bf16 and 1.7-9.0x fp16 with key "
                     "padding, a W = 64 window, 8 documents or ALiBi at n = 64-512 (B=1 H=8 D=64; 1.3-3.5x at B=8 "
                     "H=12), 1.2-1.8x decoding 1 or 16 queries over 64-4096 padded keys (fp32, bf16), and 1.2-5.9x "
                     f"the fp32 forward+backward from n = 128 ({ZEN3})"),
    "small training": ("with gradients below 512^2 scores on a CPU without AVX-512, measured in fp32: the compiled "
                       "kernel measured a median 1.10x (0.91-1.32x) the sdpa backend's forward+backward at n = 64-80 "
                       "and 1.05-1.54x at 88-112 with key padding, a W = 32 window, 4 or 8 documents or causal key "
                       "padding given densely (seven runs; 1.3-2.0x at 128; a random dense mask 0.96-1.01x at 64-96 "
                       "in one), and 1.24-1.66x with ALiBi (a structured bias, read from a table) at n = 16-128 (five "
                       f"runs), where the sdpa backend builds the dense bias ({ZEN3})"),
    "small training to sdpa": ("with gradients and a mask below 64^2 scores on a CPU without AVX-512, measured in "
                               "fp32: the sdpa backend's forward+backward was faster, the compiled kernel a median "
                               "0.89x (0.81-1.16x) of it at n = 16-56 in five runs "
                               f"({ZEN3})"),
    "small dense": ("a dense bool mask below 512^2 scores on a CPU without AVX-512: the compiled kernel reads it "
                    "as bits within each row's range of allowed keys, and measured 1.1-6.5x the sdpa backend's fp32 "
                    "forward, 1.0-5.1x bf16 and 1.8-11x fp16 with causal key padding, 8 documents or a random half "
                    "of the pairs given densely at n = 64-512 (B=1 H=8 D=64), and 1.6-6.4x its fp32 "
                    "forward+backward from n = 128 with the first two (a tie, 0.94-1.10x in two runs, with the "
                    f"random half) ({ZEN3})"),
    "dense": ("a dense bool mask on a CPU without AVX-512: the compiled kernel reads it as bits, a 64-bit word at a "
              "time, within each row's range of allowed keys, and measured 1.12-1.20x the sdpa backend's fp32 "
              "and bf16 forward and 1.12x its fp32 forward+backward at n = 1024 and 2048 with a random half of the "
              "pairs (no empty tiles to skip; a word's unset keys masked a vector at a time), 0.99-1.13x with a "
              "random eighth, 2.3-2.4x fp16 (random half, n = 1024 and 4096), 1.9-3.4x with causal key padding and "
              "5.7-12x with 8 documents, each given densely, at n = 1024 and 4096, and 2.0-7.9x (structured) its "
              f"fp32 forward+backward at n = 1024 and 2048 (B=1 H=8 D=64; {ZEN3})"),
    "masked": ("measured 1.2-1.4x torch SDPA's fp32 forward (given the dense mask or bias) with key padding, "
               "1.7-2.3x with ALiBi, 3.1-48x with a W = 256 window and 5.1-9.1x with 8 documents at "
               f"n = 1024-16384, D = 64 and 128 ({ZEN3})"),
}
# On the AMD Zen 4 (class avx512_bf16; avx512 runs the same code) the one build, measured again on 5 Dec 2026
# (docs/benchmarks.md, "Issue #27: the avx512_bf16 class with the one build"), kept the plain rules above (the grid
# at n = 1024-16384: auto within 5% on 65 of 65) and showed what the Zen 3 had shown: with a mask the kernel wins
# at every size, and where torch's GEMM of a dtype is slow (fp16 at every size off AMX; bf16's backward below
# 512^2 scores) so does the kernel. ZEN4_MEASURED holds those figures, as AVX2_MEASURED the Zen 3's; auto_rule
# reads the one of this CPU's class (MEASURED_OFF_AMX).
ZEN4_MEASURED = {
    "fp16 training": ("fp16 with gradients on a CPU without AVX512-FP16, where torch's fp16 GEMM (which SDPA's "
                      "backward calls) is a scalar fallback: the compiled kernel, which computes fp16 as fp32, "
                      "measured 1.2-12.7x SDPA's forward+backward without a mask or with a causal one at n = 32-512 "
                      "(0.69-0.87x at n = 16: SDPA), 5.9-11.2x at n = 256-4096, and 2.5-45x with a dense mask at "
                      f"n = 64-1024, D = 64 ({ZEN4})"),
    "fp16 forward": ("fp16 forward on a CPU without AVX512-FP16: the compiled kernel, which computes fp16 as fp32, "
                     "measured 0.93-1.19x SDPA's without a mask or with a causal one at n = 48-64, 2.0-3.4x at "
                     "n = 96-512 and 1.7-2.2x at n = 1024-4096, and 2.1-5.0x with 1 or 16 queries over 256-4096 "
                     "keys without a mask; called by attention's small-request shortcut, 1.28-4.49x the sdpa "
                     "backend's with 1-32 queries over 16-255 keys without a mask (the SDPA call auto made before: "
                     "1.02-1.24x) and 0.82-1.07x torch SDPA's at n = 16-32 in two runs, 0.58-0.82x in a slow "
                     f"third (the SDPA call auto made before: 0.77-0.89x), D = 64 ({ZEN4})"),
    "fp16 masked": ("measured 2.2-2.4x torch SDPA's fp16 forward (given the dense mask) with key padding and "
                    "5.0-19x with a W = 256 window at n = 1024-4096, 11-88x their forward+backward, and 2.1-2.9x "
                    f"with a random half or eighth of the pairs given densely at n = 1024-2048, D = 64 ({ZEN4})"),
    "bf16 small training": ("bf16 with gradients below 512^2 scores on the AVX-512 tiles (D, Dv multiples of 16): "
                            "the compiled kernel measured 0.95-1.83x SDPA's forward+backward without a mask (a tie "
                            "at n = 16-32) and 1.17-2.71x with a causal one at n = 16-512, and 1.3-3.0x the sdpa "
                            "backend's with key "
                            "padding, a W = 32 window, 4 documents or a dense mask at n = 16-128 (D = 64; SDPA's "
                            f"bf16 forward+backward took 2.4-2.9x its fp32 one at n = 64) ({ZEN4})"),
    "bf16 small forward": ("bf16 forward below 512^2 scores on the AVX-512 tiles (D, Dv multiples of 16): the "
                           "compiled kernel, called by attention's small-request shortcut, measured 1.30-1.69x the "
                           "SDPA call auto made before at n = 48 without a mask and 1.11-1.72x causal, 0.98-1.36x at "
                           "32 without a mask (0.66-0.81x torch SDPA's time at 16, a tie with that SDPA call), and "
                           "1.26-2.09x torch SDPA at n = 64-128, D = 64; auto on it 1.12-2.07x torch SDPA without a "
                           f"mask at n = 16-128 with H = 32 and D = 128 ({ZEN4})"),
    "small causal forward": ("a small bf16 or fp16 causal forward with many heads (B * H * L * S >= 96^2 scores): "
                             "the compiled kernel, called by attention's small-request shortcut, measured 1.4-2.1x "
                             "the SDPA call auto made before with H = 16-32 at n = 24-40 and H = 8, D = 128 at 40 "
                             "(D = 64 unless said; a tie or SDPA with H = 4-8 at n = 16-32, and in fp16 with H = 16 "
                             f"at 24-32) ({ZEN4})"),
    "bf16 decode": ("bf16 forward of few queries over many keys without a mask on the AVX-512 tiles (D, Dv "
                    "multiples of 16): the compiled kernel, called by attention's small-request shortcut, measured "
                    "1.27-1.48x the sdpa backend with 1 query over 32 keys, 1.35-1.53x with 2-4 queries over 64-128 "
                    "and 1.38-2.03x with 16-32 queries over 16-128 keys (the SDPA call auto made before 1.05-1.24x "
                    "there), 1.47-4.0x with 1 query over 64-1024 keys, D = 64; with grouped queries (8 and 32 query "
                    f"heads over 2 and 8 kv heads) 1.57-7.3x over 64-256 keys (scripts/bench_decode.py; {ZEN4})"),
    "fp32 gqa decode": ("fp32 decoding with grouped queries (one query per head, 4 or more query heads per kv head, "
                        "D >= 128): the compiled kernel stacks each group's query heads into one head's rows and "
                        "reads K and V once, and measured 1.21-2.21x SDPA's (with enable_gqa) over 1024-8192 keys "
                        "(H = 16-32, 4-8 kv heads; 0.98-1.43x at 512; with D = 64, 0.59-1.26x) "
                        f"(scripts/bench_decode.py --layers 8; {ZEN4})"),
    "fp32 few queries": ("plain fp32 forward without a mask, 16-63 queries from 1024 keys on the AVX-512 tiles (D, "
                         "Dv multiples of 16): the compiled kernel, called by attention's small-request shortcut, "
                         "measured 1.00-1.57x the sdpa backend (a median 1.26x) with 16-63 queries over 1024-4096 "
                         "keys in four runs, where the SDPA call auto made before measured 0.95-1.05x (over 64-512 "
                         f"keys a tie or slower; SDPA with 4-8 queries), D = 64 (scripts/bench_decode.py; {ZEN4})"),
    "fp32 small": ("plain fp32 below 512^2 scores on the AVX-512 tiles (D, Dv multiples of 16): the compiled kernel "
                   "measured 1.11-1.78x the sdpa backend's causal forward and 1.06-1.91x its causal forward+backward "
                   "at n = 128-512, 1.10-1.14x its forward without a mask at n = 384-512 and 1.06-1.32x that "
                   "forward+backward at n = 256-512, in two runs (and 1.05-1.34x torch SDPA's forward without a mask "
                   "at n = 288-352 in three more, 0.98-1.10x at 256; 1.00-1.01x at 288 with D = 128; since "
                   "attention's small-request shortcut calls the kernel, 1.03-1.44x torch SDPA at n = 128-256, "
                   "where auto's SDPA call measured 0.95-0.98x), and "
                   "1.05-1.16x the forward with 64-256 queries over "
                   "1024-4096 keys (512^2 scores); since it skips the causal diagonal's empty half, 1.18-1.31x torch "
                   "SDPA's causal forward+backward at n = 80 in four of six runs (0.97-0.99x in two) and 1.09-1.65x "
                   "at 88-128, 1.08-1.47x its causal forward at n = 88 in four runs and 0.94-2.04x (a median 1.49x) "
                   "at 96-128; at n = 64 0.77-0.87x, D = 64 "
                   f"({ZEN4})"),
    "small masked": ("a structured mask or bias below 512^2 scores: the compiled kernel measured 1.24-5.8x the "
                     "sdpa backend's fp32 forward, 1.5-7.7x bf16 and 1.7-9.6x fp16 with key padding, a W = 64 window "
                     "or 8 documents at n = 64-512 (B=1 H=8 D=64), and 1.9-2.7x fp32 with ALiBi, where the sdpa "
                     f"backend builds the dense bias ({ZEN4})"),
    "small training": ("with gradients below 512^2 scores, fp32: the compiled kernel measured 1.03-1.84x the sdpa "
                       "backend's forward+backward at n = 64-128 with key padding, a W = 32 window, 4 documents or "
                       "causal key padding given densely (two runs), and 1.12-1.70x with ALiBi (a structured bias, "
                       f"read from a table) at n = 16-128, where the sdpa backend builds the dense bias ({ZEN4})"),
    "small training to sdpa": ("with gradients and a mask below 64^2 scores, fp32: the sdpa backend's "
                               "forward+backward was faster or level, the compiled kernel 0.80-0.97x of it at "
                               f"n = 16-32 and 0.94-1.10x at 48, in two runs ({ZEN4})"),
    "small dense": ("a dense bool mask below 512^2 scores: the compiled kernel reads it as bits within each row's "
                    "range of allowed keys, and measured 1.14-7.7x the sdpa backend's fp32 forward, 1.45-9.4x bf16 "
                    "and 1.22-11x fp16 with causal key padding, 8 documents or a random half or eighth of the pairs "
                    "given densely at n = 64-512 (B=1 H=8 D=64), 1.11-6.4x its fp32 forward+backward from n = 128 "
                    f"(1.02-1.15x at 64) ({ZEN4})"),
    "dense": ("a dense bool mask: the compiled kernel reads it as bits, a 64-bit word at a time, within each row's "
              "range of allowed keys, and measured 1.18-1.38x the sdpa backend's fp32 forward, 1.86-2.11x bf16 and "
              "2.06-2.91x fp16 at n = 1024 and 2048 with a random half or eighth of the pairs (no empty tiles to "
              "skip), 1.34-1.39x fp32 and 1.55-1.73x bf16 forward+backward, and 2.5-13x with causal key padding "
              f"or 8 documents given densely (B=1 H=8 D=64; {ZEN4})"),
}
# fp16 with gradients goes to the kernel from FP16_TRAIN_FROM scores (every size on the Zen 3: not measured below
# n = 64 there).
FP16_TRAIN_FROM = {"avx2": 0, "avx512_bf16": 32 * 32}
# bf16 forward without a mask (False) or causal (True) below 512^2 scores on the Zen 4: the kernel where both the
# queries and the keys number at least this many (ZEN4_MEASURED["bf16 small forward"]): without a mask from 16, causal
# from 48 (below, SDPA's causal kernel is faster: the kernel by name 0.50-0.66x and 0.73-1.03x torch SDPA's speed at
# n = 16 and 32, auto on SDPA 0.73-0.86x; B=1 H=8 D=64). 64 with or without a mask until attention's small-request
# shortcut called the kernel directly (docs/benchmarks.md, "Issue #27: auto's shortcut to the kernel"), 96 without a
# mask until the kernel's bf16 tile buffers were zeroed by one memset ("Issue #27: bf16 scratch buffers").
BF16_SMALL_FWD_FROM = {False: 16, True: 48}
# A causal forward below those (bf16) or below 48^2 scores (fp16, FP16_FWD_FROM) goes to the kernel where it has many
# heads: from this many scores over all the query heads, B * H * L * S, by measured class (ZEN4_MEASURED["small causal
# forward"]). Measured at D = 64 (and 128): the kernel won with H = 16 from n = 24, with H = 32 from 24 (and at 16 with
# D = 128, which this leaves to SDPA), with H = 8 at 40 with D = 128; SDPA won or tied with H = 8 at 32 and with H = 4
# up to 40.
SMALL_CAUSAL_FWD_SCORES = {"avx512_bf16": 96 * 96}
# ... and without a mask (decoding: fewer queries) from a number of keys that depends on the queries, as (at most
# this many queries or None: any, from this many keys), first match (ZEN4_MEASURED["bf16 decode"]). One query from
# 32 keys, 2-4 from 64 (over 16-32 keys the two tie: 0.89-1.18x), more from 16. Until the shortcut called the kernel
# directly: one query from 64 keys, more from 256; until the buffers' memset: one query from 384 keys, 2-4 from
# 2048, more from 1024 ("Issue #27: bf16 decoding by the number of queries"), and before that 1024 whatever the
# queries.
BF16_DECODE_KEYS_FROM = ((1, 32), (4, 64), (None, 16))
# Decoding with grouped queries (one query per head, H > Hkv) in fp32 on the Zen 4, where the kernel stacks each
# group's query heads into one head's rows (backends/native_stack.py) and SDPA reads K and V once per query head:
# with at least 4 query heads per kv head and D >= 128, from 1024 keys (ZEN4_MEASURED["fp32 gqa decode"]). (bf16
# decoding goes to the kernel with one query from 32 keys with or without groups: BF16_DECODE_KEYS_FROM.)
GQA_FP32_DECODE_FROM = {"group": 4, "head_dim": 128, "keys": 1024}
# Plain fp32 below 512^2 scores on the Zen 4's tiles: the kernel from this many scores, by (causal, with gradients),
# where the queries and the keys both number at least FP32_SMALL_MIN (fewer query rows run on the BLAS path, whose
# decoding measured 0.89-1.00x SDPA): ZEN4_MEASURED["fp32 small"]. Causal: 128^2 until the row bounds (issue #27's
# "row bounds"), which skip the diagonal's empty half: since, 80^2 with gradients, 88^2 forward (below, at n = 64, the
# kernel measured 0.77-0.87x torch SDPA; at 80 forward a tie, 0.90-1.28x in six runs). Without a mask, forward: 128^2
# since attention's small-request shortcut calls the kernel (docs/benchmarks.md, "Issue #27: fp32 forward through the
# shortcut"); 288^2 until then, 384^2 until n = 288-352 were measured (1.05-1.34x torch SDPA in three runs).
FP32_SMALL_FROM = {(False, False): 128 * 128, (False, True): 256 * 256, (True, False): 88 * 88,
                   (True, True): 80 * 80}
FP32_SMALL_MIN = 64
# ... and a forward without a mask with fewer queries than FP32_SMALL_MIN: the kernel from (this many queries, this
# many keys), called by the shortcut (ZEN4_MEASURED["fp32 few queries"]; SDPA with 4-8 queries, a tie or faster).
FP32_FEW_QUERIES_FROM = (16, 1024)
#: the figures and thresholds of the classes measured off AMX, by class (avx512 runs the avx512_bf16 code, other the
#: avx2 rules): where these hold, auto sends masked and slow-GEMM requests to the kernel; none of them has a fast
#: fp16 GEMM (AVX512-FP16)
MEASURED_OFF_AMX = {"avx2": "avx2", "other": "avx2", "avx512_bf16": "avx512_bf16", "avx512": "avx512_bf16"}
#: every measured class's figures, by class (auto_rule.measured_class)
FIGURES = {"avx2": AVX2_MEASURED, "avx512_bf16": ZEN4_MEASURED, "amx": AMX_MEASURED}
TILES_BF16_MIN_SKIPPABLE = 0.6
# A dense (element-wise) mask with fewer skippable tiles than this is faster in SDPA's fused kernel.
MIN_SKIPPABLE = 0.25
# Inside a torch.compile graph auto reads no tensor: where a rule weighs the share of empty tiles (``skippable``),
# it takes the side most masks are on (SDPA for a dense mask or off the AMX tiles, the kernel on them) and the
# profile's masked rows are not read. The graph serves every later call's mask, whatever its contents.
IN_GRAPH = "inside a torch.compile graph, which may not branch on the mask's contents"
# The reasons are written here, not in the rule: inside a graph with dynamic shapes torch.compile cannot format
# a module's float (f"{MIN_SKIPPABLE:.0%}" fails there).
IN_GRAPH_WHY = {
    "dense": (f"a dense mask {IN_GRAPH}: SDPA's fused kernel applies it faster than tiling can skip unless "
              f"{MIN_SKIPPABLE:.0%} of the tiles are empty"),
    "dense kernel": (f"a dense mask {IN_GRAPH}: the compiled kernel wins with the mask's bits and each row's range "
                     "of keys kept with the mask, and a graph would pack the bits again on every call, without the "
                     "ranges (inductor miscompiles them)"),
    "bf16 tiles": (f"bf16 inference with a mask {IN_GRAPH}: the compiled kernel wins only from "
                   f"{TILES_BF16_MIN_SKIPPABLE:.0%} of the tiles empty ({AMX_MEASURED['bf16 tiles']})"),
}
BF16_MASKED_WHY = {                                 # by amx_kernel, after "... leaves x% of the tiles empty "
    True: f"(the compiled kernel wins from {AMX_BF16_MIN_SKIPPABLE:.0%}): {AMX_MEASURED['bf16 masked']}",
    False: (f"(the compiled kernel wins from {TILES_BF16_MIN_SKIPPABLE:.0%}): {AMX_MEASURED['bf16 tiles']}; with "
            f"padding they measured 0.42-0.78x the sdpa backend's speed, with a W = 256 window 1.65-5.9x"),
}
# From this many score entries per head, a scattered block layout (bigbird, block_sparse) runs faster
# in the sparse backend, which batches all its blocks, than in tiled, which walks them one span at a
# time. Measured on the AMD Zen 4 (1 thread) by a script that is not in the repository, so no figure
# is quoted (docs/benchmarks.md, "Issue #4"). On bands (window, dilated, global_window) tiled was
# faster there: not picked.
SPARSE_FROM = 8192 * 8192
