"""Evoformer task: axial = masked full attention on the flattened grid, equal sizes, the data's contact structure."""
from __future__ import annotations

import argparse
import json
import math
from types import SimpleNamespace

import pytest
import torch

from attnlab.data.pairs import PairTaskConfig, contact_split, draw_contacts, draw_pairs
from attnlab.models.evoformer import Evoformer, EvoformerConfig
from attnlab.nn.axial import AxialIntermediates
from attnlab.nn.attention import Intermediates
from attnlab.tasks import load_model
from attnlab.tasks.evoformer import MODEL_DEFAULTS, SPEC, EvoformerTask, contact_metrics
from attnlab.train import Trainer, TrainConfig

TINY = dict(vocab=4, max_rows=6, max_cols=12, n_blocks=2, msa_dim=12, pair_dim=6, n_heads=3, head_dim=4,
            opm_dim=3, transition=2, max_relpos=4)
TINY_DATA = PairTaskConfig(rows=6, cols=12, min_pairs=1, max_pairs=3, min_sep=3)


def grid_attention(mod, x, z=None):
    """Full softmax attention over all R·C tokens of the flattened grid, masked to the token's row
    (axis="row") or column (axis="col"), with the pair bias gathered per token pair.

    Written from the AF2 formulas with plain torch ops: no axial reshapes, no attnlab kernel.
    """
    cfg = mod.cfg
    B, R, C, d = x.shape
    H, c = cfg.n_heads, cfg.head_dim
    t = mod.norm(x).reshape(B, R * C, d)                                   # token n = s·C + i
    q, k, v = (f(t).reshape(B, R * C, H, c).transpose(1, 2) for f in (mod.to_q, mod.to_k, mod.to_v))
    row, col = torch.arange(R * C) // C, torch.arange(R * C) % C
    keep = (row[:, None] == row[None, :]) if cfg.axis == "row" else (col[:, None] == col[None, :])
    scores = q @ k.transpose(-1, -2) / math.sqrt(c)                         # (B, H, RC, RC)
    if z is not None:
        pos = col if cfg.axis == "row" else row
        bias = mod.to_pair_bias(mod.pair_norm(z)).permute(0, 3, 1, 2)      # (B, H, L, L)
        scores = scores + bias[:, :, pos[:, None], pos[None, :]]
    o = scores.masked_fill(~keep, float("-inf")).softmax(-1) @ v           # (B, H, RC, c)
    o = o.transpose(1, 2) * torch.sigmoid(mod.to_gate(t)).reshape(B, R * C, H, c)
    return mod.to_out(o.reshape(B, R * C, H * c)).reshape(B, R, C, d)


def tiny_batch(seed=0, n=3):
    return draw_pairs(TINY_DATA, torch.Generator().manual_seed(seed), n)


def tiny_model(kind="axial", **kw):
    torch.manual_seed(0)
    model = Evoformer(EvoformerConfig(kind=kind, **{**TINY, **kw})).double()
    # AF2's zero-initialised output layers and constant gates would hide every update from the test
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("to_gate.weight") or not p.any():
                p.normal_(std=0.3)
    return model


@pytest.mark.parametrize("triangle", [False, True])
def test_axial_model_equals_full_attention_on_flattened_grid(triangle):
    model = tiny_model(triangle=triangle)
    msa, _ = tiny_batch()
    want_parts = []
    for block in model.blocks:
        for attn in (block.row_attn, block.col_attn):
            attn.forward = (lambda mod: lambda x, z=None: grid_attention(mod, x, z))(attn)
            want_parts.append(attn)
    want = model(msa)
    for attn in want_parts:
        del attn.forward                                   # back to the axial implementation
    got = model(msa)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    # the check can fail: without the row/column mask the grid attention mixes the whole grid
    unmasked = model.blocks[0].row_attn
    unmasked.forward = lambda x, z=None: grid_attention(unmasked, x.transpose(1, 2).reshape(x.shape), z)
    assert (model(msa) - got).abs().max() > 1e-3
    del unmasked.forward


