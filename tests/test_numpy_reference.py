"""The NumPy oracle: written like the theory, independent of torch; the torch backends must agree with it."""
import numpy as np
import pytest
import torch

import attnlab as al
from attnlab import numpy_reference as npr


def test_worked_example_from_the_reference_sheet():
    Q, K, V = np.array([[1.0, 0.0]]), np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([[1.0, 0.0], [0.0, 1.0]])
    out, w = npr.scaled_dot_product_attention(Q, K, V)
    np.testing.assert_allclose(w, [[0.6698, 0.3302]], atol=1e-4)
    np.testing.assert_allclose(out, [[0.6698, 0.3302]], atol=1e-4)


def test_sinusoidal_values_d4():
    pe = npr.sinusoidal_encoding(2, 4)
    np.testing.assert_allclose(pe[0], [0, 1, 0, 1])
    np.testing.assert_allclose(pe[1], [0.841, 0.540, 0.010, 1.000], atol=1e-3)


def test_sinusoidal_relative_position_is_a_fixed_rotation():
    d, k = 16, 5
    pe = npr.sinusoidal_encoding(64, d)
    omega = 1.0 / 10000 ** (np.arange(0, d, 2) / d)
    M = np.zeros((d, d))
    for t, w in enumerate(omega):
        c, s = np.cos(k * w), np.sin(k * w)
        M[2 * t:2 * t + 2, 2 * t:2 * t + 2] = [[c, s], [-s, c]]
    for p in (0, 7, 40):
        np.testing.assert_allclose(pe[p + k], M @ pe[p], atol=1e-12)


@pytest.mark.parametrize("backend", ["reference", "sdpa", "tiled"])
@pytest.mark.parametrize("causal", [False, True])
def test_multi_head_self_attention_matches_torch_backends(backend, causal):
    rng = np.random.default_rng(0)
    n, d, h = 11, 24, 4
    X = rng.standard_normal((n, d))
    Wq, Wk, Wv, Wo = (rng.standard_normal((d, d)) / np.sqrt(d) for _ in range(4))
    allowed = np.tril(np.ones((n, n), dtype=bool)) if causal else None
    want, want_w = npr.multi_head_self_attention(X, Wq, Wk, Wv, Wo, h, allowed)

    x = torch.from_numpy(X)
    split = lambda W: (x @ torch.from_numpy(W)).view(n, h, d // h).transpose(0, 1)[None]   # (1, h, n, d/h)
    out, w = al.attention(split(Wq), split(Wk), split(Wv), causal=causal, backend=backend, return_weights=True)
    got = out[0].transpose(0, 1).reshape(n, d) @ torch.from_numpy(Wo)
    np.testing.assert_allclose(got.numpy(), want, atol=1e-12)
    np.testing.assert_allclose(w[0].numpy(), want_w, atol=1e-12)


def test_self_attention_is_permutation_equivariant_without_positions():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((6, 8))
    Ws = [rng.standard_normal((8, 8)) for _ in range(3)]
    perm = rng.permutation(6)
    out, _ = npr.self_attention(X, *Ws)
    out_p, _ = npr.self_attention(X[perm], *Ws)
    np.testing.assert_allclose(out_p, out[perm], atol=1e-12)
