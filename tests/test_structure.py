"""One name per concept (issue #29): what the library computes and what the bench times are the same thing, no
two definitions share a name, and every renamed name still works with a deprecation warning."""
import ast
import importlib
from pathlib import Path

import pytest
import torch

from attnlab.bench.cases import Case, attnlab_mask, flex_mods
from attnlab.positional import ALiBi


@pytest.mark.parametrize("H", range(1, 17))
def test_the_bench_alibi_is_the_library_alibi(H):
    case = Case("alibi", 12, "float32", "fwd", heads=H)
    _, bench = attnlab_mask(case)
    library = ALiBi(H).bias()
    torch.testing.assert_close(bench.dense(12, 12).double(), library.dense(12, 12).double(), rtol=1e-6, atol=0)
    _, score_mod = flex_mods(case)
    flex = torch.stack([torch.stack([torch.stack([score_mod(torch.tensor(0.0), 0, h, torch.tensor(i), torch.tensor(j))
                                                  for j in range(12)]) for i in range(12)]) for h in range(H)])
    torch.testing.assert_close(flex.double(), library.dense(12, 12).double().reshape(H, 12, 12), rtol=1e-6, atol=0)


# -- one name per concept: no two definitions share a name, and every old name still works --------------------
SRC = Path(__file__).resolve().parents[1] / "src" / "attnlab"


def _public_definitions() -> dict[tuple[str, str], list[str]]:
    """{(kind, name): [files]} of every top-level public class and function under src/attnlab."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and not node.name.startswith("_"):
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                found.setdefault((kind, node.name), []).append(str(path.relative_to(SRC)))
    return found


def test_no_two_classes_share_a_name_even_one_letter_apart():
    by_lower: dict[str, set[str]] = {}
    defs = _public_definitions()
    for (kind, name), files in defs.items():
        if kind == "class":
            assert len(files) == 1, f"class {name} is defined in {files}: give each concept its own name"
            by_lower.setdefault(name.lower(), set()).add(name)
    clashes = [sorted(names) for names in by_lower.values() if len(names) > 1]
    assert not clashes, f"class names that differ only in case: {clashes}"


@pytest.mark.parametrize("name", ["load_model", "alibi_slopes"])
def test_these_functions_have_one_definition(name):
    files = _public_definitions().get(("function", name), [])
    assert len(files) == 1, f"{name} is defined in {files}"


@pytest.mark.parametrize("module, old, new", [
    ("attnlab.nn", "MultiHeadAttention", "AttentionLayer"),
    ("attnlab.nn.attention", "MultiHeadAttention", "AttentionLayer"),
    ("attnlab.nn", "Encoder", "EncoderStack"),
    ("attnlab.nn", "Decoder", "DecoderStack"),
    ("attnlab.nn.blocks", "Encoder", "EncoderStack"),
    ("attnlab.web.app", "AttentionRequest", "MapsRequest"),
    ("attnlab.lab.inspect", "load_model", "registered_model"),
])
def test_an_old_name_still_works_and_warns(module, old, new):
    if module.startswith("attnlab.web"):
        pytest.importorskip("fastapi")
    mod = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=f"{module}.{old} is deprecated: it is now {module}.{new}"):
        assert getattr(mod, old) is getattr(mod, new)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        mod.Nope


# -- one measurement package (issue #29): bench's timing and machine, and the lab's threads(), moved ------------
@pytest.mark.parametrize("old_module, name, new_module", [
    ("attnlab.bench.timing", "time_interleaved", "attnlab.measure.timing"),
    ("attnlab.bench.timing", "time_median", "attnlab.measure.timing"),
    ("attnlab.bench.timing", "Timing", "attnlab.measure.timing"),
    ("attnlab.bench.timing", "gemm_peak_gflops", "attnlab.measure.timing"),
    ("attnlab.bench.timing", "MIN_RUNS", "attnlab.measure.timing"),              # not in __all__, still reachable
    ("attnlab.bench.machine", "machine_info", "attnlab.measure.machine"),
    ("attnlab.bench.machine", "LoadMonitor", "attnlab.measure.machine"),
    ("attnlab.bench.machine", "BUSY_WARN", "attnlab.measure.machine"),
    ("attnlab.bench.machine", "cpu_label", "attnlab.measure.machine"),
    ("attnlab.bench.machine", "code_version", "attnlab.measure.machine"),
    ("attnlab.lab.exp_sequential", "threads", "attnlab.measure.threads"),
])
def test_a_moved_name_still_works_and_warns(old_module, name, new_module):
    old, new = importlib.import_module(old_module), importlib.import_module(new_module)
    with pytest.warns(DeprecationWarning, match=f"{old_module}.{name} is deprecated: it is now {new_module}.{name} "):
        assert getattr(old, name) is getattr(new, name)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        old.Nope


@pytest.mark.parametrize("old_module, new_module", [("attnlab.bench.timing", "attnlab.measure.timing"),
                                                    ("attnlab.bench.machine", "attnlab.measure.machine")])
def test_a_moved_module_still_answers_a_star_import(old_module, new_module):
    new = importlib.import_module(new_module)
    with pytest.warns(DeprecationWarning):
        names: dict = {}
        exec(f"from {old_module} import *", names)
    assert {n: names[n] for n in new.__all__} == {n: getattr(new, n) for n in new.__all__}


def _imports(path: Path, package: str):
    """(module, name) for each ``from module import name`` in ``path``, relative modules resolved in ``package``."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module) if p)
            yield from ((module, alias.name) for alias in node.names)
        elif isinstance(node, ast.Import):
            yield from ((alias.name, None) for alias in node.names)


def test_the_users_of_a_moved_name_import_it_from_its_new_home():
    # The old paths are for code outside attnlab: inside it, an old path would warn on every run.
    moved = {"attnlab.bench.timing", "attnlab.bench.machine"}
    found = []
    for root in (SRC, SRC.parents[1] / "tests", SRC.parents[1] / "scripts"):
        for path in sorted(root.rglob("*.py")):
            # a module's package is its folder (for pkg/__init__.py too); tests and scripts import absolutely
            package = ".".join(path.relative_to(SRC.parent).parts[:-1]) if root == SRC else ""
            for module, name in _imports(path, package):
                if module in moved or f"{module}.{name}" in moved or \
                        (module == "attnlab.lab.exp_sequential" and name == "threads"):
                    found.append(f"{path}: from {module} import {name}")
    assert not found, "imports of a moved name from its old path:\n" + "\n".join(found)
