"""The import graph of ``src/attnlab``: no cycles, no import that runs up the floors (``FLOORS``: from the
CLI down to the kernels), and the kernels (``attnlab.functional``) never import a positional scheme
(``attnlab.positional``): they know biases by interface, not by name.

The graph is read from the source with ``ast`` (nothing is imported), one node per module
(``pkg/__init__.py`` is ``pkg``). An edge A -> B is a statement in A that runs B when it executes:

- ``import a.b.c`` -> ``a.b.c``; ``from P import n`` -> ``P.n`` when that is a module, else ``P``;
  relative imports are resolved against A's package;
- ``importlib.import_module("literal", __package__)`` counts like an import of that literal;
- imports inside functions count too. Module-level imports are what break at import time, but a lazy
  import that closes a loop is the same cycle, only hidden: the two modules still cannot be read,
  tested or moved one without the other, and the first caller that imports the lazy side at module
  level brings the failure back. Laziness that is only about start-up cost (torch, matplotlib,
  triton, a sibling command's heavy module) never closes a loop, so it costs nothing here.
- not counted: imports under ``if TYPE_CHECKING:`` (never run), and imports whose module name is
  computed (the task registry ``TASK_MODULES``, ``lab.verify``'s experiment list, the lazy
  ``__getattr__`` re-exports of ``attnlab``/``attnlab.lab``/``attnlab.bench``): those are registries
  looked up by name at run time, never at import time.

A cycle is reported as a strongly connected component of this graph, with one loop through it and
the file:line of each import on that loop, e.g.::

    attnlab.functional.masks -> attnlab.functional.patterns (functional/masks.py:412, module level)
    attnlab.functional.patterns -> attnlab.functional.masks (functional/patterns.py:9, module level)
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "attnlab"


@dataclass(frozen=True)
class Edge:
    """One import statement from ``source`` that runs ``target``."""
    source: str
    target: str
    path: str           # relative to the source root
    line: int
    lazy: bool          # inside a function

    def __str__(self) -> str:
        return (f"{self.source} -> {self.target} ({self.path}:{self.line}, "
                f"{'inside a function' if self.lazy else 'module level'})")


def module_name(path: Path, root: Path) -> str:
    """``root/a/b/c.py`` -> ``a.b.c``; ``root/a/b/__init__.py`` -> ``a.b``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _statements(tree: ast.AST):
    """(node, lazy) for every node that can import, skipping ``if TYPE_CHECKING:`` bodies."""
    def walk(node, lazy):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for other in child.orelse:                      # the else branch does run
                    yield from walk_one(other, lazy)
                continue
            yield from walk_one(child, lazy)

    def walk_one(node, lazy):
        yield node, lazy
        inner = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        yield from walk(node, inner)

    yield from walk(tree, False)


