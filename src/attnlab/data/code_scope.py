"""Which binding a name's use reads, by Python's scoping rules, and the same name bound in a scope it cannot read.

The variable-scope measurement (``lab/code_scope``, claim ``code-scope``) needs, for a use of a name,
two earlier bindings of that name: *b_in*, in the scope the use reads, and *b_out*, in a scope the
use cannot see. Both come from ``ast`` alone (no execution), mapped to character offsets.

Scopes are the module, each function, lambda, class body and comprehension. A use (``ast.Name`` in
load context) reads:

- its own scope, if the name is bound there (assignment and augmented-assignment targets, tuple
  unpacking, ``for`` / ``with ... as`` / ``except ... as`` targets, parameters including
  ``*args`` / ``**kw`` / keyword-only ones, imports — ``import a.b`` binds ``a`` — ``def`` / ``class``
  names, ``match`` captures, comprehension targets; ``del x`` and ``x: int`` make ``x`` local without
  being a binding occurrence), unless ``global`` / ``nonlocal`` says otherwise;
- otherwise the nearest enclosing function-like scope that binds it, skipping class bodies (a class
  body's names are not visible from its methods or its comprehensions), else the module.

A walrus inside a comprehension binds in the nearest enclosing scope that is not a comprehension;
decorators, defaults, annotations, class bases and a comprehension's first iterable are evaluated in
the enclosing scope, as Python does.

Pairs (``scope_pairs``): for each use, b_in = the latest binding occurrence of the name in the scope
it reads, textually before the use; b_out = the latest binding occurrence of the name before the use
in a scope that is *not visible* from the use — neither the use's own scope nor one of the function
scopes (or the module) enclosing it: another function's local or parameter, a nested function's,
lambda's or comprehension's local, a class body seen from outside it or from its methods. A
shadowed binding in an enclosing scope is neither. Uses without both are skipped. "Before" is text
order, the order a causal model reads: in ``x = x + 1`` the right-hand ``x``'s b_in is the same
statement's target, and a comprehension's element (``[i for i in xs]``) has no b_in of its own.

Example::

    src = "def f(x):\\n    return x\\n\\ndef g(x):\\n    return x\\n"
    [(p.name, src[p.in_start:p.in_end], p.in_start, p.out_start) for p in scope_pairs(src)]
    # [('x', 'x', 30, 6)]: g's use of x reads g's parameter (offset 30), not f's (offset 6)
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Optional

from .code_analysis import _byte_col_to_char, _line_starts

__all__ = ["ScopePair", "NameOccurrence", "name_occurrences", "scope_pairs"]

_COMPREHENSIONS = {ast.ListComp: "<listcomp>", ast.SetComp: "<setcomp>", ast.DictComp: "<dictcomp>",
                   ast.GeneratorExp: "<genexpr>"}


@dataclass(frozen=True)
class ScopePair:
    name: str
    use_start: int     # character span of the use (end exclusive)
    use_end: int
    in_start: int      # b_in: the latest binding before the use in the scope the use reads
    in_end: int
    out_start: int     # b_out: the latest binding before the use in a scope the use cannot see
    out_end: int
    out_nearer: bool   # b_out lies between b_in and the use


@dataclass(frozen=True)
class NameOccurrence:
    name: str
    start: int         # character span of the name
    end: int
    binding: bool      # a binding occurrence (else a use: a load)
    scope: str         # qualified name of the scope it reads (a use) or binds in: "<module>", "C.m", "f.<lambda>"
    scope_id: int      # which scope (two lambdas of one function share a qualified name, not an id)


class _Scope:
    def __init__(self, kind: str, name: str, parent: Optional["_Scope"], ident: int, line: int = 0):
        self.kind, self.parent, self.id = kind, parent, ident        # kind: module, function, class, comprehension
        self.line = line                                             # the node's first line (symtable's lineno)
        self.qualname = name if parent is None or parent.kind == "module" else f"{parent.qualname}.{name}"
        self.bound: set[str] = set()                                 # names local here (declared ones excepted)
        self.globals: set[str] = set()
        self.nonlocals: set[str] = set()


def _resolve(name: str, scope: _Scope, module: _Scope) -> _Scope:
    """The scope whose binding of ``name`` a use (or a binding) in ``scope`` refers to."""
    if name in scope.globals:
        return module
    if name in scope.nonlocals:
        return _enclosing(name, scope.parent, module)
    if name in scope.bound or scope.kind == "module":
        return scope
    return _enclosing(name, scope.parent, module)


def _enclosing(name: str, scope: Optional[_Scope], module: _Scope) -> _Scope:
    """A free name's scope: the nearest enclosing function-like scope binding it (class bodies skipped)."""
    while scope is not None and scope.kind != "module":
        if scope.kind != "class":
            if name in scope.globals:
                return module
            if name in scope.bound and name not in scope.nonlocals:
                return scope
        scope = scope.parent
    return module


