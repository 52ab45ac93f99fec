"""Wall-clock timing: warm-up, then the median of several runs (one function, or several
round-robin so they share the machine's drifts); and this machine's GEMM peak.

Example::

    t = time_median(lambda: a @ a)          # Timing(median_s=..., times_s=[...])
    ta, tb = time_interleaved([f, g])       # f and g already warmed up
    peak = gemm_peak_gflops(torch.float32)  # about 190 on a 2-core Zen 4
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

__all__ = ["Timing", "time_median", "time_interleaved", "paired", "gemm_peak_gflops"]

MIN_RUNS, MAX_RUNS = 3, 10
BUDGET_S = 0.5          # adaptive mode: stop adding runs once this much time is spent (after MIN_RUNS)


@dataclass
class Timing:
    median_s: float
    times_s: list[float]
    first_s: float          # the warm-up call: includes one-off costs (compilation, lazy init)


def time_median(fn: Callable[[], object], repeats: Optional[int] = None) -> Timing:
    """Call ``fn`` once to warm up, then time it and return the median.

    Args:
        fn: the work; it must finish its computation before returning (true on CPU).
        repeats: exactly this many timed runs; None = adaptive, MIN_RUNS to MAX_RUNS runs within
            about BUDGET_S seconds, so slow cases cost a few runs and fast ones get a stable median.
    Returns:
        a Timing with the median, every timed run and the warm-up call, in seconds.
    Example:
        time_median(lambda: torch.randn(512, 512) @ torch.randn(512, 512), repeats=3).median_s
    """
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    times: list[float] = []
    while True:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if repeats is not None:
            if len(times) >= repeats:
                break
        elif len(times) >= MAX_RUNS or (len(times) >= MIN_RUNS and sum(times) >= BUDGET_S):
            break
    return Timing(statistics.median(times), times, first)


def time_interleaved(fns: list[Callable[[], object]], repeats: Optional[int] = None) -> list[list[float]]:
    """Time already warmed-up functions round-robin: one run of each per round.

    On a shared machine the speed drifts over seconds; interleaving makes the drift hit every
    function alike, so their ratios stay fair even when the absolute times move. What ran just
    before a function also moves its time (on a 2-core AMD EPYC Zen 3 the contestant timed right
    after another in a fixed order was 5-9% slower than the same kernel timed before it: issue #27,
    docs/benchmarks.md), so every other round runs the functions in reverse order; with an even
    number of rounds (``paired(repeats)``) each order runs as often as the other.

    Args:
        fns: the functions, each already called once (warm-up is the caller's job).
        repeats: exactly this many rounds; None = adaptive, MIN_RUNS to MAX_RUNS rounds (whole
            pairs when there are several functions), stopping after about BUDGET_S seconds per function.
    Returns:
        per function, the seconds of each of its runs, in round order.
    Example:
        a, b = time_interleaved([lambda: x @ x, lambda: x.T @ x], repeats=4)
    """
    times: list[list[float]] = [[] for _ in fns]
    forward = list(zip(fns, times))
    orders = (forward, forward[::-1])                   # even rounds, odd rounds
    pair = 2 if len(fns) > 1 else 1
    start = time.perf_counter()
    while fns:
        for fn, ts in orders[len(times[0]) % 2]:
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        rounds = len(times[0])
        if repeats is not None:
            if rounds >= repeats:
                break
        elif rounds % pair:
            continue                                    # finish the pair: each order as often as the other
        elif rounds >= MAX_RUNS or (rounds >= MIN_RUNS and time.perf_counter() - start >= BUDGET_S * len(fns)):
            break
    return times


def paired(repeats: Optional[int]) -> Optional[int]:
    """``repeats`` rounded up to even (None stays None, adaptive): as many rounds in each order.

    Example:
        time_interleaved(steps, paired(3))     # 4 rounds: a b c, c b a, a b c, c b a
    """
    return None if repeats is None else repeats + repeats % 2


def gemm_peak_gflops(dtype: torch.dtype, size: int = 2048, repeats: int = 10) -> float:
    """Measured matmul throughput of this machine in GFLOP/s: the fastest of ``repeats`` size^3 GEMMs.

    This is the practical ceiling for attention, which is two GEMMs plus a softmax; "% of peak"
    in the bench is relative to it, not to a datasheet number. The fastest run, not the median:
    a peak is what the machine *can* do, and on a shared VM the median drifts with neighbours.

    bfloat16 and float16 are the faster of torch's matmul and MKL's half-precision GEMM
    (``cblas_gemm_bf16bf16f32``, the compiled kernel's bf16 GEMM off AMX; ``cblas_gemm_f16f16f32``): on a
    CPU without AVX-512 torch's bf16 and fp16 matmuls are scalar fallbacks (0.9-1.4 GFLOP/s on an AMD EPYC
    Zen 3 with AVX2, 4-5 Dec 2026, against MKL's 118-184), and a 2048^3 call of one takes 17 s. Attention
    does not run on those fallbacks (torch's CPU attention computes half-precision tiles in float32): against
    torch's fp16 matmul alone an fp16 SDPA row read 2,362% of peak. A GEMM whose first small call says it
    would take more than ``MAX_CALL_S`` at ``size`` is measured at a smaller size.
    """
    def rate(gemm: Callable[[Tensor, Tensor], object]) -> float:
        n = _affordable_size(gemm, dtype, size)
        a, b = _operands(n, dtype)
        t = time_median(lambda: gemm(a, b), repeats=repeats)
        return 2 * n ** 3 / min(t.times_s) / 1e9
    rates = [rate(torch.matmul)]
    mkl = _mkl_half_gemm(dtype)
    if mkl is not None:
        rates.append(rate(mkl))
    return max(rates)


#: a GEMM is measured at the largest size (halving from the requested one) whose call takes at most this
MAX_CALL_S = 0.5
_PROBE = 256


def _operands(n: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, n, generator=g).to(dtype), torch.randn(n, n, generator=g).to(dtype)


def _affordable_size(gemm: Callable[[Tensor, Tensor], object], dtype: torch.dtype, size: int) -> int:
    """``size``, halved until one call (extrapolated as n^3 from a 256^3 call) takes at most MAX_CALL_S."""
    if size <= _PROBE:
        return size
    a, b = _operands(_PROBE, dtype)
    gemm(a, b)                                                      # warm-up: lazy init is not the GEMM
    start = time.perf_counter()
    gemm(a, b)
    probe_s = time.perf_counter() - start
    while size > _PROBE and probe_s * (size / _PROBE) ** 3 > MAX_CALL_S:
        size //= 2
    return size


#: MKL's row-major half x half -> fp32 GEMMs, by the dtype they read (torch's CPU wheels export both)
_MKL_HALF_GEMMS = {torch.bfloat16: "cblas_gemm_bf16bf16f32", torch.float16: "cblas_gemm_f16f16f32"}


def _mkl_half_gemm(dtype: torch.dtype) -> Optional[Callable[[Tensor, Tensor], Tensor]]:
    """MKL's row-major ``dtype`` x ``dtype`` -> fp32 GEMM from libtorch_cpu, or None (another dtype, or a
    torch build that does not export it)."""
    import ctypes
    import os
    if dtype not in _MKL_HALF_GEMMS:
        return None
    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        fn = getattr(lib, _MKL_HALF_GEMMS[dtype])
    except (OSError, AttributeError):
        return None
    # (layout, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc); MKL's LP64 ints
    fn.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                        ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_int]
    fn.restype = None
    row_major, no_trans = 101, 111

    def gemm(a: Tensor, b: Tensor) -> Tensor:       # a (m, k), b (k, n) contiguous dtype -> (m, n) fp32
        m, k = a.shape
        n = b.shape[1]
        c = torch.empty(m, n)
        fn(row_major, no_trans, no_trans, m, n, k, 1.0, a.data_ptr(), k, b.data_ptr(), n, 0.0, c.data_ptr(), n)
        return c
    return gemm
