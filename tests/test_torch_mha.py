"""attnlab.nn.MultiheadAttention against torch.nn.MultiheadAttention: outputs, weights, gradients,
state_dict compatibility, the one deliberate difference (fully masked rows give 0, not NaN),
post-dropout weights, and errors."""
from __future__ import annotations

import random
import warnings
from dataclasses import dataclass, replace
from typing import Optional

import pytest
import torch
from einops import rearrange
from torch import nn
from torch.nn.modules.linear import NonDynamicallyQuantizableLinear

from attnlab.nn import MultiheadAttention

ATOL, RTOL = 1e-5, 1e-4       # fp32


@dataclass(frozen=True)
class Config:
    E: int
    heads: int
    N: int
    L: int
    S: int
    batch_first: bool
    kdim: Optional[int]
    vdim: Optional[int]
    bias: bool
    add_bias_kv: bool
    add_zero_attn: bool
    unbatched: bool
    self_attn: bool            # query is key is value (torch packs the projection then)
    kpm: str                   # none | bool | float
    attn_mask: str             # none | bool2 | bool3 | float2 | float3
    is_causal: bool
    need_weights: bool
    average: bool
    train: bool                # train with dropout=0, or eval with dropout=0.3
    backend: str

    def __str__(self):
        return " ".join(f"{k}={v}" for k, v in self.__dict__.items())


def random_config(i: int) -> Config:
    r = random.Random(1000 + i)
    E, heads = r.choice([(8, 2), (12, 3), (16, 4), (16, 1), (6, 2)])
    unbatched = r.random() < 0.2
    L, S = r.randint(1, 6), r.randint(1, 7)
    kdim, vdim = (r.choice([None, None, 5, 9]) for _ in range(2))
    self_attn = kdim is None and vdim is None and r.random() < 0.3
    is_causal = r.random() < 0.2
    attn_mask = r.choice(["bool2", "float2"] if is_causal else ["none", "bool2", "bool3", "float2", "float3"])
    return Config(E=E, heads=heads, N=1 if unbatched else r.randint(1, 3), L=L, S=L if self_attn else S,
                  batch_first=r.random() < 0.5, kdim=kdim, vdim=vdim, bias=r.random() < 0.7,
                  add_bias_kv=r.random() < 0.3, add_zero_attn=r.random() < 0.3, unbatched=unbatched,
                  self_attn=self_attn, kpm=r.choice(["none", "bool", "float"]), attn_mask=attn_mask,
                  is_causal=is_causal, need_weights=r.random() < 0.6, average=r.random() < 0.5,
                  train=r.random() < 0.5, backend=r.choice(["auto", "auto", "reference", "sdpa", "tiled"]))


def pair(cfg: Config, seed: int = 0, **kw) -> tuple[nn.MultiheadAttention, MultiheadAttention]:
    """torch's module and ours with torch's parameters (ours loads torch's state_dict, strictly)."""
    args = dict(embed_dim=cfg.E, num_heads=cfg.heads, dropout=0.0 if cfg.train else 0.3, bias=cfg.bias,
                add_bias_kv=cfg.add_bias_kv, add_zero_attn=cfg.add_zero_attn, kdim=cfg.kdim, vdim=cfg.vdim,
                batch_first=cfg.batch_first, **kw)
    torch.manual_seed(seed)
    theirs = nn.MultiheadAttention(**args)
    with torch.no_grad():                        # non-zero biases, so wrong bias handling shows
        for p in theirs.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ours = MultiheadAttention(**args, backend=cfg.backend)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    theirs.train(cfg.train), ours.train(cfg.train)
    return theirs, ours


def inputs(cfg: Config, g: torch.Generator):
    """query, key, value and the masks, in the layout cfg asks for; every row keeps key 0 allowed."""
    N, L, S, h = cfg.N, cfg.L, cfg.S, cfg.heads

    def x(n, width):
        t = torch.randn(n, N, width, generator=g)                           # (n, N, width)
        t = t[:, 0] if cfg.unbatched else (t.transpose(0, 1) if cfg.batch_first else t)
        return t.contiguous().requires_grad_()

    query = x(L, cfg.E)
    key, value = (query, query) if cfg.self_attn else (x(S, cfg.kdim or cfg.E), x(S, cfg.vdim or cfg.E))

    def mask(shape, kind):
        if kind.startswith("bool"):
            m = torch.rand(shape, generator=g) < 0.35
            m[..., 0] = False
            return m
        m = torch.randn(shape, generator=g)
        m = m.masked_fill(torch.rand(shape, generator=g) < 0.2, float("-inf"))
        m[..., 0] = 0.0
        return m

    kpm = None if cfg.kpm == "none" else mask((S,) if cfg.unbatched else (N, S), cfg.kpm)
    am = None
    if cfg.is_causal:        # a correct hint: top-left causal, as torch's is_causal means it
        upper = torch.ones(L, S, dtype=torch.bool).triu(1)
        am = upper if cfg.attn_mask == "bool2" else torch.zeros(L, S).masked_fill(upper, float("-inf"))
    elif cfg.attn_mask != "none":
        am = mask((L, S) if cfg.attn_mask.endswith("2") else (N * h if not cfg.unbatched else h, L, S),
                  cfg.attn_mask)
    return query, key, value, kpm, am


