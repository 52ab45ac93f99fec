"""One build for every x86-64 (issue #27): the kernel is compiled per instruction-set level
(functional/backends/native_build.py); the best level this CPU runs is chosen at import, a lower one
can be forced with ATTNLAB_NATIVE_ISA, one it cannot run is refused, and every level this machine
runs passes the kernel's conformance suite."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.functional.backends import native, native_build

ROOT = Path(__file__).resolve().parents[1]


def _probe(isa: str, **more: str) -> str:
    """native.info() in a fresh interpreter with ATTNLAB_NATIVE_ISA=isa ("": unset) and the variables in ``more``
    (the choice is made once, at import)."""
    env = dict(os.environ, **{native_build.ENV: isa}, **more)
    out = subprocess.run([sys.executable, "-c", "from attnlab.functional.backends import native; print(native.info())"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


#: the kernel's conformance suites, run once per level
CONFORMANCE = ["tests/test_native.py", "tests/test_native_tiles.py", "tests/test_native_masks.py",
               "tests/test_native_exp.py", "tests/test_nan_agreement.py", "tests/test_properties.py",
               "tests/test_layouts.py"]


def _suite(files: list[str], **env: str) -> None:
    """pytest on ``files`` in a fresh interpreter with ``env`` added to this one's (the level is chosen at import)."""
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *files],
                         cwd=ROOT, env=dict(os.environ, **env), capture_output=True, text=True, timeout=1500)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]


def test_the_best_build_this_cpu_runs_is_chosen():
    if os.environ.get(native_build.ENV) or os.environ.get(native_build.EMULATE_ENV):
        pytest.skip(f"{native_build.ENV} or {native_build.EMULATE_ENV} is set for this run")
    assert native.ISA == native_build.runnable_isas()[0], native.info()
    assert f"build {native.ISA} (the best build this CPU runs)" in native.info()


@pytest.mark.parametrize("isa", native_build.runnable_isas())
def test_every_build_this_cpu_runs_is_built_and_can_be_forced(isa):
    """make setup builds every level: a missing one fails here (a user forcing it would lose the kernel)."""
    assert f"native: build {isa} (forced by {native_build.ENV}={isa})" in _probe(isa)


@pytest.mark.parametrize("isa, why", [("sse2", "is not a build; choose one of"),
                                      ("base", "this CPU cannot run that build")])
def test_a_build_that_cannot_run_is_refused_by_name(isa, why):
    if isa == "base" and "base" in native_build.runnable_isas():
        pytest.skip("off x86-64 the base build is the one that runs")
    text = _probe(isa)
    assert text.startswith("native: unavailable:") and why in text and native_build.ENV in text, text


@pytest.mark.slow
@pytest.mark.parametrize("isa", native_build.runnable_isas())
def test_every_build_this_cpu_runs_passes_the_conformance_suite(isa):
    """The kernel's own tests, its tiles', random masks over many tiles, NaN agreement, the property tests and the
    layouts, per level. The level the default run chose (the best one, with neither variable set) is not run twice."""
    if isa == native.ISA and not os.environ.get(native_build.ENV) and not os.environ.get(native_build.EMULATE_ENV):
        pytest.skip(f"the default run tested {isa}: these suites run there on the best level this CPU runs")
    _suite(CONFORMANCE, **{native_build.ENV: isa, native_build.EMULATE_ENV: ""})


def _emulation_applies() -> None:
    runs = native_build.runnable_isas()
    if "amx" in runs or "avx512_bf16" not in runs:
        pytest.skip("AMX is emulated where the avx512_bf16 build runs and AMX does not (here: the real one, or none)")


def test_the_amx_level_is_emulated_for_tests_where_avx512_bf16_runs():
    """ATTNLAB_AMX_EMULATED=1: the amx level with a plain loop in brgemm's place, chosen as the best level and said
    so; forcing avx512_bf16 still means no AMX; any other value is refused by name."""
    _emulation_applies()
    emulated = _probe("", **{native_build.EMULATE_ENV: "1"})
    assert emulated.startswith("native: build amx (the best build this CPU runs; AMX emulated by "
                               f"{native_build.EMULATE_ENV}=1"), emulated
    assert "bfloat16 on AMX tiles" in emulated
    forced = _probe("avx512_bf16", **{native_build.EMULATE_ENV: "1"})
    assert forced.startswith(f"native: build avx512_bf16 (forced by {native_build.ENV}=avx512_bf16)"), forced
    assert "AMX" not in forced, forced
    bad = _probe("", **{native_build.EMULATE_ENV: "yes"})
    assert bad.startswith(f"native: unavailable: {native_build.EMULATE_ENV}='yes': set it to 1"), bad


