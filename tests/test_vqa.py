"""VQA on digit scenes: disjoint splits, answers that the image determines, the blind baseline, metrics, training."""
from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from torch import nn

from attnlab.data.digits import _raw_digits, load_digits_data
from attnlab.data.scenes import Scenes
from attnlab.data.vqa import (BOS, CELL_NAMES, CHANCE, IGNORE, KINDS, MAX_LEN, VOCAB, SceneQuestions, answer_words,
                              decode, encode, question_text)
from attnlab.cli import main
from attnlab.tasks import load_model
from attnlab.tasks.vqa import SPEC, VQATask, answer_scores, default_vqa_config
from attnlab.train import Trainer, TrainConfig

SMALL = dict(d_model=32, heads=2, vit_layers=1, layers=1)


@pytest.fixture(scope="module")
def vqa():
    return SceneQuestions(Scenes(load_digits_data(0), seed=0))


def batch(vqa, n, split, seed=0):
    return vqa.sample(torch.Generator().manual_seed(seed), n, split)


def cells_of(image):
    """(4, 8, 8) the 2x2 cells of a (1, 16, 16) scene, row-major."""
    return image[0].unflatten(0, (2, 8)).unflatten(2, (2, 8)).permute(0, 2, 1, 3).flatten(0, 1)


def solve(image, digit_idx, question):
    """The answer read off the picture alone: which cells hold ink, and which digit image is in each.

    Written from the cell geometry (0 1 / 2 3), not from the generator's layout table."""
    raw, labels = _raw_digits()
    held = {}                                                  # cell -> digit
    for c, cell in enumerate(cells_of(image)):
        if cell.abs().sum() > 0:
            k = [k for k in digit_idx.tolist() if torch.equal(cell, raw[k, 0])][0]
            held[c] = int(labels[k])
    words = question.split()
    d = int(words[-2])
    if words[0] == "is":
        return "yes" if d in held.values() else "no"
    mine = [c for c, dd in held.items() if dd == d]
    if words[0] == "where":
        (c,) = mine                                            # asked only when the digit is there once
        return CELL_NAMES[c]
    step = {"left": -1, "right": +1, "above": -2, "below": +2}[words[2]]
    same_row = step in (-1, 1)
    seen = {held[c + step] for c in mine if c + step in held and (not same_row or (c + step) // 2 == c // 2)}
    (answer,) = seen                                           # one neighbour in that direction
    return str(answer)


def test_answers_are_what_the_picture_shows(vqa):
    for split in ("val", "test"):                              # unshifted digits: pixel-exact cells
        q = batch(vqa, 300, split)
        for i in range(300):
            question = question_text(q.tgt_in[i])
            assert question.endswith("?")
            assert decode(q.tgt_out[i]) == solve(q.images[i], q.scenes.digit_idx[i], question), question
    assert answer_words(3, 7, 0, "what is left of the 7".split()) == ["3"]
    with pytest.raises(ValueError, match="no answer"):
        answer_words(3, 7, 0, "what is above the 7".split())
    with pytest.raises(ValueError, match="no single answer"):
        answer_words(3, 3, 0, "where is the 3".split())


def test_sequences_score_the_answer_only(vqa):
    q = batch(vqa, 200, "train")
    assert q.tgt_in.shape == q.tgt_out.shape == (200, MAX_LEN) and (q.tgt_in[:, 0] == BOS).all()
    for i in range(200):
        scored = (q.tgt_out[i] != IGNORE).nonzero().squeeze(1)
        qlen = len(question_text(q.tgt_in[i]).split())
        assert scored[0] == qlen and torch.equal(scored, torch.arange(qlen, qlen + len(scored)))
        # teacher forcing: tgt_in continues with the targets (the answer words; EOS is only a target)
        assert torch.equal(q.tgt_in[i, scored[1:]], q.tgt_out[i, scored[:-1]])
    assert encode(["is", "there", "a", "7", "?"]) == [VOCAB.index(w) for w in ("is", "there", "a", "7", "?")]


def test_splits_are_disjoint_in_combinations_and_digit_images(vqa):
    scenes, digits = vqa.scenes, vqa.scenes.digits
    train, test = batch(vqa, 600, "train"), batch(vqa, 600, "test", seed=1)
    held = {tuple(r) for r in scenes.held_out.tolist()}
    train_combos = {tuple(r) for r in train.scenes.combos.tolist()}
    test_combos = {tuple(r) for r in test.scenes.combos.tolist()}
    assert not train_combos & held and test_combos <= held and len(test_combos) > 90
    assert torch.isin(train.scenes.digit_idx, digits.train_idx).all()
    assert not torch.isin(test.scenes.digit_idx, digits.train_idx).any()
    assert torch.isin(test.scenes.digit_idx, digits.test_idx).all()


def test_question_kinds_and_answers_are_balanced(vqa):
    q = batch(vqa, 3000, "train")
    kinds = Counter(KINDS[k] for k in q.kinds.tolist())
    assert all(850 < kinds[k] < 1250 for k in KINDS), kinds       # exists gains the a == b "where" questions
    answers = Counter(decode(q.tgt_out[i]) for i in range(3000) if KINDS[q.kinds[i]] == "exists")
    assert abs(answers["yes"] - answers["no"]) < 0.1 * sum(answers.values()), answers
    where = Counter(decode(q.tgt_out[i]) for i in range(3000) if KINDS[q.kinds[i]] == "where")
    assert set(where) == set(CELL_NAMES)


def small_task(blind=False):
    return VQATask(default_vqa_config(blind=blind, **SMALL))


def test_blind_model_ignores_the_image_and_the_other_does_not(vqa):
    q = batch(vqa, 8, "test")
    other = batch(vqa, 8, "test", seed=5).images
    for blind in (True, False):
        torch.manual_seed(0)
        model = small_task(blind).build_model().eval()
        same = torch.allclose(model(q.images, q.tgt_in), model(other, q.tgt_in))
        assert same == blind


def test_greedy_answer_is_the_teacher_forced_argmax(vqa):
    torch.manual_seed(0)
    model = small_task().build_model().eval()
    q = batch(vqa, 6, "test")
    for i in range(6):
        ids = q.tgt_in[i].tolist()
        question = torch.tensor([ids[: ids.index(VOCAB.index("?")) + 1]])
        got, w = model.answer(q.images[i:i + 1], question)
        full = torch.cat([question, got[:, :-1]], 1)
        want = model(q.images[i:i + 1], full).argmax(-1)[:, question.shape[1] - 1:]
        assert torch.equal(got, want)
        assert w.shape == (1, 1, 2, got.shape[1], 16)
        torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))


