"""Linear attention (elu + 1): parallel == recurrent == naive O(n^2) evaluation of the same formula.

The naive evaluation forms the (L, S) matrix phi(q_i)·phi(k_j), masks it and normalizes: the
definition, in fp64. The chunked causal kernel, its hand-written backward and the RNN form must
all agree with it, on awkward shapes (L = 1, odd lengths, L != S both ways, GQA/MQA, padding).
"""
import math

import pytest
import torch
import torch.nn.functional as F

import attnlab as al
from attnlab.functional import masks
from attnlab.functional.backends.linear import ELU, EPS, linear_attention
from attnlab.functional.backends.linear_core import causal_linear_attention
from attnlab.functional.backends.linear_recurrent import LinearAttentionState, absorb, step

SHAPES = [(1, 33), (17, 17), (13, 29), (29, 13), (40, 40)]   # (L, S): decode, odd, L < S, L > S
HEADS = [(4, 4), (4, 2), (4, 1)]                            # MHA, GQA, MQA


def naive_linear(q, k, v, *, causal=False, lengths=None, scale=None, phi=lambda x: F.elu(x) + 1):
    """out_i = sum_j a_ij v_j / (sum_j a_ij + eps), a_ij = phi(q_i)·phi(k_j) on allowed pairs."""
    B, H, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    root = math.sqrt(1 / math.sqrt(D) if scale is None else scale)
    k, v = (t.repeat_interleave(H // Hkv, dim=1) for t in (k, v))
    a = phi(q * root) @ phi(k * root).transpose(-2, -1)                 # (B, H, L, S)
    allowed = torch.ones(L, S, dtype=torch.bool)
    if causal:
        allowed = torch.arange(S)[None, :] <= torch.arange(L)[:, None] + (S - L)
    if lengths is not None:
        allowed = allowed & (torch.arange(S)[None, None, None, :] < lengths[:, None, None, None])
    a = a * allowed
    return (a @ v) / (a.sum(-1, keepdim=True) + EPS)


def inputs(B, H, Hkv, L, S, D=8, Dv=6, dtype=torch.float64, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*s, generator=g).to(dtype) for s in ((B, H, L, D), (B, Hkv, S, D), (B, Hkv, S, Dv)))
    return [t.requires_grad_(grad) for t in (q, k, v)]


def test_worked_example():
    """REFERENCES.md 7, D = 1: phi(q) = 1, phi(k) = (1, 2), v = (3, 5)."""
    q = torch.zeros(1, 1, 2, 1, dtype=torch.float64)                    # elu(0) + 1 = 1
    k = torch.tensor([0.0, 1.0], dtype=torch.float64).view(1, 1, 2, 1)  # elu(0) + 1 = 1, elu(1) + 1 = 2
    v = torch.tensor([3.0, 5.0], dtype=torch.float64).view(1, 1, 2, 1)
    full = al.attention(q, k, v, backend="linear").flatten()
    causal = al.attention(q, k, v, causal=True, backend="linear").flatten()
    torch.testing.assert_close(full, torch.tensor([13 / 3, 13 / 3], dtype=torch.float64), rtol=1e-6, atol=0)
    torch.testing.assert_close(causal, torch.tensor([3.0, 13 / 3], dtype=torch.float64), rtol=1e-6, atol=0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("L, S", SHAPES)
@pytest.mark.parametrize("H, Hkv", HEADS)
def test_matches_naive_formula_fp64(causal, L, S, H, Hkv):
    q, k, v = inputs(2, H, Hkv, L, S)
    out = linear_attention(q, k, v, causal=causal, chunk_size=5)       # several chunks, a ragged last one
    want = naive_linear(q, k, v, causal=causal)
    torch.testing.assert_close(out, want, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("L, S", [(17, 17), (13, 29), (29, 13)])
def test_fp32_and_bf16_error_within_naive_same_dtype(causal, L, S):
    """Three runs: fp64 gold, the naive formula in the same dtype, the kernel; err <= 2 x naive's."""
    for dtype, floor in ((torch.float32, 1e-6), (torch.bfloat16, 1e-3)):
        q, k, v = inputs(2, 4, 2, L, S, D=16, Dv=16)
        gold = naive_linear(q, k, v, causal=causal)
        ref = naive_linear(q.to(dtype), k.to(dtype), v.to(dtype), causal=causal)
        out = linear_attention(q.to(dtype), k.to(dtype), v.to(dtype), causal=causal, chunk_size=8)
        assert out.dtype == dtype
        err, ref_err = ((t.double() - gold).abs().max().item() for t in (out, ref))
        assert err <= 2 * ref_err + floor, f"{dtype}: err {err:.2e} vs naive {ref_err:.2e}"


@pytest.mark.parametrize("L, S", [(7, 7), (5, 9), (9, 4)])
def test_gradcheck_causal_chunked_backward(L, S):
    q, k, v = inputs(1, 2, 1, L, S, D=3, Dv=2, grad=True)
    lengths = torch.tensor([S - 1])
    fn = lambda q, k, v: linear_attention(q, k, v, causal=True, mask=masks.padding(lengths), chunk_size=3)
    assert torch.autograd.gradcheck(fn, (q, k, v))


@pytest.mark.parametrize("causal", [False, True])
def test_gradients_match_naive(causal):
    q, k, v = inputs(2, 4, 2, 23, 31, grad=True)
    gy = torch.randn(2, 4, 23, 6, dtype=torch.float64)
    got = torch.autograd.grad(linear_attention(q, k, v, causal=causal, chunk_size=4), (q, k, v), gy)
    want = torch.autograd.grad(naive_linear(q, k, v, causal=causal), (q, k, v), gy)
    for name, a, b in zip("qkv", got, want):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-9, msg=lambda m: f"d{name}: {m}")


@pytest.mark.parametrize("causal", [False, True])
def test_key_padding_drops_keys(causal):
    q, k, v = inputs(3, 4, 2, 12, 15)
    lengths = torch.tensor([15, 7, 0])
    out = linear_attention(q, k, v, causal=causal, mask=masks.padding(lengths))
    torch.testing.assert_close(out, naive_linear(q, k, v, causal=causal, lengths=lengths), atol=1e-12, rtol=1e-10)
    assert torch.equal(out[2], torch.zeros_like(out[2])), "an example with no keys gives 0"
    k2, v2 = k.clone(), v.clone()
    k2[1, :, 7:], v2[1, :, 7:] = 100.0, -100.0                          # padded keys may hold anything
    torch.testing.assert_close(linear_attention(q, k2, v2, causal=causal, mask=masks.padding(lengths)), out)


def test_causal_rows_before_the_first_key_are_zero():
    q, k, v = inputs(1, 2, 2, 9, 4, grad=True)
    out = al.attention(q, k, v, causal=True, backend="linear")
    assert torch.equal(out[:, :, :5], torch.zeros_like(out[:, :, :5]))
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.equal(q.grad[:, :, :5], torch.zeros_like(q.grad[:, :, :5]))


@pytest.mark.parametrize("H, Hkv", HEADS)
def test_recurrent_step_equals_parallel(H, Hkv):
    """The RNN view (state S_t, z_t) gives, token by token, what the parallel causal form gives."""
    L, S = 11, 16
    q, k, v = inputs(2, H, Hkv, L, S)
    want = linear_attention(q, k, v, causal=True, chunk_size=4)
    state = LinearAttentionState.zeros(2, Hkv, 8, 6, dtype=q.dtype)
    state = absorb(state, k[:, :, :S - L], v[:, :, :S - L])            # the prompt: keys before query 0
    outs = []
    for t in range(L):
        j = S - L + t
        o, state = step(state, q[:, :, t:t + 1], k[:, :, j:j + 1], v[:, :, j:j + 1])
        outs.append(o)
    assert state.n_keys == S
    torch.testing.assert_close(torch.cat(outs, dim=2), want, atol=1e-12, rtol=1e-10)


def test_no_future_leakage():
    q, k, v = inputs(2, 4, 2, 30, 30, grad=False)
    out = linear_attention(q, k, v, causal=True, chunk_size=7)
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    for t in (q2, k2, v2):
        t[:, :, 12:] = torch.randn_like(t[:, :, 12:]) * 5               # change only the future
    out2 = linear_attention(q2, k2, v2, causal=True, chunk_size=7)
    torch.testing.assert_close(out2[:, :, :12], out[:, :, :12], atol=1e-13, rtol=1e-12)
    assert not torch.allclose(out2[:, :, 12:], out[:, :, 12:])


def test_backward_does_not_store_every_prefix_state():
    """Saved tensors stay O(n (m + Dv)); a cumsum-based backward would keep n x m x Dv states."""
    n, D = 512, 32
    q, k, v = inputs(1, 2, 2, n, n, D=D, Dv=D, dtype=torch.float32, grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel() * t.element_size()) or t,
                                                  lambda t: t):
        out = linear_attention(q, k, v, causal=True, chunk_size=64)
    prefix_states = 2 * n * D * D * 4                                    # heads x n x m x Dv fp32
    assert sum(saved) < 0.25 * prefix_states, f"saved {sum(saved)} bytes vs {prefix_states} for all states"
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_return_weights_are_the_linear_models_weights():
    q, k, v = inputs(2, 4, 2, 9, 12)
    out, w = al.attention(q, k, v, causal=True, backend="linear", return_weights=True)
    assert w.shape == (2, 4, 9, 12)
    vh = v.repeat_interleave(2, dim=1)
    torch.testing.assert_close(w @ vh, out)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 9, dtype=torch.float64), atol=1e-5, rtol=0)
    assert torch.equal(w[..., 0, 4:], torch.zeros_like(w[..., 0, 4:])), "causal: no weight on future keys"


