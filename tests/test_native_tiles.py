"""The compiled kernel's AVX-512 tiles (csrc/microkernel.cpp, float32 and bfloat16, forward and backward):
built where the CPU has them, and as accurate as the same-dtype reference on shapes that reach every edge
of the micro-kernels -- row tails (not a multiple of 6), keys not a multiple of 16, tiles whose key range
starts or ends on an odd key, L != S, GQA, Dv != D, strided views -- for every mask form, with tensor and
relative biases, softcap and dropout; outputs and all gradients."""
from functools import partial

import pytest
import torch

from attnlab.functional import masks
from attnlab.functional.backends import native
from attnlab.functional.backends.native import native_attention
from attnlab.functional.backends.reference import reference_attention
from attnlab.positional import ALiBi
from helpers import FLOOR, errors


def test_the_tiles_are_in_the_avx512_bf16_build_and_only_there():
    """A build that silently fell back to MKL's bf16 GEMM would be ~2x slower on Zen 4: fail, do not skip.
    (tests/test_native_isa.py checks that the avx512_bf16 build is the one chosen where the CPU has it;
    the amx level is that build with bf16 on AMX.)"""
    if native.ISA not in ("avx512_bf16", "amx"):
        assert "tiles" not in native.info() and not native.on_tiles(64, 64), native.info()
        return
    assert "AVX512-BF16 tiles" in native.info(), native.info()
    assert native.on_tiles(64, 64) and not native.on_tiles(40, 64) and not native.on_tiles(64, 64, tile_k=120)


DTYPES = [torch.bfloat16, torch.float32]


# (B, H, Hkv, L, S, D, Dv): row tails, S % 16 != 0, GQA, L < S and L > S, D = 128, Dv = 16 / 128; then the
# sides of kPackFromRows (microkernel.h) in query rows per kv head (L G): bfloat16 packs K and V from one (a
# decode step), float32 takes the BLAS path at 63 and packs from 64
SHAPES = [(2, 4, 2, 131, 131, 64, 64), (1, 3, 1, 45, 203, 32, 128), (1, 2, 2, 97, 40, 128, 16),
          (1, 2, 2, 1, 150, 64, 64), (2, 3, 1, 21, 150, 64, 64), (1, 4, 2, 32, 150, 64, 64)]
