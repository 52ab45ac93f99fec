"""The compiled kernel's bfloat16 products on AMX tiles (csrc/amx.cpp, the `amx` level): chosen where the CPU
has AMX, agreeing with the AVX512-BF16 tiles and the reference forward and backward, and exact where its
even key pairs and whole groups of 16 reach past a tile's keys (a NaN or inf there never reaches a row).
The broad conformance suites (test_native.py, test_native_tiles.py, test_layouts.py, ...) run on this path
wherever it is the level chosen; test_native_isa.py runs them once per level, and on a CPU without AMX once more
with this path emulated (ATTNLAB_AMX_EMULATED=1: brgemm replaced by a plain loop), this file included."""
import pytest
import torch

from attnlab.functional import masks
from attnlab.functional.backends import native, native_build
from attnlab.functional.backends.native import native_attention
from attnlab.functional.backends.reference import reference_attention
from attnlab.functional.cpu import cpu_features
from helpers import errors

pytestmark = pytest.mark.skipif(native.ISA != "amx", reason="the kernel's amx level is not the one running here")


#: this process runs the AMX path emulated (ATTNLAB_AMX_EMULATED=1), not on the CPU's tiles
EMULATED = native.ISA == "amx" and native._native.amx_emulated()


def _amx_again() -> bool:
    """Turn the AMX path back on as this process runs it: on the CPU's tiles, or emulated."""
    return native._native.emulate_amx(True) if EMULATED else native._native.set_amx(True)


@pytest.fixture
def tiles_instead():
    """Run the same module on its AVX512-BF16 tiles for the duration (what ATTNLAB_NATIVE_ISA=avx512_bf16 does)."""
    native._native.set_amx(False)
    yield
    assert _amx_again()


def _run(q, k, v, mask, **kw):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = native_attention(q, k, v, mask=mask, scale=0.125, **kw)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(out.dtype)
    return [out, *torch.autograd.grad(out, (q, k, v), g)]


def test_amx_is_the_level_chosen_on_a_cpu_with_amx():
    if not cpu_features()["amx_bf16"]:
        pytest.skip("no AMX here")
    assert native_build.runnable_isas()[0] == "amx"
    assert "bfloat16 on AMX tiles" in native.info(), native.info()
    assert native.on_amx(64, 128) and not native.on_amx(40, 64)


@pytest.mark.parametrize("mask_name", ["none", "causal", "window", "padding"])
def test_amx_and_the_avx512_bf16_tiles_agree(mask_name, tiles_instead):
    """Two exact paths, the same sums in another order: within bf16's rounding of each other, forward and backward."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 203, 64, generator=g).bfloat16()
    k, v = (torch.randn(2, 2, 171, d, generator=g).bfloat16() for d in (64, 32))
    mask = {"none": None, "causal": masks.causal(), "window": masks.window(13, 6),
            "padding": masks.padding(torch.tensor([171, 90]))}[mask_name]
    tiles = _run(q, k, v, mask, tile_q=32, tile_k=64)
    assert _amx_again()
    amx = _run(q, k, v, mask, tile_q=32, tile_k=64)
    for a, b in zip(amx, tiles):
        torch.testing.assert_close(a.float(), b.float(), atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_key_past_a_tiles_keys_never_reaches_its_rows(bad):
    """Rows 32-39 of window(7, 0) attend keys [25, 40): AMX reads the key pair from 24 and, in the backward,
    whole groups of 16 up to key 47. A NaN or inf at 24 or 40-47 must add nothing, not even 0 * NaN."""
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 96, 64, generator=g).bfloat16() for _ in range(3))
    mask = masks.window(7, 0)
    rows = slice(32, 40)
    assert mask.dense(96, 96)[..., rows, :].reshape(8, 96).any(0).nonzero().flatten().tolist() == list(range(25, 40))
    ref = _run(q, k, v, mask, tile_q=8, tile_k=32)
    for t in (k, v):
        t[:, :, 24] = bad
        t[:, :, 40:48] = bad
    out, dq, _, _ = _run(q, k, v, mask, tile_q=8, tile_k=32)
    assert torch.isfinite(out[:, :, rows]).all() and torch.isfinite(dq[:, :, rows]).all()
    torch.testing.assert_close(out[:, :, rows], ref[0][:, :, rows], atol=0, rtol=0)
    torch.testing.assert_close(dq[:, :, rows], ref[1][:, :, rows], atol=2e-2, rtol=2e-2)


def test_off_the_amx_shapes_the_tiles_or_blas_answer():
    """D = 40 is not a multiple of 16: the same call runs off AMX, still exact."""
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 2, 100, 40, generator=g).bfloat16() for _ in range(3))
    out = native_attention(q, k, v, mask=masks.causal(), scale=0.125)
    ref = reference_attention(q.double(), k.double(), v.double(), mask=masks.causal(), scale=0.125)
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("mask_name", ["none", "causal"])
def test_a_minus_inf_score_weighs_exactly_zero_in_a_plain_row(mask_name):
    """The AMX softmax's own exp (amx.cpp, exp2_nonpositive) clamps its argument: a key whose score is -inf (its
    first entry -inf against q's positive one) must weigh 0 in an unmasked row, as in the reference, and leave
    every output finite; scores spread over 200 nats (underflowing weights) must match the reference too."""
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 2, 80, 64, generator=g) for _ in range(3))
    q[..., 0] = 1.0
    k[:, :, 5, 0] = float("-inf")
    k[:, :, 60:, 1] = 400.0 * torch.linspace(-1, 1, 20)                 # scores from about -50 to +50 (scale 1/8)
    q[:, :, :, 1] = torch.linspace(-4, 4, 80)                             # rows whose scores span 200 nats or more
    q, k, v = (t.bfloat16() for t in (q, k, v))
    mask = masks.causal() if mask_name == "causal" else None
    out = native_attention(q, k, v, mask=mask, scale=0.125)
    ref = reference_attention(q.double(), k.double(), v.double(), mask=mask, scale=0.125)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("mask_name", ["none", "causal"])
def test_the_backward_on_scores_spread_over_hundreds_of_nats_matches_the_reference(mask_name):
    """The backward's probabilities on this path (amx.cpp, row_exp_inplace: the scale and the exp in one pass)
    on rows whose weights underflow to 0 and rows near uniform: errors against fp64 truth within those of the
    bf16 reference (STYLE.md), outputs and gradients."""
    g = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(1, 2, 80, 64, generator=g) for _ in range(3))
    k[:, :, :, 1] = 400.0 * torch.linspace(-1, 1, 80)
    q[:, :, :, 1] = torch.linspace(-4, 4, 80)
    q, k, v = (t.bfloat16() for t in (q, k, v))
    mask = masks.causal() if mask_name == "causal" else None
    for name, (cand, ref) in errors(native_attention, q, k, v, None, mask, scale=0.125).items():
        assert cand <= 3 * ref + 1e-6, (name, cand, ref)
