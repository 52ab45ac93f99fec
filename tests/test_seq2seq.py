"""Seq2Seq: no peeking at future targets, every source token seen, padding invariance, cached decoding
== recomputation, beam search (beam 1 == greedy; == a plain re-implementation), generated tasks and
their held-out split, the Task, errors, and a tiny training run that learns."""
from __future__ import annotations

import datetime
import math

import pytest
import torch

from attnlab.data.seq2seq_tasks import BOS, EOS, PAD, TASKS, Vocab, collate, make_task, ordinal
from attnlab.models.seq2seq import Seq2Seq, Seq2SeqConfig
from attnlab.tasks.seq2seq import SPEC, Seq2SeqTask, default_config, match_scores
from attnlab.train.task import Task

SCHEMES = ["sinusoidal", "learned", "rope", "alibi", "t5"]
V = 12


def tiny(positional="sinusoidal", **kw) -> Seq2Seq:
    torch.manual_seed(0)
    cfg = Seq2SeqConfig.preset("tiny", vocab_size=V, positional=positional, max_len=32, dropout=0.0, **kw)
    return Seq2Seq(cfg).eval()


def source(B=3, S=9, seed=0, pad_from=(9, 6, 4)) -> torch.Tensor:
    """(B, S) random symbols (ids 3..V-1), row b padded from position pad_from[b]."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, V, (B, S), generator=g)
    for b, n in enumerate(pad_from[:B]):
        src[b, n:] = PAD
    return src


def target(B=3, L=8, seed=1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(3, V, (B, L), generator=g)
    t[:, 0] = BOS
    return t


def embedding_grads(model: Seq2Seq, which: str, src, tgt_in, pick):
    """d pick(logits) / d (the embedded src or tgt_in) (B, len, C), through a forward hook."""
    kept = []

    def hook(module, inputs, out):
        out.retain_grad()
        kept.append(out)
    handle = getattr(model, which).register_forward_hook(hook)
    try:
        pick(model(src, tgt_in)).backward()
    finally:
        handle.remove()
    return kept[0].grad


@pytest.mark.parametrize("positional", SCHEMES)
def test_decoder_cannot_see_future_targets(positional):
    m = tiny(positional, share_embeddings=False)
    src, tgt = source(), target()
    other = tgt.clone()
    other[:, 5:] = (other[:, 5:] + 4) % (V - 3) + 3
    with torch.no_grad():
        a, b = m(src, tgt), m(src, other)
    assert (a[:, :5] - b[:, :5]).abs().max() < 1e-5
    assert (a[:, 5:] - b[:, 5:]).abs().amax((0, 2)).min() > 1e-4            # the changed positions do change
    t = 3
    g = embedding_grads(m, "tgt_emb", src, tgt, lambda logits: logits[:, t].square().sum())   # (B, L, C)
    per_pos = g.abs().sum((0, 2))                                              # (L,)
    assert torch.all(per_pos[t + 1:] == 0), per_pos
    assert torch.all(per_pos[: t + 1] > 0), per_pos


@pytest.mark.parametrize("positional", ["sinusoidal", "rope", "t5"])
def test_decoder_sees_every_source_token_and_no_padding(positional):
    m = tiny(positional, share_embeddings=False)
    src, tgt = source(), target()
    with torch.no_grad():
        base = m(src, tgt)
        for s in range(src.shape[1]):
            changed = src.clone()
            real = changed[:, s] != PAD
            changed[real, s] = (changed[real, s] - 3 + 1) % (V - 3) + 3
            diff = (m(changed, tgt) - base).abs().amax((1, 2))                 # (B,)
            assert torch.all(diff[real] > 1e-4), (s, diff)
            assert torch.all(diff[~real] == 0), (s, diff)
    g = embedding_grads(m, "src_emb", src, tgt, lambda logits: logits.square().sum())   # (B, S, C)
    per_tok = g.abs().sum(-1)                                                  # (B, S)
    assert torch.all(per_tok[src != PAD] > 0)
    assert torch.all(per_tok[src == PAD] == 0)                                 # padding is never attended to


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "alibi"])
def test_source_padding_does_not_change_results(positional):
    m = tiny(positional)
    src, tgt = source(pad_from=(9, 6, 4)), target()
    padded = torch.cat([src, torch.full((3, 5), PAD)], dim=1)                  # 5 more PAD columns
    with torch.no_grad():
        torch.testing.assert_close(m(padded, tgt), m(src, tgt), atol=1e-5, rtol=1e-5)
        alone = m(src[2:, :4], tgt[2:])                                         # row 2 without any padding
        torch.testing.assert_close(m(src, tgt)[2:], alone, atol=1e-5, rtol=1e-5)
    assert torch.equal(m.greedy(padded, max_len=10), m.greedy(src, max_len=10))


@pytest.mark.parametrize("positional", SCHEMES)
def test_cached_decoding_equals_full_recomputation(positional):
    m = tiny(positional, n_decoder_layers=2)
    src, tgt = source(), target()
    with torch.no_grad():
        full = m(src, tgt)                                                    # (B, L, V)
        memory, mask = m.encode(src)
        cache = m.decoder.new_cache(3, tgt.shape[1], src.shape[1])
        steps = [m.decode(tgt[:, t:t + 1], memory if t == 0 else None, mask, cache=cache)
                 for t in range(tgt.shape[1])]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    assert torch.equal(m.greedy(src, max_len=12), m.greedy(src, max_len=12, use_cache=False))


def reference_beam(m: Seq2Seq, src_row, K: int, alpha: float, T: int) -> list[int]:
    """Beam search written plainly: full recomputation per hypothesis, the same selection rule."""
    def logp(prefix):
        logits = m(src_row[None], torch.tensor([[BOS] + prefix]))[0, -1].clone()
        logits[[PAD, BOS]] = -math.inf
        return logits.log_softmax(-1)
    beams, finished = [(0.0, [])], []
    for t in range(T):
        cands = sorted(((s + lp, h + [tok]) for s, h in beams for tok, lp in enumerate(logp(h).tolist())),
                       key=lambda c: -c[0])[:2 * K]
        beams = []
        for s, h in cands:
            if h[-1] == EOS:
                finished.append((s / (t + 1) ** alpha, h))
            else:
                beams.append((s, h))
                if len(beams) == K:
                    break
        if len(finished) >= K:
            break
    else:
        finished += [(s / T ** alpha, h) for s, h in beams]
    return max(finished, key=lambda f: f[0])[1]


def test_beam_search():
    m = tiny(n_decoder_layers=2)
    src = source(B=3, pad_from=(9, 6, 4))
    greedy = m.greedy(src, max_len=9)
    assert torch.equal(m.beam_search(src, beam=1, max_len=9), greedy)
    assert torch.equal(m.generate(src, beam=1, max_len=9), greedy)
    # an untied output layer of large weights, EOS's row shrunk: outputs that depend on source and prefix,
    # ending at once, later or never (max_len), so that beams get reordered
    m = tiny(n_decoder_layers=2, tie_output=False)
    with torch.no_grad():
        torch.nn.init.normal_(m.out.weight, std=0.5, generator=torch.Generator().manual_seed(0))
        m.out.weight[EOS] *= 0.6
    lengths = set()
    for beam, alpha in ((3, 0.0), (3, 1.0), (2, 2.0), (4, 1.0)):
        got, scores = m.beam_search(src, beam=beam, length_penalty=alpha, max_len=8, return_scores=True)
        with torch.no_grad():
            for b in range(3):
                want = reference_beam(m, src[b], beam, alpha, 8)
                assert got[b, : len(want)].tolist() == want and torch.all(got[b, len(want):] == PAD), (alpha, b)
                lengths.add(len(want))
                # the score the cached search accumulated == the hypothesis' log p by a full forward
                logits = m(src[b:b + 1], torch.tensor([[BOS] + want[:-1]]))[0].clone()   # (len, V)
                logits[:, [PAD, BOS]] = -math.inf
                logp = logits.log_softmax(-1).gather(1, torch.tensor(want)[:, None]).sum()
                assert abs(logp / len(want) ** alpha - scores[b]) < 1e-4, (alpha, b)
    assert {1, 2, 8} <= lengths, lengths                 # EOS at once, later, and never (max_len) all occurred
    with pytest.raises(ValueError, match="beam must be"):
        m.beam_search(src, beam=V)


def test_cross_attention_weights():
    m = tiny(n_decoder_layers=2)
    src, tgt = source(), target()
    w = m.cross_attention(src, tgt)
    assert w.shape == (3, 2, 4, tgt.shape[1], src.shape[1])                   # (B, layers, H, L, S)
    torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
    assert torch.all(w.movedim(-1, 1)[src == PAD] == 0)                      # never on padding
    captured = []
    m(src, tgt, capture=captured)                                              # encoder layers, then self/cross
    assert len(captured) == 1 + 2 * 2 and captured[0].weights.shape == (3, 4, 9, 9)


def test_empty_source_and_bad_inputs():
    m = tiny()
    tgt = target(B=2)
    with pytest.raises(ValueError, match="empty.*at least one token"):
        m(torch.zeros(2, 0, dtype=torch.long), tgt)
    with pytest.raises(ValueError, match=r"rows \[1\] are all padding"):
        m(torch.tensor([[3, 4], [PAD, PAD]]), tgt)
    with pytest.raises(ValueError, match="ids must be in"):
        m(torch.tensor([[3, V]]), tgt[:1])
    with pytest.raises(TypeError, match="int64"):
        m(torch.zeros(2, 3), tgt)
    with pytest.raises(ValueError, match="positional"):
        Seq2SeqConfig(vocab_size=V, positional="shaw")
    with pytest.raises(ValueError, match="share_embeddings"):
        Seq2SeqConfig(vocab_size=V, tgt_vocab_size=V + 1)


def test_loss_ignores_target_padding():
    m = tiny()
    src = source(B=2, pad_from=(9, 9))
    tgt_in = target(B=2, L=5)
    tgt_out = torch.cat([tgt_in[:, 1:], torch.full((2, 1), EOS)], 1)
    padded_in = torch.cat([tgt_in, torch.full((2, 3), PAD)], 1)
    padded_out = torch.cat([tgt_out, torch.full((2, 3), PAD)], 1)
    with torch.no_grad():
        logits = m(src, tgt_in)
        want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt_out.flatten())
        torch.testing.assert_close(m.loss(src, padded_in, padded_out), want)


# -- data --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(TASKS))
def test_splits_are_disjoint_and_deterministic(name):
    task = make_task(name)
    train = task.draw(torch.Generator().manual_seed(0), 600, "train")
    held = task.draw(torch.Generator().manual_seed(0), 200, "heldout")
    key = (lambda s, t: tuple(t)) if name == "dates" else (lambda s, t: tuple(s))   # what decides the split
    assert not {key(*p) for p in train} & {key(*p) for p in held}
    dec = task.vocab.tokens
    assert all(task.split_of([dec[i] for i in s], [dec[i] for i in t]) == "heldout" for s, t in held)
    assert train == task.draw(torch.Generator().manual_seed(0), 600, "train")     # same seed, same data
    import random
    rng = random.Random(0)
    rate = sum(task.split_of(*task.example(rng)) == "heldout" for _ in range(3000)) / 3000
    assert 0.07 < rate < 0.13, rate


def test_task_examples():
    rev, srt = make_task("reversal", n_symbols=10, min_len=3, max_len=7), make_task("sorting")
    src, tgt_in, tgt_out = rev.batch(torch.Generator().manual_seed(0), 50)
    lengths = (src != PAD).sum(1) - 1                                        # EOS ends every source
    assert lengths.min() >= 3 and lengths.max() <= 7 and src.max() < rev.vocab.size
    for s, ti, to in zip(src, tgt_in, tgt_out):
        text = rev.vocab.decode(s)
        assert rev.vocab.decode(ti) == text[::-1] and rev.vocab.decode(to) == text[::-1]
        assert ti[0] == BOS and to[len(text)] == EOS
    for s, _, to in zip(*srt.batch(torch.Generator().manual_seed(1), 20)):
        assert srt.vocab.decode(to) == "".join(sorted(srt.vocab.decode(s)))
    dates = make_task("dates")
    for s, _, to in zip(*dates.batch(torch.Generator().manual_seed(2), 100)):
        iso, spelled = dates.vocab.decode(to), dates.vocab.decode(s)
        d = datetime.date.fromisoformat(iso)
        assert str(d.year) in spelled and d.strftime("%B").lower()[:3] in spelled
    assert [ordinal(d) for d in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 31)] == \
        ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd", "31st"]
    assert dates.max_source_len == len("the 23rd of september, 2099") + 1


def test_vocab_and_collate():
    v = Vocab("abc")
    assert v.encode("cab") == [5, 3, 4] and v.decode([BOS, 5, 3, EOS, 4]) == "ca"
    src, tgt_in, tgt_out = collate([([3, 4], [4, 3]), ([5], [5])])
    assert src.tolist() == [[3, 4, EOS], [5, EOS, PAD]]
    assert tgt_in.tolist() == [[BOS, 4, 3], [BOS, 5, PAD]] and tgt_out.tolist() == [[4, 3, EOS], [5, EOS, PAD]]
    with pytest.raises(ValueError, match="not in the vocabulary"):
        v.encode("z")


def test_unknown_task_and_bad_options():
    with pytest.raises(ValueError, match=r"unknown seq2seq task 'copy'; known tasks: \['dates', 'reversal'"):
        make_task("copy")
    with pytest.raises(ValueError, match="bad options"):
        make_task("dates", n_symbols=3)
    with pytest.raises(ValueError, match="min_len"):
        make_task("reversal", min_len=0)


# -- the task and training ---------------------------------------------------------------------
def test_match_scores():
    target = torch.tensor([[3, 4, EOS, PAD], [3, 4, 5, EOS]])
    pred = torch.tensor([[3, 4, EOS, PAD, PAD], [3, 5, 5, EOS, PAD]])
    exact, right = match_scores(pred, target)
    assert exact.tolist() == [True, False] and right.tolist() == [3, 3]
    exact, right = match_scores(torch.tensor([[3, 4, 6, 7, EOS]]), target[:1])   # no EOS where it should be
    assert exact.tolist() == [False] and right.tolist() == [2]


def test_task_protocol_and_tiny_training_learns():
    data = make_task("reversal", n_symbols=6, min_len=2, max_len=5)
    task = Seq2SeqTask(data, default_config(data, d_model=32, n_encoder_layers=1, n_decoder_layers=1),
                       beam=2, eval_examples=40)
    assert isinstance(task, Task) and task.units_per_batch(8) == 8 and task.tokenizer_json()
    sampler = task.sampler(32, seed=0)
    state = sampler.state()
    first = sampler.next()
    sampler.set_state(state)
    assert all(torch.equal(a, b) for a, b in zip(first, sampler.next()))   # resumable
    torch.manual_seed(0)
    model = task.build_model()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    val = task.eval_batches(32, 2, seed=1)
    losses = []
    for _ in range(150):
        loss = model.loss(*sampler.next())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        val_loss = sum(model.loss(*b).item() for b in val) / len(val)
    assert sum(losses[-10:]) / 10 < 0.5 * sum(losses[:10]) / 10, losses[::10]
    assert val_loss < 0.5 * sum(losses[:10]) / 10
    metric = task.evaluate(model)
    assert set(metric) == {"exact_match", "token_accuracy", "exact_match_beam2", "token_accuracy_beam2"}
    assert metric["token_accuracy"] > 0.3 and 0 <= metric["exact_match"] <= 1


def test_spec_builds_tasks_from_arguments():
    import argparse
    p = argparse.ArgumentParser()
    SPEC.add_arguments(p)
    task = SPEC.from_args(p.parse_args(["--task", "dates", "--d-model", "32", "--layers", "1", "--beam", "3"]))
    assert task.data.name == "dates" and task.cfg.d_model == 32 and task.cfg.n_decoder_layers == 1
    assert task.beam == 3 and task.info() == {"task": "dates", "min_year": 1900, "max_year": 2099,
                                              "heldout_fraction": 0.1, "beam": 3, "length_penalty": 1.0,
                                              "eval_examples": 500}
    assert SPEC.run_dir(p.parse_args([])) == "runs/seq2seq-reversal"
    with pytest.raises(ValueError, match="max_len"):
        Seq2SeqTask(task.data, default_config(task.data, max_len=8))


def test_trainer_run_and_checkpoint_round_trip(tmp_path):
    from attnlab.tasks import load_model
    from attnlab.train import TrainConfig, Trainer
    data = make_task("reversal", n_symbols=6, min_len=2, max_len=4)
    task = Seq2SeqTask(data, default_config(data, d_model=32, n_encoder_layers=1, n_decoder_layers=1),
                       beam=2, eval_examples=20)
    trainer = Trainer(task, TrainConfig(steps=6, batch_size=8, warmup_steps=2, eval_interval=3, eval_iters=1,
                                        checkpoint_interval=3, out_dir=str(tmp_path)), progress=False)
    trainer.train(plot=False)
    model, again = load_model(tmp_path)                     # SPEC.from_checkpoint, as `attnlab eval` does it
    assert again.info() == task.info() and again.cfg == task.cfg
    assert again.evaluate(model) == task.evaluate(trainer.model)
