"""AttentionLayer: the theory's invariants at module level, for every positional scheme and
exact backend -- permutation equivariance (and its loss), no peeking, KV-cache == full forward,
cross-attention, multi-head cost by FLOP count, and clear errors."""
from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from attnlab.nn import AttentionConfig, KVCache, AttentionLayer

SCHEMES = [None, "sinusoidal", "learned", "rope", "alibi", "t5", "shaw"]
BACKENDS = ["reference", "sdpa", "tiled"]


def make(seed=0, **kw) -> AttentionLayer:
    torch.manual_seed(seed)
    cfg = dict(d_model=32, n_heads=4, n_kv_heads=2)
    cfg.update(kw)
    m = AttentionLayer(AttentionConfig(**cfg)).eval()
    if m.positional is not None and getattr(m.positional, "value_emb", None) is not None:
        torch.nn.init.normal_(m.positional.value_emb)               # zero at init: make the value term count
    return m


def sentence(words: str, vocab: dict) -> torch.Tensor:
    return torch.stack([vocab[w] for w in words.split()])[None]    # (1, L, C)


@pytest.fixture(scope="module")
def vocab():
    g = torch.Generator().manual_seed(1)
    return {w: torch.randn(32, generator=g) for w in "the dog bit man".split()}


def test_without_positions_self_attention_is_permutation_equivariant(vocab):
    m = make()
    a, b = sentence("the dog bit the man", vocab), sentence("the man bit the dog", vocab)
    perm = torch.tensor([0, 4, 2, 3, 1])                            # b = a[perm]
    assert torch.equal(b, a[:, perm])
    with torch.no_grad():
        assert torch.allclose(m(b), m(a)[:, perm], atol=1e-6)
        x = torch.randn(2, 11, 32)
        p = torch.randperm(11)
        assert torch.allclose(m(x[:, p]), m(x)[:, p], atol=1e-6)


@pytest.mark.parametrize("scheme", SCHEMES[1:])
def test_every_positional_scheme_breaks_equivariance(scheme, vocab):
    m = make(positional=scheme)
    a, b = sentence("the dog bit the man", vocab), sentence("the man bit the dog", vocab)
    perm = torch.tensor([0, 4, 2, 3, 1])
    with torch.no_grad():
        diff = (m(b) - m(a)[:, perm]).abs().max()
    assert diff > 1e-3, f"{scheme}: 'the man bit the dog' is just a permutation of 'the dog bit the man' ({diff})"


@pytest.mark.parametrize("scheme", SCHEMES)
def test_causal_module_never_peeks(scheme):
    m = make(positional=scheme, causal=True)
    x = torch.randn(2, 12, 32)
    y = x.clone()
    y[:, 7:] = torch.randn(2, 5, 32)                                # change the future only
    with torch.no_grad():
        assert torch.allclose(m(x)[:, :7], m(y)[:, :7], atol=1e-6)
        assert not torch.allclose(m(x)[:, 7:], m(y)[:, 7:], atol=1e-3)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_kv_cache_decoding_equals_full_forward(scheme, backend):
    m = make(positional=scheme, causal=True, backend=backend)
    x = torch.randn(2, 13, 32)
    with torch.no_grad():
        full = m(x)
        cache = m.new_cache(batch=2, capacity=16)
        steps = [m(x[:, :5], cache=cache)]                          # a prompt, then one token at a time
        steps += [m(x[:, t: t + 1], cache=cache) for t in range(5, 13)]
    diff = (torch.cat(steps, 1) - full).abs().max()
    assert diff < 1e-5, f"{scheme}/{backend}: cache vs full max diff {diff:.2e}"
    assert cache.length == 13


@pytest.mark.parametrize("backend", BACKENDS)
def test_kv_cache_with_key_padding(backend):
    m = make(positional="rope", causal=True, backend=backend)
    x = torch.randn(2, 9, 32)
    keep = torch.ones(2, 9, dtype=torch.bool)
    keep[1, :3] = False                                             # example 1 is left-padded by 3
    with torch.no_grad():
        full = m(x, key_mask=keep)
        cache = m.new_cache(2, 9)
        inc = torch.cat([m(x[:, t: t + 1], cache=cache, key_mask=keep[:, : t + 1]) for t in range(9)], 1)
    assert (inc[:, 3:] - full[:, 3:]).abs().max() < 1e-5
    assert (inc[0] - full[0]).abs().max() < 1e-5


