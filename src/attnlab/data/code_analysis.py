"""What the code-model measurements look for in Python source: bracket pairs, definition → use pairs, syntax.

Everything works on character offsets into the source text, found with the standard library's
``tokenize`` (so brackets and names inside strings and comments are never counted: a string or a
comment is one token) and ``ast`` (to tell a variable assignment from a use).

- ``bracket_pairs(source)``: every matching ``()``, ``[]``, ``{}`` pair, with whether another pair
  is nested between the two.
- ``def_use_pairs(source, min_lines)``: a name's binding (``def f`` / ``class C`` / ``x = ...``)
  and a later use of it at least ``min_lines`` lines further on, with no other occurrence of the
  name in between (so the definition is the only earlier place that tells what the name is).
- ``function_prompts(source)``: per function with a docstring and a body, the prompt as it stands
  in the file (``in_file``: the ``def`` line(s) and docstring at their own indentation, what the
  model is given), the same moved to column 0 (``prompt``) and the true body.
- ``cut_body(text, indent)`` and ``body_parses(prompt, body)``: the syntax metric — the sampled text
  up to the line that leaves the function, and whether ``ast.parse`` accepts prompt + body (both at
  column 0: ``shift_left``) with at least one statement after the docstring.

Example::

    bracket_pairs("f(a[1])")            # [BracketPair(open=3, close=5, kind='[]', nested=False),
                                        #  BracketPair(open=1, close=6, kind='()', nested=True)]
    body_parses("def f():\\n    'Doc.'\\n", "    return 1\\n")        # True
"""
from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass

__all__ = ["BracketPair", "DefUse", "FunctionPrompt", "bracket_pairs", "def_use_pairs", "function_prompts",
           "shift_left", "cut_body", "body_parses", "parses", "python_tokens"]

_OPEN, _CLOSE = "([{", ")]}"
_KIND = {"(": "()", "[": "[]", "{": "{}", ")": "()", "]": "[]", "}": "{}"}


@dataclass(frozen=True)
class BracketPair:
    open: int          # character offset of the opening bracket
    close: int         # character offset of its closing bracket
    kind: str          # "()", "[]" or "{}"
    nested: bool       # another bracket pair lies between the two


@dataclass(frozen=True)
class DefUse:
    name: str
    kind: str          # "function" (def / class name) or "variable" (assignment target)
    def_start: int     # character span of the name where it is bound
    def_end: int
    use_start: int     # character span of the later use
    use_end: int
    lines: int         # use line - definition line


@dataclass(frozen=True)
class FunctionPrompt:
    name: str
    prompt: str        # the def line(s) and the docstring, at column 0, ending with a newline
    body: str          # the true body after the docstring (same indentation shift)
    indent: str = ""   # the def line's indentation in the file (a method's: 4 spaces)

    @property
    def in_file(self) -> str:
        """The prompt at its indentation in the file: what a model trained on whole files has seen."""
        return "\n".join(self.indent + ln if ln.strip() else ln for ln in self.prompt.split("\n"))


def _line_starts(source: str) -> list[int]:
    """Character offset of each line's start (1-based lines: index 0 is line 1), split on "\\n" like tokenize."""
    starts, pos = [0], source.find("\n")
    while pos >= 0:
        starts.append(pos + 1)
        pos = source.find("\n", pos + 1)
    return starts


def python_tokens(source: str) -> list[tuple[int, str, int, int]]:
    """(token type, text, start offset, line) of each token ``tokenize`` finds, stopping quietly at an error.

    Broken code (an unclosed bracket at the end of a sample) yields the tokens before the error.
    """
    starts = _line_starts(source)
    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            (row, col), _ = tok.start, tok.end
            if row - 1 < len(starts):
                out.append((tok.type, tok.string, starts[row - 1] + col, row))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return out


def bracket_pairs(source: str) -> list[BracketPair]:
    """Matching bracket pairs of ``source`` (code tokens only), in the order they close.

    A closing bracket that does not match the innermost open one (broken code) is skipped;
    brackets left open at the end have no pair.
    """
    pairs: list[BracketPair] = []
    stack: list[list] = []                                   # [char, offset, has_child]
    for ttype, text, start, _ in python_tokens(source):
        if ttype != tokenize.OP:
            continue
        if text in _OPEN:
            stack.append([text, start, False])
        elif text in _CLOSE and stack and _KIND[stack[-1][0]] == _KIND[text]:
            _, opened, has_child = stack.pop()
            pairs.append(BracketPair(opened, start, _KIND[text], has_child))
            if stack:
                stack[-1][2] = True
    return pairs


def _byte_col_to_char(line: str, col: int) -> int:
    """``ast`` columns are UTF-8 byte offsets within the line; the character offset."""
    return len(line.encode("utf-8")[:col].decode("utf-8", errors="ignore"))