def _absolute(module: str, is_package: bool, name: str | None, level: int) -> str:
    """The absolute module named by ``from <level dots><name> import ...`` inside ``module``."""
    if level == 0:
        return name or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _known(name: str, modules: set[str]) -> str | None:
    """The longest prefix of dotted ``name`` that is one of ``modules`` (None: not ours)."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in modules:
            return ".".join(parts[:k])
    return None


def _import_module_target(call: ast.Call, module: str, is_package: bool) -> str | None:
    """The module of ``importlib.import_module("<literal>"[, __package__ | __name__])``, else None."""
    f = call.func
    named = (isinstance(f, ast.Attribute) and f.attr == "import_module") or \
        (isinstance(f, ast.Name) and f.id == "import_module")
    if not named or not call.args or not isinstance(call.args[0], ast.Constant) \
            or not isinstance(call.args[0].value, str):
        return None
    name = call.args[0].value
    if not name.startswith("."):
        return name
    level = len(name) - len(name.lstrip("."))
    return _absolute(module, is_package, name.lstrip(".") or None, level)


def compiled_modules(root: Path, package: str = PACKAGE) -> set[str]:
    """Compiled extensions (``attnlab._native``): modules too, with no imports of ours. Those built here
    (``*.so``), and those ``setup.py`` declares (``CppExtension("attnlab._native", ...)``), so that a
    checkout that has not built them yet reads ``from ... import _native`` the same way."""
    found = {module_name(p.with_name(p.name.split(".")[0] + ".py"), root)
             for ext in ("*.so", "*.pyd") for p in (root / package).rglob(ext)}
    setup = root.parent / "setup.py"
    if setup.exists():
        for node in ast.walk(ast.parse(setup.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                    and str(node.args[0].value).startswith(package + ".") \
                    and getattr(node.func, "id", getattr(node.func, "attr", "")).endswith("Extension"):
                found.add(node.args[0].value)
    return found


def import_graph(root: Path, package: str = PACKAGE) -> tuple[set[str], list[Edge]]:
    """(modules, edges) of every ``*.py`` under ``root/package``; edges only between those modules."""
    files = {module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}
    modules = set(files) | compiled_modules(root, package)
    edges: list[Edge] = []
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        rel = str(path.relative_to(root / package))
        for node, lazy in _statements(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(module, is_package, node.module, node.level)
                # `from P import n`: the submodule P.n when there is one, else P itself
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            elif isinstance(node, ast.Call):
                target = _import_module_target(node, module, is_package)
                targets = [target] if target else []
            for target in dict.fromkeys(targets):
                known = _known(target, modules)
                if known is not None and known != module:
                    edges.append(Edge(module, known, rel, node.lineno, lazy))
    return modules, edges


def strongly_connected(modules: set[str], edges: list[Edge]) -> list[list[str]]:
    """Components of more than one module (Tarjan's algorithm, iterative), each sorted, sorted by first name."""
    succ: dict[str, list[str]] = {m: [] for m in modules}
    for e in edges:
        succ[e.source].append(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(modules):
        if start in index:
            continue
        work = [(start, iter(sorted(set(succ[start]))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        comp.append(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(set(succ[child])))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sorted(found)


def a_loop(component: list[str], edges: list[Edge]) -> list[Edge]:
    """One loop through a component's first module (shortest, by breadth-first search), as its edges."""
    inside = set(component)
    out: dict[str, list[Edge]] = {}
    for e in edges:
        if e.source in inside and e.target in inside:
            out.setdefault(e.source, []).append(e)
    start = component[0]
    paths: dict[str, list[Edge]] = {start: []}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for e in sorted(out.get(node, []), key=lambda e: (e.target, e.line)):
                if e.target == start:
                    return paths[node] + [e]
                if e.target not in paths:
                    paths[e.target] = paths[node] + [e]
                    nxt.append(e.target)
        frontier = nxt
    raise AssertionError(f"no loop through {start}")        # a component always has one


def describe_cycles(modules: set[str], edges: list[Edge]) -> list[str]:
    """One paragraph per cycle: its modules, then one loop with the file:line of each import."""
    return [f"cycle among {', '.join(comp)}:\n  " + "\n  ".join(map(str, a_loop(comp, edges)))
            for comp in strongly_connected(modules, edges)]


def upward_imports(edges: list[Edge], lower: str, upper: str) -> list[Edge]:
    """Imports from package ``lower`` (or its submodules) of package ``upper`` (or its submodules)."""
    def within(m, pkg):
        return m == pkg or m.startswith(pkg + ".")
    return [e for e in edges if within(e.source, lower) and within(e.target, upper)]


# The floors of the package, top first: a module may import its own floor's packages and every floor below,
# never one above (issue #29). The root package is the facade over the kernels (``al.attention``; its
# ``nn``/``models`` re-exports are lazy ``__getattr__`` look-ups, not imports), with the two leaf helpers.
FLOORS = [
    {"attnlab.__main__", "attnlab.cli"},
    {"attnlab.web"},
    {"attnlab.lab"},
    {"attnlab.bench"},
    {"attnlab.measure"},
    {"attnlab.tasks"},
    {"attnlab.train"},
    {"attnlab.models", "attnlab.integrations", "attnlab.data"},
    {"attnlab.nn"},
    {"attnlab.positional"},
    {"attnlab", "attnlab.presets", "attnlab.numpy_reference", "attnlab.deprecation"},
    {"attnlab.functional"},
]


def floor_of(module: str, floors: list[set[str]]) -> int:
    """The index in ``floors`` of the longest package (or module) name that ``module`` is or is inside."""
    best, where = -1, None
    for i, names in enumerate(floors):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, where = len(name), i
    if where is None:
        raise AssertionError(f"{module} is on no floor: add its package to FLOORS")
    return where


def upward_edges(edges: list[Edge], floors: list[set[str]]) -> list[Edge]:
    """Imports from a module to one on a higher floor."""
    return [e for e in edges if floor_of(e.target, floors) < floor_of(e.source, floors)]


@pytest.fixture(scope="module")
def graph():
    return import_graph(SRC)


# -- the rules, on attnlab ----------------------------------------------------------------------------
def test_no_import_cycle_in_src(graph):
    cycles = describe_cycles(*graph)
    assert not cycles, "import cycles (break each loop, e.g. move what both sides need into a third " \
                       "module):\n" + "\n".join(cycles)


def test_no_import_runs_up_the_floors(graph):
    bad = upward_edges(graph[1], FLOORS)
    assert not bad, "imports that run up the floors (FLOORS, top first; move the shared piece down, or the " \
                    "importer up):\n" + "\n".join(map(str, bad))


def test_the_compiled_kernel_lives_beside_its_backend():
    # native_build loads it by a computed name (one module per instruction-set level), which the graph cannot
    # see: its place is checked here instead (issue #29: it sat at the package root, a floor up).
    compiled = compiled_modules(SRC)
    assert compiled, "setup.py declares no compiled module"
    for module in compiled:
        assert module.startswith("attnlab.functional.backends._native_"), module


def test_every_module_is_on_a_floor(graph):
    for module in graph[0]:
        floor_of(module, FLOORS)


def test_functional_never_imports_positional(graph):
    bad = upward_imports(graph[1], "attnlab.functional", "attnlab.positional")
    assert not bad, "attnlab.functional imports attnlab.positional (kernels take a bias by its interface, " \
                    "e.g. a relative per-offset table, never by scheme):\n" + "\n".join(map(str, bad))


def test_the_graph_sees_the_whole_package(graph):
    modules, edges = graph
    assert {"attnlab", "attnlab.cli", "attnlab.cli.bench", "attnlab.functional.masks"} <= modules
    # a module-level relative import, an absolute one, a `from . import submodule`, a lazy one
    assert any(e.source == "attnlab.cli" and e.target == "attnlab.cli.bench" and not e.lazy for e in edges)
    assert any(e.source == "attnlab.cli.bench" and e.target.startswith("attnlab.bench") and e.lazy for e in edges)
    assert any(e.source == "attnlab.__main__" and e.target == "attnlab.cli" for e in edges)


# -- the checker, on synthetic packages that break the rules -------------------------------------------
def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_module_level_cycle_is_found_with_its_lines(tmp_path):
    root = _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "import os\nfrom .b import g\n",
        "pkg/b.py": "from . import c\n",
        "pkg/c.py": "\n\nfrom pkg.a import f\n",
        "pkg/d.py": "from .a import f\n",                       # on the way in, not on the loop
    })
    modules, edges = import_graph(root, "pkg")
    assert strongly_connected(modules, edges) == [["pkg.a", "pkg.b", "pkg.c"]]
    (text,) = describe_cycles(modules, edges)
    assert "pkg.a -> pkg.b (a.py:2, module level)" in text and "pkg.c -> pkg.a (c.py:3, module level)" in text


def test_a_lazy_import_that_closes_a_loop_is_a_cycle(tmp_path):
    root = _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/masks.py": "def f():\n    from .patterns import p\n    return p\n",
        "pkg/patterns.py": "from .masks import f\n",
    })
    modules, edges = import_graph(root, "pkg")
    (text,) = describe_cycles(modules, edges)
    assert "pkg.masks -> pkg.patterns (masks.py:2, inside a function)" in text


def test_what_is_not_a_cycle(tmp_path):
    root = _package(tmp_path, {
        "pkg/__init__.py": "from .a import f\nfrom . import b\n",
        "pkg/a.py": "import torch\nimport pkg.b\nfrom typing import TYPE_CHECKING\n"
                    "if TYPE_CHECKING:\n    from .c import C\nelse:\n    C = None\n",
        "pkg/b.py": "import importlib\ndef load(name):\n    return importlib.import_module(f'.{name}', __package__)\n",
        "pkg/c.py": "from .a import f\n",
    })
    modules, edges = import_graph(root, "pkg")
    assert strongly_connected(modules, edges) == []
    assert {(e.source, e.target) for e in edges} == {("pkg", "pkg.a"), ("pkg", "pkg.b"), ("pkg.a", "pkg.b"),
                                                     ("pkg.c", "pkg.a")}


def test_import_module_with_a_literal_is_an_import(tmp_path):
    root = _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/sub/__init__.py": "import importlib\nK = importlib.import_module('.k', __package__)\n",
        "pkg/sub/k.py": "from ..sub import K\n",
    })
    modules, edges = import_graph(root, "pkg")
    assert strongly_connected(modules, edges) == [["pkg.sub", "pkg.sub.k"]]


