"""The sparse backend: equal to the reference on every pattern and mask, and it really skips blocks."""
from functools import partial

import pytest
import torch

import attnlab as al
from attnlab.functional import FunctionBias, masks
from attnlab.functional.backends.reference import reference_attention
from attnlab.functional.backends.sparse import SparseStats, sparse_attention
from attnlab.functional.masks import EMPTY
from attnlab.functional.patterns import BigBirdMask
from helpers import CASES, FLOOR, errors, make_inputs, make_mask

PATTERNS = {
    "strided": lambda: masks.strided(5), "fixed": lambda: masks.fixed(6, 2),
    "dilated": lambda: masks.dilated_window(3, 2, 2), "global": lambda: masks.global_window(4, [0, 5]),
    "bigbird": lambda: masks.bigbird(4, 1), "bigbird&padding": lambda: masks.bigbird(4, 1) & masks.padding([30, 9]),
    "window": lambda: masks.window(5, 3),
}
# Small blocks so that several chunks, padding slots and partial blocks occur on small shapes.
SMALL = partial(sparse_attention, tile_q=4, tile_k=8)


def _check(errs, what, k_out=2.0, k_grad=3.0, floor=1e-6):
    for part, (cand, ref) in errs.items():
        k = k_out if part == "out" else k_grad
        assert cand <= k * ref + floor, f"{what} {part}: sparse {cand:.2e} vs reference {ref:.2e}"


@pytest.mark.parametrize("name", list(PATTERNS))
@pytest.mark.parametrize("case", CASES, ids=str)
def test_patterns_match_reference(name, case):
    if name == "bigbird&padding" and case.B != 2:
        pytest.skip("padding lengths are for B=2")
    q, k, v, bias = make_inputs(case, torch.float32)
    _check(errors(SMALL, q, k, v, bias, PATTERNS[name]()), f"{name} {case}")


@pytest.mark.parametrize("kind", ["none", "causal", "padding", "documents", "dense", "fully_masked"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_existing_masks_match_reference(kind, dtype):
    case = CASES[3]                                               # GQA, L > S, bias
    q, k, v, bias = make_inputs(case, dtype)
    mask = make_mask(kind, case.B, case.H, case.L, case.S)
    _check(errors(SMALL, q, k, v, bias, mask), f"{kind} {dtype}", floor=FLOOR[dtype])


def test_float64_and_default_blocks():
    q, k, v, bias = make_inputs(CASES[5], torch.float64)
    _check(errors(sparse_attention, q, k, v, bias, masks.bigbird(16, 1)), "fp64", floor=1e-12)
    _check(errors(sparse_attention, q, k, v, bias, masks.strided(7)), "fp64", floor=1e-12)


def test_gradcheck_with_bias():
    g = torch.Generator().manual_seed(0)
    q, k, v, bias = (torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True)
                     for s in ((2, 2, 6, 3), (2, 1, 9, 3), (2, 1, 9, 2), (1, 2, 1, 9)))
    mask = masks.fixed(4, 1) & masks.padding([9, 5])
    fn = lambda q, k, v, b: sparse_attention(q, k, v, mask=mask, bias=b, scale=0.4, tile_q=4, tile_k=4)
    assert torch.autograd.gradcheck(fn, (q, k, v, bias))


def test_structured_bias_and_dropout_equal_reference():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, n, 8, generator=g, dtype=torch.float64, requires_grad=True) for n in (30, 26, 26))
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], dtype=torch.float64, requires_grad=True)
    alibi = FunctionBias(lambda i, j, s: -s.view(-1, 1, 1) * (i - j).abs(), slopes)
    kw = dict(mask=masks.global_window(4, [2]), bias=alibi, scale=0.3, dropout_p=0.25, dropout_seed=11)
    out = sparse_attention(q, k, v, tile_q=8, tile_k=8, **kw)
    ref = reference_attention(q, k, v, **kw)
    torch.testing.assert_close(out, ref)
    dout = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v, slopes), dout),
                    torch.autograd.grad(ref, (q, k, v, slopes), dout)):
        torch.testing.assert_close(a, b)


def test_weights_equal_reference():
    q, k, v, bias = make_inputs(CASES[2], torch.float64)           # MQA, L < S
    mask = masks.dilated_window(2, 3, 2)
    out, w = sparse_attention(q, k, v, mask=mask, bias=None, scale=0.3, tile_q=4, tile_k=8, return_weights=True)
    ref, w_ref = reference_attention(q, k, v, mask=mask, scale=0.3, return_weights=True)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(w, w_ref)