def _bindings(source: str, tree: ast.AST, toks: list) -> dict[int, tuple[str, str, int]]:
    """{start offset: (name, kind, line)} of every def/class name and simple assignment target."""
    lines, starts = source.split("\n"), _line_starts(source)
    found = {}
    for i, (ttype, text, start, row) in enumerate(toks[:-1]):
        if ttype == tokenize.NAME and text in ("def", "class") and toks[i + 1][0] == tokenize.NAME:
            _, name, at, line = toks[i + 1]
            found[at] = (name, "function", line)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            row = node.lineno
            at = starts[row - 1] + _byte_col_to_char(lines[row - 1], node.col_offset)
            found[at] = (node.id, "variable", row)
    return found


def def_use_pairs(source: str, min_lines: int = 5) -> list[DefUse]:
    """Definition → use pairs at least ``min_lines`` lines apart (source must parse).

    For each use of a name (``ast.Name`` in load context, or an attribute ``.f`` of a def'd ``f``),
    the pair is (the latest earlier binding of that name, the use), kept only if no other token of
    the same name lies between them and the lines between are at least ``min_lines``: the use can
    only learn what the name is from the definition, many lines back.
    """
    tree = ast.parse(source)
    toks = python_tokens(source)
    binds = _bindings(source, tree, toks)
    lines, starts = source.split("\n"), _line_starts(source)
    uses = set()
    func_names = {n for n, k, _ in binds.values() if k == "function"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            uses.add(starts[node.lineno - 1] + _byte_col_to_char(lines[node.lineno - 1], node.col_offset))
        elif isinstance(node, ast.Attribute) and node.attr in func_names and node.end_lineno == node.lineno:
            line = lines[node.end_lineno - 1]
            end = _byte_col_to_char(line, node.end_col_offset)
            uses.add(starts[node.end_lineno - 1] + end - len(node.attr))
    last_seen: dict[str, tuple[int, bool]] = {}             # name -> (offset, is a binding) of its last occurrence
    pairs = []
    for ttype, text, start, row in toks:
        if ttype != tokenize.NAME:
            continue
        prev = last_seen.get(text)
        if start in uses and prev is not None and prev[1]:
            name, kind, def_row = binds[prev[0]]
            if row - def_row >= min_lines:
                pairs.append(DefUse(name, kind, prev[0], prev[0] + len(name), start, start + len(text), row - def_row))
        last_seen[text] = (start, start in binds)
    return pairs


def function_prompts(source: str) -> list[FunctionPrompt]:
    """Functions of ``source`` with a docstring and at least one statement after it, as prompts.

    The prompt is the source from the ``def`` line (decorators left out) to the docstring's last
    line, shifted left so ``def`` is at column 0; the body is the rest of the function, shifted alike.
    Only functions whose def and docstring lines all start with the def's indentation are kept, so
    ``in_file`` gives back the file's own lines.
    """
    tree = ast.parse(source)
    lines = source.split("\n")
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or len(node.body) < 2:
            continue
        doc = node.body[0]
        if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)):
            continue
        indent = lines[node.lineno - 1][:_byte_col_to_char(lines[node.lineno - 1], node.col_offset)]
        if indent.strip():                                       # def not first on its line (e.g. "if x: def")
            continue
        head = lines[node.lineno - 1:doc.end_lineno]
        if not all(ln.startswith(indent) or not ln.strip() for ln in head):     # a docstring line left of def
            continue
        body = lines[doc.end_lineno:node.end_lineno]
        out.append(FunctionPrompt(node.name, shift_left("".join(ln + "\n" for ln in head), indent),
                                  shift_left("".join(ln + "\n" for ln in body), indent), indent))
    return out


def shift_left(text: str, indent: str) -> str:
    """``text`` with ``indent`` taken off the start of every line that has it (the others are left as they are).

    Example::

        shift_left("    x = 1\n\n    y\n", "    ")       # "x = 1\n\ny\n"
    """
    return "\n".join(ln[len(indent):] if ln.startswith(indent) else ln for ln in text.split("\n"))  # as tokenize splits


def cut_body(text: str, indent: int = 0) -> tuple[str, bool]:
    """(the body, finished): ``text`` up to the first line indented ``indent`` columns or less (not a
    comment, not blank) — the end of a function whose ``def`` is at column ``indent``.

    Without such a line the sample ran out before the function ended: its last, possibly partial
    line is dropped and ``finished`` is False.
    """
    leaves = re.compile(rf"\n(?=[ \t]{{0,{indent}}}[^\s#])")
    m = leaves.search("\n" + text)                      # the sample itself may start at column <= indent
    if m:
        return text[:m.start()], True
    return text[:text.rfind("\n") + 1], False


def parses(code: str) -> bool:
    """Whether ``ast.parse`` accepts ``code``."""
    try:
        ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def body_parses(prompt: str, body: str) -> bool:
    """prompt + body parses and its first function has a statement after the docstring (an empty body fails)."""
    code = prompt + body
    if not parses(code):
        return False
    first = ast.parse(code).body[0]
    return isinstance(first, (ast.FunctionDef, ast.AsyncFunctionDef)) and len(first.body) >= 2
