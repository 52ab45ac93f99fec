"""attnlab.nn.MultiheadAttention swapped into torch's own Transformer layers (TransformerEncoderLayer,
TransformerEncoder with its nested-tensor path, TransformerDecoderLayer, nn.Transformer) agrees with
the same layers built on torch's module: training with grad, eval + no_grad (torch's fused fast path,
which calls merge_masks), the fast path switched off (attnlab computes), masks and is_causal."""
from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from torch import nn

import attnlab.nn.torch_mha as tm
from attnlab.nn import MultiheadAttention

TOL = 1e-5
E, H = 16, 4


def swapped(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` with every torch MultiheadAttention replaced by attnlab's (same weights)."""
    ours = copy.deepcopy(model)
    for name, mod in list(ours.named_modules()):
        for child_name, child in list(mod.named_children()):
            if type(child) is nn.MultiheadAttention:
                setattr(mod, child_name, MultiheadAttention.from_torch(child))
    assert not any(type(m) is nn.MultiheadAttention for m in ours.modules())
    return ours


@pytest.fixture
def calls(monkeypatch):
    """Counts attnlab.attention calls made by the module."""
    n = []
    real = tm.attention

    def spy(*a, **k):
        n.append(k.get("causal"))
        return real(*a, **k)
    monkeypatch.setattr(tm, "attention", spy)
    return n


def _masks(kind: str, N: int, L: int, g):
    """(attn_mask, key_padding_mask, is_causal) for a self-attention over L positions."""
    pad = torch.zeros(N, L, dtype=torch.bool)
    pad[1, L - 2:] = True                                   # example 1: last two positions are padding
    causal_bool = torch.ones(L, L, dtype=torch.bool).triu(1)
    return {
        "none": (None, None, False),
        "kpm": (None, pad, False),
        "bool": (torch.rand(L, L, generator=g) < 0.3, None, False),
        # 0 / -inf: torch's fused fast path reads a float mask as "masked where non-zero"
        "float": (torch.zeros(L, L).masked_fill(torch.rand(L, L, generator=g) < 0.3, float("-inf")), None, False),
        "causal": (nn.Transformer.generate_square_subsequent_mask(L), None, True),
        "causal+kpm": (causal_bool, pad, True),
        "both": (torch.rand(L, L, generator=g) < 0.3, pad, False),
    }[kind]


def _modes(mode: str):
    if mode == "train":
        return contextlib.nullcontext()
    if mode == "eval_fast":
        return torch.no_grad()
    ctx = contextlib.ExitStack()                            # eval, no grad, torch's fast path off
    ctx.enter_context(torch.no_grad())
    prev = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    ctx.callback(torch.backends.mha.set_fastpath_enabled, prev)
    return ctx


def _close(a, b, what):
    ok = ~torch.isnan(b)                                    # torch gives NaN on fully masked rows
    assert ok.any(), f"{what}: torch's result is all NaN"
    err = (a[ok] - b[ok]).abs().max().item()
    assert err <= TOL, f"{what}: max diff {err:.2e}"


@pytest.mark.parametrize("mode", ["train", "eval_fast", "eval_attnlab"])
@pytest.mark.parametrize("masks", ["none", "kpm", "bool", "float", "causal", "causal+kpm", "both"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer(mode, masks, norm_first, calls):
    torch.manual_seed(0)
    theirs = nn.TransformerEncoderLayer(E, H, dim_feedforward=32, dropout=0.0, batch_first=True,
                                        norm_first=norm_first)
    ours = swapped(theirs)
    theirs.train(mode == "train"), ours.train(mode == "train")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 7, E, generator=g, requires_grad=mode == "train")
    am, kpm, is_causal = _masks(masks, 3, 7, g)
    with _modes(mode):
        want = theirs(x, src_mask=am, src_key_padding_mask=kpm, is_causal=is_causal)
        n_before = len(calls)
        got = ours(x, src_mask=am, src_key_padding_mask=kpm, is_causal=is_causal)
    _close(got, want, f"{mode} {masks}")
    ran_attnlab = len(calls) > n_before
    assert ran_attnlab == (mode != "eval_fast"), "fast path: torch's fused layer; otherwise attnlab"
    if mode == "train":
        ga = torch.autograd.grad(got.sum(), [x] + list(ours.parameters()))
        gb = torch.autograd.grad(want.sum(), [x] + list(theirs.parameters()))
        for a, b in zip(ga, gb):
            _close(a, b, "grad")


@pytest.mark.parametrize("fast", [True, False])
def test_encoder_nested_tensor_path(fast):
    """TransformerEncoder in eval with a padding mask packs the batch into a nested tensor for the fused layers."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(E, H, dim_feedforward=32, dropout=0.0, batch_first=True)
    theirs = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=True).eval()
    ours = swapped(theirs).eval()
    x = torch.randn(3, 6, E)
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2, [False] * 2 + [True] * 4])
    with _modes("eval_fast" if fast else "eval_attnlab"):
        want, got = theirs(x, src_key_padding_mask=pad), ours(x, src_key_padding_mask=pad)
    real = ~pad
    _close(got[real], want[real], "encoder")


@pytest.mark.parametrize("mode", ["train", "eval_fast"])
@pytest.mark.parametrize("batch_first", [True, False])
def test_decoder_layer_and_transformer(mode, batch_first, calls):
    torch.manual_seed(0)
    theirs = nn.Transformer(E, H, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=32, dropout=0.0,
                            batch_first=batch_first)
    ours = swapped(theirs)
    theirs.train(mode == "train"), ours.train(mode == "train")
    g = torch.Generator().manual_seed(2)
    src, tgt = torch.randn(3, 7, E, generator=g), torch.randn(3, 5, E, generator=g)
    if not batch_first:
        src, tgt = src.transpose(0, 1), tgt.transpose(0, 1)
    src_pad = torch.zeros(3, 7, dtype=torch.bool)
    src_pad[2, 5:] = True
    tgt_mask = nn.Transformer.generate_square_subsequent_mask(5)
    kw = dict(tgt_mask=tgt_mask, src_key_padding_mask=src_pad, memory_key_padding_mask=src_pad, tgt_is_causal=True)
    with _modes(mode):
        want = theirs(src, tgt, **kw)
        got = ours(src, tgt, **kw)
    _close(got, want, f"transformer {mode}")
    assert calls and True in calls, "the decoder's causal self-attention ran structured (causal=True) in attnlab"
    if mode == "train":
        ga = torch.autograd.grad(got.sum(), list(ours.parameters()))
        gb = torch.autograd.grad(want.sum(), list(theirs.parameters()))
        for a, b in zip(ga, gb):
            _close(a, b, "grad")


def test_decoder_layer_alone_with_memory_mask():
    torch.manual_seed(0)
    theirs = nn.TransformerDecoderLayer(E, H, dim_feedforward=32, dropout=0.0, batch_first=True)
    ours = swapped(theirs)
    g = torch.Generator().manual_seed(3)
    tgt, mem = torch.randn(2, 4, E, generator=g), torch.randn(2, 6, E, generator=g)
    mem_mask = torch.rand(4, 6, generator=g) < 0.3
    mem_mask[:, 0] = False
    tgt_pad = torch.tensor([[False] * 4, [False, False, False, True]])
    want = theirs(tgt, mem, memory_mask=mem_mask, tgt_key_padding_mask=tgt_pad)
    got = ours(tgt, mem, memory_mask=mem_mask, tgt_key_padding_mask=tgt_pad)
    _close(got, want, "decoder layer")
