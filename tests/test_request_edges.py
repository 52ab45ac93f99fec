"""Edges of a request that used to slip through (issue #26, items 2, 4, 5, 7, 8).

* a bias keeps its own precision on every path, or the backend refuses it (sdpa would round a
  structured bias to bf16);
* empty sizes: L = 0 or S = 0 with every structured bias and with bigbird give an empty output
  or zeros; D = 0 / Dv = 0 are refused in validation;
* torch.compile(fullgraph=True, dynamic=True) on sdpa, and on auto with a mask;
* memory is estimated before any work: a request whose materializations exceed the memory the device
  has available is refused at once with a MemoryError naming the figure and the fix. The sizes are chosen
  so that even the code before the check failed fast (a raw allocator error, asking for more than
  this machine's RAM), never allocating gigabytes;
* transformers' attention-implementation names that transformers would read as its own are refused.
"""
from __future__ import annotations

import re

import pytest
import torch

import attnlab as al
from attnlab.functional import available_backends, masks
from attnlab.functional.bias import relative_table
from attnlab.positional.alibi import AlibiBias
from attnlab.positional.shaw import ShawRelative
from attnlab.positional.t5 import T5Bias

EXACT = [b for b in ("reference", "sdpa", "tiled", "sparse", "native") if b in available_backends()]


def _rand(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _err(out, gold) -> float:
    return (out.double() - gold).abs().max().item()


# -- item 2: a bias keeps its precision, or the backend refuses it ---------------------------------------------

def _bf16_alibi_problem():
    """bf16 inputs, ALiBi slopes 0.3, L = 512, S = 256: rounding the bias to bf16 costs ~0.28 of error."""
    H, L, S, D = 2, 512, 256, 32
    q, k, v = _rand(1, H, L, D, seed=1), _rand(1, H, S, D, seed=2), _rand(1, H, S, D, seed=3)
    return q, k, v, AlibiBias(torch.full((H,), 0.3))


def test_sdpa_refuses_a_structured_bias_it_would_round():
    q, k, v, alibi = _bf16_alibi_problem()
    with pytest.raises(ValueError, match=r"backend 'sdpa' cannot compute this request: .*rounding the "
                                         r"torch.float32 values of AlibiBias.*use tiled, native or reference"):
        al.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), bias=alibi, backend="sdpa")
    assert "cannot compute this request" in al.explain(q.bfloat16(), k.bfloat16(), v.bfloat16(), bias=alibi,
                                                       backend="sdpa")


@pytest.mark.parametrize("backend", ["auto"] + [b for b in EXACT if b != "sdpa"])
@pytest.mark.parametrize("kind", ["structured", "fp32 tensor"])
def test_a_bias_keeps_its_precision_on_every_path(backend, kind):
    """bf16 candidate vs fp64 gold, within 2x of the bf16 reference (which adds the bias in fp32)."""
    q, k, v, alibi = _bf16_alibi_problem()
    bias = alibi if kind == "structured" else alibi.dense(q.shape[2], k.shape[2]).float()
    gold = al.attention(q.double(), k.double(), v.double(), bias=alibi, backend="reference")
    qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
    ref_err = _err(al.attention(qb, kb, vb, bias=bias, backend="reference"), gold)
    out_err = _err(al.attention(qb, kb, vb, bias=bias, backend=backend), gold)
    assert out_err <= 2 * ref_err, f"{backend}: {out_err=:.3e} vs {ref_err=:.3e}"


def test_sdpa_still_takes_a_structured_bias_already_in_q_dtype():
    """Shaw's key term is computed from q, in q's dtype: SDPA loses nothing and stays runnable."""
    q, k, v = (_rand(1, 2, 32, 16, seed=s, dtype=torch.bfloat16) for s in range(3))
    bias = ShawRelative(16, 4).bias(q, 32, 32, scale=0.25)
    ref = al.attention(q, k, v, bias=bias, backend="reference")
    out = al.attention(q, k, v, bias=bias, backend="sdpa")
    assert _err(out, ref.double()) <= 0.05


# -- item 4: empty sizes -----------------------------------------------------------------------------------------

def _bias(kind: str, q, L: int, S: int, H: int):
    if kind == "alibi":
        return AlibiBias(torch.full((H,), 0.3))
    if kind == "t5":
        return T5Bias(H).bias()
    return ShawRelative(q.shape[-1], 4).bias(q, L, S, scale=0.3)