def run(mod, cfg, query, key, value, kpm, am):
    """Forward, backward of a random projection of the output (and weights); returns the results
    and the gradients of the inputs and parameters, and the warnings raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, w = mod(query, key, value, key_padding_mask=kpm, need_weights=cfg.need_weights, attn_mask=am,
                     average_attn_weights=cfg.average, is_causal=cfg.is_causal)
    g = torch.Generator().manual_seed(7)
    loss = (out * torch.randn(out.shape, generator=g)).sum()
    if w is not None and cfg.backend in ("auto", "reference"):   # "sdpa"/"tiled" weights are detached
        loss = loss + (w * torch.randn(w.shape, generator=g)).sum()
    leaves = [t for t in {id(t): t for t in (query, key, value)}.values()] + list(mod.parameters())
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return out, w, grads, sorted(str(c.message) for c in caught)


CONFIGS = [random_config(i) for i in range(90)]


@pytest.mark.parametrize("i", range(len(CONFIGS)))
def test_matches_torch(i):
    cfg = CONFIGS[i]
    theirs, ours = pair(cfg, seed=i)
    data = inputs(cfg, torch.Generator().manual_seed(i))
    t_out, t_w, t_g, t_warn = run(theirs, cfg, *data)
    o_out, o_w, o_g, o_warn = run(ours, cfg, *data)
    assert o_warn == t_warn, f"[{cfg}] warnings differ: {o_warn} vs torch {t_warn}"
    assert o_out.shape == t_out.shape, f"[{cfg}] out shape {o_out.shape} vs torch {t_out.shape}"
    err = (o_out - t_out).abs().max().item()
    assert torch.allclose(o_out, t_out, atol=ATOL, rtol=RTOL), f"[{cfg}] output max diff {err:.2e}"
    assert (o_w is None) == (t_w is None), f"[{cfg}] weights returned by one module only"
    if t_w is not None:
        assert o_w.shape == t_w.shape and o_w.dtype == t_w.dtype, f"[{cfg}] weights {o_w.shape} vs {t_w.shape}"
        err = (o_w - t_w).abs().max().item()
        assert torch.allclose(o_w, t_w, atol=ATOL, rtol=RTOL), f"[{cfg}] weights max diff {err:.2e}"
    names = ["input"] * (len(o_g) - len(list(ours.parameters()))) + [n for n, _ in ours.named_parameters()]
    for name, a, b in zip(names, o_g, t_g):
        assert (a is None) == (b is None), f"[{cfg}] grad of {name}: None for one module only"
        if a is not None:
            err = (a - b).abs().max().item()
            assert torch.allclose(a, b, atol=ATOL, rtol=RTOL), f"[{cfg}] grad of {name} max diff {err:.2e}"


def test_configs_cover_every_option():
    for field in ("batch_first", "bias", "add_bias_kv", "add_zero_attn", "unbatched", "self_attn", "is_causal",
                  "need_weights", "average", "train"):
        assert {getattr(c, field) for c in CONFIGS} == {False, True}, field
    assert {c.kpm for c in CONFIGS} == {"none", "bool", "float"}
    assert {c.attn_mask for c in CONFIGS} == {"none", "bool2", "bool3", "float2", "float3"}
    assert {c.backend for c in CONFIGS} == {"auto", "reference", "sdpa", "tiled"}
    assert {c.kdim for c in CONFIGS} >= {None, 5, 9} and {c.vdim for c in CONFIGS} >= {None, 5, 9}
    assert any(c.is_causal and c.kpm == "none" and not c.need_weights and (c.add_bias_kv or c.add_zero_attn)
               for c in CONFIGS)   # torch's SDPA is_causal path over padded keys


def test_eval_without_grad_matches_torch_fast_path():
    """Batch-first self-attention in eval without grad takes torch's native fused path."""
    cfg = replace(CONFIGS[0], E=16, heads=4, kdim=None, vdim=None, batch_first=True, add_bias_kv=False,
                  add_zero_attn=False, bias=True, train=False, backend="auto")
    theirs, ours = pair(cfg)
    x = torch.randn(3, 6, 16)
    kpm = torch.tensor([[False] * 6, [False] * 4 + [True] * 2, [False] * 5 + [True]])
    with torch.no_grad():
        for need in (False, True):
            t_out, t_w = theirs(x, x, x, key_padding_mask=kpm, need_weights=need)
            o_out, o_w = ours(x, x, x, key_padding_mask=kpm, need_weights=need)
            assert torch.allclose(o_out, t_out, atol=ATOL), f"need_weights={need}: {(o_out - t_out).abs().max():.2e}"
            if need:
                assert torch.allclose(o_w, t_w, atol=ATOL)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("how", ["kpm", "attn_mask_bool", "attn_mask_float"])