def test_the_amx_path_emulated_passes_its_own_tests():
    """tests/test_native_amx.py on this CPU without AMX: the AMX path's packing, fused softmax and key pairs past a
    tile, with brgemm emulated (a change there fails here, not only on a Xeon)."""
    _emulation_applies()
    _suite(["tests/test_native_amx.py"], **{native_build.EMULATE_ENV: "1", native_build.ENV: ""})


@pytest.mark.slow
def test_the_amx_path_emulated_passes_the_conformance_suite():
    _emulation_applies()
    _suite(CONFORMANCE + ["tests/test_native_amx.py"], **{native_build.EMULATE_ENV: "1", native_build.ENV: ""})


def test_the_avx2_build_holds_no_avx512_instruction():
    """What lets one wheel run on a CPU without AVX-512: the avx2 module (built here on an AVX-512 machine,
    with no -march=native) uses no zmm or mask register, so it cannot stop with SIGILL there."""
    import importlib
    import shutil
    if "avx2" not in native_build.runnable_isas() or shutil.which("objdump") is None:
        pytest.skip("no avx2 build or no objdump here")
    path = importlib.import_module("attnlab.functional.backends._native_avx2").__file__
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path], capture_output=True, text=True,
                          timeout=120).stdout
    assert "%ymm" in text                                   # vectorized (at::vec's AVX2 code), but
    bad = [line for line in text.splitlines() if "%zmm" in line or any(f"%k{i}" in line for i in range(8))]
    assert not bad, bad[:5]


#: run from the installed wheel, outside the checkout: where attnlab came from, the level, each case's error
#: against the float64 reference, and which compiled modules were loaded
_FROM_THE_WHEEL = """
import sys, torch, attnlab
from attnlab.functional import attention, masks
from attnlab.functional.backends import native
print(attnlab.__file__)
print(native.info())
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 4, 300, 64, generator=g) for _ in range(3))
for dtype in (torch.float32, torch.bfloat16):
    for kw in (dict(causal=True), dict(mask=masks.padding(torch.tensor([250])))):
        out = attention(q.to(dtype), k.to(dtype), v.to(dtype), backend="native", **kw).double()
        ref = attention(q.double(), k.double(), v.double(), backend="reference", **kw)
        print(dtype, (out - ref).abs().max().item())
print(sorted(m for m in sys.modules if "._native_" in m))
"""


@pytest.mark.slow
def test_a_wheel_built_here_runs_its_avx2_build_from_outside_the_checkout(tmp_path):
    """`pip wheel .` on this machine, installed elsewhere, runs with ATTNLAB_NATIVE_ISA=avx2 as a CPU without
    AVX-512 would: it imports from the wheel, runs the avx2 module alone and is exact. The wheel is built with
    ATTNLAB_BUILD_ISAS=avx2 (one level: a third of the build's time; the others are the same sources with other
    flags), from a copy of the sources without this checkout's compiled modules."""
    import shutil
    import zipfile
    if "avx2" not in native_build.runnable_isas():
        pytest.skip("this CPU runs no avx2 build")
    src = tmp_path / "src"
    for name in ("pyproject.toml", "setup.py", "README.md"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("*.so", "__pycache__", "*.egg-info"))
    env = dict(os.environ, ATTNLAB_BUILD_ISAS="avx2")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-build-isolation", "--no-deps",
                            "-q", "-w", str(tmp_path / "wheel")], env=env, capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "wheel").glob("attnlab-*.whl")
    modules = [n for n in zipfile.ZipFile(wheel).namelist() if "/_native_" in n]
    assert len(modules) == 1 and "/_native_avx2." in modules[0], modules
    site = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                                str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-3000:]
    run = subprocess.run([sys.executable, "-c", _FROM_THE_WHEEL], cwd=tmp_path, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(site), **{native_build.ENV: "avx2",
                                                                       native_build.EMULATE_ENV: ""}), timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    where, info, *errors, loaded = run.stdout.strip().splitlines()
    assert where.startswith(str(site)), where
    assert info.startswith(f"native: build avx2 (forced by {native_build.ENV}=avx2)"), info
    assert loaded == "['attnlab.functional.backends._native_avx2']", loaded
    assert len(errors) == 4, errors
    for line in errors:
        dtype, err = line.rsplit(" ", 1)
        assert float(err) <= (2e-6 if dtype == "torch.float32" else 2e-2), line
