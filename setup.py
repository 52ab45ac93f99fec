"""Builds attnlab's compiled CPU kernel (``attnlab._native``) with ``torch.utils.cpp_extension``.

Everything else about the package is in pyproject.toml. The extension is built against the torch
already installed (the Makefile pins torch==2.13.0 and installs with --no-build-isolation: an
isolated build environment would fetch a multi-GB torch of its own). If it cannot be built (no
compiler, no torch at build time) the package still installs: the ``native`` backend then reports
why in ``attnlab.available_backends()``'s absence and ``attnlab.functional.backends.native.info()``.
"""
import os
import subprocess
import sys

from setuptools import setup

ext_modules, cmdclass = [], {}


def _vector_flags(cxx: str) -> list[str]:
    """-march=native plus the at::vec capability macro the compiler can honour on this machine.

    at::vec picks its AVX-512 / AVX2 code paths from CPU_CAPABILITY_* macros, not from the
    compiler's own; without one it falls back to scalar loops (about 4x slower exp and max).
    """
    try:
        macros = subprocess.run([cxx, "-march=native", "-dM", "-E", "-x", "c++", "/dev/null"],
                                capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    flags = ["-march=native"]
    if "__AVX512F__" in macros and "__AVX512BW__" in macros and "__AVX512DQ__" in macros:
        flags += ["-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"]
    elif "__AVX2__" in macros and "__FMA__" in macros:
        flags += ["-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"]
    return flags


try:
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    class _OptionalBuild(BuildExtension):
        """Build the kernel, but never fail the install because of it (the backend says why instead)."""

        def run(self):
            try:
                super().run()
            except Exception as exc:           # noqa: BLE001  (any compiler failure)
                print(f"attnlab: warning: the native kernel was not built: {exc}", file=sys.stderr)

    src = os.path.join("src", "attnlab", "csrc")
    ext_modules = [CppExtension(
        "attnlab._native",
        [os.path.join(src, f) for f in ("bindings.cpp", "forward.cpp", "backward.cpp", "gemm.cpp", "microkernel.cpp")],
        extra_compile_args=["-O3", "-std=c++17", "-fopenmp", "-Wno-unknown-pragmas"]
        + _vector_flags(os.environ.get("CXX", "g++")),
        extra_link_args=["-fopenmp"],
    )]
    cmdclass = {"build_ext": _OptionalBuild.with_options(use_ninja=True)}
except ImportError:                            # no torch at build time: pure-Python install
    print("attnlab: warning: torch is not importable at build time; the native kernel is not built",
          file=sys.stderr)

setup(ext_modules=ext_modules, cmdclass=cmdclass)
