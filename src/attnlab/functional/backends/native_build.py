"""Which build of the compiled kernel this process runs (issue #27: one build for every x86-64).

``setup.py`` compiles the kernel once per instruction-set level, each into its own module, instead
of once with ``-march=native`` (a wheel built that way could crash with SIGILL on an older CPU):

* ``_native_avx2``        x86-64-v3 (AVX2, FMA): at::vec's AVX2 code, MKL's GEMMs;
* ``_native_avx512``      x86-64-v4 (AVX-512 F/BW/DQ/VL): at::vec's AVX-512 code, MKL's GEMMs;
* ``_native_avx512_bf16`` x86-64-v4 + AVX512-BF16: also the micro-kernel's tiles (fp32, bf16);
* ``_native_base``        other machines: no instruction-set flags.

The level ``amx`` is the avx512_bf16 module with its bfloat16 products on AMX tiles (oneDNN's brgemm
inside torch, csrc/amx.cpp): no flag of ours, the CPU's AMX is asked at run time; forcing any lower
level turns it off.

At import the best level this CPU runs is chosen (``functional.cpu.cpu_features``), or the one the
environment variable ``ATTNLAB_NATIVE_ISA`` names: a lower path, to test it or to work around a
problem (a level the CPU lacks is refused, never run).

For tests, ``ATTNLAB_AMX_EMULATED=1`` makes ``amx`` a level wherever ``avx512_bf16`` runs: the AMX path's
code with a plain loop in brgemm's place (csrc/amx.cpp ``emulate_amx``), so a CPU without AMX runs the
conformance suites on it (tests/test_native_isa.py). Exact, and far slower than either real level.

Example::

    module, isa, why = load()          # (<module ..._native_avx512_bf16>, 'amx', 'the best ...')
"""
from __future__ import annotations

import importlib
import os
import platform
from types import ModuleType
from typing import Optional

from ..cpu import cpu_features

__all__ = ["ISAS", "ENV", "EMULATE_ENV", "load", "runnable_isas"]

#: the x86-64 levels, best first
ISAS = ("amx", "avx512_bf16", "avx512", "avx2")
#: the module each level imports (amx: the avx512_bf16 module with AMX turned on)
MODULES = {"amx": "avx512_bf16"}
#: the environment variable that forces a level
ENV = "ATTNLAB_NATIVE_ISA"
#: the environment variable that emulates the amx level (tests only)
EMULATE_ENV = "ATTNLAB_AMX_EMULATED"


def runnable_isas() -> list[str]:
    """The builds this CPU can execute, best first (``['base']`` off x86-64)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return ["base"]
    f = cpu_features()
    can = {"amx": f["avx512"] and f["avx512_bf16"] and f["amx_bf16"],
           "avx512_bf16": f["avx512"] and f["avx512_bf16"], "avx512": f["avx512"], "avx2": f["avx2"]}
    return [isa for isa in ISAS if can[isa]]


def load() -> tuple[Optional[ModuleType], Optional[str], str]:
    """(the compiled module or None, its level, why this level -- or why none loaded)."""
    runs = runnable_isas()
    emulate = os.environ.get(EMULATE_ENV, "").strip()
    if emulate not in ("", "0", "1"):
        return None, None, f"{EMULATE_ENV}={emulate!r}: set it to 1 (tests: the amx level emulated) or unset it"
    emulate = emulate == "1" and "amx" not in runs and "avx512_bf16" in runs
    if emulate:
        runs = ["amx", *runs]
    forced = os.environ.get(ENV, "").strip()
    if forced:
        known = list(ISAS) + ["base"]
        if forced not in known:
            return None, None, f"{ENV}={forced!r} is not a build; choose one of {known} (or unset it)"
        if forced not in runs:
            return None, None, (f"{ENV}={forced!r}: this CPU cannot run that build (it runs {runs}); "
                                f"unset {ENV} or choose one of those")
        order, why = [forced], f"forced by {ENV}={forced}"
    else:
        order, why = runs, "the best build this CPU runs"
    errors = []
    for isa in order:
        name = f"{__package__}._native_{MODULES.get(isa, isa)}"     # beside this file: the backend's own
        try:
            module = importlib.import_module(name)
        except ImportError as exc:                 # not built (no compiler at install time): say so below
            errors.append(f"{name}: {exc}")
            continue
        if emulate and isa == "amx":
            if not module.emulate_amx(True):
                errors.append(f"{name}: this build cannot emulate AMX")
                continue
            return module, isa, f"{why}; AMX emulated by {EMULATE_ENV}=1: brgemm replaced by a plain loop (tests only)"
        if hasattr(module, "set_amx") and module.set_amx(isa == "amx") != (isa == "amx"):
            errors.append(f"{name}: the CPU reports AMX, but oneDNN cannot use it in this process")
            continue
        return module, isa, why
    if not order:
        return None, None, "this CPU has no AVX2, the lowest level the kernel is built for on x86-64"
    return None, None, (f"the compiled kernel is not built ({'; '.join(errors)}); build it with `make setup` "
                        f"(pip install --no-build-isolation -e .) on a machine with g++")
