"""AxialAttention: row / column attention equals full attention over the flattened grid with a block mask."""
from __future__ import annotations

import math

import pytest
import torch

from attnlab.functional import attention, masks
from attnlab.nn.axial import AxialAttention, AxialAttentionConfig

B, R, C, DIM, H, HEAD, PAIR = 2, 3, 5, 12, 3, 4, 6   # odd grid on purpose


def make(axis="row", pair=True, gating=True, chunk_size=None, backend="reference", dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    cfg = AxialAttentionConfig(dim=DIM, n_heads=H, head_dim=HEAD, axis=axis, pair_dim=PAIR if pair else None,
                               gating=gating, chunk_size=chunk_size, backend=backend)
    mod = AxialAttention(cfg).to(dtype)
    if gating:   # move the gate off its constant init so that the test sees x-dependent gating
        torch.nn.init.normal_(mod.to_gate.weight, std=0.3)
    return mod


def inputs(axis="row", pair=True, masked=True, dtype=torch.float64, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, R, C, DIM, generator=g).to(dtype)
    n = C if axis == "row" else R
    z = torch.randn(B, n, n, PAIR, generator=g).to(dtype) if pair else None
    mask = None
    if masked:
        mask = torch.rand(B, R, C, generator=g) > 0.3
        mask[0, 1] = False          # a fully invalid row (sequence)
        mask[1, :, 2] = False       # a fully invalid column (residue)
    return x, z, mask


def flattened_reference(mod: AxialAttention, x, z, mask):
    """Full attention over all R·C grid tokens, restricted by a block mask to one row (or column).

    Token (s, i) is number s·C + i for both axes; no transposes, no chunks, no per-row batching.
    """
    cfg = mod.cfg
    xn = mod.norm(x)
    tokens = xn.reshape(B, R * C, DIM)

    def heads(t):                                            # (B, R·C, H·c) -> (B, H, R·C, c)
        return t.reshape(B, R * C, H, HEAD).transpose(1, 2)

    q, k, v = heads(mod.to_q(tokens)), heads(mod.to_k(tokens)), heads(mod.to_v(tokens))
    s = torch.arange(R).repeat_interleave(C)                 # row of each token
    i = torch.arange(C).repeat(R)                            # column of each token
    same = s[:, None] == s[None, :] if cfg.axis == "row" else i[:, None] == i[None, :]   # (RC, RC)
    allowed = same[None, None].expand(B, 1, R * C, R * C)
    if mask is not None:
        allowed = allowed & mask.reshape(B, 1, 1, R * C)
    bias = None
    if z is not None:
        b = mod.to_pair_bias(mod.pair_norm(z)).permute(0, 3, 1, 2)      # (B, H, n, n)
        pos = i if cfg.axis == "row" else s                              # the attended coordinate
        bias = b[:, :, pos[:, None], pos[None, :]]                       # (B, H, RC, RC)
    o = attention(q, k, v, mask=masks.dense(allowed), bias=bias, backend="reference")   # (B, H, RC, c)
    o = o.transpose(1, 2)                                                # (B, RC, H, c)
    if mod.to_gate is not None:
        o = o * torch.sigmoid(mod.to_gate(tokens)).reshape(B, R * C, H, HEAD)
    return mod.to_out(o.reshape(B, R * C, H * HEAD)).reshape(B, R, C, DIM)


@pytest.mark.parametrize("axis", ["row", "col"])
@pytest.mark.parametrize("pair", [False, True])
@pytest.mark.parametrize("gating", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_equals_full_attention_with_block_mask(axis, pair, gating, masked):
    mod = make(axis, pair, gating)
    x, z, mask = inputs(axis, pair, masked)
    x.requires_grad_()
    if z is not None:
        z.requires_grad_()
    out = mod(x, z, mask)
    want = flattened_reference(mod, x, z, mask)
    assert out.shape == (B, R, C, DIM)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    # gradients through both paths agree too (transposes and rearranges included)
    dout = torch.randn_like(out)
    leaves = [x] + ([z] if z is not None else [])
    got = torch.autograd.grad(out, leaves, dout)
    exp = torch.autograd.grad(want, leaves, dout)
    for a, b in zip(got, exp):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11)


@pytest.mark.parametrize("axis", ["row", "col"])
@pytest.mark.parametrize("pair", [False, True])
@pytest.mark.parametrize("chunk_size", [1, 2, 4, 100])
def test_chunked_equals_unchunked(axis, pair, chunk_size):
    x, z, mask = inputs(axis, pair)
    full = make(axis, pair)
    chunked = make(axis, pair, chunk_size=chunk_size)
    out_full, inter_full = full(x, z, mask, return_weights=True)
    out, inter = chunked(x, z, mask, return_weights=True)
    torch.testing.assert_close(out, out_full, rtol=0, atol=1e-13)
    torch.testing.assert_close(inter.weights, inter_full.weights, rtol=0, atol=1e-13)


@pytest.mark.parametrize("axis", ["row", "col"])
def test_weights_are_per_row_probabilities(axis):
    mod = make(axis)
    x, z, mask = inputs(axis)
    _, inter = mod(x, z, mask, return_weights=True)
    N, n = (R, C) if axis == "row" else (C, R)
    assert inter.weights.shape == (B, N, H, n, n)
    assert inter.pair_bias.shape == (B, H, n, n)
    keys = mask if axis == "row" else mask.transpose(1, 2)               # (B, N, n)
    assert (inter.weights[~keys[:, :, None, None, :].expand_as(inter.weights)] == 0).all(), "invalid keys get weight"
    sums = inter.weights.sum(-1)                                         # (B, N, H, n)
    has_keys = keys.any(-1)[:, :, None, None].expand_as(sums)
    torch.testing.assert_close(sums[has_keys], torch.ones_like(sums[has_keys]))
    assert (sums[~has_keys] == 0).all(), "a row with no valid key must have all-zero weights"


def test_fully_invalid_row_gives_output_bias_and_finite_grads():
    mod = make("row")
    x, z, mask = inputs("row")
    x.requires_grad_()
    out = mod(x, z, mask)
    torch.testing.assert_close(out[0, 1], mod.to_out.bias.expand(C, DIM))   # attention output 0 there
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_gradients_reach_every_parameter():
    mod = make("row")
    x, z, mask = inputs("row")
    x.requires_grad_()
    z.requires_grad_()
    mod(x, z, mask).pow(2).sum().backward()
    for name, p in list(mod.named_parameters()) + [("x", x), ("z", z)]:
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().max() > 0, f"{name} gets a zero gradient"


def test_gate_starts_at_sigmoid_one():
    torch.manual_seed(0)
    mod = AxialAttention(AxialAttentionConfig(dim=DIM, n_heads=H, head_dim=HEAD))
    x = torch.randn(B, R, C, DIM)
    g = torch.sigmoid(mod.to_gate(mod.norm(x)))
    torch.testing.assert_close(g, torch.full_like(g, 1 / (1 + math.exp(-1))))
    # and the gated module is then exactly sigmoid(1) times the ungated attention before to_out
    ungated = AxialAttention(AxialAttentionConfig(dim=DIM, n_heads=H, head_dim=HEAD, gating=False))
    ungated.load_state_dict({k: v for k, v in mod.state_dict().items() if not k.startswith("to_gate")})
    with torch.no_grad():
        ungated.to_out.weight.mul_(1 / (1 + math.exp(-1)))
    torch.testing.assert_close(mod(x), ungated(x))


@pytest.mark.parametrize("backend", ["sdpa", "tiled"])
@pytest.mark.parametrize("axis", ["row", "col"])
def test_backends_match_reference(backend, axis):
    """fp64 gold, fp32 reference, fp32 candidate: the candidate within 2x of the reference's error."""
    gold = make(axis, backend="reference")
    x, z, mask = inputs(axis)
    want = gold(x, z, mask)
    errs = {}
    for name in ("reference", backend):
        mod = make(axis, backend=name, dtype=torch.float32)
        out = mod(x.float(), z.float(), mask)
        errs[name] = (out.double() - want).abs().max().item()
    assert errs[backend] <= 2 * errs["reference"] + 1e-6, errs


def test_edge_sizes():
    for r, c in [(1, 1), (1, 7), (6, 1)]:
        for axis in ("row", "col"):
            n = c if axis == "row" else r
            cfg = AxialAttentionConfig(dim=8, n_heads=2, head_dim=3, axis=axis, pair_dim=4, chunk_size=2)
            mod = AxialAttention(cfg)
            out = mod(torch.randn(2, r, c, 8), torch.randn(2, n, n, 4), torch.ones(2, r, c, dtype=torch.bool))
            assert out.shape == (2, r, c, 8) and torch.isfinite(out).all()


def test_bad_input_errors():
    with pytest.raises(ValueError, match="axis='diag'"):
        AxialAttentionConfig(axis="diag")
    with pytest.raises(ValueError, match="chunk_size=0"):
        AxialAttentionConfig(chunk_size=0)
    mod = AxialAttention(AxialAttentionConfig(dim=DIM, n_heads=H, head_dim=HEAD, pair_dim=PAIR))
    x = torch.randn(B, R, C, DIM)
    z = torch.randn(B, C, C, PAIR)
    with pytest.raises(ValueError, match=r"\(B, R, C, dim=12\)"):
        mod(torch.randn(B, C, DIM), z)
    with pytest.raises(ValueError, match=r"\(B, R, C, dim=12\)"):
        mod(torch.randn(B, R, C, DIM + 1), z)
    with pytest.raises(ValueError, match="pass z of shape"):
        mod(x)
    with pytest.raises(ValueError, match=r"needs \(2, 5, 5, 6\)"):
        mod(x, torch.randn(B, R, R, PAIR))
    with pytest.raises(TypeError, match="bool"):
        mod(x, z, torch.ones(B, R, C))
    with pytest.raises(ValueError, match=r"\(B, R, C\) = \(2, 3, 5\)"):
        mod(x, z, torch.ones(B, C, R, dtype=torch.bool))
    plain = AxialAttention(AxialAttentionConfig(dim=DIM, n_heads=H, head_dim=HEAD))
    with pytest.raises(ValueError, match="pair_dim=None"):
        plain(x, z)
