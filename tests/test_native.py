"""The compiled kernel's own guarantees (the shared conformance suite runs it too, via helpers.CANDIDATES):
it is built, its backward is exact (gradcheck), its mask and bias forms match the reference, it never reads
what a mask rules out, and it behaves as a torch op (compile, func)."""
from functools import partial

import pytest
import torch

import attnlab as al
from attnlab.functional import FunctionBias, masks, tiles
from attnlab.functional.backends import native
from attnlab.functional.backends.native import mask_args, native_attention, native_forward, pack_bits
from attnlab.functional.backends.reference import reference_attention
from attnlab.positional import ALiBi, ShawRelative, T5Bias
from attnlab.positional.alibi import AlibiBias
from helpers import check_dropout_equals_reference

small = partial(native_attention, tile_q=4, tile_k=8)     # tiny tiles: every row kind and chunk edge


def leaves(*shapes, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, dtype=dtype, requires_grad=True) for s in shapes]


def test_the_kernel_is_built_here():
    """make test must build the extension: a missing build fails here instead of skipping everything."""
    assert native.why_unavailable() is None, native.why_unavailable()
    assert "native" in al.available_backends()
    assert "at::vec" in native.info()


def test_far_weights_flush_inside_the_kernel_and_the_caller_keeps_its_subnormals():
    """The kernel's threads flush subnormal results to zero while they work (csrc/native.h, FlushSubnormals: on the
    Xeon with AMX each one cost a microcode assist) and restore the float state after: the calling thread, which
    runs a share of the region, still makes subnormals afterwards. ALiBi's far keys, whose weights fall below 2^-126,
    still give the fp64 reference's output within fp32's rounding, forward and backward."""
    tiny = torch.tensor([1.0e-20]) * torch.tensor([1.0e-20])
    assert 0.0 < tiny.item() < torch.finfo(torch.float32).tiny                  # a subnormal, before
    q, k, v = leaves((1, 4, 300, 16), (1, 4, 300, 16), (1, 4, 300, 16), dtype=torch.float32, seed=3)
    bias = AlibiBias(torch.tensor([0.5, 1.0, 2.0, 0.25]))          # weights below 2^-126 from 44-350 keys away
    out = native_attention(q, k, v, mask=masks.causal(), bias=bias, scale=0.25)
    assert (torch.tensor([1.0e-20]) * torch.tensor([1.0e-20])).item() == tiny.item()   # and after
    out.square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    want = reference_attention(q64, k64, v64, mask=masks.causal(), bias=bias, scale=0.25)
    want.square().sum().backward()
    torch.testing.assert_close(out.double(), want, atol=2e-6, rtol=2e-6)
    for g, t in zip(grads, (q64, k64, v64)):
        torch.testing.assert_close(g.double(), t.grad, atol=2e-5, rtol=2e-5)


ALL_MASKS = {
    "causal": lambda: masks.causal(),
    "window": lambda: masks.window(3, 1),
    "padding": lambda: masks.padding(torch.tensor([11, 4])),
    "padding_left": lambda: masks.padding(torch.tensor([11, 4]), side="left"),
    "documents": lambda: masks.documents(torch.tensor([0] * 5 + [1] * 2 + [2] * 4)),
    "documents_scattered": lambda: masks.documents(torch.tensor([0, 1] * 5 + [0])),
    "dense": lambda: masks.dense(torch.rand(2, 1, 9, 11, generator=torch.Generator().manual_seed(1)) > 0.5),
    "causal&padding&dense": lambda: masks.causal() & masks.padding(torch.tensor([11, 6]))
    & masks.dense(torch.rand(1, 4, 9, 11, generator=torch.Generator().manual_seed(2)) > 0.3),
    "strided": lambda: masks.strided(3),
    "bigbird": lambda: masks.bigbird(2, 1),
}


