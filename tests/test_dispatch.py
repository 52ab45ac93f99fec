"""The small-request shortcut in ``attention``: it must call SDPA or the compiled kernel exactly where ``auto`` would
pick it, with the same arguments, and leave every other request (and every bad input) to the full path."""
import math

import pytest
import torch

import attnlab as al
from attnlab.functional import api, auto_rule
from attnlab.functional.mask_plan import plan_count
from attnlab.functional.request import make_request


def qkv(B=2, H=3, L=32, S=32, D=16, dtype=torch.float32, Hkv=None, Dv=None):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, L, D, generator=g, dtype=dtype)
    k = torch.randn(B, Hkv or H, S, D, generator=g, dtype=dtype)
    v = torch.randn(B, Hkv or H, S, Dv or D, generator=g, dtype=dtype)
    return q, k, v


def routed(q, k, v, causal, scale=None):
    """The backend the shortcut calls ('sdpa' or 'native'), or None: the full path."""
    plain = api._plain_small(q, k, v, causal, scale)
    return None if plain is None else plain[0]


# D = 8: off the AVX-512 tiles, where plain fp32 at n = 128 and 512 (FP32_SMALL_FROM) and bf16 from n = 16 go to the
# kernel; fp16 below 16 keys: SDPA on every class
PLAIN = [dict(), dict(L=128, S=128, D=8), dict(L=1, S=16), dict(L=512, S=512, D=8), dict(L=7, S=40),
         dict(dtype=torch.float64), dict(dtype=torch.bfloat16, D=8), dict(dtype=torch.float16, L=15, S=15),
         dict(B=1, H=1, D=1),
         dict(S=15), dict(L=8, S=8), dict(L=3, S=3, dtype=torch.float64),   # few keys, finite: a check, then SDPA
         dict(H=4, Hkv=2), dict(B=1, H=8, Hkv=1, L=1, S=64)]                   # GQA, MQA decode