def test_an_upward_import_is_found(tmp_path):
    root = _package(tmp_path, {
        "pkg/__init__.py": "from .functional import k\n",
        "pkg/functional/__init__.py": "k = 1\n",
        "pkg/functional/native.py": "def f():\n    from .. import _ext\n",     # the compiled module, one floor up
        "pkg/_ext.py": "",
        "pkg/cli.py": "from .functional import native\n",
    })
    floors = [{"pkg.cli"}, {"pkg", "pkg._ext"}, {"pkg.functional"}]
    modules, edges = import_graph(root, "pkg")
    assert [(e.source, e.target, e.lazy) for e in upward_edges(edges, floors)] == [
        ("pkg.functional.native", "pkg._ext", True)]
    assert floor_of("pkg.functional.native", floors) == 2 and floor_of("pkg", floors) == 1


def test_relative_imports_resolve_against_the_package(tmp_path):
    root = _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/functional/__init__.py": "from .backends import x\n",
        "pkg/functional/backends/__init__.py": "x = 1\n",
        "pkg/functional/backends/plan.py": "from ...positional import alibi\nfrom .. import backends\n",
        "pkg/positional/__init__.py": "",
        "pkg/positional/alibi.py": "",
    })
    modules, edges = import_graph(root, "pkg")
    bad = upward_imports(edges, "pkg.functional", "pkg.positional")
    assert [(e.source, e.target, e.line) for e in bad] == [("pkg.functional.backends.plan", "pkg.positional.alibi", 1)]
    assert upward_imports(edges, "pkg.positional", "pkg.functional") == []
