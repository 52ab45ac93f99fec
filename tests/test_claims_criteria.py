"""Every verified claim's criterion can fail: one table, one row per claim id, each with measurements that
pass and measurements that must fail.

The table must name exactly the claims ``attnlab verify`` judges (kinds "claim" and "refuted": a refuted
claim keeps its judge, which must still be able to pass the day the model bears the claim out): a new claim
without a row fails ``test_every_verified_claim_has_a_row``. Accounting entries (FLOP counts, shown, not counted) have
no row: they are not verdicts. The judges' finer cases live beside their modules' tests
(tests/test_verify.py, tests/test_lab_experiments.py, tests/test_claims_subject_link.py).
"""
from __future__ import annotations

import pytest

from attnlab.lab import exp_basics as eb
from attnlab.lab import exp_complexity as ec
from attnlab.lab import verify
from attnlab.lab.claims import all_passed
from attnlab.lab.exp_longrange import judge_longrange
from attnlab.lab.exp_pretrained import judge_head_diversity
from attnlab.lab.exp_sequential import judge_critical_path, judge_wall_time, layer_flops
from attnlab.lab.subject_link import TARGET, judge_subject_link


def _spread_heads(lo: float, hi: float) -> dict:
    """72 heads (6 x 12) spread evenly from lo to hi, in distance (x5) and entropy."""
    s = [lo + (hi - lo) * i / 71 for i in range(72)]
    return {"distance": [[5 * v for v in s[i:i + 12]] for i in range(0, 72, 12)],
            "entropy": [s[i:i + 12] for i in range(0, 72, 12)]}


def _link_row(sentence: str, verb: str, key: str, **measured) -> dict:
    return {"sentence": sentence, "verb": verb, "key": key, "weight": 0.4, "rank": 1, "key_specificity": 3.0,
            "query_specificity": 3.0, **measured}


_SEL = [_link_row(f"selection {i}", f"v{i}", f"s{i}") for i in range(3)]
_HELD = [_link_row(TARGET.text, TARGET.verb, TARGET.subject), _link_row("held 1", "lay", "book")]
_NS = [16, 64, 128, 1024]
_FLOPS = {name: [layer_flops(n, 128)[name] for n in _NS] for name in ("elman", "lstm", "attention")}
_B1 = {"elman": [2.0, 3.0, 4.0, 5.0], "lstm": [1.5, 2.0, 3.0, 1.0], "attention": [1.0, 1.0, 2.0, 9.0]}
_B32 = {"elman": [1.0] * 4, "lstm": [2.0] * 4, "attention": [1.0, 1.5, 2.5, 4.0]}
_CP = {"elman": [4, 16, 64], "lstm": [4, 16, 64], "attention": [4, 4, 4]}
_CAUSAL = {"reference": {"future_max": 0.0, "past_min": 0.1}, "sdpa": {"future_max": 0.0, "past_min": 0.1}}
_RAW_E, _SC_E, _RAW_G, _SC_G = [1.4, 0.6, 0.12], [3.68, 3.69, 3.67], [0.2, 0.1, 1e-4], [0.085, 0.086, 0.084]
_CLOSED = [eb._closed_form(p, 4) for p in (0, 1)]