@pytest.mark.parametrize("shape", PLAIN, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_shortcut_is_autos_sdpa_bit_for_bit(shape, causal, scale):
    q, k, v = qkv(**shape)
    causal = causal and q.shape[2] in (1, k.shape[2])          # bottom-right causal at L == 1 masks nothing
    assert routed(q, k, v, causal, scale) == "sdpa"
    assert auto_rule.pick(make_request(q, k, v, causal=causal, scale=scale))[0] == "sdpa"
    got = al.attention(q, k, v, causal=causal, scale=scale)
    want = al.attention(q, k, v, causal=causal, scale=scale, backend="sdpa")
    assert torch.equal(got, want)


@pytest.mark.parametrize("causal", [False, True])
def test_a_causal_mask_object_takes_the_shortcut_too(causal, monkeypatch):
    q, k, v = qkv(L=64, S=64)
    want = al.attention(q, k, v, mask=al.masks.causal(), causal=causal, backend="sdpa")
    monkeypatch.setattr(api, "make_request", lambda *a, **kw: pytest.fail("the full path ran"))
    assert torch.equal(al.attention(q, k, v, mask=al.masks.causal(), causal=causal), want)


def test_other_masks_and_causal_masks_with_l_not_s_take_the_full_path(monkeypatch):
    q, k, v = qkv(L=32, S=48)
    ran, real = [], api.make_request
    monkeypatch.setattr(api, "make_request", lambda *a, **kw: ran.append(1) or real(*a, **kw))
    for mask in (al.masks.causal(), al.masks.window(4, 0)):
        got = al.attention(q, k, v, mask=mask)
        torch.testing.assert_close(got, al.attention(q, k, v, mask=mask, backend="reference"))
    assert len(ran) == 4                                  # each auto call and each named call built a request


def test_shortcut_keeps_gradients():
    q, k, v = (t.requires_grad_() for t in qkv(dtype=torch.float64))
    al.attention(q, k, v, causal=True).sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    al.attention(q, k, v, causal=True, backend="reference").sum().backward()
    for got, t in zip(grads, (q, k, v)):
        torch.testing.assert_close(got, t.grad)


OTHERS = {
    "heads not a multiple of kv heads": (dict(H=3, Hkv=2), {}),
    "Dv != D": (dict(Dv=8), {}),
    "large": (dict(L=513, S=512), {}),
    "causal L != S": (dict(L=16, S=32), dict(causal=True)),
    "int scale": ({}, dict(scale=1)),
    "inf scale": ({}, dict(scale=math.inf)),
    "causal as int": ({}, dict(causal=1)),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("cls", ["avx2", "avx512_bf16", "amx"])
def test_half_precision_training_takes_the_full_path_where_the_kernel_wins(cls, dtype, monkeypatch, tiles):
    """auto sends bf16 and fp16 with gradients to the compiled kernel where it measured faster: without AVX-512 at
    every size (bf16 once went to SDPA at n = 64-512, 1.2-8.3x slower); on the Zen 4 fp16 from 32^2 scores
    (FP16_TRAIN_FROM) and bf16 below 512^2 on the tiles; on AMX fp16 at every size (``amx_fp16``: torch's AVX512-FP16
    GEMM against the kernel's fp32 tiles), bf16 at every size on AMX's tiles (``amx_bf16``). The shortcut must not
    send those to SDPA."""
    monkeypatch.setattr(auto_rule, "cpu_class", lambda: cls)
    monkeypatch.setattr(auto_rule, "on_amx", lambda D, Dv: D % 16 == 0 and Dv % 16 == 0)
    amx16 = cls == "amx" and dtype == torch.float16
    for n, D, kernel in ((32, 16, True),
                         (16, 16, cls == "avx2" or dtype == torch.bfloat16 or amx16),
                         (32, 8, cls == "avx2" or dtype == torch.float16)):   # D = 8: off the tiles
        q, k, v = qkv(L=n, S=n, D=D, dtype=dtype)
        q.requires_grad_()
        assert routed(q, k, v, True) == ("native" if kernel else "sdpa"), (n, D)
        with torch.no_grad():
            assert routed(q, k, v, True) == "sdpa"                          # inference at n = 32, 16
        assert auto_rule.pick(make_request(q, k, v, causal=True))[0] == ("native" if kernel else "sdpa"), (n, D)


@pytest.mark.parametrize("cls", ["avx2", "avx512_bf16", "amx"])
def test_fp16_inference_goes_to_the_kernel_where_its_class_measured_it_faster(cls, monkeypatch):
    """fp16 inference off AMX (no fast fp16 GEMM: the Zen 3 and the Zen 4) goes to the compiled kernel by its class's
    FP16_FWD_FROM: on the Zen 3 from n = 48 or 256 keys, on the Zen 4 from n = 48 or, without a mask, 16 keys; to SDPA
    below; on AMX causal from 256^2 scores (AMX_FP16_CAUSAL_FROM), and without a mask to SDPA at every size the shortcut
    covers (AMX_FP16_PLAIN_FROM is larger). The shortcut calls what auto picks."""
    monkeypatch.setattr(auto_rule, "cpu_class", lambda: cls)
    assert auto_rule.FP16_FWD_FROM == {"avx2": (48 * 48, 256), "avx512_bf16": (48 * 48, 16)}
    assert auto_rule.AMX_FP16_CAUSAL_FROM == 256 * 256 and auto_rule.AMX_FP16_PLAIN_FROM == (4096 * 4096, 1024)
    zen4 = cls == "avx512_bf16"
    for L, S, kernel in ((32, 32, zen4), (47, 47, zen4), (48, 48, True), (128, 128, True), (255, 255, True),
                         (256, 256, True), (512, 512, True),
                         (1, 64, zen4), (16, 64, zen4), (1, 255, zen4), (1, 256, True), (4, 4096, True),
                         (1, 16, zen4), (1, 15, False), (47, 15, False), (16, 16, zen4)):
        for causal in (False, True):
            if causal and L != S:
                continue
            q, k, v = qkv(B=1, L=L, S=S, dtype=torch.float16)     # 3 heads: causal below 96^2 scores over them
            want = (causal and L * S >= 256 * 256) if cls == "amx" else kernel and not (causal and L * S < 48 * 48)
            picked = auto_rule.pick(make_request(q, k, v, causal=causal))[0]
            assert picked == ("native" if want else "sdpa"), (L, S, causal, picked)
            assert routed(q, k, v, causal) == picked, (L, S, causal)


@pytest.mark.parametrize("grad", [False, True])
def test_fp16_on_amx_takes_the_kernel_from_its_crossover(monkeypatch, grad):
    """Plain fp16 on a CPU with AMX, where torch's fp16 GEMM is AVX512-FP16 and the kernel computes fp16 as fp32: the
    kernel with gradients at every size; forward causal from 256^2 scores, without a mask from 4096^2 scores with at
    least 1024 queries (fewer: the kernel's conversion of K and V costs more than the products). Where SDPA is picked
    the reason quotes the fp16 figures measured on AMX; a mask with gradients goes to the kernel too."""
    monkeypatch.setattr(auto_rule, "cpu_class", lambda: "amx")
    for L, S, causal, kernel in ((4096, 4096, False, True), (4095, 4096, False, False), (1024, 16384, False, True),
                                 (1023, 32768, False, False), (2048, 2048, False, False), (64, 16384, False, False),
                                 (1, 4096, False, False), (256, 256, True, True), (255, 255, True, False),
                                 (4096, 4096, True, True), (16, 16, True, False)):
        q, k, v = qkv(B=1, H=1, Hkv=1, L=L, S=S, dtype=torch.float16)
        q.requires_grad_(grad)
        want = "native" if kernel or grad else "sdpa"
        name, why = auto_rule.pick(make_request(q, k, v, causal=causal))
        assert name == want, (L, S, causal, name, why)
        assert "fp16" in why and "AMX" in why, why
        if L * S <= auto_rule.SMALL_PROBLEM:
            assert routed(q, k, v, causal) == want, (L, S, causal)
    q, k, v = qkv(B=1, H=1, Hkv=1, L=64, S=64, dtype=torch.float16)
    q.requires_grad_(grad)
    name, why = auto_rule.pick(make_request(q, k, v, mask=al.masks.padding([40])))
    assert name == ("native" if grad else "sdpa"), (name, why)


def test_small_bf16_inference_on_the_zen4_tiles_takes_the_kernel_from_its_crossover(monkeypatch, tiles):
    """bf16 forward below 512^2 on the Zen 4's tiles: the kernel where queries and keys both number at least 16 without
    a mask and 48 with a causal one (BF16_SMALL_FWD_FROM; below, causal from 96^2 scores over all heads: with B * H
    = 6 from n = 40), and decoding without a mask (fewer queries) from 32 keys with one query, grouped or not, from 64
    with 2-4 and from 16 with more (BF16_DECODE_KEYS_FROM); below, SDPA through the shortcut."""
    monkeypatch.setattr(auto_rule, "cpu_class", lambda: "avx512_bf16")
    assert auto_rule.BF16_SMALL_FWD_FROM == {False: 16, True: 48}
    assert auto_rule.BF16_DECODE_KEYS_FROM == ((1, 32), (4, 64), (None, 16))
    for L, S, causal, kernel, Hkv in ((16, 16, False, True, 3), (15, 15, False, False, 3), (15, 16, False, True, 3),
                                      (48, 48, False, True, 3), (512, 512, False, True, 3),
                                      (32, 32, True, False, 3), (39, 39, True, False, 3), (40, 40, True, True, 3),
                                      (64, 64, True, True, 3), (1, 4096, False, True, 3),
                                      (1, 32, False, True, 3), (1, 31, False, False, 3), (1, 32, False, True, 1),
                                      (1, 31, False, False, 1), (2, 63, False, False, 3), (2, 64, False, True, 3),
                                      (4, 63, False, False, 3), (4, 64, False, True, 3), (5, 16, False, True, 3),
                                      (5, 15, False, False, 3), (128, 8, False, False, 3),
                                      (4, 2048, False, True, 3), (16, 256, False, True, 3), (32, 128, False, True, 3),
                                      (128, 32, False, True, 3), (256, 255, False, True, 3),
                                      (16, 16384, False, True, 3)):
        q, k, v = qkv(L=L, S=S, dtype=torch.bfloat16, Hkv=Hkv)
        assert routed(q, k, v, causal) == ("native" if kernel else "sdpa"), (L, S, causal, Hkv)
        assert auto_rule.pick(make_request(q, k, v, causal=causal))[0] == ("native" if kernel else "sdpa")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("cls", ["avx512_bf16", "avx2", "amx"])
def test_a_small_causal_forward_with_many_heads_takes_the_kernel_on_the_zen4(cls, dtype, monkeypatch, tiles):
    """bf16 and fp16 causal inference below n = 48 on the Zen 4's class: the kernel from 96^2 scores over all the
    query heads, B * H * L * S (SMALL_CAUSAL_FWD_SCORES), where SDPA's causal kernel is slower; SDPA below, with
    gradients (their own rules) and on the other classes (not measured)."""
    monkeypatch.setattr(auto_rule, "cpu_class", lambda: cls)
    assert auto_rule.SMALL_CAUSAL_FWD_SCORES == {"avx512_bf16": 96 * 96}
    for B, H, n, kernel in ((1, 16, 24, True), (1, 16, 23, False), (1, 32, 16, False), (1, 32, 17, True),
                            (2, 8, 24, True), (1, 8, 32, False), (1, 4, 40, False), (1, 1, 8, False)):
        q, k, v = qkv(B=B, H=H, L=n, S=n, D=64, dtype=dtype)
        want = "native" if kernel and cls == "avx512_bf16" else "sdpa"
        picked = auto_rule.pick(make_request(q, k, v, causal=True))
        assert picked[0] == want and routed(q, k, v, True) == want, (B, H, n, picked)
        if want == "native":
            assert "many heads" in picked[1] and "AMD Zen 4" in picked[1], picked
        assert routed(q, k, v, False) == ("native" if cls == "avx512_bf16" and n >= 16 else "sdpa")   # no mask


@pytest.mark.parametrize("grad", [False, True])
def test_small_fp32_on_the_tiles_takes_the_kernel_from_its_classs_crossover(monkeypatch, tiles, grad):
    """Plain fp32 below 512^2 on the Zen 4's tiles: the kernel from FP32_SMALL_FROM scores (causal 80^2 with
    gradients, 88^2 forward; without a mask 128^2 forward, 256^2 with gradients) where queries and keys both number
    at least 64, and a forward without a mask with 16-63 queries from 1024 keys (FP32_FEW_QUERIES_FROM); SDPA below,
    and on the Zen 3 (no tiles) at every size the shortcut covers. On AMX causal only, from AMX_FP32_SMALL_FROM
    (192^2 with gradients, 256^2 forward)."""
    assert auto_rule.FP32_SMALL_MIN == 64 and auto_rule.FP32_FEW_QUERIES_FROM == (16, 1024)
    fwd = not grad
    cases = ((72, 72, True, False), (80, 80, True, grad), (84, 84, True, grad), (88, 88, True, True),
             (128, 128, True, True), (512, 512, True, True), (128, 128, False, fwd), (127, 128, False, False),
             (256, 256, False, True), (255, 256, False, fwd), (384, 384, False, True), (512, 512, False, True),
             (64, 4096, False, True), (63, 4096, False, fwd), (16, 1024, False, fwd), (15, 1024, False, False),
             (16, 1023, False, False), (4096, 63, False, False), (32, 32, False, False),
             (191, 191, True, True), (192, 192, True, True), (255, 255, True, True), (256, 256, True, True))
    amx_from = 192 * 192 if grad else 256 * 256
    for cls in ("avx512_bf16", "avx2", "amx"):
        monkeypatch.setattr(auto_rule, "cpu_class", lambda: cls)
        for L, S, causal, kernel in cases:
            if cls == "amx":
                kernel = causal and L * S >= amx_from
            kernel = kernel and cls != "avx2"
            q, k, v = qkv(L=L, S=S)
            q.requires_grad_(grad)
            assert routed(q, k, v, causal) == ("native" if kernel else "sdpa"), (cls, L, S, causal)
            picked = auto_rule.pick(make_request(q, k, v, causal=causal))
            assert picked[0] == ("native" if kernel else "sdpa"), (cls, L, S, causal, picked)
            if kernel:
                assert ("Intel Xeon with AMX" if cls == "amx" else "AMD Zen 4") in picked[1], picked


@pytest.mark.parametrize("grad", [False, True])
def test_fp32_gqa_decoding_on_the_zen4_takes_the_kernel_from_its_crossover(monkeypatch, tiles, grad):
    """One fp32 query per head with grouped queries on the Zen 4's class, where the kernel stacks a group's heads:
    with 4 or more query heads per kv head and D >= 128, from 1024 keys (GQA_FP32_DECODE_FROM); SDPA with
    gradients (not measured), for MHA and on the other classes."""
    assert auto_rule.GQA_FP32_DECODE_FROM == {"group": 4, "head_dim": 128, "keys": 1024}
    cases = ((32, 8, 1024, 128, True), (16, 4, 4096, 128, True), (32, 4, 2048, 256, True), (32, 8, 1023, 128, False),
             (16, 8, 4096, 128, False), (32, 8, 4096, 64, False), (32, 32, 4096, 128, False))
    for cls in ("avx512_bf16", "avx2", "amx"):
        monkeypatch.setattr(auto_rule, "cpu_class", lambda: cls)
        for H, Hkv, S, D, kernel in cases:
            q, k, v = qkv(B=1, H=H, Hkv=Hkv, L=1, S=S, D=D)
            q.requires_grad_(grad)
            kernel = kernel and not grad and cls == "avx512_bf16"
            assert routed(q, k, v, False) == ("native" if kernel else "sdpa"), (cls, H, Hkv, S, D)
            picked = auto_rule.pick(make_request(q, k, v))
            assert picked[0] == ("native" if kernel else "sdpa"), (cls, H, Hkv, S, D, picked)
            if kernel:
                assert "grouped queries" in picked[1] and "AMD Zen 4" in picked[1], picked


@pytest.mark.parametrize("name", OTHERS)
def test_other_requests_take_the_full_path(name):
    shape, kw = OTHERS[name]
    q, k, v = qkv(**shape)
    assert not api._plain_small(q, k, v, kw.get("causal", False), kw.get("scale"))


@pytest.mark.parametrize("where", ["q", "k"])
def test_few_keys_with_a_nan_take_the_full_path_and_give_nan(where):
    q, k, v = qkv(L=8, S=8)
    (q if where == "q" else k)[0, 1, 2, 3] = float("nan")
    assert not api._plain_small(q, k, v, True, None)
    out = al.attention(q, k, v, causal=True)
    want = al.attention(q.double(), k.double(), v.double(), causal=True, backend="reference")
    torch.testing.assert_close(out, want.float(), equal_nan=True)
    assert out.isnan().any()


def test_a_decode_step_takes_the_shortcut_unmasked(monkeypatch):
    q, k, v = qkv(B=1, H=4, L=1, S=256, D=32)
    want = al.attention(q, k, v, causal=True, backend="reference")
    monkeypatch.setattr(api, "make_request", lambda *a, **kw: pytest.fail("the full path ran"))
    torch.testing.assert_close(al.attention(q, k, v, causal=True), want)


# requests the Zen 4's rules send to the compiled kernel: bf16 decoding, a small bf16 forward, causal or not, fp16
# decoding (as fp32 inside, rounded once), fp32 GQA decoding (stacked: native_stack.py)
KERNEL_SHORTCUTS = [dict(B=1, H=8, L=1, S=128, D=64, dtype=torch.bfloat16), dict(L=64, S=64, dtype=torch.bfloat16),
                    dict(B=1, H=4, L=1, S=256, dtype=torch.float16),
                    dict(B=1, H=32, Hkv=8, L=1, S=1024, D=128)]


@pytest.mark.parametrize("shape", KERNEL_SHORTCUTS, ids=str)
@pytest.mark.parametrize("how", ["plain", "causal", "causal mask"])
def test_shortcut_to_the_kernel_is_the_native_backend_bit_for_bit(shape, how, monkeypatch, tiles):
    monkeypatch.setattr(auto_rule, "cpu_class", lambda: "avx512_bf16")
    q, k, v = qkv(**shape)
    kw = dict(causal=how == "causal", mask=al.masks.causal() if how == "causal mask" else None)
    assert routed(q, k, v, how != "plain") == "native"
    assert auto_rule.pick(make_request(q, k, v, **kw))[0] == "native"
    want, unmasked = al.attention(q, k, v, backend="native", **kw), al.attention(q, k, v, backend="native")
    monkeypatch.setattr(api, "make_request", lambda *a, **kw: pytest.fail("the full path ran"))
    got = al.attention(q, k, v, **kw)
    assert got.dtype == q.dtype and torch.equal(got, want)
    # the causal mask was applied (at L == 1 it masks nothing)
    assert torch.equal(got, unmasked) == (how == "plain" or q.shape[2] == 1)


def test_shortcut_to_the_kernel_keeps_gradients(monkeypatch, tiles):
    """bf16 training below SMALL_PROBLEM goes to the kernel on the Zen 4's tiles: through the shortcut, the same
    output and gradients as the native backend by name."""
    monkeypatch.setattr(auto_rule, "cpu_class", lambda: "avx512_bf16")
    q, k, v = qkv(L=32, S=32, D=16, dtype=torch.bfloat16)
    grads = []
    for backend in ("auto", "native"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        if backend == "auto":
            assert routed(*leaves, True) == "native"
        out = al.attention(*leaves, causal=True, backend=backend)
        out.float().square().sum().backward()
        grads.append([out.detach()] + [t.grad for t in leaves])
    for got, want in zip(*grads):
        assert torch.equal(got, want)


def test_without_the_kernel_the_shortcut_calls_sdpa(monkeypatch, tiles):
    monkeypatch.setattr(auto_rule, "cpu_class", lambda: "avx512_bf16")
    monkeypatch.setattr(api, "why_native_unavailable", lambda: "not built")
    q, k, v = qkv(B=1, H=8, L=1, S=128, D=64, dtype=torch.bfloat16)
    assert routed(q, k, v, False) == "sdpa"


def test_transposed_and_subclass_inputs_take_the_full_path():
    q, k, v = qkv()
    assert not api._plain_small(q.transpose(-1, -2).contiguous().transpose(-1, -2), k, v, False, None)

    class Tagged(torch.Tensor):
        pass
    assert not api._plain_small(q.as_subclass(Tagged), k, v, False, None)


@pytest.mark.parametrize("kw, error", [
    (dict(dropout_p=False), TypeError), (dict(scale=math.nan), TypeError), (dict(causal="yes"), TypeError),
    (dict(causal=0), TypeError),
    (dict(return_weights=0), TypeError)])
def test_bad_arguments_still_get_the_full_checks(kw, error):
    q, k, v = qkv()
    with pytest.raises(error):
        al.attention(q, k, v, **kw)


def test_autos_tile_count_is_remembered_per_mask_object(monkeypatch):
    q, k, v = qkv(B=1, H=2, L=1024, S=1024, D=16)
    window = al.masks.window(64, 0)
    calls = []
    real = type(window).tile_kinds
    monkeypatch.setattr(type(window), "tile_kinds", lambda self, *a: calls.append(a) or real(self, *a))
    first = auto_rule.skippable(make_request(q, k, v, mask=window))
    assert auto_rule.skippable(make_request(q, k, v, mask=window)) == first and len(calls) == 1
    auto_rule.skippable(make_request(q[:, :, :512], k, v, mask=window))          # another L: counted again
    other = al.masks.window(64, 0)                                          # another object: counted again
    assert auto_rule.skippable(make_request(q, k, v, mask=other)) == first and len(calls) == 3
    assert plan_count(other) == 1 and plan_count(window) == 2                # kept on the masks themselves
