"""Sparse attention patterns: the papers' definitions, exact tile kinds, and the tiled kernel on each."""
import itertools
from functools import partial

import pytest
import torch

import attnlab as al
from attnlab.functional import masks
from attnlab.functional.backends.tiled import TileStats, tiled_attention
from attnlab.functional.masks import EMPTY, FULL, PARTIAL
from attnlab.functional.patterns import BIGBIRD_DEFAULT_SEED
from helpers import errors

g = torch.Generator().manual_seed(3)
LAYOUT = torch.rand(2, 4, 5, generator=g) > 0.5                   # per head, for L=13, S=17, block 4

# The papers' definitions, written independently of the library, on query position p and key j.
DEFINITIONS = {
    "strided(4)": (masks.strided(4), lambda p, j: j <= p and (max(0, p - 4) <= j or (p - j) % 4 == 0)),
    "strided(1)": (masks.strided(1), lambda p, j: j <= p),
    "fixed(4,1)": (masks.fixed(4, 1), lambda p, j: j <= p and (j // 4 == p // 4 or j % 4 in {3})),
    "fixed(5,2)": (masks.fixed(5, 2), lambda p, j: j <= p and (j // 5 == p // 5 or j % 5 in {3, 4})),
    "dilated(2,1,3)": (masks.dilated_window(2, 1, 3), lambda p, j: any(j == p + 3 * t for t in range(-2, 2))),
    "dilated(3,0,2)": (masks.dilated_window(3, 0, 2), lambda p, j: any(j == p + 2 * t for t in range(-3, 1))),
    "global(4,{0,6})": (masks.global_window(4, [0, 6]), lambda p, j: abs(p - j) <= 2 or p in (0, 6) or j in (0, 6)),
    "block_sparse": (masks.block_sparse(LAYOUT[0], 4), lambda i, j: bool(LAYOUT[0, i // 4, j // 4])),
}


def _dense_from(pred, L, S, by_row=False):
    off = 0 if by_row else S - L
    return torch.tensor([[pred(i + off, j) for j in range(S)] for i in range(L)], dtype=torch.bool)


def test_worked_examples_from_the_papers():
    # REFERENCES.md section 6: l=4, c=1, i=9; Longformer w=4, n=8, G={0}.
    row = lambda m, n, i: m.dense(n, n)[0, 0, i].nonzero().flatten().tolist()
    assert row(masks.strided(4), 10, 9) == sorted({5, 6, 7, 8, 9} | {1, 5, 9})
    assert row(masks.fixed(4, 1), 10, 9) == sorted({8, 9} | {3, 7})
    assert row(masks.global_window(4, [0]), 8, 5) == [0, 3, 4, 5, 6, 7]
    assert row(masks.global_window(4, [0]), 8, 0) == list(range(8))


@pytest.mark.parametrize("name", list(DEFINITIONS))
@pytest.mark.parametrize("L, S", [(13, 13), (7, 13), (13, 7)])
def test_dense_matches_the_definition(name, L, S):
    m, pred = DEFINITIONS[name]
    if name == "block_sparse" and (L, S) != (13, 13):
        L, S = 13, 17
    want = _dense_from(pred, L, S, by_row=name == "block_sparse")
    got = m.dense(L, S)
    assert got.shape[-2:] == (L, S) and torch.equal(got[0, 0], want), f"{name}: {(got[0, 0] != want).sum()} differ"


def _tile_truth(dense, bq, bk):
    """(nq, nk) kinds by brute force from a (Hm, L, S) dense mask."""
    Hm, L, S = dense.shape
    out = torch.empty(-(-L // bq), -(-S // bk), dtype=torch.int8)
    for a, b in itertools.product(range(out.shape[0]), range(out.shape[1])):
        t = dense[:, a * bq:(a + 1) * bq, b * bk:(b + 1) * bk]
        out[a, b] = FULL if t.all() else EMPTY if not t.any() else PARTIAL
    return out


ALL_PATTERNS = {
    **{k: v[0] for k, v in DEFINITIONS.items() if k != "block_sparse"},
    "fixed(3,0)": masks.fixed(3, 0), "fixed(3,3)": masks.fixed(3, 3), "strided(2)": masks.strided(2),
    "global(0,{})": masks.global_window(0, []), "bigbird(3,1)": masks.bigbird(3, 1),
    "bigbird(4,2,s5)": masks.bigbird(4, 2, seed=5),
}


@pytest.mark.parametrize("name", list(ALL_PATTERNS))
def test_tile_kinds_are_exact(name):
    m = ALL_PATTERNS[name]
    for (L, S), (bq, bk) in itertools.product([(17, 17), (9, 20), (20, 9), (1, 13)],
                                              [(1, 1), (1, 3), (3, 5), (4, 4), (8, 3), (16, 16)]):
        want = _tile_truth(m.dense(L, S).expand(1, -1, L, S)[0], bq, bk)
        got = m.tile_kinds(L, S, bq, bk)
        assert got.shape == (1,) + want.shape and torch.equal(got[0], want), f"{name} L={L} S={S} {bq}x{bk}"


def test_per_head_block_layout():
    m = masks.block_sparse(LAYOUT, 4)
    d = m.dense(13, 17)
    assert d.shape == (1, 2, 13, 17)
    for h in range(2):
        assert torch.equal(d[0, h], _dense_from(lambda i, j: bool(LAYOUT[h, i // 4, j // 4]), 13, 17, by_row=True))
    # A tile is empty only if it is empty for every head, full only if full for every head.
    assert torch.equal(m.tile_kinds(13, 17, 3, 5)[0], _tile_truth(d[0], 3, 5))


def test_bigbird_structure_and_seed():
    nb, r = 10, 2
    lay = masks.bigbird(4, r).dense(4 * nb, 4 * nb)[0, 0, ::4, ::4]   # (nb, nb) block layout
    assert lay[0].all() and lay[-1].all() and lay[:, 0].all() and lay[:, -1].all()
    for I in range(1, nb - 1):
        assert lay[I, I - 1:I + 2].all()
        assert int(lay[I].sum()) == len({I - 1, I, I + 1, 0, nb - 1}) + r, f"row {I}: {lay[I].nonzero().flatten()}"
    # No seed: a fixed default, the same in every instance; another seed draws other blocks.
    again = masks.bigbird(4, r).dense(4 * nb, 4 * nb)[0, 0, ::4, ::4]
    seeded = masks.bigbird(4, r, seed=BIGBIRD_DEFAULT_SEED)
    assert torch.equal(lay, again)
    assert torch.equal(lay, seeded.dense(4 * nb, 4 * nb)[0, 0, ::4, ::4])
    assert not torch.equal(lay, masks.bigbird(4, r, seed=1).dense(4 * nb, 4 * nb)[0, 0, ::4, ::4])


def test_patterns_compose_and_follow_query_positions():
    m = masks.global_window(2, [1]) & masks.causal()
    d = m.dense(6, 6)[0, 0]
    assert d[1].tolist() == [True, True, False, False, False, False]     # a global query, but causal
    assert d[5].tolist() == [False, True, False, False, True, True]      # |5 - j| <= 1, or the global key 1
    # Decoding (L=1) sees the last row of the full pattern.
    for p in (masks.strided(3), masks.fixed(4, 1), masks.bigbird(2, 1), masks.dilated_window(2, 2, 2)):
        assert torch.equal(p.dense(1, 11)[0, 0, 0], p.dense(11, 11)[0, 0, -1]), repr(p)


@pytest.mark.parametrize("bad, err", [
    (lambda: masks.strided(0), "stride=0"),
    (lambda: masks.fixed(4, 5), "c=5"),
    (lambda: masks.fixed(4, -1), "c=-1"),
    (lambda: masks.dilated_window(-1, 2), "left=-1"),
    (lambda: masks.dilated_window(2, 2, 0), "dilation=0"),
    (lambda: masks.global_window(3, [0]), "w=3 is odd"),
    (lambda: masks.global_window(4, [-1]), "global ids"),
    (lambda: masks.bigbird(0, 3), "block=0"),
    (lambda: masks.bigbird(4, -1), "n_random=-1"),
    (lambda: masks.block_sparse(LAYOUT.int(), 4), "must be a bool tensor"),
    (lambda: masks.block_sparse(LAYOUT[0, 0], 4), "expected"),
])
def test_bad_parameters_are_rejected(bad, err):
    with pytest.raises((ValueError, TypeError), match=err):
        bad()


@pytest.mark.parametrize("mask, L, err", [
    (masks.block_sparse(LAYOUT[0], 4), 17, r"needs \(ceil\(L/block\), ceil\(S/block\)\) = \(5, 5\)"),
    (masks.block_sparse(LAYOUT[0], 5), 13, "does not fit"),
    (masks.block_sparse(torch.ones(3, 4, 5, dtype=torch.bool), 4), 13, "3 heads"),
    (masks.global_window(2, [20]), 13, "global id 20"),
])
def test_masks_that_do_not_fit_the_problem(mask, L, err):
    q = torch.randn(1, 2, L, 8)
    k = torch.randn(1, 2, 17, 8)
    with pytest.raises(ValueError, match=err):
        al.attention(q, k, k, mask=mask)


TILED_CASES = {
    "strided": masks.strided(5), "fixed": masks.fixed(6, 2), "dilated": masks.dilated_window(4, 4, 3),
    "global": masks.global_window(4, [0, 9]), "bigbird": masks.bigbird(6, 1),
    "bigbird&causal": masks.bigbird(4, 2) & masks.causal(),
}


@pytest.mark.parametrize("name", list(TILED_CASES))
@pytest.mark.parametrize("H, Hkv, L, S", [(4, 2, 37, 37), (2, 1, 20, 45), (2, 2, 45, 20)])
def test_tiled_equals_reference_and_skips(name, H, Hkv, L, S):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, n, 16, generator=g) for h, n in ((H, L), (Hkv, S), (Hkv, S)))
    mask = TILED_CASES[name]
    for part, (cand, ref) in errors(partial(tiled_attention, tile_q=8, tile_k=16), q, k, v, None, mask).items():
        assert cand <= 3 * ref + 1e-6, f"{name} {part}: {cand:.2e} vs reference {ref:.2e}"
    stats = TileStats()
    tiled_attention(q, k, v, mask=mask, scale=0.25, tile_q=8, tile_k=16, stats=stats)
    kinds = mask.tile_kinds(L, S, 8, 16)
    assert stats.tiles_skipped == int((kinds == EMPTY).sum()) * (2 if kinds.shape[0] == 2 else 1)
