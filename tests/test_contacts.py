"""Contact readout math (lab/contacts.py): APC, precision at L/k, mean-field DCA, logistic readout, Jacobian."""
import numpy as np
import pytest
import torch

from attnlab.data.potts import PottsConfig, base_rate, make_family
from attnlab.lab.contacts import (LogisticReadout, apc, categorical_jacobian_scores, fit_logistic, long_range_pairs,
                                  mean_field_dca, pair_features, precision_at, predict_logistic, symmetrize,
                                  top_l_over)


def test_apc_removes_an_outer_product_and_keeps_a_planted_pair():
    rng = np.random.default_rng(0)
    L = 200
    F = np.outer(rng.uniform(1, 3, L), rng.uniform(1, 3, L))               # background only: rank one
    off = ~np.eye(L, dtype=bool)
    resid = np.abs(apc(F)[off]).max() / F.max()
    assert resid < 0.03, f"APC leaves {resid:.3f} of a rank-one background"   # O(1/L): the zeroed diagonal
    G = F.copy()
    G[3, 17] += 5.0
    assert apc(G)[3, 17] - apc(F)[3, 17] == pytest.approx(5.0, rel=0.02)
    assert np.all(apc(F).diagonal() <= 0)                                   # the diagonal was zeroed first


def test_apc_and_symmetrize_are_batched_and_take_tensors():
    maps = torch.rand(2, 3, 9, 9)
    out = apc(symmetrize(maps))
    assert out.shape == (2, 3, 9, 9) and out.dtype == np.float64
    np.testing.assert_allclose(out[1, 2], apc(symmetrize(maps[1, 2].numpy())), atol=1e-12)
    np.testing.assert_allclose(symmetrize(maps), np.swapaxes(symmetrize(maps), -1, -2))
    assert np.array_equal(apc(np.zeros((4, 4))), np.zeros((4, 4)))          # no 0/0 on an empty map


def test_precision_at_on_a_hand_made_case():
    L = 10
    contacts = np.zeros((L, L), dtype=bool)
    for i, j in [(0, 9), (1, 8), (2, 4)]:
        contacts[i, j] = contacts[j, i] = True
    s = np.zeros((L, L))
    s[2, 4] = 10.0              # the best score, but |i - j| = 2 < min_sep: skipped
    s[0, 9] = 5.0               # contact
    s[3, 9] = 4.0               # not a contact
    s[1, 8] = 3.0               # contact
    s[9, 0] = -100.0            # the lower triangle is not read
    assert precision_at(s, contacts, 1, min_sep=6) == 1.0
    assert precision_at(s, contacts, 2, min_sep=6) == 0.5
    assert precision_at(s, contacts, 3, min_sep=6) == pytest.approx(2 / 3)
    assert precision_at(s, contacts, 1, min_sep=2) == 1.0                   # now (2, 4) counts
    assert precision_at(s, contacts, 100, min_sep=6) == pytest.approx(2 / 10)  # all 10 long-range pairs
    with pytest.raises(ValueError, match="k >= 1"):
        precision_at(s, contacts, 0, min_sep=6)


def test_precision_at_breaks_ties_by_index():
    flat = np.ones((8, 8))                   # every pair tied: earlier pairs in row-major order go first
    contacts = np.zeros((8, 8), dtype=bool)
    contacts[1, 7] = contacts[7, 1] = True   # the third long-range pair, after (0, 6) and (0, 7)
    assert precision_at(flat, contacts, 2, min_sep=6) == 0.0
    assert precision_at(flat, contacts, 3, min_sep=6) == pytest.approx(1 / 3)
    nan = flat.copy()
    nan[0, 6] = np.nan                       # a NaN ranks last, so (1, 7) moves up to second
    assert precision_at(nan, contacts, 2, min_sep=6) == 0.5


def test_long_range_pairs_and_top_l_over():
    i, j = long_range_pairs(10, 6)
    assert list(zip(i.tolist(), j.tolist())) == [(0, 6), (0, 7), (0, 8), (0, 9), (1, 7), (1, 8), (1, 9),
                                                  (2, 8), (2, 9), (3, 9)]
    assert top_l_over(48, 5) == 9 and top_l_over(48, 1) == 48 and top_l_over(4, 5) == 0