def test_fully_masked_rows_give_zero_and_finite_grads():
    q, k, v = (torch.randn(1, 2, 12, 8, requires_grad=True) for _ in range(3))
    layout = torch.zeros(3, 3, dtype=torch.bool)
    layout[1:, :2] = True                                         # query block 0 sees nothing
    out = sparse_attention(q, k, v, mask=masks.block_sparse(layout, 4), scale=0.3, tile_q=4, tile_k=4)
    assert (out[:, :, :4] == 0).all()
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    assert (q.grad[:, :, :4] == 0).all() and (k.grad[:, :, 8:] == 0).all()


@pytest.mark.parametrize("mask", [masks.window(64, 64), masks.bigbird(32, 2), masks.global_window(16, [0, 500]),
                                  masks.padding([700, 300]) & masks.strided(64)], ids=repr)
def test_only_non_empty_blocks_are_computed(mask):
    B, H, n = 2, 2, 1000
    q = torch.randn(B, H, n, 8)
    stats = SparseStats()
    out = al.functional.get_backend("sparse").fn(q, q, q, mask=mask, scale=0.3, stats=stats)
    bq, bk = (32, 32) if isinstance(mask, BigBirdMask) else (64, 64)
    kinds = mask.tile_kinds(n, n, bq, bk)
    assert stats.blocks_computed == int((kinds != EMPTY).sum())
    assert stats.blocks_total == kinds.numel()
    assert stats.blocks_masked == int((kinds == 1).sum())
    if not isinstance(mask, masks.AndMask):                       # (strided is dense-ish at block level)
        assert stats.scores < 0.5 * B * n * n, f"computed {stats.scores} of {B * n * n} scores"
    torch.testing.assert_close(out, reference_attention(q, q, q, mask=mask, scale=0.3), atol=2e-5, rtol=1e-4)


def test_long_window_never_forms_an_n_by_n_tensor():
    n = 32768
    q = torch.randn(1, 1, n, 16)
    stats = SparseStats()
    out = sparse_attention(q, q, q, mask=masks.window(64, 64), scale=0.25, stats=stats)
    assert out.shape == (1, 1, n, 16) and torch.isfinite(out).all()
    assert stats.scores <= n * 4 * 64                             # at most 4 key blocks of 64 per query
    ref = reference_attention(q[:, :, :320], q[:, :, :320], q[:, :, :320], mask=masks.window(64, 64),
                              scale=0.25)[:, :, :256]
    torch.testing.assert_close(out[:, :, :256], ref, atol=2e-5, rtol=1e-4)


def test_named_backend_through_attention():
    q, k, v, _ = make_inputs(CASES[1], torch.float32)
    out = al.attention(q, k, v, mask=al.masks.strided(4), backend="sparse")
    ref = al.attention(q, k, v, mask=al.masks.strided(4), backend="reference")
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    assert "sparse" in al.available_backends()


@pytest.mark.parametrize("kw, err", [(dict(tile_q=0), "tile_q=0"), (dict(tile_k=2.5), "tile_k=2.5")])
def test_bad_block_sizes(kw, err):
    q = torch.randn(1, 1, 8, 4)
    with pytest.raises(ValueError, match=err):
        sparse_attention(q, q, q, scale=0.5, **kw)


def test_auto_picks_sparse_only_for_large_block_layouts():
    big, small = torch.randn(1, 1, 8192, 8), torch.randn(1, 1, 2048, 8)
    pick = lambda q, m, **kw: al.explain(q, q, q, mask=m, **kw).splitlines()[1]
    assert pick(big, masks.bigbird(64, 3)).startswith("auto -> sparse")
    assert pick(big, masks.block_sparse(torch.eye(128, dtype=torch.bool), 64) & masks.causal()) \
        .startswith("auto -> sparse")
    assert pick(big, masks.window(128, 128)).startswith("auto -> native")         # bands: the kernels measured faster
    assert pick(small, masks.bigbird(64, 3)).startswith("auto -> native")          # below the measured crossover
    assert pick(big, masks.bigbird(64, 3), bias=torch.zeros(1, 1, 1, 8192)).startswith("auto -> native")


def test_per_head_block_layout_with_gqa():
    g = torch.Generator().manual_seed(4)
    layout = torch.rand(4, 5, 4, generator=g) > 0.6                 # (H, ceil(19/4), ceil(13/4))
    q = torch.randn(2, 4, 19, 8, generator=g)
    k, v = torch.randn(2, 2, 13, 8, generator=g), torch.randn(2, 2, 13, 8, generator=g)
    _check(errors(SMALL, q, k, v, None, masks.block_sparse(layout, 4)), "per-head layout")
