"""Builds attnlab's compiled CPU kernel with ``torch.utils.cpp_extension``:
``attnlab.functional.backends._native_<isa>`` (beside the backend that loads it), one module per
instruction-set level (``functional/backends/native_build.py`` picks one at import).

Everything else about the package is in pyproject.toml. The extension is built against the torch
already installed (the Makefile pins torch==2.13.0 and installs with --no-build-isolation: an
isolated build environment would fetch a multi-GB torch of its own). If it cannot be built (no
compiler, no torch at build time) the package still installs: the ``native`` backend then reports
why in ``attnlab.available_backends()``'s absence and ``attnlab.functional.backends.native.info()``.
"""
import os
import platform
import sys

from setuptools import setup

ext_modules, cmdclass = [], {}


# One build for every x86-64 (issue #27): the kernel is compiled once per instruction set, each into its
# own module, and attnlab.functional.backends.native imports the best one this CPU runs (or the one
# ATTNLAB_NATIVE_ISA names). No -march=native: a wheel built on one machine runs on any x86-64 with AVX2.
# CPU_CAPABILITY_* is the at::vec macro that picks its AVX-512 / AVX2 code paths (without one it runs
# scalar loops, about 4x slower exp and max); AMX needs no flag of ours: oneDNN picks it at run time.
ISA_FLAGS = {
    "avx2": ["-march=x86-64-v3", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"],
    "avx512": ["-march=x86-64-v4", "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"],
    "avx512_bf16": ["-march=x86-64-v4", "-mavx512bf16", "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"],
}


def _isa_builds() -> dict[str, list[str]]:
    """{module suffix: flags}: the three x86-64 levels, or one portable build elsewhere (at::vec's scalar code).

    ATTNLAB_BUILD_ISAS=avx512_bf16[,avx2...] builds only those (a developer's faster rebuild; the
    others keep their last build, or are absent and cannot be chosen).
    """
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return {"base": []}
    only = [isa.strip() for isa in os.environ.get("ATTNLAB_BUILD_ISAS", "").split(",") if isa.strip()]
    unknown = sorted(set(only) - set(ISA_FLAGS))
    if unknown:
        raise SystemExit(f"attnlab: error: ATTNLAB_BUILD_ISAS names {unknown}; choose from {sorted(ISA_FLAGS)}")
    return {isa: flags for isa, flags in ISA_FLAGS.items() if not only or isa in only}


try:
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    class _OptionalBuild(BuildExtension):
        """Build the kernel, but never fail the install because of it (the backend says why instead)."""

        def run(self):
            try:
                super().run()
            except Exception as exc:           # noqa: BLE001  (any compiler failure)
                print(f"attnlab: warning: the native kernel was not built: {exc}", file=sys.stderr)

        def build_extension(self, ext):
            # The same sources compile once per ISA: each build gets its own object directory, or ninja
            # would take one build's objects, up to date by their times, for another's.
            base = self.build_temp
            self.build_temp = os.path.join(base, ext.name.rsplit(".", 1)[-1])
            try:
                super().build_extension(ext)
            finally:
                self.build_temp = base

    src = os.path.join("src", "attnlab", "csrc")
    sources = [os.path.join(src, f) for f in ("bindings.cpp", "forward.cpp", "backward.cpp", "gemm.cpp",
                                               "microkernel.cpp", "amx.cpp", "kept.cpp")]
    ext_modules = [CppExtension(
        f"attnlab.functional.backends._native_{isa}", sources,
        # -g0 overrides the -g of Python's own CFLAGS: debug info for torch's templates took a third of the
        # build's time (objdump and perf still read the symbols).
        extra_compile_args=["-O3", "-g0", "-std=c++17", "-fopenmp", "-Wno-unknown-pragmas"] + flags,
        extra_link_args=["-fopenmp"],
    ) for isa, flags in _isa_builds().items()]
    cmdclass = {"build_ext": _OptionalBuild.with_options(use_ninja=True)}
except ImportError:                            # no torch at build time: pure-Python install
    print("attnlab: warning: torch is not importable at build time; the native kernel is not built",
          file=sys.stderr)

setup(ext_modules=ext_modules, cmdclass=cmdclass)
