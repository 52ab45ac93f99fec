"""The code claims' measurements and judges: a stub model with known heads, and failing measurements."""
from __future__ import annotations

import re
import textwrap
from types import SimpleNamespace

import pytest
import torch

from attnlab.data.tokenization import CharTokenizer
from attnlab.lab.claims import all_passed
from attnlab.lab.code_measure import attention_stats, distance_bin, head_summary, pick_prompts
from attnlab.lab.exp_code import best_head, judge_brackets, judge_def_use, judge_syntax

CODE = textwrap.dedent('''\
    def scale(values, factor):
        """Scale each value."""
        out = []
        for v in values:
            out.append(v * factor)
        return out


    def total(rows):
        """Sum of the rows' first items."""
        acc = 0
        for row in rows:
            acc = acc + (row[0] * (1 + 0))
        return acc


    limit = 10
    data = [[1, 2], [3, (4 + 5)], [6, [7, 8]]]
    print(total(data))
    print(scale([1, 2], 3))
    print(limit, {"k": (1, [2])})
    ''') * 3
L = 384


class StubGPT:
    """Head 0 does what the claims look for (bracket match; use -> the name's previous occurrence);
    head 1 is uniform."""

    def __init__(self, tok):
        self.tok, self.blocks = tok, [None]
        self.cfg = SimpleNamespace(n_heads=2, backend="reference", max_len=L)

    def eval(self):
        return self

    def modules(self):                   # nn.set_backend walks the layers: the stub has none to pin
        return iter(())

    def _head0(self, text: str) -> torch.Tensor:
        A = torch.zeros(len(text), len(text))
        A[:, 0] = 1.0                                                  # default: a sink on the first token
        stack = []
        for i, ch in enumerate(text):
            if ch in "([{":
                stack.append(i)
            elif ch in ")]}" and stack:
                A[i] = 0
                A[i, stack.pop()] = 1.0
        for m in re.finditer(r"[A-Za-z_]\w*", text):                    # a name's last char -> its previous occurrence
            prev = [p for p in re.finditer(rf"\b{m.group()}\b", text[:m.start()])]
            if prev:
                q, (a, b) = m.end() - 1, prev[-1].span()
                A[q] = 0
                A[q, a:b] = 1.0 / (b - a)
        return A

    def __call__(self, idx, capture):
        rows = []
        for ids in idx.tolist():
            h0 = self._head0(self.tok.decode(ids))
            h1 = torch.tril(torch.ones(len(ids), len(ids)))
            rows.append(torch.stack([h0, h1 / h1.sum(1, keepdim=True)]))
        capture.append(SimpleNamespace(weights=torch.stack(rows)))     # (B, H, L, L)


@pytest.fixture(scope="module")
def stats():
    tok = CharTokenizer.train(CODE)
    return attention_stats(StubGPT(tok), tok, [("a.py", CODE)], seq_len=L)


def test_bracket_head_found_and_passes(stats):
    assert stats["windows"] == len(CODE) // L
    assert best_head(stats, lambda s: s["bracket_accuracy"]) == (0, 0)
    good, flat = head_summary(stats, 0, 0), head_summary(stats, 0, 1)
    assert good["bracket_accuracy"] == 1.0 and good["nested_pairs"] > 0 and good["bracket_accuracy_nested"] == 1.0
    assert good["nearest_open_accuracy_nested"] == 0.0               # nested: the nearest opening bracket is never it
    assert 0 < good["nearest_open_accuracy"] < 1
    assert all_passed(judge_brackets(good, 0.5, 2.0, 3))
    assert not all_passed(judge_brackets(flat, 0.5, 2.0, 3))          # uniform attention: a wrong model fails


def test_def_use_head_found_and_passes(stats):
    assert best_head(stats, lambda s: s["defuse_weight"] - s["defuse_control"]) == (0, 0)
    good, flat = head_summary(stats, 0, 0), head_summary(stats, 0, 1)
    assert good["defuse_pairs"] > 0 and good["defuse_weight"] == pytest.approx(1.0)
    assert good["defuse_argmax_on_def"] == 1.0
    assert all_passed(judge_def_use(good, 3.0, 0.75, 1))
    assert not all_passed(judge_def_use(flat, 3.0, 0.75, 1))
    assert flat["defuse_weight"] == pytest.approx(flat["defuse_control"], rel=0.5)