def test_fresh_blocks_are_the_identity():
    # AF2's final-layer zero init: the symbols reach block 1's outer product (and the head) intact
    torch.manual_seed(0)
    block = Evoformer(EvoformerConfig(**TINY, triangle=True)).blocks[0]
    m, z = torch.randn(2, 5, 12, TINY["msa_dim"]), torch.randn(2, 12, 12, TINY["pair_dim"])
    m2, z2 = block(m, z)
    assert torch.equal(m2, m) and torch.equal(z2, z)


def test_outputs_symmetric_and_rows_exchangeable():
    model = tiny_model()
    msa, _ = tiny_batch()
    out = model(msa)
    torch.testing.assert_close(out, out.transpose(1, 2))
    # the axial model has no row positions: shuffling the sequences changes nothing
    torch.testing.assert_close(model(msa[:, torch.randperm(msa.shape[1])]), out, rtol=1e-10, atol=1e-10)
    flat = tiny_model("flat")
    torch.testing.assert_close(flat(msa), flat(msa).transpose(1, 2))


def test_capture_records_attention_weights():
    msa, _ = tiny_batch(n=2)
    B, R, C = msa.shape
    cap: list = []
    tiny_model()(msa, capture=cap)
    assert len(cap) == 2 * TINY["n_blocks"] and all(isinstance(c, AxialIntermediates) for c in cap)
    H = TINY["n_heads"]
    assert cap[0].weights.shape == (B, R, H, C, C) and cap[1].weights.shape == (B, C, H, R, R)
    assert cap[0].pair_bias.shape == (B, H, C, C) and cap[1].pair_bias is None
    torch.testing.assert_close(cap[1].weights.sum(-1), torch.ones(B, C, H, R, dtype=torch.float64))
    cap = []
    tiny_model("flat")(msa, capture=cap)
    assert len(cap) == TINY["n_blocks"] and isinstance(cap[0], Intermediates)
    assert cap[0].weights.shape == (B, H, R * C, R * C)


@pytest.mark.parametrize("cfg", [MODEL_DEFAULTS, dict(MODEL_DEFAULTS, triangle=True), TINY,
                                 dict(MODEL_DEFAULTS, n_blocks=4, msa_dim=48, pair_dim=24)])
def test_flat_baseline_has_the_axial_parameter_count(cfg):
    base = EvoformerConfig(**{"max_rows": 12, "max_cols": 20, **cfg})
    axial, flat = Evoformer(base), Evoformer(base.with_kind("flat"))
    n_axial = sum(p.numel() for p in axial.parameters())
    n_flat = sum(p.numel() for p in flat.parameters())
    assert abs(n_flat - n_axial) / n_axial <= 0.01, f"{n_flat=} vs {n_axial=}"
    assert not hasattr(flat, "blocks") and flat.cfg.flat_dim % base.n_heads == 0


def joint_stats(msa, A):
    """For every column pair of every sample: (is x[:, j] a one-to-one function of x[:, i] over the
    rows (B, C, C) bool, their mutual information in nats (B, C, C)), from the joint symbol counts."""
    onehot = torch.nn.functional.one_hot(msa, A).double()                       # (B, R, C, A)
    joint = torch.einsum("bria,brjc->bijac", onehot, onehot)                     # (B, C, C, A, A) counts
    p = joint / msa.shape[1]
    pi, pj = p.sum(-1, keepdim=True), p.sum(-2, keepdim=True)
    mi = torch.where(p > 0, p * (p / (pi * pj)).log(), torch.zeros(())).sum((-1, -2))
    seen = joint > 0
    functional = (seen.sum(-1) <= 1).all(-1) & (seen.sum(-2) <= 1).all(-1)
    return functional, mi


