"""The thresholds ``auto`` decides by on a CPU with AMX (class ``amx``) and the figures its reasons quote there, all
measured on an Intel Xeon with AMX (``lscpu`` "Intel(R) Xeon(R) Processor", 2 cores, a KVM guest; `amx_bf16 amx_tile
avx512_bf16 avx512_fp16`). ``auto_figures`` holds the other classes'; ``auto_rule`` reads both. docs/benchmarks.md
holds the runs, with their commands (the sections marked "Intel Xeon with AMX").

Example::

    from attnlab.functional.auto_figures_amx import AMX_MEASURED
    AMX_MEASURED["small masked"]   # 'a structured mask or bias below 512^2 scores on a CPU with AMX: ... (Intel ...)'
"""
from __future__ import annotations

XEON_AMX = "Intel Xeon with AMX, 2 threads"
# On a CPU with AMX (functional/cpu.py) torch's SDPA runs bf16 products on AMX tiles through oneDNN, and so
# does the compiled kernel's `amx` build where D and Dv are multiples of 16 (on_amx; csrc/amx.cpp). Measured
# there (docs/benchmarks.md, "Issue #27: bf16 on AMX tiles", B=1 H=8, n = 1024-8192, D = 64 and 128):
# * bf16 on AMX: the compiled kernel AMX_TRAIN of SDPA's forward+backward (the kernel). Its forward, since the
#   softmax's own exp (native.h exp2_clamped; docs/benchmarks.md, "Issue #27: the softmax's exp on AMX"), measured
#   AMX_CAUSAL_FWD of SDPA's with a causal mask from n = 2048 and 0.97-1.18x at 1024 (median 1.07x of the five
#   grid and tune runs of 3 Dec 2026: the kernel from n = 1024, "Issue #27: auto on a noisy day"), and
#   AMX_PLAIN_FWD without a mask from n = 4096 (0.96-1.00x at 2048, 0.88-0.93x at 1024), D = 64 and 128. Measured
#   again on 6 Dec 2026, after the kept packed K and V, the row bounds and the bf16 buffers' memset ("Issue #27:
#   float16 on the Xeon with AMX, and subnormal weights", bf16's plain forward): causal 1.05-1.35x at n = 768-8192,
#   D = 64 and 128 (AMX_CAUSAL_FROM takes every causal forward above SMALL_PROBLEM); without a mask 1.07-1.29x
#   at n = 768-8192 with D = 64 (0.95-0.97x at 512), and with D = 128 1.03-1.18x at n = 1536-8192 (0.93-1.01x at
#   768-1024): AMX_PLAIN_FROM by head dim, larger heads than 64 by D = 128's (no other was measured).
#   Its masked forward wins where the mask leaves at least AMX_BF16_MIN_SKIPPABLE of the tiles empty: key
#   padding that empties 3% of them ran in 28.96 ms against SDPA's 33.41 ms, and 1.25-2.2x faster from 9%
#   on (`attnlab tune`, docs/bench-results-amx-tune-exp.json); below 3% nothing was measured, so SDPA;
# * bf16 off AMX (other head dims): the AVX512-BF16 tiles measured 0.25-0.36x SDPA's forward and 0.51-0.62x
#   its forward+backward: SDPA, unless TILES_BF16_MIN_SKIPPABLE of the tiles are empty (a W = 256 window:
#   1.65-5.9x; 8 documents: 2.4-3.6x);
# * fp32 on the tiles: the compiled kernel 1.05x SDPA's forward+backward without a mask, 1.02-1.15x its forward and
#   1.10-1.37x its forward+backward with a causal one (the kernel). Its forward without a mask measured 0.94-0.96x
#   on 2 Dec 2026 and a tie on 3 Dec (0.95-1.05x at n = 4096 and 16384 in six runs); on 6 Dec 2026, after the
#   softmax's exp, the row bounds and the kernel's other changes since, 1.04-1.12x torch SDPA from n = 4096 in four
#   runs, 1.02-1.05x at 2048 in three (0.95-0.99x at 1024) and 1.06-1.38x the sdpa backend with 32-256 queries over
#   16384 keys (two runs; 1.01-1.08x with 1-16 queries): the kernel from AMX_FP32_PLAIN_FROM (scores, or (queries,
#   keys)).
AMX_TRAIN = "1.24-1.81x"
AMX_FP32_PLAIN_FROM = (2048 * 2048, (32, 16384))
AMX_CAUSAL_FROM = 448 * 448                 # below SMALL_PROBLEM too: see the small requests below
# without a mask, by head dim: (at most this max(D, Dv), or None: any, from this many scores), first match
AMX_PLAIN_FROM = ((64, 768 * 768), (None, 1536 * 1536))
AMX_MEASURED = {
    "bf16": (f"bf16 on a CPU with AMX: the compiled kernel's AMX build measured {AMX_TRAIN} SDPA's forward+backward "
             f"without a mask or with a causal one, at n = 1024-8192, D = 64 and 128 ({XEON_AMX})"),
    "bf16 forward": ("bf16 forward on a CPU with AMX: the compiled kernel's AMX build measured 1.05-1.35x SDPA's "
                     "with a causal mask at n = 768-8192, D = 64 and 128 (1.15-1.30x at 448-512, D = 64), and "
                     "without one 1.07-1.29x at n = 768-8192 "
                     f"with D = 64 and 1.03-1.18x at n = 1536-8192 with D = 128 ({XEON_AMX})"),
    "bf16 masked": ("bf16 forward on a CPU with AMX, key padding at n = 2048: the compiled kernel's AMX build "
                    f"measured 1.15x SDPA's with its dense mask at 3% empty tiles, 1.25-2.2x from 9% ({XEON_AMX})"),
    "bf16 forward to sdpa": ("bf16 forward on a CPU with AMX: the compiled kernel's AMX build measured 0.87-0.97x "
                             "SDPA's without a mask at n = 512 with D = 64 (0.32-0.90x at n = 16-448), and with "
                             "D = 128 0.82-0.85x at n = 512 and 0.93-1.01x at 768-1024; causal 0.34-0.97x at "
                             f"n = 16-384 ({XEON_AMX})"),
    "bf16 tiles": ("on a CPU with AMX torch's SDPA runs bf16 on AMX tiles; with head dims off the compiled "
                   "kernel's AMX path (D, Dv not multiples of 16) its AVX512-BF16 tiles measured 0.25-0.36x "
                   f"SDPA's forward and 0.51-0.62x its forward+backward at n = 1024, 4096 ({XEON_AMX})"),
    "fp16 training": ("fp16 with gradients on a CPU with AMX (and AVX512-FP16), without a mask or causal: the "
                      "compiled kernel, which computes fp16 as fp32, measured 1.00-2.14x torch SDPA's "
                      "forward+backward at n = 16-8192 (D = 64; 1.07-1.59x at D = 128, n = 256-4096) "
                      f"({XEON_AMX})"),
    "fp16 forward": ("fp16 forward on a CPU with AMX (and AVX512-FP16): the compiled kernel, which computes fp16 as "
                     "fp32, measured 1.12-1.58x torch SDPA's causal forward at n = 256-8192, 1.09-1.10x its forward "
                     "without a mask at n = 4096-8192 and 1.02x the sdpa backend's with 1024 queries over 16384 keys "
                     "(D = 64; at D = 128 1.00-1.18x causal at n = 256-4096, 1.08x without a mask at 4096) "
                     f"({XEON_AMX})"),
    "fp16 masked": ("fp16 on a CPU with AMX (and AVX512-FP16): the compiled kernel, which computes fp16 as fp32, "
                    "measured 1.33-1.46x torch SDPA's forward (given the dense mask or bias) with key padding, "
                    "3.3-11.5x with a W = 256 window, 4.9-7.9x with 8 documents and 1.9-2.3x with ALiBi + causal "
                    f"at n = 1024 and 4096, and 1.5-11.7x its forward+backward ({XEON_AMX})"),
    "fp16 forward to sdpa": ("fp16 forward on a CPU with AMX (and AVX512-FP16): the compiled kernel, which computes "
                             "fp16 as fp32, measured 0.75-0.98x torch SDPA's forward without a mask at n = 128-1024 "
                             "and 1.04x at 2048, 0.90-0.98x causal at n = 128-192, and 0.35-0.76x the sdpa "
                             "backend's with 1-64 queries over 1024-16384 keys, where it converts all of K and V to "
                             f"fp32 on each call ({XEON_AMX})"),
    "bf16 small training": ("bf16 with gradients below 512^2 scores on a CPU with AMX (D, Dv multiples of 16): the "
                            "compiled kernel's AMX build measured 1.07-1.79x the sdpa backend's forward+backward "
                            "without a mask or causal at n = 16-512 (torch SDPA's 0.88-0.92x at n = 32, 1.10-1.76x "
                            "at 16 and from 48), and 1.32-2.19x with key padding, a W = 32 window, 4 documents or a "
                            f"dense mask at n = 16-128, D = 64 ({XEON_AMX})"),
    "bf16 masked few queries": ("bf16 forward with a mask and few queries on a CPU with AMX: the compiled kernel "
                                "measured 0.32-0.94x the sdpa backend's with 1-32 queries over 256-16384 padded keys "
                                "(its AMX path packs all of K and V on each call), 1.01-2.19x from 48 queries, in two "
                                f"runs ({XEON_AMX})"),
    "fp16 masked many keys": ("fp16 forward with a mask on a CPU with AMX: the compiled kernel, which converts all of "
                              "K and V to fp32 on each call, measured 0.44-0.96x the sdpa backend's with 1-64 queries "
                              "over more keys than max(1024, 128 per query) (key padding, up to 16384 keys; 1.08x once "
                              "with 48 queries), and 0.80-1.00x at n = 64; 0.86-1.56x within those bounds, 0.96-3.6x "
                              f"at n = 96-512, in two runs ({XEON_AMX})"),
    "small masked": ("a structured mask or bias below 512^2 scores on a CPU with AMX: the compiled kernel measured "
                     "0.99-4.0x the sdpa backend's fp32 forward, 1.00-2.5x bf16 and 0.96-3.3x fp16 (from n = 96) with "
                     "key padding, a W = 64 window or 8 documents at n = 64-512 (B=1 H=8 D=64), 1.7-3.2x fp32 with "
                     "ALiBi, where the sdpa backend builds the dense bias, and 1.15-2.1x fp32 decoding with 1-256 "
                     f"queries over 256-4096 padded keys, in two runs ({XEON_AMX})"),
    "small training": ("with gradients below 512^2 scores on a CPU with AMX, fp32: the compiled kernel measured "
                       "0.94-1.56x the sdpa backend's forward+backward at n = 64-128 with key padding, a W = 32 "
                       "window, 4 documents or a dense mask (two runs), and 1.09-1.60x with ALiBi (a structured bias, "
                       f"read from a table) at n = 16-128, where the sdpa backend builds the dense bias ({XEON_AMX})"),
    "small training to sdpa": ("with gradients and a mask below 64^2 scores on a CPU with AMX, fp32: the compiled "
                               "kernel measured 0.71-0.97x the sdpa backend's forward+backward at n = 16-48 in two "
                               f"runs ({XEON_AMX})"),
    "small dense": ("a dense bool mask below 512^2 scores on a CPU with AMX: the compiled kernel reads it as bits "
                    "within each row's range of allowed keys, and measured 0.95-4.5x the sdpa backend's fp32 and bf16 "
                    "forward and 1.02-3.6x fp16 (from n = 128) with causal key padding, 8 documents or a random half "
                    "or eighth of the pairs given densely at n = 64-512 (B=1 H=8 D=64), and 1.04-4.5x its "
                    f"forward+backward ({XEON_AMX})"),
    "dense": ("a dense bool mask on a CPU with AMX: the compiled kernel reads it as bits, a 64-bit word at a time, "
              "within each row's range of allowed keys, and measured 1.15-1.34x the sdpa backend's fp32 forward, "
              "1.23-1.84x bf16 and 1.13-1.28x fp16 at n = 1024 and 2048 with a random half or eighth of the pairs "
              "(no empty tiles to skip), 1.09-1.23x fp32 and 1.48-1.78x bf16 forward+backward, and 2.1-7.4x with "
              f"causal key padding or 8 documents given densely (B=1 H=8 D=64; {XEON_AMX})"),
    "fp32 small": ("plain fp32 below 512^2 scores on a CPU with AMX, on the compiled kernel's tiles: it measured "
                   "1.15-1.51x torch SDPA's causal forward at n = 256-512 and 1.16-1.64x its causal forward+backward "
                   f"at n = 192-512, D = 64 ({XEON_AMX})"),
    "fp32 small to sdpa": ("plain fp32 below 512^2 scores on a CPU with AMX: the compiled kernel's tiles measured "
                           "0.37-0.98x torch SDPA's forward without a mask and 0.44-1.01x its forward+backward at "
                           "n = 16-512, causal 0.40-0.93x forward below n = 256 and 0.39-0.93x forward+backward "
                           f"below 192, D = 64 ({XEON_AMX})"),
    "fp32 forward": ("fp32 forward without a mask on a CPU with AMX: the compiled kernel's tiles measured 1.04-1.12x "
                     "torch SDPA's at n = 4096-16384 in four runs and 1.02-1.05x at 2048 in three, and 1.06-1.38x the "
                     f"sdpa backend's with 32-256 queries over 16384 keys (D = 64) ({XEON_AMX})"),
    "fp32 forward to sdpa": ("fp32 forward without a mask on a CPU with AMX: the compiled kernel's tiles measured "
                             "0.95-0.99x torch SDPA's at n = 1024 in four runs, 0.93-1.09x the sdpa backend's "
                             "with 16-256 queries over 4096 keys, 1.01-1.08x with 1-16 over 16384 (D = 64) "
                             f"({XEON_AMX})"),
    "fp32": ("fp32 with D, Dv multiples of 16: the compiled kernel's tiles measured 1.05x SDPA's forward+backward "
             f"without a mask, 1.02-1.15x its forward and 1.10-1.37x its forward+backward with a causal one, at "
             f"n = 1024, 4096 ({XEON_AMX})"),
}
# fp16: the Xeon with AMX has AVX512-FP16 (no AMX-FP16), which the classes off AMX lack (auto_figures): torch's
# fp16 GEMM runs on oneDNN's AVX512-FP16 there (the bench's peak read 372 GFLOP/s, 6 Dec 2026) and SDPA's fp16 with
# it; the compiled kernel computes fp16 as fp32 on its fp32 tiles. Measured there (docs/benchmarks.md, "Issue #27:
# float16 on the Xeon with AMX, and subnormal weights"; AMX_MEASURED's fp16 figures, read through auto_rule.amx_fp16):
# the kernel with gradients at every size, and forward with a causal mask from AMX_FP16_CAUSAL_FROM scores
# (0.90-0.98x at n = 128-192); without a mask from AMX_FP16_PLAIN_FROM (scores, queries): below, a tie at
# n = 512-2048, and with fewer queries SDPA (the kernel converts all of K and V to fp32 on each call, which costs
# more than a few queries' products).
AMX_FP16_CAUSAL_FROM = 256 * 256
AMX_FP16_PLAIN_FROM = (4096 * 4096, 1024)
# bf16 inference with a mask on AMX's tiles wins from this share of empty tiles (AMX_MEASURED["bf16 masked"])
AMX_BF16_MIN_SKIPPABLE = 0.03