def test_judge_syntax_fails_when_it_should():
    assert all_passed(judge_syntax({"gpt": 0.6, "lstm": 0.2, "bigram": 0.0}, 60, 0.25))
    assert not all_passed(judge_syntax({"gpt": 0.6, "lstm": 0.55, "bigram": 0.0}, 60, 0.25))    # LSTM as good
    assert not all_passed(judge_syntax({"gpt": 0.6, "lstm": 0.2, "bigram": 0.5}, 60, 0.25))     # bigram close
    assert not all_passed(judge_syntax({"gpt": 0.2, "lstm": 0.0, "bigram": 0.0}, 60, 0.25))     # too few parse
    assert not all_passed(judge_syntax({"gpt": 0.6, "lstm": 0.2, "bigram": 0.0}, 4, 0.25))      # too few samples
    assert not all_passed(judge_syntax({"gpt": 0.0, "lstm": 0.0, "bigram": 0.0}, 0, 0.0))       # nothing sampled


def _bracket_summary(acc_nested=0.8, base=0.0, nested=50, ratios=(5.0, 4.0)):
    bins = {distance_bin(4 ** i): {"controlled_pairs": 40, "weight_match": r * 0.01, "weight_control": 0.01}
            for i, r in enumerate(ratios)}
    return {"bracket_accuracy_nested": acc_nested, "nearest_open_accuracy_nested": base, "nested_pairs": nested,
            "by_distance": bins}


def test_judge_brackets_fails_when_it_should():
    assert all_passed(judge_brackets(_bracket_summary(), 0.5, 2.0, 20))
    assert not all_passed(judge_brackets(_bracket_summary(acc_nested=0.4), 0.5, 2.0, 20))
    assert not all_passed(judge_brackets(_bracket_summary(base=0.9), 0.5, 2.0, 20))      # no better than position
    assert not all_passed(judge_brackets(_bracket_summary(nested=0), 0.5, 2.0, 20))
    assert not all_passed(judge_brackets(_bracket_summary(ratios=(5.0, 1.5)), 0.5, 2.0, 20))  # one bin too weak
    assert not all_passed(judge_brackets(_bracket_summary(ratios=(5.0,)), 0.5, 2.0, 20))      # one bin judges nothing
    assert not all_passed(judge_brackets(_bracket_summary(), 0.5, 2.0, 50))                  # bins too small


def test_judge_def_use_fails_when_it_should():
    s = {"defuse_weight": 0.3, "defuse_control": 0.05, "defuse_pairs": 100, "defuse_beats_control": 0.9}
    assert all_passed(judge_def_use(s, 3.0, 0.75, 30))
    assert not all_passed(judge_def_use({**s, "defuse_weight": 0.1}, 3.0, 0.75, 30))
    assert not all_passed(judge_def_use({**s, "defuse_beats_control": 0.5}, 3.0, 0.75, 30))
    assert not all_passed(judge_def_use({**s, "defuse_pairs": 10}, 3.0, 0.75, 30))


def test_pick_prompts_deterministic_and_bounded():
    tok = CharTokenizer.train(CODE)
    prompts = pick_prompts(tok, [("a.py", CODE)], 4, max_prompt_tokens=60)
    assert [p.name for p in prompts] == [p.name for p in pick_prompts(tok, [("a.py", CODE)], 4, 60)]
    assert prompts and all(len(p.prompt) <= 60 and p.prompt.startswith("def ") for p in prompts)


@pytest.mark.parametrize("n", [1, 2])
def test_code_models_train_on_the_configured_threads(monkeypatch, tmp_path, n):
    """The budget is CPU time on ``threads`` threads: calibration and training run with that many."""
    from attnlab.lab import code_train

    seen = []

    class Stop(Exception):
        pass

    def calibrate(task, batch_size, lr):
        seen.append(torch.get_num_threads())
        raise Stop

    monkeypatch.setattr(code_train, "make_code_task", lambda *a, **k: None)
    monkeypatch.setattr(code_train, "calibrate", calibrate)
    before = torch.get_num_threads()
    cfg = code_train.CodeTrainConfig("code-small", 1000, 300, 1.0, threads=n)
    with pytest.raises(Stop):
        code_train.train_code_model("gpt", cfg, tmp_path / "run")
    assert seen == [n] and torch.get_num_threads() == before
