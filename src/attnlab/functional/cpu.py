"""Which class of CPU this is: the speed rules of ``auto`` were measured per class, and a rule
measured on one class can be wrong by 4x on another (issue #27).

The project's machines come in two x86-64 classes, and a user's may be a third:

* ``amx``: AMX tiles for bf16 (``amx_bf16``, ``amx_tile``; Intel Xeon from Sapphire Rapids on).
  torch's CPU flash attention runs its bf16 products on them (oneDNN's brgemm), with a bf16
  GEMM peak the bench measured at 663-1,897 GFLOP/s on the project's 2-core Xeon with AMX, against
  409-427 on its 2-core AMD Zen 4 with AVX512-BF16 (docs/benchmarks.md).
* ``avx512_bf16``: AVX-512 with BF16 dot products, no AMX (AMD Zen 4). The compiled kernel's
  micro-kernel (``vdpbf16ps``) is the fastest bf16 path there. torch's fp16 GEMM needs AVX512-FP16, which it lacks
  (a scalar fallback, as without AVX-512): ``auto`` sends fp16 to the kernel there, and masked requests
  of every size, as on ``avx2`` (``auto_figures.ZEN4_MEASURED``).
* ``avx2``: AVX2 without AVX-512 (measured on an AMD EPYC Zen 3). torch has no fast bf16 GEMM there
  (oneDNN's needs AVX-512; the fallback ran at about 1 GFLOP/s), and SDPA's bf16 backward runs on it:
  ``auto`` sends bf16 training to the compiled kernel (5.3-7.9x), and has its own fp32 thresholds (causal
  forward, training without a mask).
* ``avx512``, ``other``: no rule was measured on them; ``auto`` uses the ``avx512_bf16`` rules for
  ``avx512``, where the kernel runs the same code, and the ``avx2`` ones for ``other`` (no AVX-512 either).

Example::

    cpu_class()        # 'amx' on an Intel Xeon with AMX
    cpu_features()     # {'amx_bf16': True, 'avx512_bf16': True, 'avx512': True, 'avx2': True}
"""
from __future__ import annotations

import functools
import platform

import torch

__all__ = ["cpu_class", "cpu_features", "cpu_model", "CPU_CLASSES"]

#: every class ``cpu_class`` can answer, most capable first
CPU_CLASSES = ("amx", "avx512_bf16", "avx512", "avx2", "other")


@functools.lru_cache(maxsize=1)
def cpu_features() -> dict[str, bool]:
    """The instruction-set features the speed rules depend on, as torch's own CPU dispatch sees them
    (``torch.cpu``'s checks, which read CPUID through cpuinfo; /proc/cpuinfo's flags where they are missing)."""
    checks = {"amx_bf16": "_is_amx_tile_supported", "avx512_bf16": "_is_avx512_bf16_supported",
              "avx512": "_is_avx512_supported", "avx2": "_is_avx2_supported"}
    found = {}
    for name, fn in checks.items():
        check = getattr(torch.cpu, fn, None)
        found[name] = bool(check()) if check is not None else _flag(name)
    return found


def _flag(name: str) -> bool:
    flag = {"avx512": "avx512f"}.get(name, name)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return flag in line.split()
    except OSError:
        pass
    return False


@torch.compiler.assume_constant_result
def cpu_class() -> str:
    """This machine's class, one of ``CPU_CLASSES``. A constant to torch.compile, which must not trace the CPUID
    checks (torch.cpu's are on its skip list: a graph break, an error under fullgraph=True)."""
    f = cpu_features()
    for name in CPU_CLASSES[:-1]:
        if f[name if name != "amx" else "amx_bf16"]:
            return name
    return "other"


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU's "model name" from /proc/cpuinfo, or platform's guess elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
