"""Properties over random shapes and masks (hypothesis): never NaN/inf; weight rows sum to 1 or 0."""
import torch
from hypothesis import given, settings, strategies as st

import attnlab as al
from attnlab.functional import masks
from attnlab.functional.backends.tiled import tiled_attention


@st.composite
def problems(draw, dims=(1, 3, 8), vdims=(1, 5, 8)):
    B = draw(st.integers(1, 2))
    Hkv = draw(st.integers(1, 2))
    H = Hkv * draw(st.integers(1, 3))
    L, S = draw(st.integers(1, 24)), draw(st.integers(1, 24))
    D, Dv = draw(st.sampled_from(dims)), draw(st.sampled_from(vdims))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    kind = draw(st.sampled_from(["none", "causal", "window", "padding", "documents", "dense", "combo"]))
    if kind == "none":
        mask = None
    elif kind == "causal":
        mask = masks.causal()
    elif kind == "window":
        mask = masks.window(draw(st.integers(0, 5)), draw(st.integers(0, 5)))
    elif kind == "padding":
        mask = masks.padding(torch.randint(0, S + 1, (B,), generator=g))
    elif kind == "documents":
        mask = masks.documents(torch.sort(torch.randint(0, 3, (B, S), generator=g)).values)
    elif kind == "dense":
        mask = masks.dense(torch.rand(B, H, L, S, generator=g) > draw(st.floats(0.0, 1.0)))
    else:
        mask = masks.causal() & masks.dense(torch.rand(B, 1, L, S, generator=g) > 0.5)
    scale = draw(st.sampled_from([None, 0.01, 1.0, 30.0]))       # 30: near-saturated softmax
    bias = torch.randn(B, 1, L, S, generator=g) * draw(st.sampled_from([0.0, 1.0, 20.0])) \
        if draw(st.booleans()) else None
    block = draw(st.sampled_from([(4, 8), (8, 16), (None, None)]))
    q = torch.randn(B, H, L, D, generator=g) * 3
    k = torch.randn(B, Hkv, S, D, generator=g) * 3
    v = torch.randn(B, Hkv, S, Dv, generator=g)
    return q, k, v, mask, bias, scale, block


def rounding_tolerance(q, k, bias, scale):
    """fp32 rounding of large logits (scale 30 and bias x20 reach |logit| ~ 1e3) moves each weight
    by about eps * |logit|: allow that, and no more."""
    kk = k.detach().repeat_interleave(q.shape[1] // k.shape[1], 1)
    logits = (scale or q.shape[-1] ** -0.5) * q.detach() @ kk.transpose(-1, -2)
    if bias is not None:
        logits = logits + bias.detach()
    biggest = float(logits.abs().max()) if logits.numel() else 0.0
    return 1e-5 + 4 * torch.finfo(torch.float32).eps * biggest


@settings(max_examples=80, deadline=None, derandomize=True)
@given(problems(), st.sampled_from(["reference", "sdpa", "tiled", "native"]))
def test_outputs_and_grads_finite_and_weights_normalized(problem, backend):
    q, k, v, mask, bias, scale, block = problem
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    if bias is not None:
        bias.requires_grad_()
    out, w = al.attention(q, k, v, mask=mask, bias=bias, scale=scale, backend=backend, return_weights=True)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    sums = w.sum(-1)
    B, H, L, S = w.shape
    allowed = mask.dense(L, S).expand(B, H, L, S) if mask is not None else torch.ones(B, H, L, S, dtype=torch.bool)
    empty = ~allowed.any(-1)
    tol = rounding_tolerance(q, k, bias, scale)
    assert torch.allclose(sums[~empty], torch.ones_like(sums[~empty]), atol=tol), \
        f"max dev {(sums[~empty] - 1).abs().max():.2e} > {tol:.2e}"
    assert (sums[empty] == 0).all() and (out[empty] == 0).all()
    assert (w[~allowed] == 0).all()
    out.square().sum().backward()
    for t in (q, k, v) + ((bias,) if bias is not None else ()):
        assert torch.isfinite(t.grad).all()


@settings(max_examples=30, deadline=None, derandomize=True)
@given(problems())
def test_tiled_tile_sizes_do_not_change_the_result(problem):
    q, k, v, mask, bias, scale, _ = problem
    scale = scale or q.shape[-1] ** -0.5
    a = tiled_attention(q, k, v, mask=mask, bias=bias, scale=scale, tile_q=4, tile_k=8)
    b = tiled_attention(q, k, v, mask=mask, bias=bias, scale=scale, tile_q=16, tile_k=64)
    tol = rounding_tolerance(q, k, bias, scale)
    torch.testing.assert_close(a, b, atol=tol, rtol=1e-5)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(problems(dims=(3, 8, 16, 32), vdims=(5, 8, 16, 32)))
def test_native_matches_the_reference(problem):
    """The compiled kernel (its AVX-512 tiles where D, Dv are multiples of 16, MKL's GEMMs elsewhere)
    against the reference: outputs and every gradient, on the same random masks, biases and scales."""
    q, k, v, mask, bias, scale, _ = problem
    runs = {}
    for backend in ("reference", "native"):
        ins = [t.clone().requires_grad_() for t in (q, k, v) + ((bias,) if bias is not None else ())]
        out = al.attention(*ins[:3], mask=mask, bias=ins[3] if bias is not None else None, scale=scale,
                           backend=backend)
        out.square().sum().backward()
        runs[backend] = [out] + [t.grad for t in ins]
    tol = rounding_tolerance(q, k, bias, scale)
    for want, got in zip(runs["reference"], runs["native"]):
        scale_of = max(1.0, float(want.detach().abs().max())) if want.numel() else 1.0
        torch.testing.assert_close(got, want, atol=20 * tol * scale_of, rtol=1e-4)