def test_contacts_covary_across_rows_and_nothing_else_does():
    cfg = PairTaskConfig(rows=64, cols=20)            # many rows: chance co-variation is negligible
    msa, contacts = draw_pairs(cfg, torch.Generator().manual_seed(3), 48)
    up = torch.triu(contacts, 1)
    assert torch.equal(contacts, contacts.transpose(1, 2)) and not contacts.diagonal(0, 1, 2).any()
    assert (contacts.sum(2) <= 1).all(), "a column has at most one partner"
    b, i, j = up.nonzero(as_tuple=True)
    assert ((j - i) >= cfg.min_sep).all()
    k = up.sum((1, 2))
    assert k.min() >= cfg.min_pairs and k.max() <= cfg.max_pairs and len(set(k.tolist())) > 1
    functional, mi = joint_stats(msa, cfg.vocab)
    others = torch.triu(torch.ones_like(up), 1) & ~up
    assert functional[up].all(), "a contact whose columns are not coupled"
    assert not functional[others].any(), f"{int(functional[others].sum())} non-contacts co-vary"
    assert mi[up].min() > 3 * mi[others].max(), (mi[up].min().item(), mi[others].max().item())


def test_single_columns_carry_no_contact_signal():
    cfg = PairTaskConfig(rows=12, cols=20)
    msa, contacts = draw_pairs(cfg, torch.Generator().manual_seed(4), 400)
    paired = contacts.any(2)                                                     # (B, C)
    top = torch.nn.functional.one_hot(msa, cfg.vocab).sum(1).max(-1).values.float() / cfg.rows   # (B, C) conservation
    gap = top[paired].mean() - top[~paired].mean()
    assert abs(gap) < 0.01, f"paired columns are more/less conserved by {gap:.3f}"
    # symbols are uniform overall, in paired and unpaired columns alike
    for sel in (paired, ~paired):
        freq = torch.bincount(msa.permute(0, 2, 1)[sel].flatten(), minlength=cfg.vocab).float()
        assert (freq / freq.sum() - 1 / cfg.vocab).abs().max() < 0.01


def test_noise_breaks_that_share_of_couplings():
    cfg = PairTaskConfig(rows=32, cols=20, noise=0.3, vocab=4)
    msa, contacts = draw_pairs(cfg, torch.Generator().manual_seed(5), 200)
    b, i, j = torch.triu(contacts, 1).nonzero(as_tuple=True)
    xi, xj = msa[b, :, i], msa[b, :, j]                                         # (P, R)
    # the coupling of each contact: the symbol j most often shows for each symbol of i
    joint = torch.zeros(len(b), cfg.vocab, cfg.vocab)
    joint.view(len(b), -1).scatter_add_(1, xi * cfg.vocab + xj, torch.ones_like(xi, dtype=torch.float))
    follows = joint.argmax(2).gather(1, xi) == xj                                # (P, R)
    broken = 1 - follows.float().mean().item()
    expect = cfg.noise * (1 - 1 / cfg.vocab)                                     # a random symbol may still fit
    assert abs(broken - expect) < 0.03, f"{broken=:.3f} vs {expect=:.3f}"


def test_splits_are_disjoint_contact_maps():
    cfg = PairTaskConfig(rows=4, cols=12, min_pairs=1, max_pairs=2, min_sep=3)   # few maps: overlaps likely
    g = torch.Generator().manual_seed(6)
    maps = torch.stack([draw_contacts(cfg, g) for _ in range(1500)])
    share = contact_split(cfg, maps).count("eval") / len(maps)
    assert 0.05 < share < 0.15, f"eval share {share:.3f} vs eval_fraction {cfg.eval_fraction}"
    key = lambda m: tuple(torch.triu(m, 1).flatten().tolist())
    train = {key(m) for m in draw_pairs(cfg, torch.Generator().manual_seed(7), 600, "train")[1]}
    held = {key(m) for m in draw_pairs(cfg, torch.Generator().manual_seed(8), 150, "eval")[1]}
    all_maps = {key(m) for m in maps}
    assert len(all_maps) < 700 and len(held) > 20, "the config must repeat maps, or the test proves nothing"
    assert not train & held, f"{len(train & held)} maps in both splits"
    task = EvoformerTask(cfg, EvoformerConfig(**{**TINY, "max_rows": 4}),
                         eval_samples=70)
    sampled = torch.cat([task.sampler(16, seed=0).next()[1] for _ in range(4)])
    tested = torch.cat([c for _, c in task.test_set()])
    assert set(contact_split(cfg, sampled)) == {"train"} and set(contact_split(cfg, tested)) == {"eval"}
    assert len(tested) == 70


