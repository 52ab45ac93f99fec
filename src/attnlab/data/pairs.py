"""A generated 2-D task where long-range pair interactions matter: contacts from co-variation in an MSA.

Each sample is a small "multiple sequence alignment": R aligned sequences (rows) of C positions
(columns) over an alphabet of A symbols, generated from a hidden *contact map* — a set of K
disjoint column pairs (i, j) at least ``min_sep`` positions apart. The target is the contact map.

How a sample is made (all draws from the caller's ``torch.Generator``)::

    contacts   K ~ U{min_pairs..max_pairs} disjoint pairs (i < j, j - i >= min_sep), uniformly
               one valid pair at a time; the sample's map must lie in the requested split (below)
    couplings  per contact a random permutation pi_ij of the alphabet: symbol a at i is
               "compatible" with pi_ij(a) at j. Drawn per sample, so no fixed rule can be memorised
    root       a random sequence with root[j] = pi_ij(root[i]) on every contact
    rows       each row copies the root, then every *site* mutates independently with
               probability p_mutate: an unpaired column takes a uniform random symbol; a contact
               mutates as one unit: i takes a uniform random symbol a and j becomes pi_ij(a)
    noise      with probability ``noise`` per row and contact, j instead takes a random symbol

So in every row ``x[s, j] = pi_ij(x[s, i])`` on a contact (unless noise broke it), while the two
columns of a non-contact vary independently. Every column, paired or not, keeps the root symbol
with the same probability ``(1 - p) + p / A`` and is otherwise uniform: a single column (its
conservation, its symbols) or a single row says nothing about the contacts. Only *co-variation*
does — comparing columns i and j across many rows — and contacts are ``min_sep`` or more apart.
The shared root is a confound, as phylogeny is in real MSAs: two conserved columns agree in most
rows without being coupled, so raw co-occurrence counts overstate them (the lower p, the more).
Still, with R = 12 rows and p = 0.5 a non-contact rarely looks coupled: the rule "contact iff
x[:, j] is a one-to-one function of x[:, i] over the rows" scores F1 0.994 (79 of 373k
non-contacts pass it; 1 at p = 0.8), measured on 2000 samples — the ceiling a model can approach.

Couplings through a third column (``coupling="tagged"``): every row also carries a *tag*, a
symbol t_s in [0, A) written as symbol A + t_s (a second alphabet, never a residue) in one column
drawn per sample among the columns outside every contact. A contact's rule then depends on it:
``x[s, j] = pi_ij((x[s, i] + t_s) mod A)``. Every site is drawn fresh (p_mutate = 1: no root, else
a conserved leader beside an unconserved follower would betray the pair by single columns), so
each column is uniform, and so is every *pair* of columns: x_i and t_s are independent and uniform,
hence (x_i, x_j), (x_i, t) and (x_j, t) are all independent. The contact shows only in the joint of
three columns, (x_i, t, x_j), and the tag sits at a different column in every sample. An outer
product mean of per-column features (a joint histogram of two columns) cannot see it; a model must
first move the tag into the residues' features, which in the Evoformer only row attention does
(attending by content to the tag symbol; the optional triangle updates see only two-column
aggregates). With the tag added to x_i, the rule is again a one-to-one map between two columns,
which the test of the pairwise rule can check (tests).

Splits: the held-out split is the set of contact maps whose hash falls in the first
``eval_fraction`` of 1000 buckets (a fixed random table of per-pair keys, summed over the map's
pairs). Training samples never use a held-out map, so held-out accuracy measures the mechanism,
not memorised maps; the couplings, roots and rows are fresh random draws in both splits.

Shapes: msa (B, R, C) int64 in [0, A); contacts (B, C, C) bool, symmetric, False on the diagonal.

Example::

    cfg = PairTaskConfig(rows=12, cols=20)
    g = torch.Generator().manual_seed(0)
    msa, contacts = draw_pairs(cfg, g, 32, split="train")     # (32, 12, 20), (32, 20, 20)
    tagged = PairTaskConfig(coupling="tagged")                 # symbols in [0, tagged.n_symbols) = [0, 8)
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import torch
from torch import Tensor

__all__ = ["PairTaskConfig", "SPLITS", "COUPLINGS", "draw_pairs", "draw_contacts", "contact_split", "HASH_BUCKETS"]

SPLITS = ("train", "eval")
COUPLINGS = ("pairwise", "tagged")   # x_j = pi(x_i), or x_j = pi(x_i + row tag): see the module docstring
HASH_BUCKETS = 1000
_HASH_SEED = 20240606          # the split's key table: fixed forever, so a map's split never changes


@dataclass
class PairTaskConfig:
    rows: int = 12              # R sequences per sample: co-variation needs many of them
    cols: int = 20              # C positions
    vocab: int = 4              # A symbols (a nucleotide-sized alphabet keeps chance matches visible)
    min_pairs: int = 2          # contacts per sample, drawn uniformly in [min_pairs, max_pairs]
    max_pairs: int = 5
    min_sep: int = 5            # contacts are long-range: |i - j| >= min_sep
    p_mutate: Optional[float] = None   # per row and site; None: 0.5 (pairwise), 1.0 (tagged, which needs 1).
                                # 0 gives R copies of the root (no signal at all); lower is harder: shared
                                # root symbols look like co-variation (phylogeny)
    noise: float = 0.0          # per row and contact: probability that j ignores the coupling
    eval_fraction: float = 0.1  # share of contact maps (by hash) held out for evaluation
    coupling: str = "pairwise"  # "tagged": the coupling also reads a per-row tag column (three-way only)

    def __post_init__(self):
        if self.coupling not in COUPLINGS:
            raise ValueError(f"coupling={self.coupling!r}; choose one of {COUPLINGS}")
        tagged = self.coupling == "tagged"
        if self.p_mutate is None:
            self.p_mutate = 1.0 if tagged else 0.5
        if tagged and self.p_mutate != 1.0:
            raise ValueError(f"coupling='tagged' draws every site fresh: p_mutate must be 1.0 (or None), got "
                             f"{self.p_mutate}; a shared root would make single columns betray the contacts")
        for name in ("rows", "cols", "min_sep"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.vocab < 2:
            raise ValueError(f"vocab={self.vocab}: co-variation needs at least 2 symbols")
        if not 1 <= self.min_pairs <= self.max_pairs:
            raise ValueError(f"need 1 <= min_pairs <= max_pairs, got min_pairs={self.min_pairs}, "
                             f"max_pairs={self.max_pairs}")
        # Drawing pairs one at a time never gets stuck when the free columns left before the last
        # pair still span min_sep positions.
        need = 2 * self.max_pairs - 1 + self.min_sep
        if self.cols < need:
            raise ValueError(f"cols={self.cols} cannot hold max_pairs={self.max_pairs} contacts at least "
                             f"min_sep={self.min_sep} apart: need cols >= 2*max_pairs - 1 + min_sep = {need}")
        if tagged and self.cols < 2 * self.max_pairs + 1:
            raise ValueError(f"coupling='tagged' needs a column outside every contact for the tag: cols={self.cols} "
                             f"must be >= 2*max_pairs + 1 = {2 * self.max_pairs + 1}")
        for name in ("p_mutate", "noise"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name}={getattr(self, name)} must be a probability in [0, 1]")
        if not 0.0 < self.eval_fraction < 1.0 or round(self.eval_fraction * HASH_BUCKETS) < 1:
            raise ValueError(f"eval_fraction={self.eval_fraction} must be in [{1 / HASH_BUCKETS}, 1)")

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def n_symbols(self) -> int:
        """Symbols a model must embed: the A residues, plus the A tags when ``coupling="tagged"``."""
        return 2 * self.vocab if self.coupling == "tagged" else self.vocab


def _pair_keys(cols: int) -> Tensor:
    """(C, C) int64 random keys, one per column pair, from a fixed seed."""
    g = torch.Generator().manual_seed(_HASH_SEED)
    return torch.randint(0, 2 ** 40, (cols, cols), generator=g)


def contact_split(cfg: PairTaskConfig, contacts: Tensor) -> list[str]:
    """The split ("train" or "eval") of each contact map (B, C, C) bool."""
    if contacts.dim() != 3 or contacts.shape[1:] != (cfg.cols, cfg.cols):
        raise ValueError(f"contacts has shape {tuple(contacts.shape)}; expected (B, {cfg.cols}, {cfg.cols})")
    upper = torch.triu(contacts, diagonal=1).long()                                   # (B, C, C)
    buckets = (upper * _pair_keys(cfg.cols)).sum(dim=(1, 2)) % HASH_BUCKETS           # (B,)
    held = buckets < round(cfg.eval_fraction * HASH_BUCKETS)
    return ["eval" if h else "train" for h in held.tolist()]


def draw_contacts(cfg: PairTaskConfig, generator: torch.Generator) -> Tensor:
    """One contact map (C, C) bool: K disjoint long-range pairs, each drawn uniformly among the valid ones."""
    C = cfg.cols
    i, j = torch.meshgrid(torch.arange(C), torch.arange(C), indexing="ij")
    allowed = (j - i) >= cfg.min_sep                                                  # (C, C) upper, long-range
    k = int(torch.randint(cfg.min_pairs, cfg.max_pairs + 1, (1,), generator=generator))
    free = torch.ones(C, dtype=torch.bool)
    contacts = torch.zeros(C, C, dtype=torch.bool)
    for _ in range(k):
        valid = allowed & free[:, None] & free[None, :]                               # (C, C)
        flat = int(torch.multinomial(valid.flatten().float(), 1, generator=generator))
        a, b = divmod(flat, C)
        contacts[a, b] = contacts[b, a] = True
        free[a] = free[b] = False
    return contacts


def draw_pairs(cfg: PairTaskConfig, generator: torch.Generator, batch_size: int,
               split: str = "train") -> tuple[Tensor, Tensor]:
    """A batch of (msa (B, R, C) int64 in [0, n_symbols), contacts (B, C, C) bool) from ``split``
    ("train" or "eval")."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r}; choose one of {SPLITS}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    B, R, C, A = batch_size, cfg.rows, cfg.cols, cfg.vocab
    maps = []
    while len(maps) < B:                   # rejection: redraw maps of the other split
        m = draw_contacts(cfg, generator)
        if contact_split(cfg, m[None])[0] == split:
            maps.append(m)
    contacts = torch.stack(maps)                                                      # (B, C, C)

    # Each column's "leader": itself, or for the later column j of a contact (i, j), the column i.
    cols = torch.arange(C)
    upper = torch.triu(contacts, diagonal=1)                                          # (B, C, C)
    follower = upper.any(dim=1)                                                       # (B, C): j of some (i, j)
    leader = torch.where(follower, upper.float().argmax(dim=1), cols)                 # (B, C)
    # Couplings: a random permutation of the alphabet per follower column; identity elsewhere.
    perms = torch.rand(B, C, A, generator=generator).argsort(dim=-1)                  # (B, C, A)
    perms = torch.where(follower[..., None], perms, torch.arange(A))                  # (B, C, A)

    root = torch.randint(0, A, (B, 1, C), generator=generator)                        # (B, 1, C)
    mutate = torch.rand(B, R, C, generator=generator) < cfg.p_mutate                  # (B, R, C)
    fresh = torch.randint(0, A, (B, R, C), generator=generator)                       # (B, R, C)
    x = torch.where(mutate, fresh, root)                                              # (B, R, C)
    # A follower copies its leader's mutation (and symbol), through its coupling: the pair is one site.
    lead = leader[:, None, :].expand(B, R, C)                                         # (B, R, C)
    x = x.gather(2, lead)                                                             # (B, R, C) leader symbols
    tagged = cfg.coupling == "tagged"
    if tagged:   # the row's tag shifts what a follower's coupling reads: visible only with the tag column
        tags = torch.randint(0, A, (B, R, 1), generator=generator)                    # (B, R, 1)
        x = torch.where(follower[:, None, :], (x + tags) % A, x)                      # (B, R, C)
    x = perms[:, None].expand(B, R, C, A).gather(3, x[..., None]).squeeze(-1)         # (B, R, C)
    if cfg.noise > 0:
        broken = follower[:, None, :] & (torch.rand(B, R, C, generator=generator) < cfg.noise)
        x = torch.where(broken, torch.randint(0, A, (B, R, C), generator=generator), x)
    if tagged:   # the tag column: one per sample, outside every contact, holding symbols A + t
        free = ~contacts.any(dim=2)                                                   # (B, C)
        where = torch.multinomial(free.float(), 1, generator=generator)               # (B, 1)
        x = x.scatter(2, where[:, None, :].expand(B, R, 1), A + tags)                 # (B, R, C)
    return x, contacts
