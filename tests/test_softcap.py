"""Score soft-capping (Gemma 2): s = softcap * tanh(scale * q k^T / softcap), then bias, mask, softmax.

Conformance against an independent definition (flash-attention's ``attention_ref``: scores / softcap,
tanh, * softcap, then masks), and every exact backend against the fp64 reference, forward and backward.
"""
import math

import pytest
import torch

from attnlab.functional import FunctionBias, attention, explain, masks
from attnlab.functional.backends.sparse import sparse_attention
from attnlab.functional.backends.tiled import tiled_attention
from attnlab.functional.registry import get_backend

from helpers import FLOOR, errors

EXACT = ["reference", "tiled", "sparse"]


def rand(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale


def flash_ref(q, k, v, softcap, causal):
    """flash-attention's attention_ref with softcap (bottom-right causal, no padding), (B, H, L, D)."""
    s = torch.einsum("bhid,bhjd->bhij", q / math.sqrt(q.shape[-1]), k)
    s = (s / softcap).tanh() * softcap
    if causal:
        L, S = s.shape[-2:]
        s = s.masked_fill(torch.arange(S) > torch.arange(L)[:, None] + S - L, float("-inf"))
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("backend", EXACT)
@pytest.mark.parametrize("causal", [False, True])
def test_softcap_equals_flash_attention_ref(backend, causal):
    # large scores (x3) so that the cap really bends them: without it the answer is far off
    q, k, v = rand(2, 3, 19, 16, seed=1, scale=3), rand(2, 3, 23, 16, seed=2, scale=3), rand(2, 3, 23, 8, seed=3)
    want = flash_ref(q, k, v, 5.0, causal)
    out = attention(q, k, v, causal=causal, softcap=5.0, backend=backend)
    assert (out - want).abs().max().item() < 1e-10
    uncapped = attention(q, k, v, causal=causal, backend=backend)
    assert (uncapped - want).abs().max().item() > 1e-2          # the test can fail: capping matters here


CASES = {
    "causal&padding+bias": (lambda: masks.causal() & masks.padding(torch.tensor([21, 9])), "tensor"),
    "window+alibi": (lambda: masks.window(5, 2), "function"),
    "padded_left_causal": (lambda: masks.padded(torch.tensor([21, 12]), side="left", causal=True), None),
    "none": (lambda: None, None),
}


@pytest.mark.parametrize("backend", ["tiled", "sparse"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softcap_backends_match_gold(backend, case, dtype, monkeypatch):
    make_mask, bias_kind = CASES[case]
    q, k, v = rand(2, 4, 21, 16, seed=4, scale=2), rand(2, 2, 21, 16, seed=5, scale=2), rand(2, 2, 21, 16, seed=6)
    bias = rand(1, 4, 21, 21, seed=7) if bias_kind == "tensor" else None
    small = {"tiled": lambda *a, **kw: tiled_attention(*a, **kw, tile_q=8, tile_k=16),
             "sparse": lambda *a, **kw: sparse_attention(*a, **kw, tile_q=8, tile_k=8)}[backend]

    def fn(q, k, v, **kw):
        if bias_kind == "function":
            kw["bias"] = FunctionBias(lambda i, j: -0.1 * (i - j).abs().to(torch.float32))
        return small(q, k, v, softcap=4.0, **kw)

    def ref(q, k, v, **kw):
        if bias_kind == "function":
            kw["bias"] = FunctionBias(lambda i, j: -0.1 * (i - j).abs().to(torch.float32))
        return get_backend("reference").fn(q, k, v, softcap=4.0, **kw)

    import helpers
    monkeypatch.setattr(helpers, "reference_attention", ref)      # the fp64 gold and same-dtype runs, capped
    errs = errors(fn, q.to(dtype), k.to(dtype), v.to(dtype), None if bias is None else bias.to(dtype), make_mask())
    for name, (cand, refe) in errs.items():
        k_ = 2 if name == "out" else 3
        assert cand <= k_ * refe + FLOOR[dtype], f"{name}: {cand:.3g} vs reference {refe:.3g}"


@pytest.mark.parametrize("backend", ["tiled", "sparse"])
def test_gradcheck_with_softcap(backend):
    q, k, v = rand(1, 2, 7, 4, seed=8, scale=2), rand(1, 1, 9, 4, seed=9, scale=2), rand(1, 1, 9, 3, seed=10)
    bias = rand(1, 2, 7, 9, seed=11)
    leaves = [t.requires_grad_() for t in (q, k, v, bias)]
    fn = {"tiled": lambda q, k, v, b: tiled_attention(q, k, v, mask=masks.causal(), bias=b, scale=0.7, softcap=1.5,
                                                      tile_q=4, tile_k=4),
          "sparse": lambda q, k, v, b: sparse_attention(q, k, v, mask=masks.causal(), bias=b, scale=0.7, softcap=1.5,
                                                        tile_q=4, tile_k=4)}[backend]
    assert torch.autograd.gradcheck(fn, leaves)


def test_weights_are_capped_too():
    q, k, v = rand(1, 2, 9, 8, seed=12, scale=3), rand(1, 2, 9, 8, seed=13, scale=3), rand(1, 2, 9, 8, seed=14)
    _, want = attention(q, k, v, softcap=2.0, backend="reference", return_weights=True)
    for backend in ("tiled", "sparse"):
        _, w = attention(q, k, v, softcap=2.0, backend=backend, return_weights=True)
        assert torch.allclose(w, want, atol=1e-12), backend


@pytest.mark.parametrize("backend", ["sdpa", "linear", "favor"])
def test_backends_without_softcap_refuse_it(backend):
    q = k = v = rand(1, 2, 8, 4)
    with pytest.raises(ValueError, match="softcap"):
        attention(q, k, v, softcap=3.0, backend=backend)


def test_auto_routes_softcap_to_an_exact_backend_that_caps():
    q = k = v = rand(1, 2, 8, 4)
    why = explain(q, k, v, softcap=3.0)
    assert "softcap=3.0" in why and "auto -> sdpa" not in why
    assert "not sdpa: torch's SDPA has no score capping" in why
    out = attention(q, k, v, softcap=3.0)
    assert torch.allclose(out, attention(q, k, v, softcap=3.0, backend="reference"), atol=1e-12)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "3"])
def test_bad_softcap_is_a_clear_error(bad):
    q = k = v = rand(1, 1, 4, 4)
    with pytest.raises(ValueError, match="softcap"):
        attention(q, k, v, softcap=bad)
