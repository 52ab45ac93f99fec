"""Transformer blocks and stacks: every norm x MLP x placement runs forward/backward, post-norm
ends normalized, the decoder never peeks and decodes with a cache, T5 tables are shared."""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from attnlab.nn import MLP, BlockConfig, DecoderStack, EncoderStack, TransformerBlock

VARIANTS = list(itertools.product(["layer", "rms"], ["gelu", "swiglu"], [True, False]))


@pytest.mark.parametrize("norm,mlp,norm_first", VARIANTS)
def test_every_variant_trains(norm, mlp, norm_first):
    torch.manual_seed(0)
    cfg = BlockConfig(d_model=32, n_heads=4, norm=norm, mlp=mlp, norm_first=norm_first, dropout=0.1)
    enc, dec = EncoderStack(cfg, 2), DecoderStack(cfg, 2)
    src, tgt = torch.randn(2, 7, 32), torch.randn(2, 5, 32)
    y = dec(tgt, enc(src))
    assert y.shape == (2, 5, 32)
    y.square().mean().backward()
    for name, p in itertools.chain(enc.named_parameters(), dec.named_parameters()):
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_post_norm_output_is_normalized_pre_norm_residual_is_not():
    torch.manual_seed(0)
    x = 5 + 3 * torch.randn(2, 6, 32)
    post = TransformerBlock(BlockConfig(d_model=32, n_heads=4, norm_first=False)).eval()
    pre = TransformerBlock(BlockConfig(d_model=32, n_heads=4, norm_first=True)).eval()
    with torch.no_grad():
        yp, yr = post(x), pre(x)
    assert torch.allclose(yp.mean(-1), torch.zeros(2, 6), atol=1e-5)
    assert torch.allclose(yp.std(-1, unbiased=False), torch.ones(2, 6), atol=1e-3)
    assert (yr.mean(-1) - 5).abs().max() < 2.0 and (yr.std(-1) - 1).abs().min() > 0.5


def test_mlps():
    torch.manual_seed(0)
    x = torch.randn(3, 16)
    g = MLP(BlockConfig(d_model=16, n_heads=2, mlp="gelu"))
    assert torch.allclose(g(x), g.down(0.5 * g.up(x) * (1 + torch.erf(g.up(x) / 2 ** 0.5))), atol=1e-6)
    s = MLP(BlockConfig(d_model=24, n_heads=2, mlp="swiglu"))
    assert s.down.in_features == 64                                  # 8/3 * 24 = 64
    value, gate = s.up(x.new_zeros(1, 24) + 1).chunk(2, -1)
    assert torch.allclose(s(x.new_zeros(1, 24) + 1), s.down(value * F.silu(gate)))


def test_decoder_never_peeks_and_cache_equals_full():
    torch.manual_seed(0)
    cfg = BlockConfig(d_model=32, n_heads=4, n_kv_heads=2, norm="rms", mlp="swiglu", positional="rope")
    dec = DecoderStack(cfg, 2).eval()
    mem, tgt = torch.randn(2, 6, 32), torch.randn(2, 8, 32)
    with torch.no_grad():
        full = dec(tgt, mem)
        changed = tgt.clone()
        changed[:, 5:] += 1
        assert torch.allclose(dec(changed, mem)[:, :5], full[:, :5], atol=1e-6)
        cache = dec.new_cache(2, 8, memory_len=6)
        inc = torch.cat([dec(tgt[:, t: t + 1], mem if t == 0 else None, cache=cache) for t in range(8)], 1)
    assert (inc - full).abs().max() < 1e-5


def test_encoder_padding_and_t5_sharing():
    torch.manual_seed(0)
    enc = EncoderStack(BlockConfig(d_model=32, n_heads=4, positional="t5"), 3).eval()
    tables = {id(layer.self_attn.positional) for layer in enc.layers}
    assert len(tables) == 1 and enc.layers[0].self_attn.positional.bidirectional
    assert sum(p.numel() for p in enc.parameters() if p.shape == (32, 4)) == 32 * 4   # one table in all
    x = torch.randn(1, 7, 32)
    keep = torch.tensor([[True] * 5 + [False] * 2])
    with torch.no_grad():
        padded = enc(x, key_mask=keep)[:, :5]
    # T5 positions are relative, so dropping the padded tail changes nothing for the real tokens
    assert torch.allclose(padded, enc(x[:, :5]), atol=1e-5)


def test_block_errors():
    with pytest.raises(ValueError, match="norm must be 'layer' or 'rms'"):
        BlockConfig(d_model=8, n_heads=2, norm="batch")
    with pytest.raises(ValueError, match="mlp must be"):
        BlockConfig(d_model=8, n_heads=2, mlp="relu2")
    with pytest.raises(ValueError, match="n_layers >= 1"):
        EncoderStack(BlockConfig(d_model=8, n_heads=2), 0)
    dec = DecoderStack(BlockConfig(d_model=8, n_heads=2), 1)
    with pytest.raises(ValueError, match="pass the encoder output as memory"):
        dec(torch.randn(1, 3, 8), None)


def test_capture_records_every_layers_attention():
    torch.manual_seed(0)
    cfg = BlockConfig(d_model=32, n_heads=4)
    enc, dec = EncoderStack(cfg, 2).eval(), DecoderStack(cfg, 3).eval()
    src, tgt = torch.randn(1, 7, 32), torch.randn(1, 5, 32)
    with torch.no_grad():
        caught: list = []
        mem = enc(src, capture=caught)
        assert torch.equal(mem, enc(src))                            # capturing changes nothing
        assert [c.weights.shape for c in caught] == [(1, 4, 7, 7)] * 2
        caught = []
        dec(tgt, mem, capture=caught)
        assert [c.weights.shape for c in caught] == [(1, 4, 5, 5), (1, 4, 5, 7)] * 3
        assert torch.all(caught[0].weights.triu(1) == 0)             # decoder self-attention is causal


def test_a_key_mask_becomes_a_padding_mask_read_once_per_stack(monkeypatch):
    from attnlab.functional import api, masks
    from attnlab.functional.masks import DenseMask, PaddingMask
    right = torch.tensor([[True, True, True, False], [True, True, True, True]])
    assert isinstance(masks.from_key_mask(right), PaddingMask)
    assert masks.from_key_mask(right.flip(-1)).side == "left"
    assert masks.from_key_mask(torch.ones(2, 4, dtype=torch.bool)) is None
    holes = torch.tensor([[True, False, True, True]])
    assert isinstance(masks.from_key_mask(holes), DenseMask)
    for km in (right, right.flip(-1), holes):                      # the same keys, whichever form
        assert torch.equal(masks.from_key_mask(km).dense(3, 4).expand(km.shape[0], 1, 3, 4),
                           km[:, None, None, :].expand(-1, 1, 3, -1))
    reads, seen = [], []
    real_read, real_attention = masks.from_key_mask, api.attention
    monkeypatch.setattr(masks, "from_key_mask", lambda km: reads.append(1) or real_read(km))
    import attnlab.nn.attention as attn_mod
    monkeypatch.setattr(attn_mod, "attention", lambda *a, **kw: seen.append(kw["mask"]) or real_attention(*a, **kw))
    enc = EncoderStack(BlockConfig(d_model=16, n_heads=2), 3).eval()
    x = torch.randn(2, 4, 16)
    with torch.no_grad():
        out = enc(x, key_mask=right)
        dense_out = enc(x, key_mask=masks.dense(right[:, None, None, :]))
    assert len(reads) == 1 and all(isinstance(m, PaddingMask) for m in seen[:3])
    torch.testing.assert_close(out, dense_out)