# Below SMALL_PROBLEM scores (512^2 per head) the class kept SDPA for every request until 6 Dec 2026: a rule measured
# for the Python tiled kernel before the compiled kernel existed. Measured with the kernel, called directly
# (docs/benchmarks.md, "Issue #27: small requests on the Xeon with AMX"; B=1 H=8 D=64, 2 threads), as on the Zen 3
# and the Zen 4 it wins most of them:
# * a structured mask or bias, forward, at every size (AMX_MEASURED["small masked"]), and a dense bool mask, at every
#   size and above SMALL_PROBLEM whatever its empty tiles (["small dense"], ["dense"]), but for two exceptions that
#   hold whatever the size, since they cost the kernel per key on each call: bf16 with fewer than
#   AMX_BF16_MASKED_QUERIES queries (its AMX path packs all of K and V: ["bf16 masked few queries"]), and fp16 over
#   keys outside AMX_FP16_MASKED_KEYS (its conversion of all of K and V to fp32: ["fp16 masked many keys"]);
# * with gradients and a mask: bf16 on AMX's tiles at every size (["bf16 small training"]), fp32 from
#   SMALL_TRAIN_FROM scores, the Zen 3's and the Zen 4's crossover too (["small training"]; a structured bias at every
#   size);
# * plain, against torch's SDPA (the small-request shortcut's call): fp32 causal from AMX_FP32_SMALL_FROM's scores
#   (forward, forward+backward: ["fp32 small"]), bf16 causal forward from AMX_CAUSAL_FROM, bf16 with gradients at
#   every size; without a mask the forward stays on SDPA, and fp32's forward+backward (["fp32 small to sdpa"]).
AMX_BF16_MASKED_QUERIES = 48
# fp16 with a mask: the kernel over (at least this many keys, at most the larger of this many and this many per query)
AMX_FP16_MASKED_KEYS = (96, 1024, 128)
AMX_FP32_SMALL_FROM = {False: 256 * 256, True: 192 * 192}    # causal, by with gradients
