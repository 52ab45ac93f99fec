"""Conformance: every exact backend against the fp64 reference, the same-dtype reference and torch SDPA.

The rule (flash-attention's): an optimized backend may be as inaccurate as naive PyTorch in the
same dtype, within 2x for outputs and 3x for gradients, plus a small absolute floor.
"""
import pytest
import torch
import torch.nn.functional as F

import attnlab as al
from attnlab.functional.backends import native
from attnlab.functional.backends.reference import reference_attention
from helpers import CANDIDATES, CASES, FLOOR, MASK_KINDS, errors, make_inputs, make_mask

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


@pytest.mark.parametrize("backend", sorted(CANDIDATES))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_backend_matches_reference(backend, dtype, kind, case):
    q, k, v, bias = make_inputs(case, dtype)
    mask = make_mask(kind, case.B, case.H, case.L, case.S)
    errs = errors(CANDIDATES[backend], q, k, v, bias, mask)
    for name, (cand, ref) in errs.items():
        factor = 2 if name == "out" else 3
        assert cand <= factor * ref + FLOOR[dtype], f"{backend} {name}: err {cand:.2e} vs reference {ref:.2e}"


@pytest.mark.parametrize("backend", ["reference", "sdpa", "tiled", "auto"])
@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("case", CASES[:4], ids=str)
def test_backend_equals_torch_sdpa(backend, kind, case):
    """Through the public API, every backend equals F.scaled_dot_product_attention given the dense mask."""
    q, k, v, bias = make_inputs(case, torch.float64, seed=3)
    mask = make_mask(kind, case.B, case.H, case.L, case.S, seed=3)
    out = al.attention(q, k, v, mask=mask, bias=bias, backend=backend)
    attn_mask = None if mask is None else mask.dense(case.L, case.S)
    if bias is not None:
        attn_mask = bias if attn_mask is None else bias.masked_fill(~attn_mask, float("-inf"))
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=case.H != case.Hkv)
    torch.testing.assert_close(out, want, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("backend", ["reference", "sdpa", "tiled"])
def test_causal_equals_torch_is_causal_when_square(backend):
    q, k, v = (torch.randn(2, 4, 37, 16, dtype=torch.float64) for _ in range(3))
    out = al.attention(q, k, v, causal=True, backend=backend)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_causal_is_bottom_right_aligned():
    """With a KV cache (L < S) the last query sees every key: decode needs no special case."""
    q, k, v = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 5, 8), torch.randn(1, 1, 5, 8)
    torch.testing.assert_close(al.attention(q, k, v, causal=True), al.attention(q, k, v))
    allowed = al.masks.causal().dense(2, 5)[0, 0]
    assert allowed.tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]