@pytest.mark.parametrize("backend", ["auto"] + EXACT)
@pytest.mark.parametrize("kind", ["alibi", "t5", "shaw"])
@pytest.mark.parametrize("L, S", [(0, 5), (5, 0), (0, 0)])
def test_empty_sizes_with_a_structured_bias(backend, kind, L, S):
    H, D = 2, 8
    q, k, v = _rand(1, H, L, D), _rand(1, H, S, D, seed=1), _rand(1, H, S, D, seed=2)
    out = al.attention(q, k, v, bias=_bias(kind, q, L, S, H), backend=backend)
    assert out.shape == (1, H, L, D) and not out.any()          # S = 0: nothing to attend to -> zeros


@pytest.mark.parametrize("L, S", [(0, 5), (5, 0), (0, 0)])
def test_relative_table_of_empty_sizes_stays_tied_to_its_params(L, S):
    slopes = torch.full((2,), 0.3, requires_grad=True)
    table = relative_table(AlibiBias(slopes), L, S)
    assert table.shape == (1, 2, max(L + S - 1, 0)) and table.requires_grad
    if "native" in available_backends():              # the compiled kernel reads the table itself
        from attnlab.functional.backends.native import native_attention
        q, k = _rand(1, 2, L, 8), _rand(1, 2, S, 8, seed=1)
        out = native_attention(q, k, k, bias=AlibiBias(slopes), scale=0.3)
        assert out.shape == (1, 2, L, 8) and not out.any()


@pytest.mark.parametrize("backend", ["auto"] + EXACT)
@pytest.mark.parametrize("D, Dv", [(0, 8), (8, 0), (0, 0)])
def test_zero_head_dims_are_refused_in_validation(backend, D, Dv):
    q, k, v = torch.randn(1, 2, 16, D), torch.randn(1, 2, 16, D), torch.randn(1, 2, 16, Dv)
    with pytest.raises(ValueError, match=rf"head dim D={D} and v has Dv={Dv}; attention needs D >= 1 and Dv >= 1"):
        al.attention(q, k, v, backend=backend)


@pytest.mark.parametrize("backend", ["auto"] + EXACT)
@pytest.mark.parametrize("L, S", [(5, 0), (0, 0), (0, 5)])
def test_bigbird_with_no_keys_or_queries(backend, L, S):
    q, k, v = _rand(1, 2, L, 8), _rand(1, 2, S, 8, seed=1), _rand(1, 2, S, 8, seed=2)
    out = al.attention(q, k, v, mask=masks.bigbird(2, 1), backend=backend)
    assert out.shape == (1, 2, L, 8) and not out.any()
    assert masks.bigbird(2, 1).dense(L, S).shape[-2:] == (L, S)


# -- item 5: torch.compile(fullgraph=True, dynamic=True) ---------------------------------------------------------

@pytest.mark.parametrize("backend, mask, Hkv", [("sdpa", None, 4), ("sdpa", None, 2),
                                                ("auto", masks.window(4, 0), 4), ("sdpa", masks.window(4, 0), 2)])
def test_compile_dynamic_fullgraph(backend, mask, Hkv):
    """SDPA's enable_gqa must be a bool; `H != Hkv` on dynamic shapes is a SymBool it refuses."""
    torch._dynamo.reset()
    fn = lambda q, k, v: al.attention(q, k, v, mask=mask, backend=backend)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True, dynamic=True)
    for L in (32, 48):                                            # a second length reuses the dynamic graph
        q, k, v = _rand(1, 4, L, 8), _rand(1, Hkv, L, 8, seed=1), _rand(1, Hkv, L, 8, seed=2)
        ref = al.attention(q, k, v, mask=mask, backend="reference")
        out = compiled(q, k, v)
        assert (out - ref).abs().max() <= 1e-5, f"L={L}: max diff {(out - ref).abs().max():.2e}"


# -- item 7: memory checked before work ----------------------------------------------------------------------------

N = 2 ** 20


def _long(n: int, D: int = 1):
    """(1, 1, n, D) zeros expanded from one element: a few bytes, whatever n."""
    return torch.zeros(1, 1, 1, 1).expand(1, 1, n, D)


