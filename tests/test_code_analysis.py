"""The code-measurement extractors on hand-written code: brackets, definition -> use pairs, the syntax metric."""
from __future__ import annotations

import textwrap

from attnlab.data.code_analysis import (bracket_pairs, body_parses, cut_body, def_use_pairs, function_prompts,
                                        parses, shift_left)

SRC = textwrap.dedent('''\
    def area(w, h):
        """Area of a (w x h) box [docstring brackets are not code]."""
        s = "not ( a [ bracket"  # nor ( is this )
        return w * h


    total = 0
    for box in boxes:
        total = total + area(box[0], (box[1]))
    print(area(1, 2))
    ''')


def _chars(src, pairs):
    return [(src[p.open], src[p.close]) for p in pairs]


def test_brackets_found_and_matched():
    pairs = bracket_pairs(SRC)
    assert all(_KIND_OK(SRC[p.open], SRC[p.close]) for p in pairs)
    # def area( ); area( box[ ] , ( box[ ] ) ); print( area( ) )
    assert _chars(SRC, pairs).count(("(", ")")) == 5 and _chars(SRC, pairs).count(("[", "]")) == 2
    assert len(pairs) == 7


def _KIND_OK(o, c):
    return (o, c) in {("(", ")"), ("[", "]"), ("{", "}")}


def test_brackets_in_strings_and_comments_ignored():
    pairs = bracket_pairs('x = "(" + f(\'[\')  # ) ]\ny = [1]\n')
    assert [(p.kind, p.nested) for p in pairs] == [("()", False), ("[]", False)]
    src = 'x = "(" + f(\'[\')  # ) ]\n'
    assert src[pairs[0].open] == "(" and pairs[0].open == src.index("f(") + 1


def test_nesting_flag():
    src = "f(a[1], (b))"
    pairs = {(src[p.open], p.open): p for p in bracket_pairs(src)}
    assert pairs[("(", 1)].nested                           # f( ... ) holds [1] and (b)
    assert not pairs[("[", 3)].nested and not pairs[("(", 8)].nested
    assert pairs[("(", 1)].close == len(src) - 1


def test_brackets_broken_code_does_not_raise():
    assert [p.kind for p in bracket_pairs("f(a[1)")] == []     # mismatched: skipped, nothing paired wrongly
    assert [p.kind for p in bracket_pairs("g(x)\nf(a, [1")] == ["()"]


def test_brackets_non_ascii_offsets_are_characters():
    src = 'é = "€"; f(ü)\n'
    (p,) = bracket_pairs(src)
    assert src[p.open] == "(" and src[p.close] == ")"


def test_def_use_pairs():
    pairs = def_use_pairs(SRC, min_lines=5)
    got = {(p.name, p.kind, SRC[p.def_start:p.def_end], SRC[p.use_start:p.use_end]) for p in pairs}
    # area is defined on line 1 and first used on line 9 (8 lines later)
    assert ("area", "function", "area", "area") in got
    area = next(p for p in pairs if p.name == "area")
    assert SRC.count("\n", 0, area.def_start) == 0 and SRC.count("\n", 0, area.use_start) == 8 and area.lines == 8
    # the second call (line 10) has the first call in between: not a def -> use pair
    assert sum(p.name == "area" for p in pairs) == 1
    # 'total' is re-bound on line 9 right before its use on the same line: too close; 'w' (line 4) too close
    assert not any(p.name in ("total", "w", "h", "s") for p in pairs)


def test_def_use_ignores_strings_and_comments_and_min_lines():
    src = "x = 1\n" + "# x x x\n" * 3 + 'y = "x"\n' + "z = x\n"
    (p,) = def_use_pairs(src, min_lines=5)
    assert (p.name, p.kind, p.lines) == ("x", "variable", 5) and src[p.use_start] == "x" and p.use_start > 30
    assert def_use_pairs(src, min_lines=6) == []


def test_def_use_method_call_through_attribute():
    src = "class A:\n    def go(self):\n        pass\n" + "\n" * 5 + "    def run(self):\n        self.go()\n"
    pairs = def_use_pairs(src, min_lines=5)
    assert [(p.name, p.kind) for p in pairs] == [("go", "function")]
    assert src[pairs[0].use_start:pairs[0].use_end] == "go"


def test_function_prompts_dedent_and_body():
    src = textwrap.dedent('''\
        class K:
            @staticmethod
            def f(x):
                """Double.

                More."""
                y = x * 2
                return y

            def g(self):
                """Only a docstring."""
        ''')
    (fp,) = function_prompts(src)
    assert fp.name == "f" and fp.prompt.startswith("def f(x):\n    \"\"\"Double.") and fp.prompt.endswith('More."""\n')
    assert fp.body.startswith("    y = x * 2\n    return y\n")
    assert body_parses(fp.prompt, fp.body)
    # what the model is given: the method's lines as in the file (blank docstring line left blank)
    assert fp.indent == "    " and fp.in_file == '    def f(x):\n        """Double.\n\n        More."""\n'
    assert fp.in_file in src


def test_shift_left_only_strips_the_indent_and_splits_like_tokenize():
    assert shift_left("    x = 1\n\n      y\n  # c\n", "    ") == "x = 1\n\n  y\n  # c\n"
    assert shift_left("    s = 'a\x0cb'\n", "    ") == "s = 'a\x0cb'\n"          # a form feed is not a line break


def test_cut_body():
    assert cut_body("    return 1\n\ndef h():\n") == ("    return 1\n\n", True)
    assert cut_body("    x = 1\n# a comment at column 0\n    y = 2\nz") == (
        "    x = 1\n# a comment at column 0\n    y = 2\n", True)
    assert cut_body("    x = 1\n    y = (") == ("    x = 1\n", False)       # ran out: the partial line is dropped
    assert cut_body("print(1)") == ("", True)


def test_cut_body_of_a_method():
    """A method's body (def at column 4) ends at the next line indented 4 or less, e.g. the next def."""
    sample = "        x = 1\n\n        return x\n\n    def g(self):\n        pass\n"
    assert cut_body(sample, 4) == ("        x = 1\n\n        return x\n\n", True)
    assert cut_body("        x = (\n    # comment at 4\n            1)\nclass", 4) == (
        "        x = (\n    # comment at 4\n            1)\n", True)
    assert cut_body("        x = 1\n        y = (", 4) == ("        x = 1\n", False)
    assert cut_body("    def g(self):\n", 4) == ("", True)                  # wrote no body at all
    assert cut_body("        return 1\n", 0) == ("        return 1\n", False)  # indent 0: as before


def test_syntax_metric_good_and_bad():
    prompt = 'def f(a):\n    """Doc."""\n'
    assert body_parses(prompt, "    return a + 1\n")
    assert body_parses(prompt, "    if a:\n        return [a, (a)]\n    return None\n")
    assert not body_parses(prompt, "")                                   # docstring only: no body was written
    assert not body_parses(prompt, "    return (a + 1\n")                 # unclosed bracket
    assert not body_parses(prompt, "    x = = 1\n")
    assert not body_parses(prompt, "  return a\n    return a\n")          # inconsistent indentation
    assert parses("x = 1\n") and not parses("def (:\n") and not parses("a\0b")