# claim id -> (judge called on passing measurements, {why it must fail: judge called on failing ones})
CRITERIA = {
    "permutation-equivariance": (lambda: eb.judge_equivariance(4e-16, 0.3), {
        "order leaks in without PE": lambda: eb.judge_equivariance(1e-6, 0.3),
        "PE changes nothing": lambda: eb.judge_equivariance(0.0, 1e-5)}),
    "sinusoidal-values": (lambda: eb.judge_sinusoid_values(_CLOSED, _CLOSED, 1e-6), {
        "sin and cos swapped": lambda: eb.judge_sinusoid_values(
            [_CLOSED[0], [_CLOSED[1][1], _CLOSED[1][0], *_CLOSED[1][2:]]], _CLOSED, 1e-6)}),
    "sinusoidal-relative-position": (lambda: eb.judge_relative_position({1: 1e-14}, {1: 1e-14}, 5.0, 3.0), {
        "not a rotation": lambda: eb.judge_relative_position({1: 1e-6}, {1: 1e-14}, 5.0, 3.0),
        "the control passes too": lambda: eb.judge_relative_position({1: 1e-14}, {1: 1e-14}, 1e-13, 3.0)}),
    "sqrt-dk-scaling": (lambda: eb.judge_scaling(_RAW_E, _SC_E, _RAW_G, _SC_G), {
        "no collapse unscaled": lambda: eb.judge_scaling([1.4, 1.3, 1.2], _SC_E, _RAW_G, _SC_G),
        "scaled entropy drifts": lambda: eb.judge_scaling(_RAW_E, [3.7, 3.0, 2.0], _RAW_G, _SC_G)}),
    "causal-gradient": (lambda: eb.judge_causal(_CAUSAL, 0.05), {
        "a backend raised": lambda: eb.judge_causal({**_CAUSAL, "tiled": {"error": "RuntimeError: x"}}, 0.05),
        "the future leaks": lambda: eb.judge_causal({**_CAUSAL, "sdpa": {"future_max": 1e-30, "past_min": 0.1}},
                                                    0.05),
        "blind: the control sees no future": lambda: eb.judge_causal(_CAUSAL, 0.0)}),
    "memory-scaling": (lambda: ec.judge_memory(1.97, 1.0, 0.5), {
        "reference not quadratic": lambda: ec.judge_memory(1.5, 1.0, 0.5),
        "tiled growing quadratically": lambda: ec.judge_memory(1.97, 1.9, 0.5),
        "a point was lost": lambda: ec.judge_memory(1.97, 1.0, 0.5, ["reference n=1024: exit status 1"])}),
    "sequential-critical-path": (lambda: judge_critical_path([4, 16, 64], _CP), {
        "attention grows with n": lambda: judge_critical_path([4, 16, 64], {**_CP, "attention": [4, 5, 6]}),
        "a hidden recurrence": lambda: judge_critical_path([4, 16, 64], _CP, opaque=["mkldnn_rnn_layer"])}),
    "sequential-wall-time": (lambda: judge_wall_time(_NS, _B1, 128, _B32, _FLOPS), {
        "an RNN wins at batch 1, n <= d": lambda: judge_wall_time(_NS, {**_B1, "lstm": [1.5, 0.9, 3.0, 1.0]}, 128,
                                                                  _B32, _FLOPS),
        "attention wins where it does more work": lambda: judge_wall_time(
            _NS, _B1, 128, {**_B32, "attention": [1.0, 1.5, 2.5, 1.9]}, _FLOPS)}),
    "long-range-dependencies": (lambda: judge_longrange([8, 16, 64], [1.0, 0.99, 0.95], [0.9, 0.4, 0.13]), {
        "the transformer misses a k": lambda: judge_longrange([8, 16, 64], [1.0, 0.85, 0.95], [0.9, 0.4, 0.13]),
        "an untrained LSTM": lambda: judge_longrange([8, 16, 64], [1.0, 0.99, 0.95], [0.123, 0.125, 0.124])}),
    "minilm-sat-award": (lambda: judge_subject_link({"layer": 4, "head": 1}, _SEL, _HELD), {
        "a head in layer 0": lambda: judge_subject_link({"layer": 0, "head": 0}, _SEL, _HELD),
        "under 2x against other keys": lambda: judge_subject_link(
            {"layer": 4, "head": 1}, _SEL, [{**_HELD[0], "key_specificity": 1.94}, _HELD[1]]),
        "passes on the selection set, not held out": lambda: judge_subject_link(
            {"layer": 4, "head": 1}, _SEL, [{**r, "key_specificity": 1.2, "query_specificity": 1.1} for r in _HELD])}),
    "heads-attend-differently": (lambda: judge_head_diversity(_spread_heads(1.0, 3.0), _spread_heads(1.0, 1.01)), {
        "the heads are alike": lambda: judge_head_diversity(_spread_heads(1.0, 1.1), _spread_heads(1.0, 1.01)),
        "random weights spread too": lambda: judge_head_diversity(_spread_heads(1.0, 3.0), _spread_heads(1.0, 3.0))}),
}


def test_every_verified_claim_has_a_row():
    ids = {e.id for e in verify.collect() if e.kind in ("claim", "refuted")}
    assert set(CRITERIA) == ids, (sorted(ids - set(CRITERIA)), sorted(set(CRITERIA) - ids))


@pytest.mark.parametrize("claim_id", sorted(CRITERIA))
def test_the_criterion_passes_and_fails(claim_id):
    good, bad = CRITERIA[claim_id]
    checks = good()
    assert all_passed(checks) and all(c.label for c in checks), [c.label for c in checks if not c.passed]
    assert bad, f"{claim_id}: no failing measurements"
    for why, judge in bad.items():
        assert not all_passed(judge()), f"{claim_id}: '{why}' passed"