@pytest.mark.parametrize("kw, match", [
    (dict(mask=masks.window(1, 0)), r"the sdpa backend materializes the dense \(1, 1, 1048576, 1048576\) mask"),
    (dict(dropout_p=0.1), r"\(1, 1, 1048576, 1048576\) scores of SDPA's math path \(dropout\)"),
    (dict(v=_long(N, 2)), r"\(1, 1, 1048576, 1048576\) scores of SDPA's math path \(Dv != D\)"),
])
def test_sdpa_refuses_what_it_would_materialize(kw, match):
    q, kw = _long(N), dict(kw)
    v = kw.pop("v", q)
    with pytest.raises(MemoryError, match=match + r".*: ~[\d,]+ GiB \([\d,]+ bytes\), more than the [\d,.]+ GiB "
                                              r".* this cpu device has available; .*backend='tiled' or 'native'"):
        al.attention(q, q, v, backend="sdpa", **kw)


# decode with 65536 query heads on one kv head: O(H) forward work, (1, 65536, 1, 131072) = 32 GiB of weights
_DECODE = (torch.zeros(1, 1, 1, 1).expand(1, 2 ** 16, 1, 1), torch.zeros(1, 1, 1, 1).expand(1, 1, 2 ** 17, 1))


@pytest.mark.parametrize("backend", ["auto", "reference", "sdpa", "tiled", "sparse", "native", "linear", "favor"])
def test_return_weights_too_big_is_refused_before_the_forward(backend):
    if backend not in available_backends() + ["auto"]:
        pytest.skip(f"{backend} is not available here")
    if backend in ("tiled", "sparse", "linear", "favor"):
        q, k = _DECODE
        shape = r"\(1, 65536, 1, 131072\)"
    else:                                   # a window: the forward is O(n), the weights (1, 1, n, n)
        q = k = _long(N)
        shape = r"\(1, 1, 1048576, 1048576\)"
    mask = None if backend in ("linear", "favor") else masks.window(1, 0)
    what = "scores" if backend == "reference" else r"weights \(return_weights=True\)"
    with pytest.raises(MemoryError, match=rf"\(B, H, L, S\) = {shape} {what}.*~[\d,]+ GiB.*device has available"):
        al.attention(q, k, k, mask=mask, backend=backend, return_weights=True)


def test_sparse_refuses_block_tables_that_cannot_fit():
    q = _long(2 ** 24)
    with pytest.raises(MemoryError, match=r"sparse backend plans \(nq, nk\) = \(262144, 262144\) blocks of 64 x 64"
                                          r".*use larger tile_q / tile_k"):
        al.attention(q, q, q, backend="sparse")


def test_tiled_refuses_a_mask_grid_that_cannot_fit():
    q = _long(2 ** 24)
    with pytest.raises(MemoryError, match=r"tiled backend classifies the mask's \(nq, nk\) = \(131072, 262144\) "
                                          r"tiles.*use backend='native'"):
        al.attention(q, q, q, mask=masks.window(1, 0), backend="tiled")


def test_what_fits_is_not_refused():
    q = _rand(1, 2, 64, 8)
    out, w = al.attention(q, q, q, mask=masks.window(4, 0), backend="sdpa", return_weights=True, dropout_p=0.0)
    assert w.shape == (1, 2, 64, 64) and out.shape == q.shape


# -- item 8: transformers names it would read as its own ----------------------------------------------------------

@pytest.mark.parametrize("name, why", [
    ("attnlab_sdpa", "containing 'sdpa'"), ("my_flash", "containing 'flash'"),
    ("x_flex_attention", "containing 'flex_attention'"), ("paged|attnlab", "prefix"),
    ("org/attnlab", "Hub"), ("eager", "own implementation"),
])
def test_transformers_names_it_would_misread_are_refused(name, why):
    hf = pytest.importorskip("attnlab.integrations.transformers")
    with pytest.raises(ValueError, match=rf"name={re.escape(repr(name))}: pick a new implementation name, "
                                         rf"e.g. 'attnlab'.*{why}"):
        hf.register(name)


def test_implementation_name_is_never_misread():
    hf = pytest.importorskip("attnlab.integrations.transformers")
    for backend in ["auto"] + available_backends():
        name = hf.implementation_name(backend)
        assert hf._misread(name) is None and hf.register(name, backend=backend) == name


def test_native_refuses_a_dense_mask_form_it_cannot_pack():
    """A block layout has no interval form: native bit-packs its dense (L, S) form (~10 bytes a pair)."""
    if "native" not in available_backends():
        pytest.skip("native is not built here")
    q = _long(N)
    with pytest.raises(MemoryError, match=r"native backend bit-packs BigBirdMask .* \(1048576, 1048576\).*"
                                          r"backend='sparse'"):
        al.attention(q, q, q, mask=masks.bigbird(64, 3), backend="native")