def test_draws_are_reproducible():
    a = draw_pairs(TINY_DATA, torch.Generator().manual_seed(9), 4)
    b = draw_pairs(TINY_DATA, torch.Generator().manual_seed(9), 4)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    s = EvoformerTask(TINY_DATA, EvoformerConfig(**TINY)).sampler(4, seed=1)
    state = s.state()
    first = s.next()
    s.set_state(state)
    assert all(torch.equal(x, y) for x, y in zip(first, s.next()))


def test_contact_metrics_against_hand_counts():
    contacts = torch.zeros(2, 4, 4, dtype=torch.bool)
    contacts[0, 0, 3] = contacts[0, 3, 0] = contacts[0, 1, 2] = contacts[0, 2, 1] = True
    contacts[1, 0, 2] = contacts[1, 2, 0] = True
    logits = torch.full((2, 4, 4), -1.0)
    logits[0, 0, 3] = logits[0, 3, 0] = 2.0               # tp
    logits[0, 0, 1] = logits[0, 1, 0] = 1.0               # fp, ranked above the missed (1, 2)
    logits[1, 0, 2] = logits[1, 2, 0] = 3.0               # tp
    m = contact_metrics(logits, contacts)
    # 6 pairs per sample: tp 2, fp 1, fn 1, tn 8
    assert m["precision"] == pytest.approx(2 / 3) and m["recall"] == pytest.approx(2 / 3)
    assert m["contact_f1"] == pytest.approx(2 / 3) and m["pair_accuracy"] == pytest.approx(10 / 12)
    assert m["top_k_precision"] == pytest.approx((1 / 2 + 1) / 2) and m["map_exact"] == pytest.approx(0.5)


def test_bad_inputs_raise():
    model = tiny_model().float()
    with pytest.raises(ValueError, match=r"\(B, R, C\)"):
        model(torch.zeros(2, 12, dtype=torch.long))
    with pytest.raises(TypeError, match="integer"):
        model(torch.zeros(1, 3, 12))
    with pytest.raises(ValueError, match="vocab=4"):
        model(torch.full((1, 3, 12), 4))
    with pytest.raises(ValueError, match="max_rows=6"):
        tiny_model("flat")(torch.zeros(1, 7, 12, dtype=torch.long))
    msa, contacts = tiny_batch()
    with pytest.raises(ValueError, match="contacts has shape"):
        model.loss(msa, contacts[:, :-1, :-1])
    with pytest.raises(ValueError, match="kind="):
        EvoformerConfig(kind="conv")
    with pytest.raises(ValueError, match="multiple of n_heads"):
        EvoformerConfig(n_heads=4, flat_dim=30)
    with pytest.raises(ValueError, match="cols >= "):
        PairTaskConfig(cols=10, max_pairs=4, min_sep=5)
    with pytest.raises(ValueError, match="split="):
        draw_pairs(TINY_DATA, torch.Generator(), 2, split="test")
    with pytest.raises(ValueError, match="vocab=8"):
        EvoformerTask(TINY_DATA, EvoformerConfig(**{**TINY, "vocab": 8}))
    with pytest.raises(ValueError, match="must both be"):
        contact_metrics(torch.zeros(1, 4, 4), torch.zeros(1, 4, 5, dtype=torch.bool))


def test_spec_builds_both_kinds_and_rebuilds_from_a_checkpoint():
    p = argparse.ArgumentParser()
    SPEC.add_arguments(p)
    for kind in ("axial", "flat"):
        args = p.parse_args(["--model", kind, "--rows", "5", "--cols", "16", "--blocks", "1"])
        task = SPEC.from_args(args)
        assert SPEC.run_dir(args) == f"runs/evoformer-{kind}"
        assert task.model_cfg.kind == kind and task.data.rows == 5 and task.model_cfg.n_blocks == 1
        model = task.build_model()
        ckpt = SimpleNamespace(model_config=task.model_config(), extra={"task": "evoformer", "data": task.info()})
        again = SPEC.from_checkpoint(ckpt)
        assert again.data == task.data and again.model_cfg == task.model_cfg
        again.build_model().load_state_dict(model.state_dict())          # same architecture, same names


