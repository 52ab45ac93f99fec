"""Positional encodings: the papers' numbers, their defining properties, and the structured biases
(ALiBi, T5, Shaw) computed per tile by the tiled backend without a (B, H, L, S) tensor."""
from __future__ import annotations

import math

import pytest
import torch

from attnlab.functional import attention
from attnlab.functional.backends.reference import reference_attention
from attnlab.functional.backends.tiled import tiled_attention
from attnlab.functional.bias import StructuredBias
from attnlab.functional import masks
from attnlab.positional import (ALiBi, LearnedEncoding, LearnedEncoding2D, RoPE, ShawRelative, SinusoidalEncoding,
                                T5Bias, alibi_slopes, make_positional, max_abs_rotation_error, sinusoidal,
                                sinusoidal_2d, t5_bucket)


# -- sinusoidal ------------------------------------------------------------------------------------
def test_sinusoidal_table_d4():
    pe = sinusoidal(2, 4, dtype=torch.float64)
    assert torch.allclose(pe[0], torch.tensor([0.0, 1.0, 0.0, 1.0], dtype=torch.float64))
    assert torch.allclose(pe[1], torch.tensor([0.841, 0.540, 0.010, 1.000], dtype=torch.float64), atol=5e-4)
    assert torch.allclose(pe[1], torch.tensor([math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)],
                                              dtype=torch.float64), atol=1e-15)


@pytest.mark.parametrize("k", [1, 3, 17, 100])
def test_sinusoidal_shift_is_a_fixed_rotation(k):
    pe = sinusoidal(300, 16, dtype=torch.float64)
    assert max_abs_rotation_error(pe, k) < 1e-12
    # and a different k's rotation does NOT map PE(p) to PE(p + k): the check can fail
    assert max_abs_rotation_error(torch.cat([pe[:1], pe[2:]]), k) > 1e-3


def test_sinusoidal_module_and_offsets():
    x = torch.zeros(2, 5, 8)
    enc = SinusoidalEncoding(8)
    assert torch.allclose(enc(x, 3)[0], sinusoidal(8, 8)[3:])
    per_example = enc(x, torch.tensor([0, 2]))
    assert torch.allclose(per_example[1], sinusoidal(7, 8)[2:])
    with pytest.raises(ValueError, match="divisible by 2"):
        SinusoidalEncoding(7)


