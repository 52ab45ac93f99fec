"""NaN in -> NaN out, the same on every exact backend and shape (docs/design.md, "NaN and inf").

The rule, with "may attend" from the mask (causal, window, padding...):

* a NaN in query row i makes output row i NaN (all of it); a row with nothing to attend to stays 0;
* a NaN in key j makes NaN every output row that may attend to key j, and no other (a masked key is
  never used, even when its score is NaN);
* a NaN in value j, channel d, makes channel d NaN in every row that may attend to key j; other
  channels are untouched. Rows that may not attend to j are not specified (0 * NaN is NaN where a
  backend multiplies the whole row of weights, 0 where it skips the masked tile).

torch's CPU SDPA flash kernel breaks the first rule below 16 keys (a NaN row comes out 0): the
sdpa backend runs the reference formula there (sdpa.NAN_SAFE_S). Tiled and sparse add the mask as
0 / -inf blocks for speed, which lets a masked NaN score through (NaN + -inf = NaN): with a NaN/inf
in q or k they apply it with ``where`` instead.
"""
from __future__ import annotations

import pytest
import torch

import attnlab as al
from attnlab.functional.registry import get_backend
from attnlab.functional.request import make_request

EXACT = ["reference", "sdpa", "tiled", "sparse", "native", "auto"]
NAN = float("nan")


def _masks(B: int, S: int):
    return {
        "none": (None, False),
        "causal": (None, True),
        "window": (al.masks.window(3, 0), False),
        "padding": (al.masks.padding(torch.tensor([S, max(1, S // 2)][:B])), False),
        "documents": (al.masks.documents(torch.arange(S) * 3 // max(S, 1)), False),
    }


def _allowed(mask, causal, q, k) -> torch.Tensor:
    """(B, H, L, S) bool: may query i attend to key j, for the request attention() builds."""
    req = make_request(q, k, k, mask=mask, causal=causal)
    B, H, _, L, S, _, _ = req.shape
    if req.mask is None:
        return torch.ones(B, H, L, S, dtype=torch.bool)
    return req.mask.dense(L, S).expand(B, H, L, S)


def _run(backend, q, k, v, mask, causal):
    """attention() on this backend, or None where it cannot compute the request (e.g. sparse without a layout)."""
    if backend != "auto":
        req = make_request(q, k, v, mask=mask, causal=causal)
        if get_backend(backend).unsupported(req) is not None:
            return None
    return al.attention(q, k, v, mask=mask, causal=causal, backend=backend)


SHAPES = [  # (B, H, Hkv, L, S, D)
    (1, 4, 4, 4, 4, 4),            # the shape: SDPA's short-row path
    (1, 1, 1, 1, 1, 8),            # one query, one key
    (2, 2, 1, 5, 9, 8),            # GQA, L != S, S < 16
    (1, 2, 2, 16, 16, 16),         # SDPA's flash kernel from here
    (2, 4, 2, 70, 70, 16),         # several tiles, partial ones
    (1, 2, 2, 300, 300, 32),       # the tiled kernel's row tiles of 256
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mask_kind", ["none", "causal", "window", "padding", "documents"])
@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_nan_in_nan_out_on_every_exact_backend(shape, mask_kind, where):
    B, H, Hkv, L, S, D = shape
    g = torch.Generator().manual_seed(L * 1000 + S)
    q = torch.randn(B, H, L, D, generator=g)
    k = torch.randn(B, Hkv, S, D, generator=g)
    v = torch.randn(B, Hkv, S, D, generator=g)
    mask, causal = _masks(B, S)[mask_kind]
    allowed = _allowed(mask, causal, q, k)                                       # (B, H, L, S)
    G = H // Hkv
    i, j, d, b = L // 2, S - 1 if S > 1 else 0, 1 % D, B - 1
    if where == "q":
        q[b, 0, i, 0] = NAN
        want = torch.zeros(B, H, L, D, dtype=torch.bool)
        want[b, 0, i, :] = allowed[b, 0, i].any()
    elif where == "k":
        k[b, 0, j, 0] = NAN
        want = torch.zeros(B, H, L, D, dtype=torch.bool)
        want[b, :G] = allowed[b, :G, :, j, None].expand(G, L, D)                # every row that may see key j
    else:
        v[b, 0, j, d] = NAN
        must = torch.zeros(B, H, L, D, dtype=torch.bool)
        must[b, :G, :, d] = allowed[b, :G, :, j]
    ref = al.attention(q, k, v, mask=mask, causal=causal, backend="reference")
    clean = al.attention(*(t.nan_to_num(0.0) for t in (q, k, v)), mask=mask, causal=causal, backend="reference")
    ran = 0
    for backend in EXACT:
        out = _run(backend, q, k, v, mask, causal)
        if out is None:
            continue
        ran += 1
        nan = torch.isnan(out)
        if where == "v":
            assert bool(nan[must].all()), (backend, "a row that attends to the NaN value is not NaN")
            other = torch.ones(D, dtype=torch.bool)
            other[d] = False
            assert not bool(nan[..., other].any()), (backend, "NaN leaked into another channel")
            torch.testing.assert_close(out[..., other], clean[..., other], atol=2e-5, rtol=2e-5)
        else:
            assert torch.equal(nan, want), (backend, int(nan.sum()), int(want.sum()))
            assert torch.equal(torch.isnan(ref), want)
            # everything not NaN is what the rows compute without the poisoned input
            torch.testing.assert_close(out[~want], clean[~want] if where == "q" else ref[~want], atol=2e-5, rtol=2e-5)
    assert ran >= 4                                                              # reference, sdpa, tiled, auto at least


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("S", [1, 7, 8, 15, 16, 17])
def test_sdpa_short_rows_keep_nan_in_every_dtype(dtype, S):
    q, k, v = (torch.randn(1, 2, n, 8, dtype=dtype) for n in (3, S, S))
    q[0, 1, 2, 0] = NAN
    for backend in ("sdpa", "auto", "tiled", "native", "reference"):
        nan = torch.isnan(al.attention(q, k, v, backend=backend))
        assert bool(nan[0, 1, 2].all()) and int(nan.sum()) == 8, (backend, S)


def test_inf_in_a_masked_key_is_never_used():
    q, k, v = (torch.randn(1, 1, 40, 8) for _ in range(3))
    k[0, 0, 39, 0] = float("inf")                                                # only the last query may see it
    outs = {b: al.attention(q, k, v, causal=True, backend=b) for b in ("reference", "sdpa", "tiled", "native")}
    for b, out in outs.items():
        assert torch.isfinite(out[0, 0, :39]).all(), b
        torch.testing.assert_close(out, outs["reference"], equal_nan=True)