@pytest.mark.parametrize("seed", [0, 1])
def test_mean_field_dca_finds_the_planted_contacts(seed):
    cfg = PottsConfig(depth=1000)
    fam = make_family(cfg, seed)            # train-split seeds: a check of DCA and the sampler, not the claim
    F = mean_field_dca(fam.msa, cfg.symbols)
    assert F.shape == (48, 48) and np.allclose(F, F.T)
    p = precision_at(F, fam.contacts, top_l_over(48, 5), min_sep=cfg.long_range)
    rate = base_rate(fam.contacts, cfg.long_range)
    assert p >= 3 * rate, f"DCA precision at L/5 {p:.2f} vs base rate {rate:.3f}"


def test_mean_field_dca_reweights_duplicated_sequences():
    # a family plus 20 copies of one of its sequences: reweighting makes the copies count as one, so the
    # scores barely move; without it they would dominate the frequencies
    fam = make_family(PottsConfig(depth=300), 0)
    dup = np.concatenate([fam.msa, np.repeat(fam.msa[:1], 200, axis=0)])
    F, G = mean_field_dca(fam.msa, 8), mean_field_dca(dup, 8)
    H = mean_field_dca(dup, 8, theta=0.0)    # identity > 1: no reweighting at all
    assert np.abs(F - G).max() < 0.25 * np.abs(F - H).max()


def test_logistic_separates_a_separable_set_on_raw_features():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 3))
    y = X[:, 0] - 2 * X[:, 1] > 0
    X[:, 0] += 3 * np.sign(X[:, 0] - 2 * X[:, 1])             # a margin
    X[:, 2] *= 1e4                                            # a large, useless feature: standardized inside
    model = fit_logistic(X, y, l2=1e-4)
    assert isinstance(model, LogisticReadout)
    p = predict_logistic(model, X)
    assert p.shape == (400,) and ((p > 0.5) == y).all()
    w, b = model
    assert abs(w[2]) * 1e4 < 0.1 * abs(w[1])


def test_logistic_recovers_the_generating_weights():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(40000, 2)) * [1.0, 10.0] + [0.0, 5.0]
    w_true, b_true = np.array([1.5, -0.2]), 0.5
    y = rng.random(40000) < 1 / (1 + np.exp(-(X @ w_true + b_true)))
    w, b = fit_logistic(torch.as_tensor(X), y, l2=1e-8)
    np.testing.assert_allclose(w, w_true, rtol=0.05)
    assert b == pytest.approx(b_true, abs=0.1)


def test_pair_features_stack_every_layer_and_head():
    maps = np.random.default_rng(0).random((2, 3, 7, 7))
    feats = pair_features(maps)
    assert feats.shape == (7, 7, 6)
    for layer in range(2):
        for head in range(3):
            np.testing.assert_allclose(feats[..., layer * 3 + head], apc(symmetrize(maps[layer, head])))
    np.testing.assert_allclose(feats, np.swapaxes(feats, 0, 1))


def test_categorical_jacobian_finds_the_one_dependency():
    q, L, R = 5, 30, 3
    g = torch.Generator().manual_seed(0)
    W_self, W_pair, W_other = (torch.randn(q, q, generator=g) for _ in range(3))

    def predict_fn(x):                                     # (N, R, L) -> (N, R, L, q)
        logits = W_self[x] + 7.0                           # every position sees its own residue (the diagonal)
        logits[:, :, 5] += W_pair[x[:, :, 20]]             # position 5 reads position 20 of its own row
        logits[:, 0, 7] += W_other[x[:, 1, 25]]            # row 0 reads another row: not row 0's mutation
        logits[:, 1, 10] += W_other[x[:, 0, 12]]           # another row reads row 0: not row 0's logits
        return logits

    rows = torch.randint(0, q, (R, L), generator=g)
    F = categorical_jacobian_scores(predict_fn, rows, q, chunk=7)     # 7 does not divide L * q
    assert F.shape == (L, L) and np.allclose(F, F.T)
    i, j = np.triu_indices(L, 1)
    best = np.argmax(F[i, j])
    assert (i[best], j[best]) == (5, 20), f"top pair {(i[best], j[best])}"
    assert F[7, 25] < 0.05 * F[5, 20] and F[10, 12] < 0.05 * F[5, 20]