def test_cross_attention_lengths_and_dependence_on_context():
    m = make(cross=True, d_context=24, n_kv_heads=1)
    x, ctx = torch.randn(2, 5, 32), torch.randn(2, 9, 24)
    with torch.no_grad():
        y = m(x, ctx)
        assert y.shape == (2, 5, 32)
        ctx2 = ctx.clone()
        ctx2[:, 4] += 1.0
        assert not torch.allclose(m(x, ctx2), y, atol=1e-4)
        cache = m.new_cache(2, 9)
        first = m(x[:, :2], ctx, cache=cache)                       # stores the context's keys once
        rest = m(x[:, 2:], cache=cache)                             # reuses them
        assert torch.allclose(torch.cat([first, rest], 1), y, atol=1e-6)
        pad = torch.ones(2, 9, dtype=torch.bool)
        pad[:, 6:] = False
        assert torch.allclose(m(x, ctx, key_mask=pad), m(x, ctx[:, :6]), atol=1e-6)


def test_intermediates_and_dropout():
    m = make(positional="alibi", causal=True, dropout=0.5)
    x = torch.randn(1, 6, 32)
    with torch.no_grad():
        y, inter = m(x, return_intermediates=True)
        assert torch.allclose(y, m(x))                              # eval: no dropout, same path
        assert inter.weights.shape == inter.scores.shape == (1, 4, 6, 6)
        assert torch.allclose(inter.weights, torch.softmax(inter.scores, -1), atol=1e-6)
        assert torch.allclose(inter.weights.sum(-1), torch.ones(1, 4, 6))
        assert torch.isinf(inter.scores[0, :, 0, 1:]).all()         # causal: the future is -inf
        m.train()
        assert not torch.allclose(m(x), m(x))                       # training: dropout active


def count_flops(m: AttentionLayer, x: torch.Tensor) -> int:
    with FlopCounterMode(display=False) as counter:
        m(x)
    return counter.get_total_flops()


def test_h_heads_cost_the_same_flops_as_one_wide_head():
    x = torch.randn(1, 64, 48)
    one = count_flops(make(d_model=48, n_heads=1, n_kv_heads=None, backend="reference"), x)
    for h in (2, 4, 6, 12):
        assert count_flops(make(d_model=48, n_heads=h, n_kv_heads=None, backend="reference"), x) == one
    N, d = 64, 48
    assert one == 8 * N * d * d + 4 * N * N * d                     # 4 projections + QK^T and PV


def test_gqa_shrinks_projections_and_cache():
    m = make(n_heads=8, n_kv_heads=2)
    assert m.k_proj.out_features == m.v_proj.out_features == 2 * 4
    assert m.new_cache(3, 10).k.shape == (3, 2, 10, 4)


def test_clear_errors():
    with pytest.raises(ValueError, match="d_model=30 is not divisible by n_heads=4"):
        AttentionConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="n_heads=6 is not a multiple of n_kv_heads=4"):
        AttentionConfig(d_model=48, n_heads=6, n_kv_heads=4)
    m = make(positional="learned", positional_options={"max_len": 8})
    with pytest.raises(ValueError, match="past the learned encoding's max length 8"):
        m(torch.randn(1, 9, 32))
    cm = make(cross=True, d_context=24)
    with pytest.raises(ValueError, match=r"context must be \(B=1, S, d_context=24\)"):
        cm(torch.randn(1, 3, 32), torch.randn(1, 4, 32))
    with pytest.raises(ValueError, match="needs a context"):
        cm(torch.randn(1, 3, 32))
    with pytest.raises(ValueError, match="self-attention"):
        make()(torch.randn(1, 3, 32), torch.randn(1, 3, 32))
    sm = make(causal=True)
    cache = sm.new_cache(1, 4)
    sm(torch.randn(1, 3, 32), cache=cache)
    with pytest.raises(ValueError, match="KV cache is full: 3 \\+ 2 new positions > capacity 4"):
        sm(torch.randn(1, 2, 32), cache=cache)
    with pytest.raises(ValueError, match=r"x must be \(B, L, 32\)"):
        sm(torch.randn(3, 32))
    with pytest.raises(ValueError, match="cross-attention takes no positional scheme"):
        AttentionConfig(d_model=32, n_heads=4, cross=True, positional="rope")
    with pytest.raises(ValueError, match="KV cache capacity"):
        KVCache(1, 1, 4, 0)


def test_gradients_reach_every_parameter():
    for scheme in SCHEMES:
        m = make(positional=scheme, causal=True, backend="tiled").train()
        m(torch.randn(2, 7, 32)).square().sum().backward()
        for name, p in m.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), f"{scheme}: {name}"