def test_sinusoidal_2d_rows_and_columns():
    h, w, d = 3, 4, 16
    pe = sinusoidal_2d(h, w, d, dtype=torch.float64).reshape(h, w, d)
    one_d = torch.cat([sinusoidal(4, d // 2, dtype=torch.float64)[:, 0::2],
                       sinusoidal(4, d // 2, dtype=torch.float64)[:, 1::2]], dim=-1)   # [sin | cos] layout
    assert torch.allclose(pe[:, 2, : d // 2], one_d[:h])           # first half: row index
    assert torch.allclose(pe[1, :, d // 2:], one_d[:w])            # second half: column index
    enc = LearnedEncoding2D(h, w, d)
    assert enc(torch.zeros(1, h * w, d)).shape == (1, h * w, d)
    with pytest.raises(ValueError, match="12"):
        enc(torch.zeros(1, 11, d))


def test_learned_encoding_past_max_length():
    enc = LearnedEncoding(8, 4)
    assert enc(torch.zeros(1, 8, 4)).shape == (1, 8, 4)
    with pytest.raises(ValueError, match="position 8 is past the learned encoding's max length 8"):
        enc(torch.zeros(1, 2, 4), offset=7)


# -- RoPE ------------------------------------------------------------------------------------------
def test_rope_worked_example():
    q = torch.tensor([1.0, 0.0], dtype=torch.float64).reshape(1, 1, 1, 2)
    out = RoPE(2)(q, torch.tensor([1]))
    assert torch.allclose(out.flatten(), torch.tensor([math.cos(1), math.sin(1)], dtype=torch.float64))


@pytest.mark.parametrize("interleaved", [True, False])
def test_rope_scores_depend_on_offset_only_and_norms_kept(interleaved):
    g = torch.Generator().manual_seed(0)
    rope = RoPE(16, interleaved=interleaved)
    q, k = torch.randn(1, 1, 1, 16, generator=g, dtype=torch.float64), torch.randn(1, 1, 1, 16, generator=g,
                                                                                    dtype=torch.float64)

    def score(m, n):
        return float((rope(q, torch.tensor([m])) * rope(k, torch.tensor([n]))).sum())

    for m, n in [(0, 3), (5, 8), (100, 103), (4000, 4003)]:
        assert abs(score(m, n) - score(0, 3)) < 1e-9, (m, n)
    assert abs(score(0, 4) - score(0, 3)) > 1e-3                    # a different offset changes the score
    pos = torch.arange(50)
    x = torch.randn(2, 3, 50, 16, generator=g, dtype=torch.float64)
    assert torch.allclose(rope(x, pos).norm(dim=-1), x.norm(dim=-1))


def test_rope_conventions_differ_by_a_channel_permutation():
    x = torch.randn(1, 2, 7, 8, dtype=torch.float64)
    perm = torch.tensor([0, 4, 1, 5, 2, 6, 3, 7])                   # half-split channel t, t+4 -> pair (2t, 2t+1)
    pos = torch.arange(3, 10)
    a = RoPE(8, interleaved=True)(x[..., perm], pos)
    b = RoPE(8, interleaved=False)(x, pos)[..., perm]
    assert torch.allclose(a, b)


def test_rope_partial_and_errors():
    x = torch.randn(1, 1, 4, 8)
    out = RoPE(8, rotary_dim=4)(x, torch.arange(4))
    assert torch.equal(out[..., 4:], x[..., 4:]) and not torch.allclose(out[..., :4], x[..., :4])
    with pytest.raises(ValueError, match="even"):
        RoPE(8, rotary_dim=3)
    with pytest.raises(ValueError, match="positions must be"):
        RoPE(8)(x, torch.arange(5))


# -- ALiBi -----------------------------------------------------------------------------------------
def test_alibi_slopes_match_the_paper():
    assert torch.equal(alibi_slopes(8), torch.tensor([2.0 ** -e for e in range(1, 9)], dtype=torch.float64))
    twelve = [2.0 ** -e for e in range(1, 9)] + [2.0 ** -e for e in (0.5, 1.5, 2.5, 3.5)]
    assert torch.allclose(alibi_slopes(12), torch.tensor(twelve, dtype=torch.float64), rtol=1e-14)
    assert torch.allclose(alibi_slopes(6), torch.tensor([2.0 ** -e for e in (2, 4, 6, 8, 1, 3)],
                                                        dtype=torch.float64), rtol=1e-14)
    with pytest.raises(ValueError, match="positive number of heads"):
        alibi_slopes(0)


def test_alibi_bias_values():
    b = ALiBi(2).bias().dense(3, 5)                                 # (1, 2, 3, 5); queries at positions 2..4
    expected = -torch.tensor([0.0625, 0.00390625])[:, None, None] * (torch.arange(2, 5)[:, None]
                                                                     - torch.arange(5)[None]).abs()
    assert torch.allclose(b[0], expected)


# -- T5 ----------------------------------------------------------------------------------------------
BIDIR = [(0, 0), (7, 7), (8, 8), (11, 8), (12, 9), (15, 9), (16, 10), (22, 10), (23, 11), (31, 11), (32, 12),
         (45, 12), (46, 13), (63, 13), (64, 14), (90, 14), (91, 15), (1000, 15)]
CAUSAL = [(15, 15), (16, 16), (18, 16), (19, 17), (20, 17), (21, 18), (23, 18), (24, 19), (26, 19), (27, 20),
          (30, 20), (31, 21), (34, 21), (35, 22), (39, 22), (40, 23), (45, 23), (46, 24), (51, 24), (52, 25),
          (58, 25), (59, 26), (66, 26), (67, 27), (76, 27), (77, 28), (86, 28), (87, 29), (98, 29), (99, 30),
          (112, 30), (113, 31), (5000, 31)]


def test_t5_buckets_match_hand_computed_cases():
    a = torch.tensor([d for d, _ in BIDIR])
    past = t5_bucket(-a, bidirectional=True)                        # key in the past: n = j - i = -a
    future = t5_bucket(a[1:], bidirectional=True)
    assert past.tolist() == [b for _, b in BIDIR]
    assert future.tolist() == [16 + b for _, b in BIDIR[1:]]
    c = torch.tensor([d for d, _ in CAUSAL])
    assert t5_bucket(-c, bidirectional=False).tolist() == [b for _, b in CAUSAL]
    assert t5_bucket(torch.tensor([1, 50]), bidirectional=False).tolist() == [0, 0]   # future keys
    with pytest.raises(ValueError, match="num_buckets"):
        T5Bias(4, num_buckets=2)


# -- structured biases on the tiled backend ------------------------------------------------------
def _t5_bias(q, L, S):
    torch.manual_seed(3)                                            # the same table each time it is built
    return T5Bias(q.shape[1], num_buckets=8, max_distance=20).to(q.dtype).bias()


def _shaw_bias(q, L, S):
    torch.manual_seed(3)
    return ShawRelative(q.shape[-1], 3, values=False).double().to(q.dtype).bias(q, L, S, scale=q.shape[-1] ** -0.5)


BIASES = {
    "alibi": lambda q, L, S: ALiBi(q.shape[1]).bias(),
    "t5": _t5_bias,
    "shaw": _shaw_bias,
}


@pytest.mark.parametrize("name", sorted(BIASES))
@pytest.mark.parametrize("L,S,mask", [(37, 37, "causal"), (11, 45, "causal"), (40, 29, None)])
def test_structured_bias_tiled_matches_reference_without_dense(name, L, S, mask, monkeypatch):
    torch.manual_seed(0)
    q = torch.randn(2, 4, L, 16, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, S, 16, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, S, 16, dtype=torch.float64, requires_grad=True)
    m = masks.causal() if mask else None
    bias = BIASES[name](q, L, S)
    params = [p for p in bias.params if p.requires_grad]
    ref = reference_attention(q, k, v, mask=m, bias=bias, scale=0.25)
    g_ref = torch.autograd.grad(ref.square().sum(), [q, k, v, *params])
    monkeypatch.setattr(StructuredBias, "dense", lambda *a: pytest.fail("the tiled backend materialized the bias"))
    bias = BIASES[name](q, L, S)
    out = tiled_attention(q, k, v, mask=m, bias=bias, scale=0.25, tile_q=8, tile_k=16)
    g_out = torch.autograd.grad(out.square().sum(), [q, k, v, *[p for p in bias.params if p.requires_grad]])
    assert (out - ref).abs().max() < 1e-12
    for a, b in zip(g_out, g_ref):
        assert (a - b).abs().max() < 1e-10


def test_shaw_value_term_matches_the_papers_sum():
    torch.manual_seed(0)
    L, S, D, k = 5, 7, 4, 2
    shaw = ShawRelative(D, k).double()
    torch.nn.init.normal_(shaw.value_emb)
    w = torch.softmax(torch.randn(1, 1, L, S, dtype=torch.float64), -1)
    got = shaw.value_term(w, L, S)[0, 0]
    for i in range(L):
        expected = sum(w[0, 0, i, j] * shaw.value_emb[max(-k, min(k, j - (i + S - L))) + k] for j in range(S))
        assert torch.allclose(got[i], expected)


def test_make_positional_names():
    for name in ["sinusoidal", "learned", "rope", "alibi", "t5", "shaw"]:
        assert make_positional(name, d_model=16, n_heads=4, head_dim=4, causal=True).kind in (
            "absolute", "rotary", "bias", "relative")
    with pytest.raises(ValueError, match="unknown positional scheme 'nope'"):
        make_positional("nope", d_model=16, n_heads=4, head_dim=4, causal=True)


def test_alibi_through_attention_api_auto():
    q = torch.randn(1, 8, 40, 16)
    out = attention(q, q, q, causal=True, bias=ALiBi(8).bias())
    ref = attention(q, q, q, causal=True, bias=ALiBi(8).bias().dense(40, 40), backend="reference")
    assert (out - ref).abs().max() < 1e-5