def _visible(scope: _Scope) -> set[int]:
    """Ids of the scopes a use in ``scope`` can read: itself, then the enclosing non-class scopes."""
    seen, s = {scope.id}, scope.parent
    while s is not None:
        if s.kind != "class":
            seen.add(s.id)
        s = s.parent
    return seen


class _Collector(ast.NodeVisitor):
    """One pass over the tree: scopes with their local and declared names, bindings and uses with offsets."""

    def __init__(self, source: str):
        self.source, self.lines, self.starts = source, source.split("\n"), _line_starts(source)
        self.module = _Scope("module", "<module>", None, 0)
        self.scope = self.module
        self.scopes = [self.module]
        # (key, name, start, end, scope): the key is the name as Python stores it (mangled in a class)
        self.binds: list[tuple[str, str, int, int, _Scope]] = []      # scope: where it binds (walrus: outside)
        self.uses: list[tuple[str, str, int, int, _Scope]] = []       # scope: where the use stands

    # -- offsets
    def _at(self, line: int, col: int) -> int:
        return self.starts[line - 1] + _byte_col_to_char(self.lines[line - 1], col)

    def _start(self, node) -> int:
        return self._at(node.lineno, node.col_offset)

    def _end(self, node) -> int:
        return self._at(node.end_lineno, node.end_col_offset)

    def _key(self, name: str) -> str:
        """``name`` as Python stores it: "__x" inside class C (its methods included) is "_C__x"."""
        s = self.scope
        while s is not None and s.kind != "class":
            s = s.parent
        if s is None or not name.startswith("__") or name.endswith("__") or not s.qualname.split(".")[-1].strip("_"):
            return name
        return f"_{s.qualname.split('.')[-1].lstrip('_')}{name}"

    def _bind(self, name: str, start: int, scope: Optional[_Scope] = None) -> None:
        key = self._key(name)
        scope = scope or self.scope
        scope.bound.add(key)
        self.binds.append((key, name, start, start + len(name), scope))

    def _find(self, pattern: str, lo: int, hi: int, last: bool = False) -> int:
        """Offset of the group ``name`` of ``pattern``'s first (or last) match in source[lo:hi]."""
        rx = re.compile(pattern)
        m = None
        if last:
            for m in rx.finditer(self.source, lo, hi):
                pass
        else:
            m = rx.search(self.source, lo, hi)
        if m is None:
            raise ValueError(f"no {pattern!r} in source[{lo}:{hi}]")
        return m.start("name")

    def _child(self, kind: str, name: str, node, body) -> None:
        scope = _Scope(kind, name, self.scope, len(self.scopes), node.lineno)
        self.scopes.append(scope)
        outer, self.scope = self.scope, scope
        try:
            body(scope)
        finally:
            self.scope = outer

    def _visit_all(self, nodes) -> None:
        for n in nodes:
            if n is not None:
                self.visit(n)

    # -- names and declarations
    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self.uses.append((self._key(node.id), node.id, self._start(node), self._end(node), self.scope))
        elif isinstance(node.ctx, ast.Store):
            self._bind(node.id, self._start(node))
        else:                                                         # del x: local, but binds nothing
            self.scope.bound.add(self._key(node.id))

    def visit_Global(self, node: ast.Global) -> None:
        self.scope.globals.update(map(self._key, node.names))

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        self.scope.nonlocals.update(map(self._key, node.names))

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is None and isinstance(node.target, ast.Name):  # "x: int" makes x local, binds no value
            self.scope.bound.add(self._key(node.target.id))
        else:
            self.visit(node.target)
        self._visit_all([node.annotation, node.value])

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        target = self.scope
        while target.kind == "comprehension":                         # PEP 572: binds outside the comprehension
            target = target.parent
        self._bind(node.target.id, self._start(node.target), target)
        self.visit(node.value)

    def visit_Import(self, node) -> None:
        for alias in node.names:
            if alias.name == "*":
                continue
            if alias.asname:
                self._bind(alias.asname, self._end(alias) - len(alias.asname))
            else:
                self._bind(alias.name.split(".")[0], self._start(alias))   # import a.b binds a

    visit_ImportFrom = visit_Import

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        self._visit_all([node.type])
        if node.name:
            lo = self._end(node.type) if node.type else self._start(node)
            self._bind(node.name, self._find(rf"\bas\s+(?P<name>{re.escape(node.name)})\b", lo,
                                             self._start(node.body[0])))
        self._visit_all(node.body)

    # -- match captures: the name ends the pattern's span ("x", "p as x", "*x"), or is "**x" before "}"
    def visit_MatchAs(self, node) -> None:
        self._visit_all([node.pattern])
        if node.name:
            self._bind(node.name, self._end(node) - len(node.name))

    def visit_MatchStar(self, node) -> None:
        if node.name:
            self._bind(node.name, self._end(node) - len(node.name))

    def visit_MatchMapping(self, node) -> None:
        self._visit_all(node.keys + node.patterns)
        if node.rest:
            self._bind(node.rest, self._find(rf"\*\*\s*(?P<name>{re.escape(node.rest)})\b", self._start(node),
                                             self._end(node), last=True))

    # -- scopes
    def _function(self, node, name: str) -> None:
        a = node.args
        self._visit_all(a.defaults + a.kw_defaults)                   # evaluated where the def / lambda stands
        params = a.posonlyargs + a.args + [a.vararg] + a.kwonlyargs + [a.kwarg]
        params = [p for p in params if p is not None]
        if not isinstance(node, ast.Lambda):
            self._visit_all(node.decorator_list + [p.annotation for p in params] + [node.returns])
            self._bind(node.name, self._find(rf"\b(?:def|class)\s+(?P<name>{re.escape(node.name)})\b",
                                             self._start(node), len(self.source)))

        def body(scope: _Scope) -> None:
            for p in params:
                self._bind(p.arg, self._start(p))
            self._visit_all(node.body if isinstance(node.body, list) else [node.body])
        self._child("function", name, node, body)

    def visit_FunctionDef(self, node) -> None:
        self._function(node, node.name)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._function(node, "<lambda>")

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._visit_all(node.decorator_list + node.bases + node.keywords)
        self._bind(node.name, self._find(rf"\bclass\s+(?P<name>{re.escape(node.name)})\b", self._start(node),
                                         len(self.source)))
        self._child("class", node.name, node, lambda scope: self._visit_all(node.body))

    def _comprehension(self, node) -> None:
        gens = node.generators
        self.visit(gens[0].iter)                                      # the first iterable: the enclosing scope

        def body(scope: _Scope) -> None:
            for i, g in enumerate(gens):
                self._visit_all([g.target] + ([g.iter] if i else []) + g.ifs)
            self._visit_all([node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt])
        self._child("comprehension", _COMPREHENSIONS[type(node)], node, body)

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension


def _analyse(source: str):
    c = _Collector(source)
    c.visit(ast.parse(source))
    resolve = lambda name, scope: _resolve(name, scope, c.module)
    binds = sorted(((start, end, name, key, resolve(key, scope)) for key, name, start, end, scope in c.binds),
                   key=lambda b: b[0])
    uses = sorted(((start, end, name, key, scope, resolve(key, scope)) for key, name, start, end, scope in c.uses),
                  key=lambda u: u[0])
    return binds, uses


def name_occurrences(source: str) -> list[NameOccurrence]:
    """Every binding occurrence and every use of a name in ``source`` (which must parse), in text order,
    each with the scope it binds in or reads (see the module doc).

    Example::

        [(o.name, o.binding, o.scope) for o in name_occurrences("def f(x):\\n    return x\\n")]
        # [('f', True, '<module>'), ('x', True, 'f'), ('x', False, 'f')]
    """
    binds, uses = _analyse(source)
    out = [NameOccurrence(n, s, e, True, sc.qualname, sc.id) for s, e, n, _, sc in binds]
    out += [NameOccurrence(n, s, e, False, sc.qualname, sc.id) for s, e, n, _, _, sc in uses]
    return sorted(out, key=lambda o: (o.start, not o.binding))


def scope_pairs(source: str) -> list[ScopePair]:
    """(use, b_in, b_out) for every use that has both (see the module doc); ``source`` must parse.

    Args:
        source: Python source text.
    Returns:
        ScopePairs in the order of the uses, character offsets into ``source``.
    Raises:
        SyntaxError (or ValueError) when ``source`` does not parse.

    Example::

        src = "def f(n):\\n    return n\\n\\ndef g(n):\\n    return n\\n"
        [p.in_start for p in scope_pairs(src)]             # [30]: g's parameter; b_out is f's (offset 6)
    """
    binds, uses = _analyse(source)
    by_name: dict[str, list] = {}
    for start, end, _, key, scope in binds:                           # sorted by start
        by_name.setdefault(key, []).append((start, end, scope))
    pairs = []
    for u_start, u_end, name, key, where, reads in uses:
        visible = _visible(where)
        b_in = b_out = None
        for b in reversed(by_name.get(key, ())):
            if b[0] >= u_start:
                continue
            if b_in is None and b[2] is reads:
                b_in = b
            elif b_out is None and b[2].id not in visible:
                b_out = b
            if b_in is not None and b_out is not None:
                break
        if b_in is not None and b_out is not None:
            pairs.append(ScopePair(name, u_start, u_end, b_in[0], b_in[1], b_out[0], b_out[1], b_out[0] > b_in[0]))
    return pairs