def test_fully_masked_rows_give_zero_where_torch_gives_nan(how, batch_first):
    torch.manual_seed(0)
    E, h, N, L, S = 8, 2, 2, 4, 5
    theirs = nn.MultiheadAttention(E, h, batch_first=batch_first)
    with torch.no_grad():
        theirs.out_proj.bias.normal_()
    ours = MultiheadAttention(E, h, batch_first=batch_first)
    ours.load_state_dict(theirs.state_dict())
    query, key, value = (torch.randn(N, n, E) for n in (L, S, S))
    kpm = am = None
    if how == "kpm":
        kpm = torch.zeros(N, S, dtype=torch.bool)
        kpm[1] = True                                    # example 1 has no key at all
        empty = (1, slice(None))                         # (n, rows) of the empty rows
    else:
        am = torch.zeros(L, S, dtype=torch.bool)
        am[2] = True                                     # query 2 may attend nothing
        if how == "attn_mask_float":
            am = torch.zeros(L, S).masked_fill(am, float("-inf"))
        empty = (slice(None), 2)
    if not batch_first:
        query, key, value = (t.transpose(0, 1) for t in (query, key, value))
    query.requires_grad_()
    t_out, t_w = theirs(query, key, value, key_padding_mask=kpm, attn_mask=am, average_attn_weights=False)
    o_out, o_w = ours(query, key, value, key_padding_mask=kpm, attn_mask=am, average_attn_weights=False)
    if not batch_first:
        t_out, o_out = t_out.transpose(0, 1), o_out.transpose(0, 1)       # (N, L, E)
    assert torch.isnan(t_out[empty]).all() and torch.isnan(t_w[empty[0], :, empty[1]]).all()
    assert torch.equal(o_out[empty], ours.out_proj.bias.expand_as(o_out[empty]))   # attention gave 0
    assert (o_w[empty[0], :, empty[1]] == 0).all()
    keep = ~torch.isnan(t_out).any(-1)
    assert torch.allclose(o_out[keep], t_out[keep], atol=ATOL), "rows that have keys still match torch"
    grads = torch.autograd.grad((o_out ** 2).sum() + o_w.sum(), [query] + list(ours.parameters()))
    assert all(torch.isfinite(g).all() for g in grads)


def _dropout_case(backend: str, need_weights: bool = True):
    torch.manual_seed(3)
    mod = MultiheadAttention(16, 4, dropout=0.5, batch_first=True, backend=backend)
    x = torch.randn(2, 7, 16)
    am = torch.rand(7, 7) < 0.3
    am[:, 0] = False
    mod.eval()
    _, w_eval = mod(x, x, x, attn_mask=am, average_attn_weights=False)
    mod.train()
    out, w = mod(x, x, x, attn_mask=am, average_attn_weights=False, need_weights=need_weights)
    return mod, x, out, w, w_eval


@pytest.mark.parametrize("backend", ["auto", "reference", "tiled"])
def test_training_weights_are_post_dropout_and_consistent_with_output(backend):
    mod, x, out, w, w_eval = _dropout_case(backend)
    # every weight is either dropped or the pre-dropout weight scaled by 1 / (1 - p)
    kept = w != 0
    assert torch.allclose(w[kept], w_eval[kept] * 2.0, atol=1e-6)
    frac = kept[w_eval > 0].float().mean().item()
    assert 0.3 < frac < 0.7, f"kept fraction {frac:.2f} for p=0.5"
    # the output was computed with exactly these weights
    v = rearrange(torch.nn.functional.linear(x, *_v_proj(mod)), "n s (h d) -> n h s d", h=4)
    manual = mod.out_proj(rearrange(w @ v, "n h l d -> n l (h d)"))
    assert torch.allclose(out, manual, atol=1e-5), f"max diff {(out - manual).abs().max():.2e}"