def test_tiny_training_smoke(tmp_path):
    task = EvoformerTask(TINY_DATA, EvoformerConfig(**TINY), eval_samples=32)
    cfg = TrainConfig(steps=16, batch_size=8, lr=3e-3, warmup_steps=2, eval_interval=8, eval_iters=2,
                      checkpoint_interval=16, out_dir=str(tmp_path / "run"))
    trainer = Trainer(task, cfg, progress=False)
    trainer.train(plot=False)
    vals = [r["val_loss"] for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
            if "val_loss" in r]
    assert len(vals) == 3 and vals[-1] < vals[0], vals
    metrics = task.evaluate(trainer.model)
    assert set(metrics) == {"contact_f1", "precision", "recall", "top_k_precision", "pair_accuracy", "map_exact"}
    assert all(0.0 <= v <= 1.0 for v in metrics.values())
    model, again = load_model(tmp_path / "run")             # what `attnlab eval` does
    assert again.evaluate(model) == metrics


def test_tagged_contacts_show_only_in_three_columns():
    cfg = PairTaskConfig(rows=64, cols=12, max_pairs=3, min_sep=3, coupling="tagged")
    assert cfg.p_mutate == 1.0 and cfg.n_symbols == 2 * cfg.vocab
    msa, contacts = draw_pairs(cfg, torch.Generator().manual_seed(7), 48)
    A = cfg.vocab
    is_tag = (msa >= A).all(1)                                                   # (B, C)
    assert (is_tag.sum(1) == 1).all() and not (msa[~is_tag[:, None, :].expand_as(msa)] >= A).any()
    assert not (contacts.any(2) & is_tag).any(), "the tag column is never in a contact"
    tag = msa.gather(2, is_tag.float().argmax(1)[:, None, None].expand(-1, cfg.rows, 1)) - A     # (B, R, 1)
    up = torch.triu(contacts, 1)
    residues = ~is_tag[:, :, None] & ~is_tag[:, None, :] & torch.triu(torch.ones_like(up), 1)
    others = residues & ~up
    # two columns alone: no contact is a one-to-one function, and non-contacts co-vary as much as contacts
    functional, mi = joint_stats(msa.clamp(max=A - 1), A)
    assert not functional[up].any()
    assert abs(mi[up].mean() - mi[others].mean()) < 0.02, (mi[up].mean().item(), mi[others].mean().item())
    # with the row's tag added to column i, every contact is one-to-one and no non-contact is
    b, i, j = up.nonzero(as_tuple=True)
    shifted = msa.clone()
    shifted[b, :, i] = (msa[b, :, i] + tag[b, :, 0]) % A
    functional3, _ = joint_stats(shifted.clamp(max=A - 1), A)
    assert functional3[up].all()
    assert not (functional3 & others).any()
    # the tag alone says nothing about either column of a contact
    t_onehot = torch.nn.functional.one_hot(tag[b, :, 0], A).double()              # (P, R, A)
    for col in (i, j):
        joint = torch.einsum("pra,prc->pac", t_onehot, torch.nn.functional.one_hot(msa[b, :, col], A).double())
        p = joint.sum(0) / joint.sum()                                            # pooled over contacts
        assert (p - 1 / A ** 2).abs().max() < 0.01


def test_tagged_config_errors():
    with pytest.raises(ValueError, match="p_mutate must be 1.0"):
        PairTaskConfig(coupling="tagged", p_mutate=0.5)
    with pytest.raises(ValueError, match="column outside every contact"):
        PairTaskConfig(coupling="tagged", cols=10, max_pairs=5, min_sep=1)
    with pytest.raises(ValueError, match="coupling="):
        PairTaskConfig(coupling="triple")
    assert PairTaskConfig().p_mutate == 0.5 and PairTaskConfig().n_symbols == 4
