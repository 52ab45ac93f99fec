"""Synthetic protein families: a Potts model planted on a made-up lattice fold, sampled by Gibbs (issue #30).

Each family has its own fold (a compact self-avoiding walk on the cubic lattice), its own per-site fields,
and the one shared contact energy ``contact_energy(q)``: J_ij(a, b) = coupling * E(a, b) on the fold's
contacts, 0 elsewhere. Its MSA is M sequences drawn from P(x) ∝ exp(Σ_i h_i(x_i) + Σ_{i<j} J_ij(x_i, x_j))
(REFERENCES.md §12). Columns in contact co-vary; single columns carry no contact signal.

Shapes: L residues (``length``), q symbols (``symbols``), M sequences (``depth``).

Example::

    cfg = PottsConfig()
    fam = make_family(cfg, seed=0)            # fam.msa (256, 48) int64, fam.contacts (48, 48) bool
    train = family_set(cfg, "train", 100)     # memoized; "fit" and "test" use disjoint seeds
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

__all__ = ["PottsConfig", "Family", "contact_energy", "lattice_walk", "lattice_contacts", "gibbs_sample",
           "make_family", "family_set", "base_rate", "SPLIT_OFFSETS"]

# Seed ranges of the splits: far enough apart that no realistic n makes two splits share a family.
SPLIT_OFFSETS = {"train": 0, "fit": 10**6, "test": 2 * 10**6}
_ENERGY_SEED = 20080201  # fixed forever: every family, every split, every run shares this chemistry
_STEPS = np.array([[1, 0, 0], [-1, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1], [0, 0, -1]])


@dataclass(frozen=True)
class PottsConfig:
    length: int = 48          # L residues (sites of the lattice walk)
    symbols: int = 8          # q: a small alphabet keeps the q x q coupling blocks well estimated from M rows
    depth: int = 256          # M sequences per family
    coupling: float = 0.6     # J = coupling * E on contacts: contact MI ~2x the rest at M = 256; by 1.0 the
                              # model starts to order (one symbol takes ~half of all residues), so stay well below
    field_scale: float = 1.0  # h_i(a) ~ field_scale * N(0, 1): columns unevenly used, as in real families,
                              # yet diverse (mean pairwise identity ~0.24; 1/q = 0.125 is no structure at all)
    burn_in: int = 100        # sweeps before a chain's first recorded sequence (1000 gives the same statistics)
    thin: int = 10            # sweeps between the sequences one chain records
    chains: int = 64          # independent chains; each records depth / chains sequences, `thin` sweeps apart.
                              # A family has no phylogeny here, so its rows should be near-independent draws:
                              # many short chains give that, and a few records per chain share one burn-in
    min_separation: int = 3   # |i - j| below this is never a contact (the lattice allows none at 2 anyway)
    long_range: int = 6       # the evaluation's |i - j| >= 6
    compactness: float = 1.5  # walk growth prefers a free site with n occupied neighbours by exp(compactness * n)


@dataclass
class Family:
    """One synthetic family. Treat the arrays as read-only: ``family_set`` shares them between callers."""
    msa: np.ndarray        # (M, L) int64 in [0, q)
    contacts: np.ndarray   # (L, L) bool, symmetric, False where |i - j| < min_separation
    coords: np.ndarray     # (L, 3) int64 lattice sites of the fold
    seed: int


@functools.lru_cache(maxsize=None)
def _energy(q: int) -> np.ndarray:
    rng = np.random.default_rng([_ENERGY_SEED, q])
    E = rng.standard_normal((q, q))
    E = (E + E.T) / 2
    E = E - E.mean(0, keepdims=True) - E.mean(1, keepdims=True) + E.mean()  # zero-sum gauge
    E = E / np.sqrt((E**2).mean())                                          # unit RMS: `coupling` is the scale
    E.setflags(write=False)
    return E


def contact_energy(q: int) -> np.ndarray:
    """The contact energy E (q, q), symmetric, shared by every family (a copy; fixed forever).

    A fixed-seed Gaussian matrix rather than hand-made hydrophobic/charged/polar classes: it works for any q,
    is full rank (every symbol pair has its own preference, so a contact shows in many pair frequencies, not
    in one class contrast), and is put in the zero-sum gauge (rows and columns sum to 0), so it contributes
    nothing that a field could absorb: all of its strength is co-variation. Scaled to unit RMS entry.
    Shared on purpose: a model trained on many families can only learn a generic rule for "these two
    columns co-vary" if the chemistry is the same in every family, as in real proteins.

    Example::

        E = contact_energy(8)           # (8, 8)
        assert np.allclose(E, E.T) and np.allclose(E.sum(0), 0)
    """
    return _energy(q).copy()


def lattice_walk(length: int, rng: np.random.Generator, compactness: float = 1.5) -> np.ndarray:
    """A compact self-avoiding walk through ``length`` sites of the cubic lattice, (length, 3) int64.

    Grows one step at a time to a free neighbour, chosen with weight exp(compactness * occupied neighbours
    of it), so the chain folds back on itself and many residues far apart in sequence end up adjacent; on a
    dead end (no free neighbour) it starts over (with the same generator, so the walk is still a function of
    the seed).

    Example::

        xyz = lattice_walk(48, np.random.default_rng(0))          # (48, 3)
        assert (np.abs(np.diff(xyz, axis=0)).sum(1) == 1).all()
    """
    while True:
        xyz = [(0, 0, 0)]
        occupied = {xyz[0]}
        while len(xyz) < length:
            here = np.array(xyz[-1])
            free = [tuple(here + s) for s in _STEPS if tuple(here + s) not in occupied]
            if not free:
                break
            n_occ = np.array([sum(tuple(np.array(f) + s) in occupied for s in _STEPS) for f in free])
            w = np.exp(compactness * (n_occ - n_occ.max()))
            nxt = free[rng.choice(len(free), p=w / w.sum())]
            xyz.append(nxt)
            occupied.add(nxt)
        if len(xyz) == length:
            return np.array(xyz, dtype=np.int64)


def lattice_contacts(coords: np.ndarray, min_separation: int) -> np.ndarray:
    """(L, L) bool: lattice neighbours (distance 1) at least ``min_separation`` apart in sequence."""
    L = len(coords)
    dist = np.abs(coords[:, None, :] - coords[None, :, :]).sum(-1)  # (L, L) Manhattan distance
    sep = np.abs(np.arange(L)[:, None] - np.arange(L)[None, :])     # (L, L)
    return (dist == 1) & (sep >= min_separation)


def gibbs_sample(fields: np.ndarray, neighbours: np.ndarray, blocks: np.ndarray, colour: np.ndarray,
                 rng: np.random.Generator, *, chains: int, per_chain: int, burn_in: int, thin: int) -> np.ndarray:
    """Draw chains * per_chain sequences from a Potts model with sparse couplings by blocked Gibbs sampling.

    Args:
        fields: (L, q) h_i(a).
        neighbours: (L, K) int, the sites coupled to each site, padded with -1.
        blocks: (L, K, q, q) J_{i, neighbours[i, k]}(a, b), a = residue at i; zero where padded.
        colour: (L,) int in {0, 1}: no two coupled sites share a colour, so all sites of one colour are
            conditionally independent given the other and update together (a checkerboard sweep: an exact
            Gibbs sampler, vectorised over sites as well as chains). A lattice fold is bipartite (parity of
            x + y + z), which is why this works for every family.
        rng: the generator.
        chains, per_chain, burn_in, thin: ``chains`` independent chains from uniform random states; each runs
            ``burn_in`` sweeps, then records its state ``per_chain`` times, ``thin`` sweeps apart.

    Returns:
        (per_chain * chains, L) int64, record-major: rows 0 .. chains - 1 are the first record of every chain,
        so any leading block of rows comes from as many different chains as it can.

    Example::

        h = np.zeros((2, 2)); nb = np.array([[1], [0]]); J = np.array([[[[1., 0], [0, 0]]]] * 2)
        x = gibbs_sample(h, nb, J, np.array([0, 1]), np.random.default_rng(0), chains=100, per_chain=5,
                         burn_in=10, thin=2)   # (500, 2)
    """
    L, q = fields.shape
    nb = np.where(neighbours >= 0, neighbours, 0)                               # (L, K): padding reads site 0
    if (colour[nb] == colour[:, None])[neighbours >= 0].any():
        raise ValueError("gibbs_sample: two coupled sites share a colour, so they cannot update together; "
                         "colour the coupling graph with 2 colours (a lattice fold: parity of x + y + z)")
    groups = [np.flatnonzero(colour == c) for c in (0, 1)]
    x = rng.integers(0, q, size=(chains, L))                                     # (C, L)
    ks = np.arange(nb.shape[1])[None, :]                                         # (1, K)

    def sweep() -> None:
        for S in groups:
            xn = x[:, nb[S]]                                                     # (C, |S|, K)
            logits = fields[S] + blocks[S[:, None], ks, :, xn].sum(2)            # (C, |S|, q)
            x[:, S] = (logits + rng.gumbel(size=logits.shape)).argmax(-1)       # Gumbel-max: an exact draw

    for _ in range(burn_in):
        sweep()
    out = []
    for r in range(per_chain):
        for _ in range(thin if r else 0):
            sweep()
        out.append(x.copy())
    return np.stack(out).reshape(per_chain * chains, L)


def make_family(cfg: PottsConfig, seed: int) -> Family:
    """Sample one family: fold, fields, MSA, all from ``seed`` (fold and sampling use separate streams).

    Example::

        fam = make_family(PottsConfig(depth=64), seed=3)    # fam.msa (64, 48)
    """
    fold_rng, field_rng, gibbs_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    L, q = cfg.length, cfg.symbols
    coords = lattice_walk(L, fold_rng, cfg.compactness)                        # (L, 3)
    contacts = lattice_contacts(coords, cfg.min_separation)                    # (L, L)
    fields = cfg.field_scale * field_rng.standard_normal((L, q))               # (L, q)

    K = max(1, int(contacts.sum(1).max()))
    neighbours = np.full((L, K), -1)
    blocks = np.zeros((L, K, q, q))
    J = cfg.coupling * contact_energy(q)                                       # symmetric, so J_ji = J_ij^T = J
    for i in range(L):
        js = np.flatnonzero(contacts[i])
        neighbours[i, :len(js)] = js
        blocks[i, :len(js)] = J
    colour = coords.sum(1) % 2                                                 # lattice parity: bipartite

    per_chain = -(-cfg.depth // cfg.chains)
    msa = gibbs_sample(fields, neighbours, blocks, colour, gibbs_rng, chains=cfg.chains, per_chain=per_chain,
                       burn_in=cfg.burn_in, thin=cfg.thin)[: cfg.depth]
    return Family(msa=msa.astype(np.int64), contacts=contacts, coords=coords, seed=seed)


@functools.lru_cache(maxsize=32)
def _family_set(cfg: PottsConfig, split: str, n: int) -> tuple[Family, ...]:
    return tuple(make_family(cfg, SPLIT_OFFSETS[split] + k) for k in range(n))


def family_set(cfg: PottsConfig, split: str, n: int) -> list[Family]:
    """The first ``n`` families of a split ("train", "fit" or "test"; disjoint seeds), memoized in-process.

    Example::

        fit = family_set(PottsConfig(), "fit", 8)      # seeds 10**6 ... 10**6 + 7
    """
    if split not in SPLIT_OFFSETS:
        raise ValueError(f"unknown split {split!r}; choose one of {sorted(SPLIT_OFFSETS)}")
    if not 0 <= n < 10**6:
        raise ValueError(f"n = {n} families would overlap the next split's seeds; use 0 <= n < 10**6")
    return list(_family_set(cfg, split, n))


def base_rate(contacts: np.ndarray, long_range: int) -> float:
    """True long-range contacts / long-range pairs (i < j, j - i >= long_range): precision by chance.

    Example::

        r = base_rate(make_family(PottsConfig(), 0).contacts, 6)
    """
    L = contacts.shape[-1]
    i, j = np.triu_indices(L, k=long_range)
    return float(contacts[i, j].mean()) if len(i) else 0.0