def _v_proj(mod):
    E = mod.embed_dim
    return mod.in_proj_weight[2 * E:], mod.in_proj_bias[2 * E:]


def test_sdpa_backend_returns_pre_dropout_weights_in_training():
    _, _, _, w, w_eval = _dropout_case("sdpa")
    assert torch.allclose(w, w_eval, atol=1e-6)      # documented: SDPA's dropout draw is not recoverable


def test_dropout_draw_does_not_depend_on_need_weights():
    """Peeking the dropout seed for the weights consumes nothing: the same output either way."""
    out_w = _dropout_case("reference", need_weights=True)[2]
    out_nw = _dropout_case("reference", need_weights=False)[2]
    assert torch.equal(out_w, out_nw)


@pytest.mark.parametrize("kw", [dict(), dict(bias=False), dict(add_bias_kv=True, add_zero_attn=True),
                                dict(kdim=5), dict(vdim=3, batch_first=True), dict(kdim=4, vdim=6, bias=False)],
                         ids=str)
def test_state_dict_round_trip_and_same_init(kw):
    torch.manual_seed(11)
    theirs = nn.MultiheadAttention(12, 3, **kw)
    torch.manual_seed(11)
    ours = MultiheadAttention(12, 3, **kw)
    t_named = [(n, p.shape) for n, p in theirs.named_parameters()]
    assert [(n, p.shape) for n, p in ours.named_parameters()] == t_named
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for (n, a), b in zip(ours.state_dict().items(), theirs.state_dict().values()):
        assert torch.equal(a, b), f"{n}: same seed should give torch's initial values"
    assert type(ours.out_proj) is NonDynamicallyQuantizableLinear
    for p in ours.parameters():
        torch.nn.init.normal_(p)
    theirs.load_state_dict(ours.state_dict(), strict=True)       # ours -> torch
    fresh = MultiheadAttention(12, 3, **kw)
    fresh.load_state_dict(theirs.state_dict(), strict=True)      # torch -> ours
    for (n, a), b in zip(fresh.state_dict().items(), ours.state_dict().values()):
        assert torch.equal(a, b), n


def test_weights_from_auto_carry_gradients():
    mod = MultiheadAttention(8, 2)
    x = torch.randn(3, 2, 8)
    _, w = mod(x, x, x)
    assert w.requires_grad and w.shape == (2, 3, 3)


X = torch.randn(4, 2, 8)         # (L, N, E) for MultiheadAttention(8, 2)


@pytest.mark.parametrize("make, call, err, match", [
    (dict(embed_dim=10, num_heads=3), None, ValueError,
     r"embed_dim=10 is not divisible by num_heads=3; choose num_heads among \[1, 2, 5, 10\]"),
    (dict(embed_dim=0, num_heads=1), None, ValueError, r"embed_dim must be a positive int, got 0"),
    (dict(embed_dim=8, num_heads=2, dropout=1.0), None, ValueError, r"dropout=1.0 must be a probability in \[0, 1\)"),
    (dict(embed_dim=8, num_heads=2, backend="flash9"), None, ValueError, r"unknown backend 'flash9'"),
    (None, dict(key_padding_mask=torch.zeros(2, 5, dtype=torch.bool)), ValueError,
     r"key_padding_mask has shape \(2, 5\); expected \(2, 4\) = \(N, S\)"),
    (None, dict(attn_mask=torch.zeros(4, 5, dtype=torch.bool)), ValueError,
     r"attn_mask has shape \(4, 5\); expected \(4, 4\) = \(L, S\) or \(4, 4, 4\) = \(N \* num_heads, L, S\)"),
    (None, dict(attn_mask=torch.zeros(2, 4, 4, dtype=torch.bool)), ValueError, r"attn_mask has shape \(2, 4, 4\)"),
    (None, dict(attn_mask=torch.zeros(4, 4, dtype=torch.long)), TypeError,
     r"attn_mask has dtype torch.int64; use a bool mask"),
    (None, dict(key_padding_mask=torch.zeros(2, 4, dtype=torch.float64)), TypeError,
     r"key_padding_mask is a torch.float64 float mask but the query is torch.float32"),
    (None, dict(is_causal=True), ValueError, r"is_causal=True .* needs attn_mask"),
    (None, dict(query=torch.randn(4, 2, 6)), ValueError,
     r"query has width 6 \(4, 2, 6\) but the module was built with embed_dim=8"),
    (None, dict(query=X.double()), TypeError, r"query has dtype torch.float64 but the parameters are torch.float32"),
    (None, dict(query=torch.randn(1, 4, 2, 8)), ValueError, r"query has 4 dims"),
    (None, dict(key=torch.randn(4, 8)), ValueError, r"query is 3-D but key is 2-D"),
    (None, dict(key=torch.randn(4, 3, 8), value=torch.randn(4, 3, 8)), ValueError,
     r"batch sizes differ: query 2, key 3"),
    (None, dict(value=torch.randn(5, 2, 8)), ValueError, r"key has 4 positions but value has 5"),
], ids=lambda v: v.split(";")[0][:40] if isinstance(v, str) else "")
def test_bad_input_names_the_problem(make, call, err, match):
    if call is None:
        with pytest.raises(err, match=match):
            MultiheadAttention(**make)
        return
    mod = MultiheadAttention(8, 2)
    args = {"query": X, "key": X, "value": X, **call}
    with pytest.raises(err, match=match):
        mod(**args)
    theirs = nn.MultiheadAttention(8, 2)
    with pytest.raises(Exception):          # torch rejects the same input (with a vaguer error)
        theirs(**args)