class Oracle(nn.Module):
    """Logits from the true targets, with some rows' first answer word changed (tests the metric)."""

    def __init__(self, tgt_out, wrong=()):
        super().__init__()
        self.tgt_out, self.wrong = tgt_out, list(wrong)

    def forward(self, images, tgt_in):
        t = self.tgt_out.clamp(min=0).clone()
        for r in self.wrong:
            first = int((self.tgt_out[r] != IGNORE).nonzero()[0])
            t[r, first] = (t[r, first] + 1) % len(VOCAB)
        return nn.functional.one_hot(t, len(VOCAB)).float()


def test_scores_on_an_oracle(vqa):
    q = batch(vqa, 60, "test")
    right = answer_scores(Oracle(q.tgt_out), q)
    assert right["answer_accuracy"] == 1.0 and all(right[f"accuracy_{k}"] == 1.0 for k in KINDS)
    wrong = [i for i in range(60) if KINDS[q.kinds[i]] == "where"][:3]
    got = answer_scores(Oracle(q.tgt_out, wrong), q)
    assert got["answer_accuracy"] == pytest.approx(57 / 60)
    n_where = int((q.kinds == KINDS.index("where")).sum())
    assert got["accuracy_where"] == pytest.approx(1 - 3 / n_where) and got["accuracy_exists"] == 1.0
    assert got["chance"] == pytest.approx(sum(CHANCE[KINDS[k]] for k in q.kinds.tolist()) / 60)


def test_training_smoke_and_eval_from_the_checkpoint(tmp_path):
    task = small_task()
    cfg = TrainConfig(steps=30, batch_size=32, lr=3e-3, warmup_steps=5, eval_interval=15, eval_iters=1,
                      checkpoint_interval=30, out_dir=str(tmp_path / "run"))
    trainer = Trainer(task, cfg, progress=False)
    trainer.train(plot=False)
    vals = [r["val_loss"] for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
            if "val_loss" in r]
    assert vals[-1] < vals[0], vals
    metrics = task.evaluate(trainer.model)
    assert set(metrics) == {"answer_accuracy", "chance", *(f"accuracy_{k}" for k in KINDS)}
    model, again = load_model(tmp_path / "run")                # what `attnlab eval` does
    assert isinstance(again, VQATask) and again.evaluate(model) == metrics
    assert SPEC.run_dir(SPEC_ARGS(blind=True)) == "runs/vqa-blind"
    out = tmp_path / "show"                                    # `attnlab show`: each answer word's patches
    assert main(["show", "--checkpoint", str(tmp_path / "run"), "--image-index", "2", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["ckpt-run-question2-layer0.png"]
    assert main(["show", "--checkpoint", str(tmp_path / "run"), "--text", "hi", "--out", str(out)]) == 2


def SPEC_ARGS(**kw):
    import argparse
    p = argparse.ArgumentParser()
    SPEC.add_arguments(p)
    return p.parse_args(["--blind"] if kw.get("blind") else [])
