"""Structured masks: dense form is right, composition is AND, tile kinds agree with the dense form."""
import pytest
import torch

import attnlab as al
from attnlab.functional import masks, tiles
from attnlab.functional.masks import EMPTY, FULL, PARTIAL


def brute_kinds(dense: torch.Tensor, L, S, bq, bk):
    """Tile kinds from a (Bm, Hm, L, S) dense mask by looking at every entry."""
    dense = dense.expand(-1, -1, L, S)
    out = torch.empty(dense.shape[0], -(-L // bq), -(-S // bk), dtype=torch.int8)
    for b in range(dense.shape[0]):
        for i in range(out.shape[1]):
            for j in range(out.shape[2]):
                t = dense[b, :, i * bq:(i + 1) * bq, j * bk:(j + 1) * bk]
                out[b, i, j] = FULL if t.all() else EMPTY if not t.any() else PARTIAL
    return out


def all_masks(B=2, H=3, S=23):
    g = torch.Generator().manual_seed(0)
    ids = torch.tensor([[0] * 5 + [1] * 9 + [2] * 9, [0] * 12 + [1] * 11])
    return {
        "causal": masks.causal(),
        "window": masks.window(4, 2),
        "window_left_unbounded": masks.window(None, 1),
        "padding": masks.padding(torch.tensor([23, 7])),
        "documents": masks.documents(ids),
        "documents_1d": masks.documents(ids[0]),
        "dense": masks.dense(torch.rand(B, H, 1, S, generator=g) > 0.3),
        "causal&padding": masks.causal() & masks.padding(torch.tensor([3, 20])),
        "window&documents": masks.window(3, 3) & masks.documents(ids),
        "padding_left": masks.padding(torch.tensor([23, 7]), side="left"),
        "causal&padding_left": masks.causal() & masks.padding(torch.tensor([3, 20]), side="left"),
        "varlen_causal": masks.varlen(torch.tensor([0, 5, 14, 23]), causal=True),
        "varlen_window_qk": masks.varlen(torch.tensor([[0, 4, 9, 9], [0, 1, 2, 9]]),
                                         torch.tensor([[0, 8, 15, 23], [0, 11, 20, 20]]), window=(2, 1)),
        "padded_left_causal": masks.padded(torch.tensor([9, 4]), torch.tensor([23, 11]), side="left", causal=True),
        "padded_right_window": masks.padded(torch.tensor([9, 0]), torch.tensor([17, 3]), window=(3, 0)),
    }


SEQUENCE_MASKS = ["varlen_causal", "varlen_window_qk", "padded_left_causal", "padded_right_window"]


@pytest.mark.parametrize("name", list(all_masks()))
@pytest.mark.parametrize("L, S", [(23, 23), (9, 23), (30, 23), (1, 23)])
@pytest.mark.parametrize("bq, bk", [(4, 8), (5, 3), (64, 64)])
def test_tile_kinds_agree_with_dense(name, L, S, bq, bk):
    m = all_masks()[name]
    kinds = m.tile_kinds(L, S, bq, bk)
    want = brute_kinds(m.dense(L, S), L, S, bq, bk)
    # A structured mask may call a tile PARTIAL when it is really empty or full (conservative),
    # but never EMPTY or FULL wrongly: that would drop or mis-mask real work.
    k = kinds.expand_as(want)
    assert ((k == EMPTY) <= (want == EMPTY)).all(), f"{name}: wrongly EMPTY tiles"
    assert ((k == FULL) <= (want == FULL)).all(), f"{name}: wrongly FULL tiles"
    if name in ("causal", "window", "padding", "window_left_unbounded", "dense", "padding_left",
                *SEQUENCE_MASKS):
        assert (k == want).all(), f"{name}: classification not exact"


@pytest.mark.parametrize("little_endian", [True, False], ids=["numpy_packbits", "torch_fallback"])
@pytest.mark.parametrize("L, S", [(70, 200), (128, 256), (1, 64), (33, 130)])
@pytest.mark.parametrize("bq, bk", [(16, 64), (64, 128), (32, 192), (8, 48)])
def test_dense_tile_kinds_are_exact_on_words(L, S, bq, bk, little_endian, monkeypatch):
    """A dense mask's kinds from its bit-packed words (tile_k a multiple of 64) or its bools (else): exact,
    at S off a word's edge, over heads (Hm = 3) and a broadcast head (Hm = 1); with whole tiles allowed, none
    allowed, and one pair off in an allowed tile."""
    monkeypatch.setattr(tiles, "_LITTLE_ENDIAN", little_endian)
    g = torch.Generator().manual_seed(L * S + bq + bk)
    for Hm in (3, 1):
        m = torch.rand(2, Hm, L, S, generator=g) > 0.4                   # (Bm, Hm, L, S)
        blocks = torch.rand(2, 1, -(-L // bq), -(-S // bk), generator=g)
        blocks[1, 0, 0, 0], blocks[1, 0, -1, -1] = 0.0, 0.9                # at least one FULL and one EMPTY tile
        whole = blocks.repeat_interleave(bq, 2).repeat_interleave(bk, 3)[:, :, :L, :S]
        m = (m | (whole < 0.3)) & (whole < 0.7)                            # FULL and EMPTY tiles among PARTIAL ones
        m[0, 0, -1, -1] = not bool(m[0, 0, -1, -1])                        # the last key of a word off S's edge
        want = brute_kinds(m, L, S, bq, bk)
        assert {EMPTY, FULL} <= set(want.flatten().tolist()) or blocks[0, 0].numel() == 1
        assert torch.equal(tiles.dense_tile_kinds(m, L, S, bq, bk), want)


@pytest.mark.parametrize("S", [1, 63, 64, 65, 130])
@pytest.mark.parametrize("Hb", [1, 3])
def test_bit_spans_are_each_rows_first_and_last_allowed_key(S, Hb):
    """Over heads, from the words: a row with none ([0, 0)), with all, with only its last or first key, with
    bit 63 of a word (the int64's sign), and sparse rows."""
    g = torch.Generator().manual_seed(S * Hb)
    m = torch.rand(2, Hb, 12, S, generator=g) > 0.9                          # (Bb, Hb, L, S)
    m[:, :, 0], m[:, :, 1] = False, True
    m[:, :, 2], m[:, :, 3] = False, False
    m[:, -1, 2, -1], m[:, 0, 3, 0] = True, True                              # in one head only
    m[:, :, 4], m[:, :, 4, min(63, S - 1)] = False, True
    want = torch.zeros(2, 12, 1, 2, dtype=torch.long)
    for b in range(2):
        for i in range(12):
            keys = m[b, :, i].any(0).nonzero().flatten()
            if len(keys):
                want[b, i, 0] = torch.stack([keys[0], keys[-1] + 1])
    assert torch.equal(tiles.bit_spans(tiles.pack_bits(m)), want)


@pytest.mark.parametrize("name", list(all_masks()))
def test_tiles_are_slices_of_dense(name):
    m = all_masks()[name]
    L, S = 17, 23
    full = m.dense(L, S).expand(2, -1, L, S)
    tile = m.tile(3, 11, 5, 20, L, S).expand(2, -1, 8, 15)
    assert torch.equal(tile, full[:, :, 3:11, 5:20])


def test_block_is_a_deprecated_alias_of_tile():
    m = masks.causal() & masks.window(3, 0)
    with pytest.warns(DeprecationWarning, match="Mask.tile"):
        old = m.block(2, 9, 1, 7, 11, 13)
    with pytest.warns(DeprecationWarning, match="Mask.tile_key"):
        old_key = m.block_key(2, 9, 1, 7, 11, 13)
    assert torch.equal(old, m.tile(2, 9, 1, 7, 11, 13)) and old_key == m.tile_key(2, 9, 1, 7, 11, 13)


def test_a_mask_written_with_the_old_names_still_works():
    """A third-party subclass that defines block / block_key (the names before "tile") keeps working."""
    with pytest.warns(DeprecationWarning, match="old name of Mask.tile"):
        class OldEvenKeys(masks.Mask):
            def block(self, r0, r1, c0, c1, L, S):
                return (torch.arange(c0, c1) % 2 == 0)[None, None, None]          # (1, 1, 1, lc)

            def block_key(self, r0, r1, c0, c1, L, S):
                return ("even", r1 - r0, c0 % 2, c1 - c0)

            def tile_kinds(self, L, S, block_q, block_k):
                return torch.full((1, -(-L // block_q), -(-S // block_k)), PARTIAL, dtype=torch.int8)

    m = OldEvenKeys() & masks.causal()
    want = (torch.arange(9)[None, :] % 2 == 0) & masks.causal().dense(6, 9)[0, 0]
    assert torch.equal(m.dense(6, 9)[0, 0], want)
    assert m.tile_key(0, 4, 2, 6, 6, 9) == (("even", 4, 0, 4), ("causal", 4, 4, 1))
    q = torch.randn(1, 2, 6, 4, dtype=torch.float64)
    k, v = torch.randn(2, 1, 2, 9, 4, dtype=torch.float64)
    out = al.attention(q, k, v, mask=m, backend="tiled")
    ref = al.attention(q, k, v, mask=masks.dense(want), backend="reference")
    torch.testing.assert_close(out, ref)


def test_an_old_subclass_of_a_built_in_mask_can_call_super_block():
    with pytest.warns(DeprecationWarning):
        class CausalNotFirst(masks.CausalMask):
            def block(self, r0, r1, c0, c1, L, S):
                return super().block(r0, r1, c0, c1, L, S) & (torch.arange(c0, c1) > 0)

    with pytest.warns(DeprecationWarning, match="Mask.block is deprecated"):
        d = CausalNotFirst().dense(4, 4)[0, 0]
    assert d.int().tolist() == [[0, 0, 0, 0], [0, 1, 0, 0], [0, 1, 1, 0], [0, 1, 1, 1]]


def test_tile_helpers():
    r0, r1, c0, c1 = tiles.tile_bounds(10, 7, 4, 3)
    assert (r0.flatten().tolist(), r1.flatten().tolist()) == ([0, 4, 8], [4, 8, 10])
    assert (c0.flatten().tolist(), c1.flatten().tolist()) == ([0, 3, 6], [3, 6, 7])
    got = tiles.classify(torch.tensor([[True], [False], [False]]), torch.tensor([[True, False]]))
    assert got.dtype == torch.int8 and got.tolist() == [[EMPTY, EMPTY], [FULL, PARTIAL], [FULL, PARTIAL]]
    x = torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])
    assert tiles.tile_reduce(x, 2, 99, torch.amin).tolist() == [[1, 1, 5], [2, 5, 3]]
    a = tiles.interval_spans(torch.tensor([0, 2, 5]), torch.tensor([4, 1, 9]))     # (1, 3, 1, 2); hi >= lo
    assert a.tolist() == [[[[0, 4]], [[2, 2]], [[5, 9]]]]
    b = torch.tensor([[[[1, 2], [3, 9]]] * 3])                                    # (1, 3, 2, 2)
    assert tiles.intersect_spans(a, b)[0, 2].tolist() == [[5, 5], [5, 9]]


def test_mask_modules_do_not_import_back():
    """tiles <- mask_base <- {patterns, varlen} <- masks: the helpers never import the namespace."""
    import ast
    import pathlib
    root = pathlib.Path(masks.__file__).parent
    for name in ("tiles", "mask_base", "patterns", "varlen"):
        tree = ast.parse((root / f"{name}.py").read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1}
        assert "masks" not in imported, f"functional/{name}.py imports .masks: that makes a cycle"


def test_dense_values():
    assert masks.causal().dense(3, 3)[0, 0].tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert masks.window(1, 0).dense(4, 4)[0, 0].int().tolist() == \
        [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
    assert masks.padding([2, 3]).dense(1, 4)[:, 0, 0].int().tolist() == [[1, 1, 0, 0], [1, 1, 1, 0]]
    d = masks.documents(torch.tensor([0, 0, 1, 1, 1])).dense(5, 5)[0, 0].int()
    assert d.tolist() == [[1, 1, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 1, 1], [0, 0, 1, 1, 1], [0, 0, 1, 1, 1]]
    # queries of a KV-cache step take the ids of the last positions
    assert masks.documents(torch.tensor([0, 0, 1])).dense(1, 3)[0, 0].int().tolist() == [[0, 0, 1]]


def test_and_is_intersection():
    a, b = masks.causal(), masks.window(2, 2)
    assert torch.equal((a & b).dense(6, 6), a.dense(6, 6) & b.dense(6, 6))


@pytest.mark.parametrize("bad, err", [
    (lambda: masks.padding(torch.tensor([1.5])), ValueError),
    (lambda: masks.padding(torch.tensor([-1, 2])), ValueError),
    (lambda: masks.window(-1, 0), ValueError),
    (lambda: masks.window(2.5, 0), ValueError),
    (lambda: masks.documents(torch.rand(4)), ValueError),
    (lambda: masks.dense(torch.ones(3, 3)), TypeError),
    (lambda: masks.padding([2, 3]) & masks.padding([1, 2, 3]), ValueError),
])
def test_bad_masks_are_rejected(bad, err):
    with pytest.raises(err):
        bad()


@pytest.mark.parametrize("name", list(all_masks()))
@pytest.mark.parametrize("L, S", [(23, 23), (9, 23), (30, 23), (1, 23)])
def test_row_spans_agree_with_dense(name, L, S):
    m = all_masks()[name]
    try:
        m.check(2, 3, L, S)
    except ValueError:
        pytest.skip("mask does not fit this shape")
    spans = m.row_spans(L, S)
    if spans is None:
        return
    assert spans.dtype == torch.int64 and spans.dim() == 4 and spans.shape[1] == L
    lo, hi = spans[..., 0], spans[..., 1]
    assert ((0 <= lo) & (lo <= hi) & (hi <= S)).all()
    j = torch.arange(S)
    from_spans = ((j >= lo[..., None]) & (j < hi[..., None])).any(2)          # (Bm, L, S)
    want = m.dense(L, S).expand(-1, 3, L, S)
    assert torch.equal(from_spans[:, None].expand_as(want), want), name


def test_left_padding_values():
    m = masks.padding([2, 3], side="left")
    assert m.dense(1, 4)[:, 0, 0].int().tolist() == [[0, 0, 1, 1], [0, 1, 1, 1]]
    assert repr(m) == "padding([2, 3], side='left')"
    # with causal (bottom-right) a left-padded query row sees its own sequence's past only
    d = (masks.causal() & m).dense(4, 4)[1, 0].int().tolist()
    assert d == [[0, 0, 0, 0], [0, 1, 0, 0], [0, 1, 1, 0], [0, 1, 1, 1]]


def test_varlen_is_flash_attention_alignment():
    """Each sequence's last query sees its own last key (causal aligned per sequence, not to S)."""
    # two sequences: 2 queries over 4 keys, then 3 queries over 3 keys (packed q: 5 rows, k: 7 keys)
    m = masks.varlen(torch.tensor([0, 2, 5]), torch.tensor([0, 4, 7]), causal=True)
    d = m.dense(5, 7)[0, 0].int().tolist()
    assert d == [[1, 1, 1, 0, 0, 0, 0],
                 [1, 1, 1, 1, 0, 0, 0],
                 [0, 0, 0, 0, 1, 0, 0],
                 [0, 0, 0, 0, 1, 1, 0],
                 [0, 0, 0, 0, 1, 1, 1]]
    p = masks.padded(torch.tensor([2, 3]), torch.tensor([4, 3]), window=(1, 0))
    # example 0: 2 queries end-aligned to 4 keys (row 2 is padding); example 1: 3 over 3
    assert p.dense(3, 4)[:, 0].int().tolist() == [[[0, 1, 1, 0], [0, 0, 1, 1], [0, 0, 0, 0]],
                                                   [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0]]]


@pytest.mark.parametrize("bad", [
    lambda: masks.padding([1, 2], side="middle"),
    lambda: masks.varlen(torch.tensor([1, 3])),
    lambda: masks.varlen(torch.tensor([0, 3, 2])),
    lambda: masks.varlen(torch.tensor([0, 3]), torch.tensor([0, 1, 2])),
    lambda: masks.varlen(torch.tensor([0.0, 3.0])),
    lambda: masks.varlen(torch.tensor([0, 3]), window=(-1, 0)),
    lambda: masks.varlen(torch.tensor([0, 3]), window=4),
    lambda: masks.padded(torch.tensor([1, 2]), torch.tensor([1])),
    lambda: masks.padded(torch.tensor([1, -2])),
    lambda: masks.padded(torch.tensor([1, 2]), side="top"),
])
def test_bad_sequence_masks_are_rejected(bad):
    with pytest.raises(ValueError):
        bad()


def test_sequence_masks_check_their_extent():
    with pytest.raises(ValueError, match="need 9 queries"):
        masks.varlen(torch.tensor([0, 3, 9])).check(1, 1, 8, 8)
    with pytest.raises(ValueError, match="need 5 queries"):
        masks.padded(torch.tensor([5, 2]), side="left").check(2, 1, 4, 4)


def test_kernels_still_take_block_q_and_block_k_with_a_warning():
    from attnlab.functional.backends.native import native_attention
    from attnlab.functional.backends.sparse import sparse_attention
    from attnlab.functional.backends.tiled import tiled_attention
    q = torch.randn(1, 2, 12, 4)
    for kernel in (tiled_attention, sparse_attention, native_attention):
        want = kernel(q, q, q, mask=masks.causal(), scale=0.5, tile_q=4, tile_k=64)
        with pytest.warns(FutureWarning, match="block_q=.*deprecated.*tile_q"):
            got = kernel(q, q, q, mask=masks.causal(), scale=0.5, block_q=4, tile_k=64)
        assert torch.equal(got, want)
        with pytest.raises(TypeError, match="block_k= and tile_k="):
            kernel(q, q, q, scale=0.5, block_k=64, tile_k=64)