# --- what torch's own layers and tests call (issue #17) -----------------------------------------------

@pytest.mark.parametrize("am", ["none", "bool2", "bool3", "float2"])
@pytest.mark.parametrize("kpm", ["none", "bool", "float"])
def test_merge_masks_equals_torch(am, kpm):
    theirs, ours = nn.MultiheadAttention(8, 2, batch_first=True), MultiheadAttention(8, 2, batch_first=True)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 5, 8, generator=g)
    a = {"none": None, "bool2": torch.rand(5, 5, generator=g) < 0.3, "bool3": torch.rand(6, 5, 5, generator=g) < 0.3,
         "float2": torch.randn(5, 5, generator=g)}[am]
    k = {"none": None, "bool": torch.rand(3, 5, generator=g) < 0.3, "float": torch.randn(3, 5, generator=g)}[kpm]
    want, want_type = theirs.merge_masks(a, k, q)
    got, got_type = ours.merge_masks(a, k, q)
    assert got_type == want_type
    assert (got is None and want is None) or (got.shape == want.shape and torch.equal(got, want))


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("grad", [False, True])
def test_half_in_proj_bias_with_double_query_promotes_like_torch(need_weights, grad):
    """torch's test_multihead_attn_fast_path_query_and_bias_have_different_dtypes: torch's module runs
    (its projection adds the half bias to a double matmul), so ours must too, with the same result."""
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(4, 4, batch_first=True, dtype=torch.double).eval()
    theirs.in_proj_bias = nn.Parameter(torch.randn(12).half())
    ours = MultiheadAttention(4, 4, batch_first=True, dtype=torch.double).eval()
    ours.in_proj_bias = nn.Parameter(torch.empty(12, dtype=torch.half))
    ours.load_state_dict(theirs.state_dict())
    q = torch.randn(4, 4, 4, dtype=torch.double)
    with torch.set_grad_enabled(grad):
        t_out, t_w = theirs(q, q, q, need_weights=need_weights)
        o_out, o_w = ours(q, q, q, need_weights=need_weights)
    assert o_out.dtype == t_out.dtype == torch.double
    assert torch.allclose(o_out, t_out, atol=1e-10), f"max diff {(o_out - t_out).abs().max():.2e}"
    if need_weights:
        assert torch.allclose(o_w, t_w, atol=1e-10)


def test_from_torch_copies_configuration_weights_and_mode():
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(12, 3, dropout=0.1, add_bias_kv=True, kdim=5, vdim=7, batch_first=True).eval()
    ours = MultiheadAttention.from_torch(theirs, backend="reference")
    assert not ours.training and ours.backend == "reference" and ours.kdim == 5 and ours.vdim == 7
    for (n, a), b in zip(ours.state_dict().items(), theirs.state_dict().values()):
        assert torch.equal(a, b), n
    q, k, v = torch.randn(2, 3, 12), torch.randn(2, 4, 5), torch.randn(2, 4, 7)
    assert torch.allclose(ours(q, k, v)[0], theirs(q, k, v)[0], atol=ATOL)
    with pytest.raises(TypeError, match="from_torch expects a torch.nn.MultiheadAttention, got Linear"):
        MultiheadAttention.from_torch(nn.Linear(2, 2))