MASKS = {
    "none": lambda B, L, S: None,
    "causal": lambda B, L, S: masks.causal(),
    "window_odd_edges": lambda B, L, S: masks.window(13, 6),          # tile key ranges start/end on odd keys
    "padding": lambda B, L, S: masks.padding(torch.tensor([S, S // 2 + 1][:B])),
    "documents": lambda B, L, S: masks.documents(torch.tensor([0] * (S // 3) + [1] * (S - S // 3))),
    "causal&dense": lambda B, L, S: masks.causal() & masks.dense(
        torch.rand(B, 1, L, S, generator=torch.Generator().manual_seed(4)) > 0.3),
}


def _check(errs, dtype):
    for name, (cand, ref) in errs.items():
        factor = 2 if name == "out" else 3
        assert cand <= factor * ref + FLOOR[dtype], f"{name}: err {cand:.2e} vs reference {ref:.2e}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tiles", [(64, 128), (16, 32), (None, None)], ids=["64x128", "16x32", "default"])
@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_tiles_are_as_accurate_as_the_same_dtype_reference(shape, mask_name, tiles, dtype):
    B, H, Hkv, L, S, D, Dv = shape
    g = torch.Generator().manual_seed(hash(shape) % 1000)
    q, k, v = (torch.randn(B, h, n, d, generator=g).to(dtype)
               for h, n, d in ((H, L, D), (Hkv, S, D), (Hkv, S, Dv)))
    bias = torch.randn(1, H, L, S, generator=g).to(dtype) if mask_name == "causal" else None
    fn = partial(native_attention, tile_q=tiles[0], tile_k=tiles[1])
    _check(errors(fn, q, k, v, bias, MASKS[mask_name](B, L, S)), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kw", [{"dropout_p": 0.2, "dropout_seed": 3}, {"softcap": 4.0}], ids=["dropout", "softcap"])
def test_dropout_and_softcap_on_the_tiles(kw, dtype):
    """Outputs and gradients (the backward's five products run on the tiles too) against fp64 truth."""
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(2, 4, 150, 64, generator=g).to(dtype) for _ in range(3))
    _check(errors(partial(native_attention, tile_q=32, tile_k=64), q, k, v, None, masks.causal(), **kw), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_relative_bias_and_softcap_on_the_tiles(dtype):
    """ALiBi (a structured bias, made in each dtype) with softcap: outputs and all gradients."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 4, 150, 64, generator=g).to(dtype) for _ in range(3))
    alibi = lambda dt: ALiBi(4).to(dt).bias()
    _check(errors(partial(native_attention, tile_q=32, tile_k=64), q, k, v, alibi, masks.causal(), scale=0.125,
                  softcap=5.0), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_strided_views_on_the_tiles(dtype):
    x = torch.randn(2, 77, 4, 64).to(dtype)
    q = x.transpose(1, 2)                                                     # (B, H, L, D) view of (B, L, H, D)
    out = native_attention(q, q, q, mask=masks.causal(), scale=0.125, tile_q=32, tile_k=32)
    want = native_attention(q.contiguous(), q.contiguous(), q.contiguous(), mask=masks.causal(), scale=0.125,
                            tile_q=32, tile_k=32)
    assert torch.equal(out, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_tiles_and_the_blas_path_agree(dtype):
    """tile_k = 120 (not a multiple of 16) runs MKL's GEMMs: the same sums in another order."""
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, 200, 64, generator=g).to(dtype).requires_grad_() for _ in range(3))
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}
    runs = []
    for tile_k in (128, 120):
        out = native_attention(q, k, v, mask=masks.causal(), scale=0.125, tile_q=64, tile_k=tile_k)
        runs.append([out, *torch.autograd.grad(out.float().square().sum(), (q, k, v))])
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, **tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("window", [(8, 0), (9, 0), (6, 3)])
def test_nan_outside_a_tiles_key_range_never_reaches_the_output(window, dtype):
    """Key chunks start on a multiple of 16 and V is read in pairs: the keys below a tile's range that
    this drags in (the one next to an odd first key included) must add nothing, not even 0 * NaN."""
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 96, 64, generator=g).to(dtype) for _ in range(3))
    mask = masks.window(*window)
    first = int(mask.dense(96, 96)[..., 32:40, :].reshape(8, 96).any(0).nonzero().min())   # the tile's first key
    k[:, :, :first], v[:, :, :first] = float("nan"), float("nan")
    out = native_attention(q, k, v, mask=mask, scale=0.125, tile_q=8, tile_k=32)
    ref = reference_attention(q[:, :, 32:], k[:, :, first:], v[:, :, first:], mask=masks.window(*window),
                              scale=0.125)
    assert torch.isfinite(out[:, :, 32:]).all()
    torch.testing.assert_close(out[:, :, 32:], ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("L", [1, 64])
def test_a_kept_buffer_holds_nothing_of_the_call_before(L, dtype):
    """Packed K and V go into buffers kept on this thread between calls (csrc/kept.cpp). A call that fits the
    buffers of a longer one before it -- 133 keys after 160 of NaN -- reads only its own keys: its pairs past
    key 133 are zeros again (on AMX, whose products reach a few keys past a tile's, a NaN left there would give
    0 * NaN; the AVX-512 tiles never read them), and its result is the fresh buffers' bit for bit."""
    g = torch.Generator().manual_seed(9)
    q = torch.randn(1, 4, L, 64, generator=g).to(dtype).requires_grad_()
    k, v = (torch.randn(1, 2, 133, 64, generator=g).to(dtype).requires_grad_() for _ in range(2))
    nan = torch.full((1, 2, 160, 64), float("nan"), dtype=dtype)

    def run():
        out = native_attention(q, k, v, mask=masks.padding([120]), scale=0.125)
        return [out, *torch.autograd.grad(out.float().sum(), (q, k, v))]

    native.release_buffers()
    fresh = run()
    native.release_buffers()
    qn, kn, vn = (x.detach().clone().requires_grad_() for x in (q, nan, nan))
    before = native_attention(qn, kn, vn, scale=0.125)                      # fills the kept buffers with NaN:
    before.float().sum().backward()                                          # the forward's and the backward's
    kept = run()
    assert torch.isnan(before).all()
    for a, b in zip(fresh, kept):
        assert torch.equal(a, b)


def test_release_buffers_frees_what_a_packed_call_kept():
    if not native.on_tiles(64, 64):
        pytest.skip("K and V are packed only for the AVX-512 tiles or AMX: " + native.info())
    native.release_buffers()
    q, k, v = (torch.randn(1, 8, 128, 64).to(torch.bfloat16) for _ in range(3))
    native_attention(q, k, v, scale=0.125)
    words = 8 * 128 * 64 // 2                                               # 8 heads of 128 keys, D = 64: pairs
    if native.on_amx(64, 64):            # AMX (amx.cpp): keys padded to 144, K^T's rows 160 words, V as pairs
        assert native.release_buffers() == 4 * (8 * 160 * 64 // 2 + 8 * 144 * 64 // 2)
    else:
        assert native.release_buffers() == 4 * 2 * words                    # k_groups and v_pairs
    assert native.release_buffers() == 0


def test_the_nan_cases_include_odd_first_keys():
    firsts = {int(masks.window(*w).dense(96, 96)[..., 32:40, :].reshape(8, 96).any(0).nonzero().min()) % 2
              for w in [(8, 0), (9, 0), (6, 3)]}
    assert firsts == {0, 1}


def _scattered_rows(L: int, S: int, seed: int) -> torch.Tensor:
    """(L, S) allowed pairs: each row one interval of keys at a random place (widths 0 to 39, a row in 7 with
    none, some with one key), so the rows of one block of the micro-kernel's rows (6) need unrelated columns."""
    g = torch.Generator().manual_seed(seed)
    lo, width = torch.randint(0, S, (L,), generator=g), torch.randint(0, 40, (L,), generator=g)
    width[::7], width[3::11] = 0, 1
    j = torch.arange(S)
    return (j >= lo[:, None]) & (j < (lo + width)[:, None])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tiles", [(64, 128), (30, 64), (None, None)], ids=["64x128", "30x64", "default"])
def test_rows_with_scattered_keys_get_every_key_they_may_attend(tiles, dtype):
    """The tiles' products compute, per block of 6 rows, only the columns of those rows' hull (RowBounds,
    csrc/microkernel.h). Rows whose allowed keys lie anywhere -- empty rows, one-key rows, neighbours far
    apart, row tails -- given as a dense mask (each row read within its range): outputs and all gradients."""
    B, H, L, S = 1, 2, 100, 150
    g = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(B, H, n, 64, generator=g).to(dtype) for n in (L, S, S))
    mask = masks.dense(_scattered_rows(L, S, seed=11)[None, None])
    _check(errors(partial(native_attention, tile_q=tiles[0], tile_k=tiles[1]), q, k, v, None, mask), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_block_of_rows_reads_only_the_keys_its_rows_may_attend(dtype):
    """What the row bounds skip is skipped: NaN in V at key 40, which only row 3 may attend (the others attend
    keys 0-8), makes row 3 NaN and leaves every row outside its block of 6 (rows 0-5) exact. (0 * NaN in the
    other rows of row 3's block is the NaN rule's unspecified case, docs/design.md.)"""
    if not native.on_tiles(64, 64) or (dtype == torch.bfloat16 and native.on_amx(64, 64)):
        pytest.skip("the row bounds are the AVX-512 tiles': " + native.info())
    g = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(1, 1, n, 64, generator=g).to(dtype) for n in (64, 48, 48))
    allowed = torch.zeros(64, 48, dtype=torch.bool)
    allowed[:, :9] = True
    allowed[3] = False
    allowed[3, 38:42] = True
    v[..., 40, :] = float("nan")
    out = native_attention(q, k, v, mask=masks.dense(allowed[None, None]), scale=0.125)
    assert torch.isnan(out[0, 0, 3]).all()
    want = reference_attention(q[:, :, 6:], k[:, :, :9], v[:, :, :9], scale=0.125)
    torch.testing.assert_close(out[:, :, 6:], want, atol=2e-2, rtol=2e-2)