@pytest.mark.parametrize("backend", ["reference", "sdpa", "tiled"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fully_masked_rows_give_zero_and_finite_grads(backend, dtype):
    q, k, v = (torch.randn(2, 4, 20, 16, dtype=dtype, requires_grad=True) for _ in range(3))
    mask = torch.rand(2, 4, 20, 20) > 0.5
    mask[:, :, 3] = False
    out = al.attention(q, k, v, mask=mask, backend=backend)
    assert (out[:, :, 3] == 0).all()
    out.sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert (q.grad[:, :, 3] == 0).all()


@pytest.mark.parametrize("backend", ["reference", "sdpa", "tiled"])
def test_return_weights_are_exact(backend):
    q, k, v = (torch.randn(2, 4, 30, 16, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(2, 1, 30, 30, dtype=torch.float64)
    mask = al.masks.causal() & al.masks.padding(torch.tensor([30, 11]))
    out, w = al.attention(q, k, v, mask=mask, bias=bias, backend=backend, return_weights=True)
    _, want = reference_attention(q, k, v, mask=mask, bias=bias, scale=0.25, return_weights=True)
    torch.testing.assert_close(w.to(want.dtype), want)
    torch.testing.assert_close(out, w.to(v.dtype) @ v)
    sums = w.sum(-1)
    assert torch.allclose(sums, torch.ones_like(sums))


def test_low_precision_inputs_softmax_in_fp32_and_output_in_input_dtype():
    q, k, v = (torch.randn(1, 2, 64, 32, dtype=torch.bfloat16) for _ in range(3))
    for backend in ("reference", "sdpa", "tiled"):
        out, w = al.attention(q, k, v, backend=backend, return_weights=True)
        assert out.dtype == torch.bfloat16 and w.dtype == torch.float32


def test_fp32_bias_with_bf16_inputs_is_added_in_fp32():
    q, k, v = (torch.randn(1, 2, 40, 16, dtype=torch.bfloat16) for _ in range(3))
    bias = torch.randn(1, 2, 40, 40) * 3
    want = reference_attention(q.double(), k.double(), v.double(), bias=bias.double(), scale=0.25)
    ref = reference_attention(q, k, v, bias=bias, scale=0.25)
    out = al.attention(q, k, v, bias=bias, backend="tiled")
    assert (out.double() - want).abs().max() <= 2 * (ref.double() - want).abs().max() + 1e-3
    with pytest.raises(ValueError, match="sdpa"):
        al.attention(q, k, v, bias=bias, backend="sdpa")


def test_empty_sequences():
    q, k, v = torch.randn(2, 4, 0, 8), torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 6)
    for backend in ("auto", "sdpa", "tiled", "reference"):
        assert al.attention(q, k, v, backend=backend).shape == (2, 4, 0, 6)
    q = torch.randn(2, 4, 3, 8, requires_grad=True)
    k, v = torch.randn(2, 4, 0, 8), torch.randn(2, 4, 0, 6)
    for backend in ("auto", "sdpa", "tiled", "reference"):
        out = al.attention(q, k, v, backend=backend)
        assert out.shape == (2, 4, 3, 6) and (out == 0).all()
        out.sum().backward()
        assert (q.grad == 0).all()


def test_auto_picks_sdpa_flash_without_mask_and_tiled_with_one():
    q, k, v = (torch.randn(1, 8, 1024, 64) for _ in range(3))
    assert "auto -> sdpa" in al.explain(*(t[..., :40] for t in (q, k, v)))   # D = 40: off the native tiles
    assert "auto -> sdpa" in al.explain(*(t.double() for t in (q, k, v)), causal=True)   # fp32 causal: native
    text = al.explain(q, k, v, mask=al.masks.window(64, 64))
    assert "auto -> native" in text and "not sdpa" in text and "not reference" in text
    assert "auto -> native" in al.explain(q, k, v, bias=torch.zeros(1024, 1024))
    small = [t[:, :, :256] for t in (q, k, v)]
    want = "auto -> native" if native.why_unavailable() is None else "auto -> sdpa"     # every class: measured
    assert want in al.explain(*small, mask=al.masks.window(64, 64))
    assert want in al.explain(*small, mask=al.masks.dense(torch.rand(256, 256) > 0.5))      # read as bits


def test_available_backends_lists_the_registry():
    assert {"reference", "sdpa", "tiled"} <= set(al.available_backends())


@pytest.mark.parametrize("variant", ["plain", "mask", "gqa", "dv", "dropout", "strided", "bf16"])
def test_sdpa_kernel_kind_mirrors_torch_choice(variant):
    """auto's model of SDPA (flash vs math) must match what torch actually picks on this build."""
    from attnlab.functional.backends.sdpa import sdpa_kernel_kind
    from attnlab.functional.request import make_request
    q, k, v = (torch.randn(1, 4, 64, 32) for _ in range(3))
    mask, p = None, 0.0
    if variant == "mask":
        mask = torch.rand(64, 64) > 0.5
    elif variant == "gqa":
        k, v = k[:, :2], v[:, :2]
    elif variant == "dv":
        v = torch.randn(1, 4, 64, 16)
    elif variant == "dropout":
        p = 0.1
    elif variant == "strided":
        q = torch.randn(1, 4, 32, 64).transpose(2, 3)
    elif variant == "bf16":
        q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    torch_choice = torch._fused_sdp_choice(q, k, v, mask, p, enable_gqa=q.shape[1] != k.shape[1])
    want = {0: "math", 1: "flash"}[torch_choice]
    assert sdpa_kernel_kind(make_request(q, k, v, mask=mask, dropout_p=p)) == want


@pytest.fixture
def zen4(monkeypatch):
    """auto's rules as measured on AMD Zen 4 (AVX512-BF16, no AMX), whatever CPU the tests run on."""
    monkeypatch.setattr("attnlab.functional.auto_rule.cpu_class", lambda: "avx512_bf16")


@pytest.mark.parametrize("cls", ["avx512_bf16", "amx", "avx2"])
def test_a_dense_mask_goes_to_the_kernel_however_few_tiles_are_empty(cls, monkeypatch):
    """The kernel, which masks a 64-bit word at a time, measured faster than SDPA's fused kernel however few tiles are
    empty on every class (each class's "dense" figures; on AMX 1.15-1.84x with a random half or eighth of the pairs,
    where its rule had weighed the empty tiles and sent them to SDPA)."""
    monkeypatch.setattr("attnlab.functional.auto_rule.cpu_class", lambda: cls)
    q, k, v = (torch.randn(1, 2, 1024, 32) for _ in range(3))
    line = al.explain(q, k, v, mask=torch.rand(1024, 1024) > 0.5).split("\n")[1]
    assert line.startswith("auto -> native: a dense bool mask"), line
    block_sparse = torch.zeros(1024, 1024, dtype=torch.bool)
    block_sparse[:512, :512] = True
    assert "auto -> native" in al.explain(q, k, v, mask=block_sparse)


@pytest.fixture
def amx(monkeypatch):
    """auto's rules as measured on an Intel Xeon with AMX, the compiled kernel's amx build loaded."""
    monkeypatch.setattr("attnlab.functional.auto_rule.cpu_class", lambda: "amx")
    monkeypatch.setattr("attnlab.functional.auto_rule.on_amx", lambda D, Dv: D % 16 == 0 and Dv % 16 == 0)


def test_auto_sends_plain_fp32_and_bf16_to_the_compiled_kernel_where_its_tiles_apply(zen4, tiles):
    """D, Dv multiples of 16: the AVX-512 tiles win forward and backward in fp32 and bf16 (the tiles as an
    AVX512-BF16 build reports them, whatever this machine built)."""
    q, k, v = (torch.randn(1, 1, 1024, 64, dtype=torch.bfloat16) for _ in range(3))
    want = "auto -> native"
    assert want in al.explain(q, k, v)
    assert want in al.explain(q.requires_grad_(), k, v, causal=True)
    small = [t[:, :, :512].detach() for t in (q, k, v)]
    assert "auto -> native: bf16 forward below 512^2" in al.explain(*small, causal=True)   # SDPA's bf16: slower
    assert "auto -> native: plain fp32 below 512^2" in al.explain(*(t.float() for t in small), causal=True)
    assert "auto -> sdpa" in al.explain(*(t[:, :, :80].float() for t in small), causal=True)   # fp32: too small
    big = torch.empty(1, 1, 8192, 64, dtype=torch.bfloat16)
    assert want in al.explain(big, big, big)
    q32 = q.detach().float()                                                           # fp32 on the tiles too
    assert want in al.explain(q32, k.float(), v.float())
    assert want in al.explain(q32.requires_grad_(), k.float(), v.float(), causal=True)
    assert "auto -> sdpa" in al.explain(*(t[..., :40].detach().float() for t in (q, k, v)))   # D = 40: MKL, SDPA


def test_auto_sends_bf16_causal_inference_below_8192_to_the_compiled_kernel_only_off_the_tiles(zen4):
    """D = 8 is not a multiple of 16: MKL's bf16 GEMM, where only causal inference below 8192 wins."""
    q, k, v = (torch.randn(1, 1, 1024, 8, dtype=torch.bfloat16) for _ in range(3))
    assert "auto -> native" in al.explain(q, k, v, causal=True)
    assert "auto -> sdpa" in al.explain(q, k, v)                                        # no mask: SDPA
    assert "auto -> sdpa" in al.explain(q.requires_grad_(), k, v, causal=True)         # training: SDPA
    small = [t[:, :, :512].detach() for t in (q, k, v)]
    assert "auto -> sdpa" in al.explain(*small, causal=True)
    big = torch.empty(1, 1, 8192, 8, dtype=torch.bfloat16)
    assert "auto -> sdpa" in al.explain(big, big, big, causal=True)


def test_auto_sends_fp32_causal_and_large_fp32_training_to_the_compiled_kernel(zen4):
    q, k, v = (torch.randn(1, 1, 1024, 8) for _ in range(3))
    assert "auto -> native" in al.explain(q, k, v, causal=True)
    assert "auto -> native" in al.explain(q.requires_grad_(), k, v, causal=True)
    assert "auto -> sdpa" in al.explain(q, k, v)                                        # no mask, n < 4096
    small = [t[:, :, :512].detach() for t in (q, k, v)]
    assert "auto -> sdpa" in al.explain(*small, causal=True)
    big = torch.empty(1, 1, 4096, 8)
    assert "auto -> sdpa" in al.explain(big, big, big)                                  # forward: SDPA
    assert "auto -> native" in al.explain(big.requires_grad_(), big, big)               # with gradients
    assert "auto -> sdpa" in al.explain(*(t.double() for t in small))                   # fp64: not measured


def test_on_a_cpu_with_amx_auto_sends_bf16_training_and_masks_to_the_amx_kernel(amx):
    """Both run bf16 on AMX there: the kernel's forward+backward, its masked forward (it skips the empty tiles)
    and its forward from 448^2 scores causal (AMX_CAUSAL_FROM), from n = 768 without a mask with D = 64 and from 1536
    with D = 128 (AMX_PLAIN_FROM) are the faster; below those SDPA is kept (docs/benchmarks.md)."""
    from attnlab.functional.backends.native import on_tiles
    if not on_tiles(64, 64):
        pytest.skip("the compiled kernel's tiles are not built here")
    q = torch.empty(1, 8, 4096, 64, dtype=torch.bfloat16)
    for kw in ({}, dict(causal=True)):
        why = al.explain(q, q, q, **kw)
        assert "auto -> native" in why and "Intel Xeon with AMX" in why, why
        why = al.explain(q.clone().requires_grad_(), q, q, **kw)
        assert "auto -> native" in why and "Intel Xeon with AMX" in why, why
        wide = torch.empty(1, 8, 4096, 128, dtype=torch.bfloat16)
        assert "auto -> native" in al.explain(wide, wide, wide, **kw)
    for n, D, plain in ((768, 64, True), (767, 64, False), (1535, 128, False), (1536, 128, True), (768, 32, True),
                        (2048, 96, True), (1024, 96, False)):
        x = torch.empty(1, 8, n, D, dtype=torch.bfloat16)
        why = al.explain(x, x, x)
        assert (f"auto -> {'native' if plain else 'sdpa'}" in why) and "Intel Xeon with AMX" in why, (n, D, why)
    for n, D in ((513, 64), (768, 128)):                                  # causal above 512^2 scores, any head dim
        x = torch.empty(1, 8, n, D, dtype=torch.bfloat16)
        assert "auto -> native" in al.explain(x, x, x, causal=True), (n, D)
    for n, want in ((447, "sdpa"), (448, "native"), (512, "native")):     # causal from AMX_CAUSAL_FROM, 448^2
        x = q[:, :, :n]
        why = al.explain(x, x, x, causal=True)
        assert f"auto -> {want}" in why and "Intel Xeon with AMX" in why, (n, why)
    for mask in (al.masks.padding(torch.tensor([3072])), al.masks.window(256, 0),
                 al.masks.documents(torch.arange(4096) // 512)):
        assert "auto -> native" in al.explain(q, q, q, mask=mask)
    from attnlab.positional import ALiBi                     # sdpa cannot keep its fp32 values: native
    assert "auto -> native" in al.explain(q, q, q, causal=True, bias=ALiBi(8).bias())
    assert "auto -> sdpa" in al.explain(q, q, q, mask=al.masks.padding(torch.tensor([4000])))   # 2% empty


def test_on_a_cpu_with_amx_auto_sends_bf16_off_the_amx_path_to_sdpa_unless_the_mask_skips_most_tiles(amx):
    """D = 48 + 8: the AVX512-BF16 tiles, which measured 0.25-0.62x SDPA on plain requests there."""
    from attnlab.functional.backends.native import on_tiles
    if not on_tiles(64, 64):
        pytest.skip("the compiled kernel's tiles are not built here")
    q = torch.empty(1, 8, 4096, 56, dtype=torch.bfloat16)
    for kw in ({}, dict(causal=True)):
        for x in (q, q.clone().requires_grad_()):
            why = al.explain(x, q, q, **kw)
            assert "auto -> sdpa" in why and "Intel Xeon with AMX" in why, why
    assert "auto -> sdpa" in al.explain(q, q, q, mask=al.masks.padding(torch.tensor([3072])))
    for mask in (al.masks.window(256, 0), al.masks.documents(torch.arange(4096) // 512)):
        why = al.explain(q, q, q, mask=mask)
        assert "auto -> native" in why and "Intel Xeon with AMX" in why, why


def test_on_a_cpu_with_amx_auto_sends_fp32_to_the_kernel_except_smaller_plain_inference(amx):
    """fp32 on the tiles: causal and with gradients the kernel; a forward without a mask from 2048^2 scores or over
    16384 keys with 32 queries or more (AMX_FP32_PLAIN_FROM), SDPA below (0.95-0.99x at n = 1024)."""
    from attnlab.functional.backends.native import on_tiles
    if not on_tiles(64, 64):
        pytest.skip("the compiled kernel's tiles are not built here")
    q = torch.empty(1, 8, 4096, 64)
    for why in (al.explain(q, q, q, causal=True), al.explain(q.clone().requires_grad_(), q, q)):
        assert "auto -> native" in why and "Intel Xeon with AMX" in why, why
    for L, S, want in ((4096, 4096, "native"), (2048, 2048, "native"), (2047, 2048, "sdpa"), (32, 16384, "native"),
                       (31, 16384, "sdpa"), (256, 16383, "sdpa")):
        x, y = torch.empty(1, 8, L, 64), torch.empty(1, 8, S, 64)
        why = al.explain(x, y, y)
        assert f"auto -> {want}" in why and "Intel Xeon with AMX" in why, (L, S, why)


@pytest.fixture
def avx2(monkeypatch):
    """auto's rules as measured on an AMD EPYC Zen 3 (AVX2, no AVX-512), the compiled kernel's avx2 build."""
    monkeypatch.setattr("attnlab.functional.auto_rule.cpu_class", lambda: "avx2")
    monkeypatch.setattr("attnlab.functional.auto_rule.on_tiles", lambda D, Dv: False)
    monkeypatch.setattr("attnlab.functional.auto_rule.on_amx", lambda D, Dv: False)


def test_without_avx512_auto_sends_bf16_training_to_the_compiled_kernel_at_every_size(avx2):
    """torch's bf16 GEMM is a scalar fallback there and SDPA's backward runs on it (5.3-7.9x): no size, mask
    or head dim sends bf16 with gradients to SDPA, not even the small-problem and dense-mask rules."""
    for n, D, kw in ((4096, 64, {}), (1024, 64, dict(causal=True)), (64, 64, {}), (1024, 40, {}),
                     (1024, 64, dict(mask=torch.rand(1024, 1024) > 0.5))):
        q = torch.empty(1, 8, n, D, dtype=torch.bfloat16)
        why = al.explain(q.clone().requires_grad_(), q, q, **kw)
        assert "auto -> native" in why and "AMD EPYC Zen 3" in why, (n, D, kw, why)
        assert "auto -> sdpa" in al.explain(q, q, q)                                      # inference: SDPA
    assert "auto -> sdpa" in al.explain(*(torch.empty(1, 8, 4096, 64, dtype=torch.bfloat16),) * 3)


def test_without_avx512_fp32_causal_inference_goes_to_sdpa_from_4096(avx2):
    """The kernel's fp32 causal forward: 1.26x at n = 1024, a tie at 4096, 0.81-0.97x beyond (two runs)."""
    small, big = torch.empty(1, 8, 1024, 64), torch.empty(1, 8, 4096, 64)
    assert "auto -> native" in al.explain(small, small, small, causal=True)
    why = al.explain(big, big, big, causal=True)
    assert "auto -> sdpa" in why and "AMD EPYC Zen 3" in why, why
    assert "auto -> native" in al.explain(big.clone().requires_grad_(), big, big, causal=True)   # training
    assert "auto -> sdpa" in al.explain(small, small, small)                                     # no mask
    half = torch.empty(1, 8, 1024, 64, dtype=torch.bfloat16)
    assert "auto -> native" in al.explain(half, half, half, causal=True)                        # 1.14x
    huge = torch.empty(1, 8, 8192, 64, dtype=torch.bfloat16)
    assert "auto -> sdpa" in al.explain(huge, huge, huge, causal=True)                          # 0.90x


def test_without_avx512_fp32_training_without_a_mask_goes_to_the_kernel_from_2048(avx2):
    """A tie below n = 2048 (0.95-1.05x at n = 576-1536), left to SDPA; the kernel 1.01-1.06x at 2048 in six
    runs and ahead beyond. The Zen 4 rule (NATIVE_TRAIN_FROM, n = 4096) no longer applies on this class."""
    for n, want in ((1024, "sdpa"), (1536, "sdpa"), (2048, "native"), (4096, "native")):
        q = torch.empty(1, 8, n, 64)
        why = al.explain(q.clone().requires_grad_(), q, q)
        assert f"auto -> {want}" in why and "AMD EPYC Zen 3" in why, (n, why)
        assert "auto -> sdpa" in al.explain(q, q, q)                                   # inference: SDPA
    cross = torch.empty(1, 8, 1024, 64), torch.empty(1, 8, 4096, 64)                  # sqrt(L * S) = 2048
    assert "auto -> native" in al.explain(cross[0].clone().requires_grad_(), cross[1], cross[1])


def test_without_avx512_the_sdpa_note_quotes_the_training_tie_only_where_it_was_measured(avx2):
    """Where the kernel is not built, fp32 training of any size reaches SDPA: the note on the tie below
    n = 2048 must not be quoted for n = 4096 or a causal request, which the kernel wins."""
    from attnlab.functional.auto_rule import _class_note
    from attnlab.functional.request import make_request
    for n, causal, quoted in ((1024, False, True), (4096, False, False), (1024, True, False)):
        q = torch.empty(1, 8, n, 64, requires_grad=True)
        note = _class_note(make_request(q, q, q, causal=causal))
        assert ("below n = 2048, a tie" in note) == quoted, (n, causal, note)
    x = torch.empty(1, 8, 4096, 64)
    assert "AMD EPYC Zen 3" in _class_note(make_request(x, x, x))                  # forward: quoted


def test_without_avx512_the_sdpa_note_quotes_forward_figures_only_where_they_were_measured(avx2):
    """The forward figures were measured on fp32 and bf16 requests the rule sends to SDPA: not on fp16, nor on
    a causal forward the kernel wins (fp32 below n = 4096, bf16 below 8192), which reaches SDPA only where the
    kernel is not built."""
    from attnlab.functional.auto_rule import _class_note
    from attnlab.functional.request import make_request
    for n, dtype, causal, quoted in ((4096, torch.float32, False, True), (4096, torch.bfloat16, False, True),
                                     (4096, torch.float32, True, True), (8192, torch.bfloat16, True, True),
                                     (1024, torch.float32, True, False), (4096, torch.bfloat16, True, False),
                                     (4096, torch.float16, False, False), (4096, torch.float16, True, False)):
        x = torch.empty(1, 8, n, 64, dtype=dtype)
        note = _class_note(make_request(x, x, x, causal=causal))
        assert ("AMD EPYC Zen 3" in note) == quoted, (n, dtype, causal, note)


@pytest.mark.parametrize("cls", ["amx", "avx512_bf16", "avx2"])
def test_every_ratio_auto_quotes_names_the_cpu_it_was_measured_on(monkeypatch, cls):
    """Issue #27: explain() never quotes one CPU's ratios as this machine's."""
    monkeypatch.setattr("attnlab.functional.auto_rule.cpu_class", lambda: cls)
    from attnlab.positional import ALiBi
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for D in (64, 40, 8):
            q = torch.empty(1, 8, 4096, D, dtype=dtype)
            for kw in ({}, dict(causal=True), dict(mask=al.masks.window(256, 0)), dict(bias=ALiBi(8).bias())):
                for x in (q, q.clone().requires_grad_()):
                    line = al.explain(x, q, q, **kw).split("\n")[1]                   # "auto -> name: why"
                    if "measured" in line:
                        assert any(cpu in line for cpu in ("Intel Xeon with AMX", "AMD Zen 4", "AMD EPYC Zen 3")), line


def test_fp16_without_avx512_goes_to_the_compiled_kernel_where_it_measured_faster(avx2):
    """fp16 on the Zen 3: the kernel (fp16 computed as fp32) with gradients at every size, forward from n = 48,
    SDPA below; and with a dense mask however few of its tiles are empty (2.3-2.4x with a random half of the
    pairs, since the kernel masks a word at a time; 0.85-0.94x before)."""
    from attnlab.functional.auto_figures import FP16_FWD_FROM
    assert FP16_FWD_FROM["avx2"][0] == 48 * 48
    x = torch.empty(1, 8, 32, 64, dtype=torch.float16)
    assert al.explain(x, x, x).split("\n")[1].startswith("auto -> sdpa")
    assert al.explain(x.requires_grad_(), x, x).split("\n")[1].startswith("auto -> native: fp16 with gradients")
    for n, kw in ((96, {}), (96, dict(causal=True)), (4096, {}), (4096, dict(causal=True))):
        x = torch.empty(1, 8, n, 64, dtype=torch.float16)
        line = al.explain(x, x, x, **kw).split("\n")[1]
        assert line.startswith("auto -> native: fp16 forward") and "AMD EPYC Zen 3" in line, (n, kw, line)
    x = torch.empty(1, 8, 1024, 64, dtype=torch.float16)
    line = al.explain(x, x, x, mask=al.masks.window(256, 0)).split("\n")[1]
    assert line.startswith("auto -> native") and "fp16 forward (given the dense mask" in line, line
    dense = al.masks.dense(torch.rand(1, 1, 1024, 1024, generator=torch.Generator().manual_seed(0)) > 0.5)
    line = al.explain(x, x, x, mask=dense).split("\n")[1]                         # few empty tiles: still the kernel
    assert line.startswith("auto -> native: a dense bool mask on a CPU without AVX-512") and "Zen 3" in line, line


def test_without_avx512_small_requests_with_a_structured_mask_or_bias_go_to_the_compiled_kernel(avx2):
    """Below 512^2 scores the kernel, called directly, beat the sdpa backend from n = 64 forward (and decoding one
    query), with fp32 gradients from n = 64 with a mask and at every size with a structured bias, a dense bool mask
    too (its own reason). Below 64 with a mask and gradients: SDPA, saying why. A dense bias and a block layout
    were not measured: SDPA."""
    from attnlab.positional import ALiBi
    from attnlab.functional.auto_figures import SMALL_TRAIN_FROM
    assert SMALL_TRAIN_FROM == 64 * 64
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for L, S in ((64, 64), (512, 512), (1, 4096), (1, 64)):
            q, k = torch.empty(1, 8, L, 64, dtype=dtype), torch.empty(1, 8, S, 64, dtype=dtype)
            for kw in (dict(mask=al.masks.padding([S - 3])), dict(mask=al.masks.window(16, 0)),
                       dict(mask=al.masks.documents(torch.arange(S) // 8) & al.masks.causal())):
                line = al.explain(q, k, k, **kw).split("\n")[1]
                assert line.startswith("auto -> native: a structured mask or bias below 512^2"), (dtype, L, S, line)
                assert "AMD EPYC Zen 3" in line
    x = torch.empty(1, 8, 64, 64)
    assert al.explain(x, x, x, bias=ALiBi(8).bias()).split("\n")[1].startswith("auto -> native: a structured")
    for n, want in ((16, "sdpa"), (63, "sdpa"), (64, "native"), (96, "native"), (127, "native"), (512, "native")):
        x = torch.empty(1, 8, n, 64, requires_grad=True)
        line = al.explain(x, x, x, mask=al.masks.padding([n - 1])).split("\n")[1]
        reason = "with gradients below 512^2" if want == "native" else "with gradients and a mask below 64^2"
        assert line.startswith(f"auto -> {want}: {reason}") and "Zen 3" in line, (n, line)
        line = al.explain(x, x, x, bias=ALiBi(8).bias(), causal=True).split("\n")[1]      # a structured bias: any n
        assert line.startswith("auto -> native: with gradients below 512^2") and "ALiBi" in line, (n, line)
    x = torch.empty(1, 8, 256, 64)
    for kw in (dict(bias=torch.zeros(256, 256)), dict(mask=al.masks.bigbird(2, 1)),
               dict(mask=al.masks.padding([200]), dropout_p=0.1)):
        assert al.explain(x, x, x, **kw).split("\n")[1].startswith("auto -> sdpa: L*S"), kw
    dense = al.masks.dense(torch.rand(256, 256, generator=torch.Generator().manual_seed(0)) > 0.5)
    for mask in (dense, al.masks.causal() & dense):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            line = al.explain(x.to(dtype), x.to(dtype), x.to(dtype), mask=mask).split("\n")[1]
            assert line.startswith("auto -> native: a dense bool mask below 512^2") and "AMD EPYC Zen 3" in line
    for n, want in ((48, "sdpa"), (63, "sdpa"), (64, "native"), (128, "native")):
        x = torch.empty(1, 8, n, 64, requires_grad=True)
        assert f"auto -> {want}" in al.explain(x, x, x, mask=al.masks.dense(torch.rand(n, n) > 0.5)), n
    assert "auto -> sdpa" in al.explain(x, x, x)                                   # no mask: the plain rules


def test_on_amx_small_masked_requests_go_to_the_compiled_kernel_by_its_own_figures(amx):
    """Measured on the Xeon with AMX (auto_figures_amx): below 512^2 a structured or dense mask goes to the kernel
    forward at every size, fp32 training from 64^2 scores (SMALL_TRAIN_FROM, as on the Zen 3 and the Zen 4) or with a
    structured bias, bf16
    training on AMX's tiles at every size; and each reason names that CPU."""
    from attnlab.functional.auto_figures import SMALL_TRAIN_FROM
    from attnlab.positional import ALiBi
    assert SMALL_TRAIN_FROM == 64 * 64
    x = torch.empty(1, 8, 256, 64)
    dense = al.masks.dense(torch.rand(256, 256, generator=torch.Generator().manual_seed(0)) > 0.5)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for mask, reason in ((al.masks.padding([200]), "a structured mask or bias below"),
                             (al.masks.window(64, 0), "a structured mask or bias below"),
                             (dense, "a dense bool mask below")):
            h = x.to(dtype)
            line = al.explain(h, h, h, mask=mask).split("\n")[1]
            assert line.startswith(f"auto -> native: {reason} 512^2") and "Intel Xeon with AMX" in line, (dtype, line)
    for n, want in ((48, "sdpa"), (63, "sdpa"), (64, "native"), (128, "native")):
        x = torch.empty(1, 8, n, 64, requires_grad=True)
        line = al.explain(x, x, x, mask=al.masks.padding([n - 1])).split("\n")[1]
        assert line.startswith(f"auto -> {want}: with gradients") and "Intel Xeon with AMX" in line, (n, line)
        line = al.explain(x, x, x, bias=ALiBi(8).bias(), causal=True).split("\n")[1]      # a structured bias: any n
        assert line.startswith("auto -> native: with gradients below 512^2"), (n, line)
    for n in (16, 64):
        h = torch.empty(1, 8, n, 64, dtype=torch.bfloat16, requires_grad=True)
        line = al.explain(h, h, h, mask=al.masks.padding([n - 1])).split("\n")[1]
        assert line.startswith("auto -> native: bf16 with gradients below 512^2 scores on a CPU with AMX"), (n, line)


def test_on_amx_a_masked_forward_that_costs_the_kernel_per_key_goes_to_sdpa(amx):
    """Whatever the size: bf16 with fewer than 48 queries (its AMX path packs all of K and V on each call), fp16 over
    fewer than 96 keys or more than max(1024, 128 per query) (it converts all of K and V to fp32 on each call)."""
    for dtype, L, S, want in ((torch.bfloat16, 47, 4096, "sdpa"), (torch.bfloat16, 48, 4096, "native"),
                              (torch.bfloat16, 1, 256, "sdpa"), (torch.bfloat16, 32, 16384, "sdpa"),
                              (torch.float16, 1, 1024, "native"), (torch.float16, 1, 1025, "sdpa"),
                              (torch.float16, 16, 2048, "native"), (torch.float16, 16, 2049, "sdpa"),
                              (torch.float16, 64, 16384, "sdpa"), (torch.float16, 128, 16384, "native"),
                              (torch.float16, 64, 64, "sdpa"), (torch.float16, 96, 96, "native"),
                              (torch.float32, 1, 16384, "native"), (torch.float32, 1, 64, "native")):
        q, k = torch.empty(1, 8, L, 64, dtype=dtype), torch.empty(1, 8, S, 64, dtype=dtype)
        line = al.explain(q, k, k, mask=al.masks.padding([S // 2])).split("\n")[1]
        assert line.startswith(f"auto -> {want}"), (dtype, L, S, line)
        assert want == "native" or "Intel Xeon with AMX" in line, line
        with_grad = al.explain(q.clone().requires_grad_(), k, k, mask=al.masks.padding([S // 2])).split("\n")[1]
        assert with_grad.startswith("auto -> native") or dtype == torch.float32, (dtype, L, S, with_grad)


@pytest.mark.parametrize("cls", ["avx512_bf16", "avx512"])
def test_on_the_zen4_small_masked_requests_go_to_the_compiled_kernel_by_its_own_figures(monkeypatch, cls, tiles):
    """As on the Zen 3, measured on the Zen 4 (class avx512_bf16; avx512 runs its code): a structured or dense mask
    below 512^2 goes to the kernel forward at every size, fp32 training from 64^2 scores (SMALL_TRAIN_FROM), each
    reason quoting the Zen 4; bf16 training below 512^2 on the tiles and fp16 training from 32^2, whatever the mask."""
    from attnlab.functional.auto_figures import SMALL_TRAIN_FROM
    monkeypatch.setattr("attnlab.functional.auto_rule.cpu_class", lambda: cls)
    assert SMALL_TRAIN_FROM == 64 * 64
    x = torch.empty(1, 8, 256, 64)
    dense = al.masks.dense(torch.rand(256, 256, generator=torch.Generator().manual_seed(0)) > 0.5)
    for mask, reason in ((al.masks.padding([200]), "a structured mask or bias below"),
                         (dense, "a dense bool mask below")):
        line = al.explain(x, x, x, mask=mask).split("\n")[1]
        assert line.startswith(f"auto -> native: {reason} 512^2") and "AMD Zen 4" in line, line
    for n, want in ((32, "sdpa"), (63, "sdpa"), (64, "native"), (128, "native")):
        x = torch.empty(1, 8, n, 64, requires_grad=True)
        line = al.explain(x, x, x, mask=al.masks.padding([n - 1])).split("\n")[1]
        assert line.startswith(f"auto -> {want}: with gradients") and "AMD Zen 4" in line, (n, line)
        for dtype, reason in ((torch.bfloat16, "bf16 with gradients below 512^2"), (torch.float16, "fp16 with")):
            h = x.detach().to(dtype).requires_grad_()
            line = al.explain(h, h, h, mask=al.masks.padding([n - 1])).split("\n")[1]
            assert line.startswith(f"auto -> native: {reason}") and "AMD Zen 4" in line, (n, dtype, line)
    h = torch.empty(1, 8, 16, 64, dtype=torch.float16, requires_grad=True)         # fp16 below 32^2: SDPA
    assert al.explain(h, h, h, causal=True).split("\n")[1].startswith("auto -> sdpa")


@pytest.mark.parametrize("cls", ["avx512_bf16", "avx2"])
def test_small_masked_training_in_another_dtype_says_the_figures_are_fp32s(monkeypatch, cls):
    """The small-training rule (SMALL_TRAIN_FROM) was measured in fp32. fp16 below FP16_TRAIN_FROM scores and bf16 off
    the tiles' head dims (D = 8) reach it on the Zen 4: their reason says the dtype was not measured and the figures
    are fp32's (it quoted them as if measured for the request). An fp32 request keeps the figures alone."""
    monkeypatch.setattr("attnlab.functional.auto_rule.cpu_class", lambda: cls)
    cases = [(torch.float32, 16, 64, None), (torch.float32, 64, 64, None)]
    if cls == "avx512_bf16":                     # on the Zen 3 fp16 and bf16 training take the kernel at any size
        cases += [(torch.float16, 16, 64, "float16"), (torch.bfloat16, 32, 8, "bfloat16"),
                  (torch.bfloat16, 64, 8, "bfloat16")]
    for dtype, n, D, unmeasured in cases:
        x = torch.empty(1, 8, n, D, dtype=dtype, requires_grad=True)
        line = al.explain(x, x, x, mask=al.masks.padding([n - 1])).split("\n")[1]
        want = "sdpa" if n * n < 64 * 64 else "native"
        if unmeasured is None:
            assert line.startswith(f"auto -> {want}: with gradients") and "fp32" in line, line
        else:
            assert line.startswith(f"auto -> {want}: {unmeasured} with gradients and a mask at this size was not "
                                   "measured") and "the fp32 figures decide: with gradients" in line, line


def test_fp16_on_amx_goes_to_the_compiled_kernel_where_it_measured_faster(amx):
    """fp16 on AMX (where torch's fp16 GEMM is AVX512-FP16, the kernel computes fp16 as fp32): the kernel with gradients
    and for a causal forward at n = 4096, SDPA for a forward without a mask at n = 2048, each quoting AMX's own fp16
    figures; a masked request goes to the kernel (it went to the Python tiled kernel while the compiled one refused
    fp16), quoting AMX's fp16 figures too."""
    x = torch.empty(1, 8, 4096, 64, dtype=torch.float16)
    for kw in ({}, dict(causal=True)):
        assert al.explain(x.clone().requires_grad_(), x, x, **kw).split("\n")[1].startswith(
            "auto -> native: fp16 with gradients on a CPU with AMX")
    line = al.explain(x, x, x, causal=True).split("\n")[1]
    assert line.startswith("auto -> native: fp16 forward on a CPU with AMX") and "Intel Xeon with AMX" in line, line
    y = torch.empty(1, 8, 2048, 64, dtype=torch.float16)
    line = al.explain(y, y, y).split("\n")[1]
    assert line.startswith("auto -> sdpa") and "fp16 forward on a CPU with AMX" in line, line
    line = al.explain(x, x, x, mask=al.masks.window(256, 0)).split("\n")[1]
    assert line.startswith("auto -> native") and "fp16" in line and "Intel Xeon with AMX" in line, line


@pytest.mark.parametrize("cls", ["avx512_bf16", "avx512"])
def test_fp16_on_the_zen4_goes_to_the_compiled_kernel_where_it_measured_faster(monkeypatch, cls):
    """The Zen 4 has no AVX512-FP16 either (every class off AMX): fp16 forward from n = 48, or from 16 keys without a
    mask (FP16_FWD_FROM), with gradients from 32^2 scores, masked by the Zen 4's own fp16 figures."""
    monkeypatch.setattr("attnlab.functional.auto_rule.cpu_class", lambda: cls)
    for n, kw, want in ((32, dict(causal=True), "sdpa"), (32, {}, "native: fp16 forward"),
                        (48, dict(causal=True), "native: fp16 forward"),
                        (4096, dict(causal=True), "native: fp16 forward")):
        x = torch.empty(1, 8, n, 64, dtype=torch.float16)
        line = al.explain(x, x, x, **kw).split("\n")[1]
        assert line.startswith(f"auto -> {want}") and (want == "sdpa" or "AMD Zen 4" in line), (n, line)
    x = torch.empty(1, 8, 4096, 64, dtype=torch.float16, requires_grad=True)
    assert al.explain(x, x, x).split("\n")[1].startswith("auto -> native: fp16 with gradients")
    x = x.detach()
    line = al.explain(x, x, x, mask=al.masks.window(256, 0)).split("\n")[1]
    assert line.startswith("auto -> native") and "fp16 forward (given the dense mask)" in line and "Zen 4" in line


def test_structured_bias_tile_values_and_its_old_name():
    from attnlab.positional.alibi import ALiBi
    bias = ALiBi(2).bias()
    want = bias.tile_values(1, 4, 0, 5, 6, 5)                               # (1, 2, 3, 5)
    torch.testing.assert_close(want, bias.dense(6, 5)[:, :, 1:4, 0:5])
    with pytest.warns(FutureWarning, match="block.*deprecated.*tile_values"):
        torch.testing.assert_close(bias.block(1, 4, 0, 5, 6, 5), want)