@pytest.mark.parametrize("name", list(ALL_MASKS))
def test_mask_forms_equal_the_dense_mask(name):
    """spans (intersected) AND bits, read the way the kernel reads them, give back exactly dense()."""
    mask, L, S = ALL_MASKS[name](), 9, 11
    spans, bits = mask_args(mask, L, S)
    assert bits is None or spans is not None              # a dense part's row ranges join the spans (bit_spans)
    allowed = torch.ones(1, 1, L, S, dtype=torch.bool)
    j = torch.arange(S)
    if spans is not None:
        allowed = allowed & ((j >= spans[..., 0:1]) & (j < spans[..., 1:2])).any(-2)[:, None]
    if bits is not None:
        unpacked = (bits[..., j // 64] >> (j % 64)) & 1                       # (Bb, Hb, L, S)
        allowed = allowed & unpacked.bool()
    want = mask.dense(L, S)
    assert torch.equal(*torch.broadcast_tensors(allowed, want)), name


class _TwoSpans(masks.Mask):
    """Keys 0-9 and the 30 keys up to the row's own: two intervals per row (no library mask has K > 1)."""

    def row_spans(self, L, S):
        i = torch.arange(L) + S - L                                            # (L,) the row's key position
        first = torch.stack([torch.zeros(L, dtype=torch.long), torch.full((L,), 10)], -1)
        second = torch.stack([(i - 30).clamp(min=0), (i + 1).clamp(max=S)], -1)
        return torch.stack([first, second], 1)[None]                           # (1, L, 2, 2)

    def tile(self, r0, r1, c0, c1, L, S):
        i, j = torch.arange(r0, r1)[:, None] + S - L, torch.arange(c0, c1)[None]
        return ((j < 10) | ((j <= i) & (j >= i - 30)))[None, None]

    def tile_kinds(self, L, S, tile_q, tile_k):
        return torch.full((1, -(-L // tile_q), -(-S // tile_k)), masks.PARTIAL, dtype=torch.int8)


@pytest.mark.parametrize("spans", [None, "window", "two"], ids=["dense", "window&dense", "two_intervals&dense"])
def test_dense_rows_classified_and_masked_a_word_at_a_time(spans):
    """The kernel asks of each row's bits in a key chunk whether all or none are set, and masks the unset ones, a
    64-bit word at a time: rows with every bit of their range set, none, one bit off at a word's first or last key
    (63, 64, 127, 128, the range's ends), ranges starting mid-word (a window's spans), two intervals per row
    (K > 1); outputs and gradients against float64."""
    L, S = 24, 200
    allowed = torch.zeros(1, 2, L, S, dtype=torch.bool)                    # (1, Hb, L, S)
    allowed[:, :, 0:6] = True                                              # all set
    for r, j in zip(range(6, 14), (0, 63, 64, 127, 128, 199, 100, 65)):
        allowed[:, :, r] = True
        allowed[:, :, r, j] = False                                        # one bit off
    for r, (a, e) in zip(range(14, 20), ((0, 64), (64, 128), (63, 65), (127, 200), (5, 6), (130, 131))):
        allowed[:, :, r, a:e] = True                                       # a range ending on or off a word edge
    allowed[:, 1, 20] = True                                               # one head only; rows 21-23 have none
    mask = masks.dense(allowed)
    if spans == "window":
        mask = masks.window(150, 40) & mask
    elif spans == "two":
        mask = _TwoSpans() & mask
    assert mask_args(mask, L, S)[0].shape[2] == (2 if spans == "two" else 1)
    q, k, v = leaves((1, 2, L, 16), (1, 2, S, 16), (1, 2, S, 8), seed=3)
    for backend in ("native", "reference"):
        out = al.attention(q, k, v, mask=mask, backend=backend, scale=0.25)
        grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        if backend == "native":
            got = [out, *grads]
    for g, w in zip(got, [out, *grads]):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tile_k", [None, 8], ids=["chunks512", "chunks8"])
def test_unset_bits_masked_in_reduced_precision(dtype, tile_k):
    """Reduced precisions accumulate in float, whose words with many unset keys are masked a vector at a time (the
    word-wise test above runs in double, key by key): rows whose range starts at every offset of a word, with
    random holes (a whole word holds ~19), one hole at each of 16 neighbouring keys (few: key by key), and chunks
    shorter than a word; outputs and gradients against the float64 reference (a hole read as allowed, or the
    reverse, moves them by far more than the tolerance)."""
    L, S = 80, 203
    g = torch.Generator().manual_seed(5)
    allowed = torch.rand(1, 1, L, S, generator=g) > 0.3                     # (1, 1, L, S) random holes
    for r in range(L):
        allowed[..., r, : r] = False                                       # row r's range starts at key r
        allowed[..., r, r] = True
    for r in range(40, 56):
        allowed[..., r, 64:] = True
        allowed[..., r, 64 + (r - 40)] = False                             # one hole at each of 16 keys
    mask = masks.dense(allowed)
    q, k, v = leaves((1, 2, L, 16), (1, 2, S, 16), (1, 2, S, 8), seed=7)
    want = al.attention(q, k, v, mask=mask, backend="reference", scale=0.25)
    want_grads = torch.autograd.grad(want, (q, k, v), torch.ones_like(want))
    qs, ks, vs = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    out = native_attention(qs, ks, vs, mask=mask, scale=0.25, tile_k=tile_k)
    grads = torch.autograd.grad(out, (qs, ks, vs), torch.ones_like(out))
    tol = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 5e-3}[dtype]
    for got, w in zip([out, *grads], [want, *want_grads]):
        torch.testing.assert_close(got.double(), w, rtol=tol, atol=tol)


@pytest.mark.parametrize("little_endian", [True, False], ids=["numpy_packbits", "torch_fallback"])
@pytest.mark.parametrize("S", [130, 128, 1])
def test_pack_bits_round_trip_across_word_edges(S, little_endian, monkeypatch):
    monkeypatch.setattr(tiles, "_LITTLE_ENDIAN", little_endian)
    m = torch.rand(2, 3, 5, S, generator=torch.Generator().manual_seed(0)) > 0.5
    m[..., -1] = True                                                          # bit 63 of a full last word
    reversed_dims = m.permute(3, 2, 1, 0).contiguous().permute(3, 2, 1, 0)       # numpy kept its order (a crash)
    for given in (m, m.transpose(-1, -2).contiguous().transpose(-1, -2), m[:1].expand(2, 3, 5, S), reversed_dims):
        words = pack_bits(given)                                               # (2, 3, 5, ceil(S / 64))
        assert words.dtype == torch.int64 and words.shape == (2, 3, 5, -(-S // 64))
        j = torch.arange(S)
        assert torch.equal(((words[..., j // 64] >> (j % 64)) & 1).bool(), given)


@pytest.mark.parametrize("mask", [None, masks.causal(), masks.window(2, 1) & masks.padding([9, 4]),
                                  masks.dense(torch.rand(1, 4, 9, 11,
                                                         generator=torch.Generator().manual_seed(5)) > 0.3)],
                         ids=["none", "causal", "window&padding", "dense"])
def test_gradcheck_with_a_tensor_bias(mask):
    q, k, v, bias = leaves((2, 4, 9, 5), (2, 2, 11, 5), (2, 2, 11, 3), (1, 4, 9, 11))
    fn = lambda q, k, v, bias: small(q, k, v, mask=mask, bias=bias, scale=0.4)
    assert torch.autograd.gradcheck(fn, (q, k, v, bias))


def test_gradcheck_table_bias_softcap_and_dropout():
    q, k, v = leaves((1, 2, 7, 4), (1, 1, 8, 4), (1, 1, 8, 4))
    slopes = torch.tensor([0.5, 0.25], dtype=torch.float64, requires_grad=True)
    from attnlab.positional.alibi import AlibiBias
    fn = lambda q, k, v, s: small(q, k, v, mask=masks.causal(), bias=AlibiBias(s), scale=0.5, softcap=1.5,
                                  dropout_p=0.3, dropout_seed=123)
    assert torch.autograd.gradcheck(fn, (q, k, v, slopes))


@pytest.mark.parametrize("scheme", ["alibi", "t5", "shaw"])
@pytest.mark.parametrize("LS", [(13, 13), (5, 13), (13, 6)])
def test_relative_biases_read_from_tables_equal_the_reference(scheme, LS):
    """ALiBi / T5 as per-offset tables, Shaw's key term as per-row tables: values and parameter gradients."""
    L, S = LS
    q, k, v = leaves((2, 4, L, 8), (2, 4, S, 8), (2, 4, S, 8))
    torch.manual_seed(0)
    if scheme == "alibi":
        module = ALiBi(4).double()
        bias_of = lambda q: module.bias()
    elif scheme == "t5":
        module = T5Bias(4, bidirectional=True, num_buckets=8, max_distance=6).double()
        bias_of = lambda q: module.bias()
    else:
        module = ShawRelative(8, max_distance=3, values=False).double()
        bias_of = lambda q: module.bias(q, L, S, scale=0.3)
    params = [p for p in module.parameters() if p.requires_grad]
    results = []
    for fn in (small, reference_attention):
        out = fn(q, k, v, mask=masks.causal(), bias=bias_of(q), scale=0.3)
        results.append([out] + list(torch.autograd.grad((out * out).sum(), [q, k, v] + params)))
    for a, b in zip(*results):
        assert torch.allclose(a, b, atol=1e-10), f"{(a - b).abs().max().item():.2e}"


def test_a_function_bias_without_a_table_is_refused_by_name():
    q, k, v = leaves((1, 2, 5, 4), (1, 2, 5, 4), (1, 2, 5, 4))
    bias = FunctionBias(lambda i, j, s: s * (i * j), torch.tensor(0.1))
    with pytest.raises(ValueError, match="native.*table.*tiled"):
        al.attention(q, k, v, bias=bias, backend="native")


def test_dropout_matches_the_reference_for_the_same_seed():
    q, k, v = leaves((2, 4, 33, 8), (2, 2, 33, 8), (2, 2, 33, 8))
    check_dropout_equals_reference(small, q, k, v, mask=masks.causal(), scale=0.3, dropout_p=0.25, dropout_seed=7)


def test_nan_in_keys_the_mask_rules_out_never_reaches_the_output():
    """NaN keys and values in the tiles a mask rules out: the kernel must never read them."""
    q, k, v = (t.detach() for t in leaves((1, 2, 64, 8), (1, 2, 64, 8), (1, 2, 64, 8), dtype=torch.float32))
    k[:, :, :20], v[:, :, :20] = float("nan"), float("nan")    # query tiles from row 32 never see keys < 24
    mask = masks.window(8, 0)
    out = native_attention(q, k, v, mask=mask, scale=0.3, tile_q=8, tile_k=16)
    ref = reference_attention(q[:, :, 32:], k[:, :, 24:], v[:, :, 24:], mask=mask, scale=0.3)
    assert torch.isfinite(out[:, :, 32:]).all()
    torch.testing.assert_close(out[:, :, 32:], ref)


def test_nan_in_q_gives_nan_in_the_same_rows_as_the_reference():
    q, k, v = (t.detach() for t in leaves((1, 2, 6, 4), (1, 2, 6, 4), (1, 2, 6, 4), dtype=torch.float32))
    q[0, 1, 3, 2] = float("nan")
    out = native_attention(q, k, v, mask=masks.causal(), scale=0.5)
    ref = reference_attention(q, k, v, mask=masks.causal(), scale=0.5)
    assert torch.equal(out.isnan(), ref.isnan()) and out.isnan().any()


def test_rows_with_nothing_to_attend_to_and_their_lse():
    q, k, v = leaves((1, 2, 7, 4), (1, 2, 3, 4), (1, 2, 3, 4))
    out, lse = native_forward(q, k, v, mask=masks.causal(), scale=0.5)         # L > S: rows 0-3 see nothing
    assert (out[:, :, :4] == 0).all() and (lse[:, :, :4] == float("-inf")).all()
    torch.autograd.grad(out.sum(), (q, k, v))
    logits = (0.5 * q @ k.transpose(-1, -2)).masked_fill(~masks.causal().dense(7, 3), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(logits, -1))


@pytest.mark.parametrize("backend", ["native", "tiled"])
def test_fp16_on_the_cpu_is_computed_as_fp32(backend):
    """The contract (docs/design.md, "float16"): the same bits as the fp32 computation on the same values,
    rounded once; lse in fp32, gradients in fp16 (autograd's cast of the fp32 ones). A kernel that rounded P or
    dS to fp16 inside would differ here."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 70, 32, generator=g).half().requires_grad_() for _ in range(3))
    dout = torch.randn(2, 4, 70, 32, generator=g).half()
    mask = masks.window(9, 3) & masks.padding([70, 41])
    out = al.attention(q, k, v, mask=mask, backend=backend)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    out32 = al.attention(q32, k32, v32, mask=mask, backend=backend)
    assert out.dtype == torch.float16 and torch.equal(out, out32.half())
    out.backward(dout)
    out32.backward(dout.float())
    for t, t32 in zip((q, k, v), (q32, k32, v32)):
        assert t.grad.dtype == torch.float16 and torch.equal(t.grad, t32.grad.half())
    if backend == "native":
        _, lse = native_forward(q.detach(), k.detach(), v.detach(), mask=mask, scale=32 ** -0.5)
        assert lse.dtype == torch.float32


def test_return_weights_are_the_reference_weights():
    q, k, v = leaves((2, 4, 9, 8), (2, 2, 11, 8), (2, 2, 11, 8))
    mask = masks.window(2, 2) & masks.padding([11, 3])
    _, w = small(q, k, v, mask=mask, scale=0.4, return_weights=True, softcap=2.0)
    _, w_ref = reference_attention(q, k, v, mask=mask, scale=0.4, return_weights=True, softcap=2.0)
    torch.testing.assert_close(w, w_ref)


def test_strided_views_run_without_a_copy_and_agree():
    """(B, L, H, D) storage viewed as (B, H, L, D): only the last dim needs stride 1."""
    x = torch.randn(2, 33, 4, 16)
    q = x.transpose(1, 2)                                                      # non-contiguous view
    out = native_attention(q, q, q, mask=masks.causal(), scale=0.25, tile_q=8, tile_k=16)
    torch.testing.assert_close(out, reference_attention(q, q, q, mask=masks.causal(), scale=0.25))


@pytest.mark.parametrize("D,Dv", [(65, 15), (40, 40), (64, 64)])     # MKL's GEMMs, and the micro-kernel
@pytest.mark.parametrize("BH", [(1, 1), (2, 4)])                     # one work unit (no parallel region), several
def test_results_are_the_same_bits_at_any_thread_count(D, Dv, BH):
    """The design's promise: no thread count changes a bit of the output or the gradients (before MKL was
    pinned to one thread per call, fp32 results moved by up to 8e-7 between 1 and 2 threads at D = 65)."""
    q, k, v = leaves((*BH, 70, D), (*BH, 90, D), (*BH, 90, Dv), dtype=torch.float32)
    before = torch.get_num_threads()
    runs = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            out = native_attention(q, k, v, mask=masks.causal(), scale=D ** -0.5)
            runs.append((out, *torch.autograd.grad(out, (q, k, v), torch.ones_like(out))))
    finally:
        torch.set_num_threads(before)
    for run in runs[1:]:
        for a, b in zip(runs[0], run):
            assert torch.equal(a, b), f"max difference {(a - b).abs().max().item():.3g} between thread counts"


def test_rows_narrower_than_their_width_are_read_right():
    """A sequence stride below the row width is no BLAS leading dimension (MKL: "Parameter 8 was incorrect",
    and a wrong answer): an expanded V (stride 0), an L = 1 view whose row stride is 1, a D = 1 last dim with
    any stride, and an expanded Dv = 1 incoming gradient -- each read through a copy or canonical strides."""
    g = torch.Generator().manual_seed(3)
    cases = [
        (torch.randn(1, 1, 5, 17, generator=g), torch.randn(1, 1, 4, 17, generator=g),
         torch.randn(1, 1, 1, 17, generator=g).expand(1, 1, 4, 17)),
        (torch.randn(1, 2, 31, 1, generator=g).transpose(-1, -2), torch.randn(1, 2, 64, 31, generator=g),
         torch.randn(1, 2, 64, 8, generator=g)),
        (torch.randn(2, 3, 7, 1, generator=g)[:, :, ::2], torch.randn(2, 3, 9, 1, generator=g).transpose(1, 2)
         .contiguous().transpose(1, 2), torch.randn(2, 1, 9, 1, generator=g).expand(2, 3, 9, 1)),
    ]
    for q, k, v in cases:
        qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
        qf, kf, vf = (t.detach().requires_grad_() for t in (q, k, v))
        want = reference_attention(qd, kd, vd, mask=masks.causal(), scale=0.3)
        got = native_attention(qf, kf, vf, mask=masks.causal(), scale=0.3)
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
        want.sum().backward()
        got.sum().backward()                                    # dout: ones expanded with stride 0
        for a, b in zip((qf, kf, vf), (qd, kd, vd)):
            torch.testing.assert_close(a.grad.double(), b.grad, atol=1e-5, rtol=1e-5)


def test_gqa_gradients_sum_over_each_group():
    q, k, v = leaves((1, 6, 10, 4), (1, 2, 10, 4), (1, 2, 10, 4))
    assert torch.autograd.gradcheck(lambda q, k, v: small(q, k, v, mask=masks.causal(), scale=0.5), (q, k, v))


def test_auto_and_explain_name_it():
    q, k, v = (torch.randn(1, 2, 1024, 32) for _ in range(3))
    why = al.explain(q, k, v, mask=masks.window(64, 0))
    assert "native" in why


def test_compiles_as_one_graph_and_works_under_torch_func():
    q, k, v = leaves((1, 2, 8, 4), (1, 2, 8, 4), (1, 2, 8, 4))
    fn = lambda q, k, v: al.attention(q, k, v, mask=masks.window(3, 0), backend="native")
    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(q, k, v), fn(q, k, v))
    g = torch.func.grad(lambda q: fn(q, k, v).sum())(q)
    torch.testing.assert_close(g, torch.autograd.grad(fn(q, k, v).sum(), q)[0])
    batched = torch.func.vmap(lambda q: fn(q, k, v))(q.detach().expand(3, *q.shape).clone())
    torch.testing.assert_close(batched[1], fn(q, k, v))


def test_compiles_with_a_relative_bias_and_a_document_mask():
    """A table bias whose slopes get gradients, and a document mask (whose spans read the ids, so under
    compile it goes the bit-packed way): one graph, the same output and gradients as eager."""
    from attnlab.positional.alibi import AlibiBias
    q, k, v = leaves((2, 2, 9, 8), (2, 2, 9, 8), (2, 2, 9, 8))
    slopes = torch.rand(2, dtype=torch.float64).requires_grad_()
    for mask in (masks.causal() & masks.padding(torch.tensor([9, 5])),
                 masks.documents(torch.tensor([0] * 4 + [1] * 5))):
        fn = lambda q, k, v, s: al.attention(q, k, v, mask=mask, bias=AlibiBias(s), backend="native")
        compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
        got, want = compiled(q, k, v, slopes), fn(q, k, v, slopes)
        torch.testing.assert_close(got, want)
        for a, b in zip(torch.autograd.grad(got.square().sum(), (q, k, v, slopes)),
                        torch.autograd.grad(want.square().sum(), (q, k, v, slopes))):
            torch.testing.assert_close(a, b)
    torch._dynamo.reset()


def test_jacrev_and_batched_gradcheck():
    q, k, v = leaves((1, 2, 5, 3), (1, 1, 6, 3), (1, 1, 6, 2))
    fn = lambda q, k, v: small(q, k, v, mask=masks.causal(), scale=0.5)
    jac = torch.func.jacrev(fn)(q, k, v)                                      # (out shape) + (q shape)
    ref = torch.autograd.functional.jacobian(lambda q: reference_attention(q, k, v, mask=masks.causal(), scale=0.5), q)
    torch.testing.assert_close(jac, ref)
    assert torch.autograd.gradcheck(fn, (q, k, v), check_batched_grad=True)
