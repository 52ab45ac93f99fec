"""The variable-scope claim: scope resolution (checked against symtable), windows and the control, and judges
that fail recency-only and spread-out heads and pass a scope-tracking one only while names link it."""
from __future__ import annotations

import ast
import re
import symtable
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from attnlab.data import code_scope as cs
from attnlab.data.code_scope import name_occurrences, scope_pairs
from attnlab.data.tokenization import BPETokenizer, CharTokenizer
from attnlab.lab.claims import VerifyContext, all_passed
from attnlab.lab.code_scope import (held_out_scope_stats, identifier_tokens, judge_scope, scope_head, scope_stats,
                                    scope_summary, scope_verdict, scope_windows, scramble_names)


def _src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def _line(src: str, offset: int) -> int:
    return src.count("\n", 0, offset) + 1


def _pairs(src: str) -> list[tuple]:
    """(name, use line, b_in line, b_out line, out_nearer) of every pair; every span holds the name."""
    out = []
    for p in scope_pairs(src):
        assert src[p.use_start:p.use_end] == src[p.in_start:p.in_end] == src[p.out_start:p.out_end] == p.name
        out.append((p.name, _line(src, p.use_start), _line(src, p.in_start), _line(src, p.out_start), p.out_nearer))
    return out


# ------------------------------------------------------------------------------------------ resolution
CASES = {  # source, [(name, use line, b_in line, b_out line, out_nearer)]
    # g's y reads g's parameter; f's local y is another function's
    "siblings": ("def f(x):\n    y = x + 1\n    return y\ndef g(y):\n    return y\n", [("y", 5, 4, 2, False)]),
    "methods": ("class A:\n    def m(self):\n        return self\n    def n(self, other):\n        return self\n",
                [("self", 5, 4, 2, False)]),
    # uses in a comprehension's element precede its target: no b_in; "return i" reads f's i, the
    # comprehensions' i are out of its sight (and nearer)
    "comprehension": (_src("""
        def f(items):
            i = 0
            squares = [i * i for i in items]
            odd = [i for i in items if i]
            return i
        """), [("i", 4, 4, 3, False), ("i", 5, 2, 4, True)]),
    # the lambda's own use has no out-of-scope binding (f's k is visible, only shadowed)
    "lambda": ("def f(k):\n    key = lambda k: k + 1\n    return key(k)\n", [("k", 3, 1, 2, True)]),
    # bump's "count = ..." binds outer's count (nonlocal): out of other's sight
    "nonlocal": (_src("""
        def outer():
            count = 0
            def bump():
                nonlocal count
                count = count + 1
                return count
            return bump
        def other():
            count = 5
            return count
        """), [("count", 10, 9, 5, False)]),
    # add's "total = ..." binds the module's total (global); reset's is its own
    "global": (_src("""
        total = 0
        def add(n):
            global total
            total = total + n
        def reset():
            total = 0
            return total
        def read():
            return total
        """), [("total", 9, 4, 6, True)]),
    # m reads the module's scale: a class body is not visible from its methods
    "class attribute": (_src("""
        scale = 1
        class C:
            scale = 2
            def m(self):
                return scale
            def n(self):
                scale = 3
                return scale
            limit = scale
        """), [("scale", 5, 1, 3, True), ("scale", 8, 7, 3, False), ("scale", 9, 3, 7, True)]),
    "module after local": ('name = 1\ndef first():\n    name = 2\n    return name\ndef second():\n    return name\n',
                           [("name", 6, 1, 3, True)]),
    # __x in class P is _P__x: the module's __x is another name, so h's use has no pair
    "mangled": ("__x = 0\nclass P:\n    __x = 1\n    def get(self):\n        __x = 2\n        return __x\n"
                "def h():\n    return __x\n", [("__x", 6, 5, 3, False)]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_scope_pairs_resolve_the_tricky_cases(case):
    src, expected = CASES[case]
    assert _pairs(src) == expected
    assert _symtable_disagreements(src) == []


def test_bindings_and_scopes_of_every_binding_kind():
    src = _src("""
        import os.path
        import numpy as np
        from a import b as c, d
        import pkg.sub as alias
        def f(p, /, q, *args, r, **kw):
            for i, (j, k) in enumerate(args):
                pass
            with open(p) as fh:
                pass
            try:
                pass
            except (ValueError, TypeError) as err:
                pass
            if (m := len(q)) > 1:
                pass
            t: int = 1
            u: int
            del k
            x = 1
            x += 1
            print([w for w in r if (z := w)])
            return u
        class K:
            pass
        async def g(q):
            match q:
                case [first, *rest] as whole:
                    pass
                case {"a": val, **others}:
                    pass
        """)
    occ = name_occurrences(src)
    assert all(src[o.start:o.end] == o.name for o in occ)
    binds = {}
    for o in occ:
        if o.binding:
            binds.setdefault(o.scope, []).append(o.name)
    assert binds == {"<module>": ["os", "np", "c", "d", "alias", "f", "K", "g"],
                     "f": ["p", "q", "args", "r", "kw", "i", "j", "k", "fh", "err", "m", "t", "x", "x", "z"],
                     "f.<listcomp>": ["w"], "g": ["q", "first", "rest", "whole", "val", "others"]}
    uses = {(o.name, o.scope) for o in occ if not o.binding}
    assert ("u", "f") in uses                       # "u: int" makes u local, without binding it
    assert ("w", "f.<listcomp>") in uses and ("r", "f") in uses and ("r", "f.<listcomp>") not in uses  # 1st iterable


def test_offsets_are_characters_not_bytes():
    src = 's = "héllo →"; t = s\ndef f(s):\n    return "ü" + s\n\ndef g(s):\n    return "ü" + s\n'
    occ = name_occurrences(src)
    assert all(src[o.start:o.end] == o.name for o in occ)
    assert _pairs(src) == [("s", 6, 5, 2, False)]


def _symtable_disagreements(src: str) -> list:
    """Uses whose resolved scope disagrees with CPython's symtable (local / global / free)."""
    c = cs._Collector(src)
    c.visit(ast.parse(src))
    top = symtable.symtable(src, "x.py", "exec")
    tables, stack = {}, list(top.get_children())
    while stack:
        t = stack.pop()
        tables.setdefault((t.get_name().strip("<>"), t.get_lineno()), []).append(t)
        stack.extend(t.get_children())
    bad = []
    for key, name, start, _, where in c.uses:
        reads = cs._resolve(key, where, c.module)
        if where.kind == "module":
            bad += [] if reads is c.module else [(name, start)]
            continue
        (table,) = tables[(where.qualname.rsplit(".", 1)[-1].strip("<>"), where.line)]
        sym = table.lookup(key)
        expect = ((reads is c.module) if sym.is_global() else (reads is where) if sym.is_local()
                  else (reads not in (where, c.module) and reads.kind != "class") if sym.is_free() else False)
        bad += [] if expect else [(name, start, where.qualname, reads.qualname)]
    return bad


def test_resolution_agrees_with_symtable_on_real_modules():
    import argparse
    import json.decoder
    for mod in (argparse, json.decoder):
        src = Path(mod.__file__).read_text(encoding="utf-8")
        assert len(name_occurrences(src)) > 100
        assert _symtable_disagreements(src) == []


def test_a_broken_resolver_is_caught(monkeypatch):
    """Reading class bodies from methods (the classic mistake) changes the pairs and disagrees with symtable."""
    def no_class_skip(name, scope, module):
        while scope is not None and scope.kind != "module":
            if name in scope.bound:
                return scope
            scope = scope.parent
        return module
    monkeypatch.setattr(cs, "_enclosing", no_class_skip)
    src, expected = CASES["class attribute"]
    assert _pairs(src) != expected and _symtable_disagreements(src) != []


# ------------------------------------------------------------------------------------------ windows
# Names are used several times after their binding, as in real code: the nearest earlier occurrence of a
# name is often a use, not its binding.
SOURCE = _src("""
    rate = 2
    count = 10


    def area(width, height):
        total = width * height
        extra = total + width + height
        if total > width:
            extra = extra + total
        return total * rate + extra


    def perimeter(width, height):
        total = width + height
        twice = total + total
        if width > height:
            twice = twice + width
        return twice + total + height


    def scaled(width, rate):
        count = width * rate
        extra = count + width
        if count > rate:
            extra = extra + count + rate
        return extra + count * width


    def report(height):
        value = area(height, height)
        value = value + perimeter(height, height)
        if value > height:
            value = value + count
        return value + count + rate + height
    """)


def _check_windows(tok, wins, seq_len, text):
    for w in wins:
        ids = w["ids"]
        assert 0 < len(ids) <= seq_len
        assert w["use_pos"][-1] == len(ids) - 1                            # the query ends the window
        for key in ("in_pos", "out_pos", "use_pos"):
            assert tok.decode([ids[i] for i in w[key]]).strip() == w["name"]
        assert max(w["in_pos"][-1], w["out_pos"][-1]) < w["use_pos"][0]
        assert not set(w["in_pos"]) & set(w["out_pos"])
        assert w["d_in"] == len(ids) - 1 - w["in_pos"][-1] and w["d_out"] == len(ids) - 1 - w["out_pos"][-1]
        assert tok.decode(ids) in text


def test_windows_map_pairs_to_tokens_char_and_bpe():
    char = CharTokenizer.train(SOURCE)
    wins = scope_windows(char, [("a.py", SOURCE)], len(SOURCE))
    assert len(wins) == len(scope_pairs(SOURCE)) == 23
    _check_windows(char, wins, len(SOURCE), SOURCE)
    bpe = BPETokenizer.train(SOURCE * 4, vocab_size=300)
    wins = scope_windows(bpe, [("a.py", SOURCE)], 128)
    assert 0 < len(wins) < 23                                              # a 128-token window loses far pairs
    assert any(len(w["in_pos"]) < len(w["name"]) for w in wins)            # tokens of several characters
    _check_windows(bpe, wins, 128, SOURCE)


def test_short_windows_drop_far_bindings_and_start_at_the_file():
    tok = CharTokenizer.train(SOURCE)
    full = scope_windows(tok, [("a.py", SOURCE)], len(SOURCE))
    short = scope_windows(tok, [("a.py", SOURCE)], 200)
    assert 0 < len(short) < len(full)
    assert all(max(w["d_in"], w["d_out"]) < 200 for w in short)
    assert {len(w["ids"]) for w in full} == {p.use_end for p in scope_pairs(SOURCE)}   # from the file's start
    capped = scope_windows(tok, [("a.py", SOURCE)], len(SOURCE), max_pairs=5)
    assert len(capped) == 5 and capped[0]["ids"] == full[0]["ids"] and capped[-1]["ids"] == full[-1]["ids"]
    nearest = np.mean([w["in_is_nearest"] for w in full])
    assert 0.1 < nearest < 0.5 and sum(w["out_nearer"] for w in full) == 3


@pytest.mark.parametrize("tok", [CharTokenizer.train(SOURCE), BPETokenizer.train(SOURCE * 4, vocab_size=300)],
                         ids=["char", "bpe"])
def test_control_keeps_positions_and_never_reuses_the_names_tokens(tok):
    pool = identifier_tokens(tok)
    assert all(tok.decode([i]).strip().isidentifier() for i in pool)
    lead = np.array([tok.decode([i]).startswith(" ") for i in range(tok.vocab_size)])
    wins = scope_windows(tok, [("a.py", SOURCE)], 128)
    for seed, w in enumerate(wins):
        ids = np.array(w["ids"])
        ctrl = np.array(scramble_names(w, pool, lead, np.random.default_rng(seed)))
        swapped = np.concatenate([w["in_pos"], w["out_pos"]])
        keep = np.setdiff1d(np.arange(len(ids)), swapped)
        assert len(ctrl) == len(ids) and (ctrl[keep] == ids[keep]).all()        # the use and the rest in place
        own = set(ids[np.concatenate([swapped, w["use_pos"]])].tolist())
        assert not own & set(ctrl[swapped].tolist()) and set(ctrl[swapped].tolist()) <= set(pool.tolist())
        assert (lead[ctrl[swapped]] == lead[ids[swapped]]).all()
        assert scramble_names(w, pool, lead, np.random.default_rng(seed)) == ctrl.tolist()      # seeded


# ------------------------------------------------------------------------------------------ stub model
def _binding_ends(text: str, name: str) -> list[int]:
    """Last characters of the name's bindings as text shows them: assignment targets and def parameters."""
    ends = [m.end() - 1 for m in re.finditer(rf"\b{name}\b(?=\s*[-+*/]?=(?!=))", text)]
    for m in re.finditer(r"def \w+\(([^)]*)\)", text):
        ends += [m.start(1) + p.end() - 1 for p in re.finditer(r"\w+", m.group(1)) if p.group() == name]
    return sorted(ends)


class StubGPT:
    """Three name-based heads, computed from the token ids of the window (so scrambling names changes them),
    each from the window's last token (a use) to the last character of:

    0. the nearest earlier occurrence of the same name, any scope, binding or use ("recency");
    1. every earlier binding of the name, weight spread equally;
    2. the latest binding of the name in the use's own function (top-level defs), else at module level:
       a head that tracks scope (b_in, as the tests' sources are written).
    With no target the weight goes to the first token."""

    def __init__(self, tok, max_len: int = 256):
        self.tok, self.blocks = tok, [None]
        self.cfg = SimpleNamespace(n_heads=3, backend="reference", max_len=max_len)

    def eval(self):
        return self

    def modules(self):
        return iter(())

    @staticmethod
    def _targets(text: str) -> list[dict]:
        m = re.search(r"[A-Za-z_]\w*$", text)
        if m is None:
            return [{}, {}, {}]
        name, start = m.group(), m.start()
        before = text[:start]
        near = [o.end() - 1 for o in re.finditer(rf"\b{name}\b", before)]
        binds = _binding_ends(before, name)
        scoped = None
        if text[before.rfind("\n") + 1] == " ":                             # inside a (top-level) function
            func = before.rfind("\ndef ") + 1
            scoped = next((e for e in reversed(binds) if e >= func), None)
        if scoped is None:
            module = [o.end() - 1 for o in re.finditer(rf"(?m)^{name}\b(?=\s*=)", before)]
            scoped = module[-1] if module else None
        return [{near[-1]: 1.0} if near else {}, {e: 1.0 / len(binds) for e in binds},
                {scoped: 1.0} if scoped is not None else {}]

    def __call__(self, idx, capture):
        B, L = idx.shape
        A = torch.zeros(B, 3, L, L)
        for b, ids in enumerate(idx.tolist()):
            for h, target in enumerate(self._targets(self.tok.decode(ids))):
                for pos, w in (target or {0: 1.0}).items():
                    A[b, h, -1, pos] = w
        capture.append(SimpleNamespace(weights=A))                          # (B, H, L, L)


@pytest.fixture(scope="module")
def stats():
    tok = CharTokenizer.train(SOURCE)
    return scope_stats(StubGPT(tok), tok, [("a.py", SOURCE)], len(SOURCE), seed=0)


def test_stub_heads_do_what_they_say(stats):
    assert stats["shape"] == (1, 3) and stats["windows"] == 23 and stats["w_in"].shape == (1, 3, 23)
    assert (stats["w_in"][0, 2] == 1).all() and (stats["w_out"][0, 2] == 0).all()      # the scope head: b_in
    np.testing.assert_allclose(stats["w_in"][0, 1], stats["w_out"][0, 1])              # spread: equal shares
    near = np.array(stats["in_is_nearest"])
    np.testing.assert_array_equal(stats["w_in"][0, 0], near.astype(float))             # recency: b_in when nearest


def test_judge_fails_recency_and_spread_and_passes_the_scope_head(stats):
    near, spread, scope = (scope_summary(stats, 0, h) for h in range(3))
    judge = lambda h: judge_scope(scope_summary(stats, 0, h), scope_summary(stats, 0, h, control=True), 0.75, 2.0, 20)
    assert near["in_beats_out"] < 0.5 and not all_passed(judge(0))       # nearest same-named token, any scope
    assert spread["in_beats_out"] == 0 and not all_passed(judge(1))      # every binding alike: ties lose
    assert scope["in_beats_out"] == 1 and all_passed(judge(2))
    ctrl = scope_summary(stats, 0, 2, control=True)                      # names scrambled: the rule loses its link
    assert ctrl["pairs"] == 23 and ctrl["in_beats_out"] < 0.75 and ctrl["w_in"] < 0.5
    assert not all_passed(judge_scope(ctrl, ctrl, 0.75, 2.0, 20))        # the control, judged as a model, fails
    assert scope_head(stats) == (0, 2)


def test_held_out_halves_and_cap(stats):
    tok = CharTokenizer.train(SOURCE)
    data = SimpleNamespace(tokenizer=tok, heldout_half=lambda half: [(half, SOURCE)])
    cfg = SimpleNamespace(windows=7, train=SimpleNamespace(seed=3))
    halves = held_out_scope_stats(StubGPT(tok, max_len=len(SOURCE)), data, cfg)
    assert set(halves) == {"select", "test"} and all(h["windows"] == 7 for h in halves.values())
    layer, head, s, c, checks = scope_verdict(halves, SimpleNamespace(scope_beats=0.75, scope_ratio=2.0,
                                                                      min_scope_pairs=5))
    assert (layer, head) == (0, 2) and s["pairs"] == 7 and all_passed(checks)


# ------------------------------------------------------------------------------------------ judge and verdict
GOOD = {"pairs": 100, "in_beats_out": 0.9, "w_in": 0.3, "w_out": 0.05, "ratio": 6.0}
CTRL = {"pairs": 100, "in_beats_out": 0.5, "w_in": 0.1, "w_out": 0.1, "ratio": 1.0}


@pytest.mark.parametrize("s, c, verdicts", [
    (GOOD, CTRL, [True, True, True, True]),
    ({**GOOD, "pairs": 10}, CTRL, [False, True, True, True]),                          # too few pairs
    ({**GOOD, "in_beats_out": 0.7}, CTRL, [True, False, True, True]),                  # wins too few uses
    ({**GOOD, "w_in": 0.08, "ratio": 1.6}, CTRL, [True, True, False, True]),           # ratio too small
    ({**GOOD, "w_in": 0.0, "w_out": 0.0, "ratio": 0.0}, CTRL, [True, True, False, True]),   # no weight at all
    (GOOD, {**CTRL, "in_beats_out": 0.8, "w_in": 0.3, "w_out": 0.1, "ratio": 3.0}, [True, True, True, False]),
    (GOOD, {**CTRL, "in_beats_out": 0.8}, [True, True, True, True]),                   # control meets one only
    (GOOD, {**CTRL, "w_in": 0.3, "w_out": 0.1, "ratio": 3.0}, [True, True, True, True]),
    ({**GOOD, "pairs": 0}, {**CTRL, "pairs": 0}, [False, False, False, True]),          # nothing measured
])
def test_judge_scope_fails_each_check(s, c, verdicts):
    checks = judge_scope(s, c, 0.75, 2.0, 30)
    assert [ch.passed for ch in checks] == verdicts
    assert "30" in checks[0].label and "75%" in checks[1].label and "2.0 x" in checks[2].label
    assert "scrambled" in checks[3].label


def test_judge_scope_nothing_measured_fails():
    empty = {"pairs": 0, "in_beats_out": 0.0, "w_in": 0.0, "w_out": 0.0, "ratio": 0.0}
    assert not all_passed(judge_scope(empty, empty, 0.75, 2.0, 0))


def _stats(w_in, w_out) -> dict:
    w_in, w_out = np.array(w_in, dtype=float), np.array(w_out, dtype=float)            # (layers, H, pairs)
    return {"w_in": w_in, "w_out": w_out, "w_in_ctrl": w_out, "w_out_ctrl": w_in, "shape": w_in.shape[:2],
            "windows": w_in.shape[-1]}


def test_head_chosen_on_select_by_share_then_ratio_and_judged_on_test():
    select = _stats([[[0.5, 0.5, 0.1], [0.9, 0.9, 0.1], [0.2, 0.2, 0.0]]],
                    [[[0.1, 0.1, 0.2], [0.1, 0.1, 0.2], [0.1, 0.1, 0.1]]])
    assert scope_head(select) == (0, 1)                  # heads 0 and 1 tie on share (2/3): head 1's ratio is larger
    test = _stats([[[0.5, 0.5, 0.5], [0.0, 0.0, 0.0], [0.9, 0.9, 0.9]]], [[[0.1] * 3, [0.1] * 3, [0.1] * 3]])
    cfg = SimpleNamespace(scope_beats=0.75, scope_ratio=2.0, min_scope_pairs=3)
    layer, head, s, c, checks = scope_verdict({"select": select, "test": test}, cfg)
    assert (layer, head) == (0, 1) and s["in_beats_out"] == 0 and not all_passed(checks)   # not re-chosen on test
    assert c["control"] and c["w_in"] == pytest.approx(0.1)


def test_claim_runs_end_to_end(monkeypatch, tmp_path):
    from attnlab.lab import exp_code
    tok = CharTokenizer.train(SOURCE)
    prov = {a: {"params": 1, "steps": 1, "cpu_s_per_step": 0.1, "source": "stub"} for a in ("gpt", "lstm")}
    data = SimpleNamespace(tokenizer=tok, heldout_half=lambda half: [(half, SOURCE)])
    models = SimpleNamespace(gpt=StubGPT(tok, max_len=len(SOURCE)), data=data, provenance=prov)
    monkeypatch.setattr(exp_code, "_models", lambda ctx, cfg: models)
    monkeypatch.setattr(exp_code, "_STATS", {})
    claim = exp_code.claim_code_scope(VerifyContext(quick=True, workdir=tmp_path))
    assert claim.id == "code-scope" and len(claim.checks) == 4 and claim.figure[:4] == b"\x89PNG"
    assert claim.measurement["layer"] == 0 and claim.measurement["head"] == 2
    assert [c.passed for c in claim.checks] == [False, True, True, True]             # 23 pairs < 30
    assert f"{np.mean(claim.measurement['in_is_nearest']):.0%}" in claim.notes
    assert exp_code.claim_code_scope in exp_code.CLAIMS
    assert (exp_code.CODE_FULL.scope_beats, exp_code.CODE_FULL.scope_ratio, exp_code.CODE_FULL.min_scope_pairs) == \
        (0.75, 2.0, 30)