def test_nested_tensor_input_is_refused_with_the_fix():
    mod = MultiheadAttention(8, 2, batch_first=True)
    nt = torch.nested.nested_tensor([torch.randn(3, 8), torch.randn(5, 8)], layout=torch.jagged)
    with pytest.raises(TypeError, match=r"query is a nested tensor: .*to_padded_tensor"):
        mod(nt, nt, nt)


def _torch_patterns():
    """Usage patterns from torch's own test/nn/test_multihead_attention.py (fast-path cases in eval + no_grad)."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(8, 5, 14, generator=g)
    am2 = torch.randint(0, 2, (5, 5), generator=g).bool()
    kpm = torch.randint(0, 2, (8, 5), generator=g).bool()
    am3 = torch.randint(0, 2, (8, 2, 3), generator=g).float()
    am3 = am3.masked_fill(am3 == 0, float("-inf")).masked_fill(am3 == 1, 0.0).repeat_interleave(4, 0)
    q3, kv3 = torch.rand(2, 8, 8, generator=g), torch.rand(3, 8, 8, generator=g)
    return {
        "two_masks_fast_path": (dict(embed_dim=14, num_heads=7, batch_first=True), (x, x, x),
                                dict(attn_mask=am2, key_padding_mask=kpm)),
        "3d_attn_mask": (dict(embed_dim=8, num_heads=4), (q3, kv3, kv3), dict(attn_mask=am3)),
        "small_fast_path_double": (dict(embed_dim=4, num_heads=4, batch_first=True, dtype=torch.double),
                                   (x[..., :4].double(),) * 3, {}),
        "in_proj_bias_none": (dict(embed_dim=2, num_heads=2, bias=False), (x[:2, :2, :2],) * 3, {}),
        "in_proj_weight_none": (dict(embed_dim=4, num_heads=4, kdim=2, vdim=2),
                                (x[:4, :4, :4], x[:4, :4, :2], x[:4, :4, :2]), {}),
    }


@pytest.mark.parametrize("name", list(_torch_patterns()))
@pytest.mark.parametrize("need_weights", [True, False])
def test_torch_test_patterns_in_eval_without_grad(name, need_weights):
    make, args, kw = _torch_patterns()[name]
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(**make).eval()
    ours = MultiheadAttention.from_torch(theirs)
    with torch.no_grad():
        t_out, t_w = theirs(*args, need_weights=need_weights, **kw)
        o_out, o_w = ours(*args, need_weights=need_weights, **kw)
    ok = ~torch.isnan(t_out)                                  # torch: NaN where a row has no key
    assert ok.any() and torch.allclose(o_out[ok], t_out[ok], atol=ATOL), f"{name}: output differs"
    if need_weights:
        ok = ~torch.isnan(t_w)
        assert torch.allclose(o_w[ok], t_w[ok], atol=ATOL), f"{name}: weights differ"


@pytest.mark.parametrize("which", ["key_padding_mask", "attn_mask"])
def test_one_bool_mask_tensor_is_one_attnlab_mask_across_calls(which, monkeypatch):
    """A caller passing one bool mask tensor to every call: each call hands attention the same inverted tensor (so
    the same attnlab mask and its kept plans), until the tensor is edited in place, after which the output still
    follows torch's module."""
    import attnlab.nn.torch_mha as tm
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(16, 4, batch_first=True)
    ours = MultiheadAttention.from_torch(theirs)
    x = torch.randn(2, 12, 16)
    m = (torch.rand(2, 12) > 0.7) if which == "key_padding_mask" else (torch.rand(12, 12) > 0.7)
    m[..., 0] = False                                            # no row fully masked (torch gives NaN there)
    seen = []
    real = tm.attention
    monkeypatch.setattr(tm, "attention", lambda *a, **k: seen.append(k["mask"]) or real(*a, **k))
    for _ in range(2):
        out = ours(x, x, x, need_weights=False, **{which: m})[0]
    assert seen[0] is seen[1]
    m[..., 5] = True                                             # edited in place: a new mask
    out = ours(x, x, x, need_weights=False, **{which: m})[0]
    assert seen[2] is not seen[1]
    torch.testing.assert_close(out, theirs(x, x, x, need_weights=False, **{which: m})[0], atol=ATOL, rtol=RTOL)
