"""FAVOR+ (Performer): the random features, the estimator, the stabilizers, causal == recurrent.

Statistical checks use fixed seeds and averages, and compare with standard errors, so they are
deterministic and still able to fail: a biased estimator or a feature map that does not converge
would be caught.
"""
import math

import pytest
import torch

import attnlab as al
from attnlab.functional import masks
from attnlab.functional.backends.favor import FavorFeatures, default_n_features, favor_attention
from attnlab.functional.backends.linear_core import causal_linear_attention
from attnlab.functional.backends.linear_recurrent import LinearAttentionState, absorb, step
from attnlab.functional.backends.reference import reference_attention


def inputs(B, H, Hkv, L, S, D=8, Dv=6, std=1.0, dtype=torch.float64, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    shapes = ((B, H, L, D), (B, Hkv, S, D), (B, Hkv, S, Dv))
    q, k, v = (torch.randn(*s, generator=g, dtype=torch.float64) for s in shapes)
    q, k = q * std, k * std
    return [t.to(dtype).requires_grad_(grad) for t in (q, k, v)]


def naive_favor(q, k, v, feats, causal=False):
    """The estimator as written, unstabilized: a_ij = phi(x_i)·phi(y_j), phi = exp(log phi)."""
    B, H, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    root = D ** -0.25
    k, v = (t.repeat_interleave(H // Hkv, dim=1) for t in (k, v))
    a = torch.exp(feats(q * root)) @ torch.exp(feats(k * root)).transpose(-2, -1)   # (B, H, L, S)
    if causal:
        a = a * (torch.arange(S)[None, :] <= torch.arange(L)[:, None] + (S - L))
    den = a.sum(-1, keepdim=True)
    return (a @ v) / torch.where(den > 0, den, 1.0)                       # FAVOR+ adds no eps


def test_kernel_estimate_is_unbiased():
    """The mean of phi(x)·phi(y) over 800 seeds is within 4 standard errors of exp(x·y)."""
    g = torch.Generator().manual_seed(0)
    x, y = (0.3 * torch.randn(8, generator=g, dtype=torch.float64) for _ in range(2))
    for orthogonal in (True, False):
        est = torch.stack([FavorFeatures(8, 16, seed=s, orthogonal=orthogonal).kernel_estimate(x, y)
                           for s in range(800)])
        se = est.std().item() / math.sqrt(len(est))
        truth = math.exp(float(x @ y))
        assert abs(est.mean().item() - truth) < 4 * se, f"orthogonal={orthogonal}: mean {est.mean():.4f} " \
                                                         f"vs exp(x·y) = {truth:.4f} (se {se:.4f})"
        assert se < 0.05 * truth, "the check must be tight enough to see a bias"


def test_features_orthogonal_within_blocks():
    feats = FavorFeatures(8, 20, seed=3)
    w = feats.matrix                                                      # (20, 8)
    unit = w / w.norm(dim=1, keepdim=True)
    for a, b in ((0, 8), (8, 16), (16, 20)):                              # blocks of d = 8, the last truncated
        gram = unit[a:b] @ unit[a:b].T
        torch.testing.assert_close(gram, torch.eye(b - a, dtype=torch.float64), atol=1e-12, rtol=0)
    assert (unit[:8] @ unit[8:16].T).abs().max() > 1e-3, "different blocks are independent draws"
    norms = w.norm(dim=1)
    assert norms.std() > 0.1, "chi-distributed row norms differ from row to row"
    flat = FavorFeatures(8, 20, seed=3, scaling="sqrt_d").matrix.norm(dim=1)
    torch.testing.assert_close(flat, torch.full((20,), math.sqrt(8), dtype=torch.float64))


def test_seeded_and_redrawable():
    a, b, c = FavorFeatures(16, 40, seed=7), FavorFeatures(16, 40, seed=7), FavorFeatures(16, 40, seed=8)
    assert torch.equal(a.matrix, b.matrix) and not torch.equal(a.matrix, c.matrix)
    first = a.matrix.clone()
    a.redraw()
    assert not torch.equal(a.matrix, first), "redraw changes the features"
    b.redraw()
    assert torch.equal(a.matrix, b.matrix), "the same seed reproduces the sequence of draws"
    assert a.draws == 2


def test_error_falls_as_features_grow():
    """Relative error vs exact softmax, averaged over 3 seeds, falls with m (roughly as 1/sqrt(m))."""
    q, k, v = inputs(1, 2, 2, 128, 128, D=16, Dv=16, std=0.5)
    exact = reference_attention(q, k, v, scale=16 ** -0.5)
    errs = []
    for m in (16, 64, 256, 1024):
        e = [((favor_attention(q, k, v, FavorFeatures(16, m, seed=s)) - exact).norm() / exact.norm()).item()
             for s in range(3)]
        errs.append(sum(e) / len(e))
    assert all(a > b for a, b in zip(errs, errs[1:])), f"errors by m: {errs}"
    assert errs[-1] < 0.4 * errs[0], f"errors by m: {errs}"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("L, S, H, Hkv", [(17, 17, 4, 2), (9, 23, 4, 1), (21, 8, 2, 2), (1, 30, 4, 4)])
def test_stabilized_equals_unstabilized_formula(causal, L, S, H, Hkv):
    """The per-row query max and the shared key constant cancel: same result as the raw estimator."""
    q, k, v = inputs(2, H, Hkv, L, S)
    feats = FavorFeatures(8, 24, seed=2)
    out = favor_attention(q, k, v, feats, causal=causal, chunk_size=4)
    torch.testing.assert_close(out, naive_favor(q, k, v, feats, causal), atol=1e-12, rtol=1e-10)


def test_stabilizers_keep_large_inputs_accurate():
    """With |x|^2 / 2 ~ 90 every raw weight exp(w·x - |x|^2/2) exp(w·y - |y|^2/2) underflows in fp32;
    the stabilized fp32 kernel still matches the raw formula evaluated in fp64.

    Non-causal on purpose: in causal mode the key constant is shared by the whole sequence, so at
    such norms an early row that sees only a few small keys can underflow (docs: the recurrent
    form's running max does not have this limit).
    """
    q, k, v = inputs(1, 2, 2, 40, 40, D=8, std=8.0)
    feats = FavorFeatures(8, 32, seed=0)
    gold = naive_favor(q, k, v, feats)                                    # fp64 holds e^-150
    out = favor_attention(q.float(), k.float(), v.float(), feats)
    raw = naive_favor(q.float(), k.float(), v.float(), feats)
    assert gold.abs().amax() > 0.1, "the fp64 gold is not degenerate"
    torch.testing.assert_close(out.double(), gold, atol=1e-4, rtol=1e-4)
    assert (raw.double() - gold).abs().max() > 0.1, "without stabilizers fp32 loses the weights"


def test_causal_key_constant_is_a_running_max_over_segments():
    """Ordinary keys in a later segment must not make earlier rows underflow (fp32 vs the fp64 raw formula).

    The first 24 keys are one large key repeated (log phi <= -89), the rest ordinary (log phi ~ 1).
    One key constant for the whole sequence (segment = 64 rows here) makes every early weight
    exp(-90) = 0 in fp32; the per-segment running max keeps those rows exact, and equal to a run
    on the first 24 rows alone.
    """
    q, k, v = inputs(1, 2, 2, 40, 40, D=8)
    k[:, :, :24] = 10.0 * k[:, :, :1]
    feats = FavorFeatures(8, 32, seed=0)
    assert feats(k[:, :, :24] * 8 ** -0.25).amax() < feats(k[:, :, 24:] * 8 ** -0.25).amax() - 88
    gold = naive_favor(q, k, v, feats, causal=True)[:, :, :24]

    def run(n, segment):
        q32, k32, v32 = (t[:, :, :n].float() for t in (q, k, v))
        return causal_linear_attention(q32, k32, v32, feats, keep=None, scale=8 ** -0.5, chunk=4, segment=segment)
    out = run(40, 8)[:, :, :24]
    torch.testing.assert_close(out.double(), gold, atol=1e-5, rtol=1e-5)
    assert torch.equal(out, run(24, 8)), "the early rows do not depend on later segments"
    assert (run(40, 64)[:, :, :24].double() - gold).abs().max() > 0.5, "one shared constant would underflow"


@pytest.mark.parametrize("H, Hkv", [(4, 4), (4, 2)])
def test_recurrent_step_equals_parallel(H, Hkv):
    """The decoding state (with its running key max) reproduces the parallel causal form."""
    L, S = 12, 15
    q, k, v = inputs(2, H, Hkv, L, S)
    k[:, :, 9] *= 6.0                                     # a late large key: the running max must rescale
    feats = FavorFeatures(8, 24, seed=5)
    want = favor_attention(q, k, v, feats, causal=True, chunk_size=5)
    state = LinearAttentionState.zeros(2, Hkv, 8, 6, features=feats, dtype=q.dtype)
    state = absorb(state, k[:, :, :S - L], v[:, :, :S - L])
    outs = []
    for t in range(L):
        j = S - L + t
        o, state = step(state, q[:, :, t:t + 1], k[:, :, j:j + 1], v[:, :, j:j + 1])
        outs.append(o)
    torch.testing.assert_close(torch.cat(outs, dim=2), want, atol=1e-12, rtol=1e-10)


def test_no_future_leakage_even_when_the_key_stabilizer_moves():
    """A huge future key changes the shared key constant; earlier outputs must not move."""
    q, k, v = inputs(1, 4, 2, 25, 25)
    feats = FavorFeatures(8, 16, seed=1)
    out = favor_attention(q, k, v, feats, causal=True, chunk_size=6)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 20:] *= 8.0
    v2[:, :, 20:] = 3.0
    out2 = favor_attention(q, k2, v2, feats, causal=True, chunk_size=6)
    torch.testing.assert_close(out2[:, :, :20], out[:, :, :20], atol=1e-12, rtol=1e-10)


def test_gradcheck_causal():
    q, k, v = inputs(1, 2, 1, 6, 8, D=4, Dv=2, grad=True)
    feats = FavorFeatures(4, 6, seed=0)
    fn = lambda q, k, v: favor_attention(q, k, v, feats, causal=True, chunk_size=3,
                                         mask=masks.padding(torch.tensor([7])))
    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_backend_uses_default_features():
    q, k, v = inputs(1, 4, 2, 20, 20, D=16, Dv=16, dtype=torch.float32)
    out = al.attention(q, k, v, causal=True, backend="favor")
    want = favor_attention(q, k, v, FavorFeatures(16, default_n_features(16), seed=0), causal=True)
    torch.testing.assert_close(out, want)
    assert default_n_features(64) == 266                                  # Performer's d ln d


def test_bad_arguments():
    q, k, v = inputs(1, 2, 2, 5, 5, D=8, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"n_features=0: must be a positive int"):
        FavorFeatures(8, 0)
    with pytest.raises(ValueError, match=r"scaling='unit'"):
        FavorFeatures(8, 16, scaling="unit")
    with pytest.raises(TypeError, match=r"seed=1.5"):
        FavorFeatures(8, 16, seed=1.5)
    with pytest.raises(ValueError, match=r"built for head dim 16 but q has head dim 8.*FavorFeatures\(8, 32"):
        favor_attention(q, k, v, FavorFeatures(16, 32))
    with pytest.raises(TypeError, match=r"features must be FavorFeatures"):
        favor_attention(q, k, v, "favor")
    with pytest.raises(ValueError, match=r"backend 'favor' cannot compute.*dropout"):
        al.attention(q, k, v, backend="favor", dropout_p=0.2)
