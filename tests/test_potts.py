"""Synthetic Potts families (data/potts.py): the fold, the contacts, the splits, and the Gibbs sampler."""
import itertools
from dataclasses import replace

import numpy as np
import pytest

from attnlab.data.potts import (SPLIT_OFFSETS, PottsConfig, base_rate, contact_energy, family_set, gibbs_sample,
                                lattice_contacts, lattice_walk, make_family)


def _mutual_information(msa: np.ndarray, q: int) -> np.ndarray:
    """(L, L) plug-in mutual information of column pairs."""
    M = len(msa)
    oh = np.eye(q)[msa]                                                     # (M, L, q)
    f1 = oh.mean(0)                                                         # (L, q)
    f2 = np.einsum("mia,mjb->ijab", oh, oh) / M                             # (L, L, q, q)
    ind = f1[:, None, :, None] * f1[None, :, None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(f2 > 0, f2 * np.log(f2 / ind), 0.0).sum((-1, -2))


@pytest.mark.parametrize("length, seed", [(1, 0), (2, 1), (48, 0), (48, 7), (100, 3)])
def test_walk_is_self_avoiding_with_bonds_of_length_one(length, seed):
    xyz = lattice_walk(length, np.random.default_rng(seed))
    assert xyz.shape == (length, 3)
    assert len({tuple(p) for p in xyz}) == length, "the walk visits a site twice"
    assert (np.abs(np.diff(xyz, axis=0)).sum(1) == 1).all(), "a bond is not one lattice step"


def test_walk_is_compact():
    # a compact fold has many non-bonded neighbours; a free random walk of 48 sites has only a handful
    compact = lattice_contacts(lattice_walk(48, np.random.default_rng(0)), 3).sum() // 2
    loose = lattice_contacts(lattice_walk(48, np.random.default_rng(0), compactness=0.0), 3).sum() // 2
    assert compact >= 25 and compact > 2 * loose, f"{compact=} {loose=}"


@pytest.mark.parametrize("min_separation", [3, 4])
def test_contacts_are_the_non_bonded_lattice_neighbours(min_separation):
    cfg = PottsConfig(depth=8, burn_in=1, chains=8, min_separation=min_separation)
    fam = make_family(cfg, seed=4)
    c, xyz = fam.contacts, fam.coords
    assert c.dtype == bool and c.shape == (48, 48) and (c == c.T).all()
    for i, j in itertools.combinations(range(48), 2):
        near = np.abs(xyz[i] - xyz[j]).sum() == 1
        assert c[i, j] == (near and j - i >= min_separation), (i, j)
    assert not c.diagonal().any()
    assert (c.sum(1) <= 5).all()                       # a cubic site has 6 neighbours, at least 1 bonded
    assert (c[np.triu_indices(48, 6)]).sum() >= 15     # many contacts are long-range


def test_families_are_deterministic_from_the_seed():
    cfg = PottsConfig(depth=32, chains=16)
    a, b, c = make_family(cfg, 11), make_family(cfg, 11), make_family(cfg, 12)
    assert (a.msa == b.msa).all() and (a.contacts == b.contacts).all() and (a.coords == b.coords).all()
    assert not (a.coords == c.coords).all() and not (a.msa == c.msa).all()
    # the fold and the fields do not depend on how long the sampler runs
    d = make_family(replace(cfg, burn_in=3), 11)
    assert (d.coords == a.coords).all() and not (d.msa == a.msa).all()


def test_splits_are_disjoint_and_memoized():
    cfg = PottsConfig(depth=16, chains=16, burn_in=2)
    sets = {s: family_set(cfg, s, 3) for s in ("train", "fit", "test")}
    seeds = {s: [f.seed for f in fams] for s, fams in sets.items()}
    assert seeds == {s: [SPLIT_OFFSETS[s] + k for k in range(3)] for s in sets}
    assert len({x for v in seeds.values() for x in v}) == 9
    folds = {f.coords.tobytes() for fams in sets.values() for f in fams}
    assert len(folds) == 9, "two families share a fold"
    again = family_set(cfg, "fit", 3)
    assert all(x is y for x, y in zip(again, sets["fit"])) and again is not sets["fit"]
    with pytest.raises(ValueError, match="unknown split 'val'"):
        family_set(cfg, "val", 3)


def test_family_layout():
    fam = make_family(PottsConfig(), seed=0)
    assert fam.msa.shape == (256, 48) and fam.msa.dtype == np.int64
    assert fam.msa.min() >= 0 and fam.msa.max() < 8
    assert fam.coords.shape == (48, 3) and fam.seed == 0


def test_contact_energy_is_shared_symmetric_and_gauged():
    E = contact_energy(8)
    assert E.shape == (8, 8) and np.allclose(E, E.T)
    assert np.allclose(E.sum(0), 0) and np.isclose((E**2).mean(), 1.0)
    E[0, 0] = 99.0                                   # a caller's copy cannot change everyone's chemistry
    assert np.array_equal(contact_energy(8), contact_energy(8)) and contact_energy(8)[0, 0] != 99.0


def test_sampler_matches_an_enumerable_two_site_model():
    rng = np.random.default_rng(0)
    q = 3
    h = rng.normal(size=(2, q))
    J = 1.5 * rng.normal(size=(q, q))                # asymmetric: a transposed block would show
    p = np.exp(h[0][:, None] + h[1][None, :] + J)
    p /= p.sum()                                     # exact P(a, b)
    blocks = np.stack([J, J.T])[:, None]             # (2, 1, q, q): site 0 sees J, site 1 sees Jᵀ
    x = gibbs_sample(h, np.array([[1], [0]]), blocks, np.array([0, 1]), np.random.default_rng(1),
                     chains=4000, per_chain=5, burn_in=10, thin=3)
    assert x.shape == (20000, 2)
    with pytest.raises(ValueError, match="share a colour"):
        gibbs_sample(h, np.array([[1], [0]]), blocks, np.array([0, 0]), np.random.default_rng(1),
                     chains=2, per_chain=1, burn_in=1, thin=1)
    emp = np.zeros((q, q))
    np.add.at(emp, (x[:, 0], x[:, 1]), 1.0)
    emp /= len(x)
    sigma = np.sqrt(p * (1 - p) / len(x))
    assert (np.abs(emp - p) < 5 * sigma).all(), f"max |z| = {np.abs(emp - p).max() / sigma.max():.1f}"


def test_sampler_respects_fields_with_no_couplings():
    h = np.log(np.array([[0.7, 0.2, 0.1]] * 3))
    x = gibbs_sample(h, np.full((3, 1), -1), np.zeros((3, 1, 3, 3)), np.array([0, 1, 0]),
                     np.random.default_rng(0), chains=3000, per_chain=2, burn_in=2, thin=1)
    freq = np.stack([np.bincount(col, minlength=3) for col in x.T]) / len(x)
    assert np.abs(freq - [0.7, 0.2, 0.1]).max() < 0.02, freq


def test_contact_columns_co_vary_and_others_do_not():
    cfg = PottsConfig()
    fam = make_family(cfg, seed=0)
    L = cfg.length
    sep = np.abs(np.subtract.outer(np.arange(L), np.arange(L)))
    others = (sep >= cfg.min_separation) & ~fam.contacts
    mi = _mutual_information(fam.msa, cfg.symbols)
    assert mi[fam.contacts].mean() > 1.6 * mi[others].mean(), (mi[fam.contacts].mean(), mi[others].mean())
    # the control: the same fold without couplings shows no contact signal, so the check above can fail
    flat = make_family(replace(cfg, coupling=0.0), seed=0)
    mi0 = _mutual_information(flat.msa, cfg.symbols)
    assert mi0[flat.contacts].mean() < 1.2 * mi0[others].mean()


def test_sequences_are_diverse():
    fam = make_family(PottsConfig(), seed=1)
    same = (fam.msa[:, None, :] == fam.msa[None, :, :]).mean(-1)           # (M, M) identity
    identity = same[np.triu_indices(len(fam.msa), 1)].mean()
    assert identity < 0.4, f"mean pairwise identity {identity:.2f}"
    assert len(np.unique(fam.msa, axis=0)) == len(fam.msa)
    top_share = max(np.bincount(col, minlength=8).max() for col in fam.msa.T) / len(fam.msa)
    assert top_share < 0.95, "a column is frozen into one symbol"


def test_base_rate_counts_long_range_pairs_of_the_upper_triangle():
    c = np.zeros((10, 10), dtype=bool)
    c[0, 7] = c[7, 0] = True          # long-range
    c[2, 5] = c[5, 2] = True          # |i - j| = 3: not counted
    assert base_rate(c, 6) == pytest.approx(1 / 10)   # pairs with j - i >= 6 in L = 10: 4+3+2+1
    assert base_rate(np.zeros((4, 4), dtype=bool), 6) == 0.0


def test_sampler_output_is_record_major():
    # thin = 0: a chain's records are identical, so row r and row r + chains come from the same chain
    h = np.zeros((6, 4))
    x = gibbs_sample(h, np.full((6, 1), -1), np.zeros((6, 1, 4, 4)), np.arange(6) % 2, np.random.default_rng(0),
                     chains=5, per_chain=3, burn_in=1, thin=0)
    assert x.shape == (15, 6)
    assert (x[:5] == x[5:10]).all() and (x[:5] == x[10:]).all() and len(np.unique(x[:5], axis=0)) == 5