def test_scale_one_is_the_papers_formula():
    q, k, v = inputs(1, 2, 2, 10, 10, D=16)
    out = linear_attention(q, k, v, scale=1.0)
    torch.testing.assert_close(out, naive_linear(q, k, v, scale=1.0))
    assert not torch.allclose(out, linear_attention(q, k, v))           # the default scale 1/sqrt(D) differs


def test_empty_sequences():
    q, k, v = inputs(1, 2, 2, 0, 5)
    assert linear_attention(q, k, v, causal=True).shape == (1, 2, 0, 6)
    q, k, v = inputs(1, 2, 2, 4, 0)
    assert torch.equal(al.attention(q, k, v, backend="linear"), torch.zeros(1, 2, 4, 6, dtype=torch.float64))


def test_auto_never_picks_linear():
    q, k, v = inputs(1, 2, 2, 64, 64, dtype=torch.float32)
    text = al.explain(q, k, v, causal=True)
    assert "not linear: approximate" in text and "not favor: approximate" in text


@pytest.mark.parametrize("kwargs, match", [
    (dict(mask=masks.window(4, 0)), r"backend 'linear' cannot compute.*mask window.*use backend='sparse' or 'tiled'"),
    (dict(mask=masks.documents(torch.arange(12) // 4)), r"documents.*causal=True and key padding"),
    (dict(mask=torch.ones(10, 12, dtype=torch.bool)), r"dense.*not supported"),
    (dict(bias=torch.zeros(10, 12)), r"nothing to add a bias to"),
    (dict(dropout_p=0.1), r"dropout_p=0.1.*apply dropout to the output"),
    (dict(scale=-1.0), r"scale=-1.0 < 0"),
])
def test_unsupported_requests_are_refused(kwargs, match):
    q, k, v = inputs(1, 2, 2, 10, 12, dtype=torch.float32)
    with pytest.raises(ValueError, match=match):
        al.attention(q, k, v, backend="linear", **kwargs)


def test_bad_arguments():
    q, k, v = inputs(1, 2, 2, 10, 12, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"chunk=0.*positive int"):
        linear_attention(q, k, v, causal=True, chunk_size=0)
    with pytest.raises(TypeError, match=r"features must be a FeatureMap"):
        linear_attention(q, k, v, features="elu")
    with pytest.raises(ValueError, match=r"linear_attention cannot compute.*window"):
        linear_attention(q, k, v, mask=masks.window(2, 2))
    state = LinearAttentionState.zeros(1, 2, 8, 6)
    with pytest.raises(ValueError, match=r"step\(\) takes one token"):
        step(state, q[:, :, :2], k[:, :, :2], v[:, :, :2])
    with pytest.raises(ValueError, match=r"k_t has shape \(1, 1, 1, 8\); this state expects \(1, 2, 1, 8\)"):
        step(state, q[:, :, :1], k[:, :1, :1], v[:, :, :1])
    with pytest.raises(ValueError, match=r"scale=-2.0"):
        LinearAttentionState.zeros(1, 2, 8, 6, scale=-2.0)


@pytest.mark.parametrize("chunk, segment", [(1, 1), (2, 4), (3, 7), (4, 100), (64, None)])
@pytest.mark.parametrize("L, S", [(11, 11), (5, 14), (14, 5)])
def test_fused_segments_any_chunk_and_segment(chunk, segment, L, S):
    """Segments of chunks (key-only segments first when S > L), values and gradients vs the naive formula."""
    q, k, v = inputs(2, 4, 2, L, S, D=3, Dv=4, grad=True)
    lengths = torch.tensor([S, S - 2])
    keep = (torch.arange(S)[None, :] < lengths[:, None])[:, None, :, None]          # (B, 1, S, 1)
    fn = lambda q, k, v: causal_linear_attention(q, k, v, ELU, keep=keep, scale=0.5, chunk=chunk, segment=segment)
    naive = lambda q, k, v: naive_linear(q, k, v, causal=True, lengths=lengths, scale=0.5)
    torch.testing.assert_close(fn(q, k, v), naive(q, k, v), atol=1e-12, rtol=1e-10)
    gy = torch.randn(2, 4, L, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    got = torch.autograd.grad(fn(q, k, v), (q, k, v), gy)
    want = torch.autograd.grad(naive(q, k, v), (q, k, v), gy)
    for name, a, b in zip("qkv", got, want):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-9, msg=lambda m: f"d{name}: {m}")
    if chunk == 3 and L == S:
        assert torch.autograd.gradcheck(fn, (q, k, v))


def test_gradient_only_for_inputs_that_need_it():
    q, k, v = inputs(1, 2, 1, 9, 12, grad=False)
    v.requires_grad_()
    out = causal_linear_attention(q, k, v, ELU, keep=None, scale=1.0, chunk=2, segment=4)
    (dv,) = torch.autograd.grad(out.sum(), (v,))
    (want,) = torch.autograd.grad(naive_linear(q, k, v, causal=True, scale=1.0).sum(), (v,))
    torch.testing.assert_close(dv, want)


def test_complexity_bench_fits_the_causal_fwdbwd_series(tmp_path):
    """The command that measures issue #14's alpha: linear on causal fwd+bwd, no head-to-head targets."""
    import json
    from attnlab.cli import main
    path = tmp_path / "c.json"
    assert main(["bench", "--complexity", "--backend", "linear", "--mask", "causal", "--mode", "fwdbwd",
                 "--n", "128", "256", "--repeats", "1", "--no-memory", "--heads", "2", "--json", str(path)]) == 0
    rep = json.loads(path.read_text())
    assert rep["meta"]["config"]["mode"] == "fwdbwd" and rep["targets"] == {}
    s = rep["series"]["linear"]
    assert s["mask"] == "causal" and [p["n"] for p in s["points"]] == [128, 256]
    assert math.isfinite(s["fit"]["alpha"])
