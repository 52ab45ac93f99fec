"""GQA decoding on the compiled kernel: a group's query heads stacked into the rows of one head (native_stack.py)
give what the kernel gives them one head at a time -- outputs, log-sum-exps, gradients, masks of every form."""
import pytest
import torch

from attnlab.functional import attention, masks
from attnlab.functional.backends import native, native_stack
from attnlab.functional.backends.native_stack import stack_factor, stack_mask_args, stack_rows, unstack_rows

pytestmark = pytest.mark.skipif(native.why_unavailable() is not None, reason="the kernel is not built")


def test_stacked_rows_are_each_heads_rows_and_come_back():
    x = torch.arange(2 * 6 * 1 * 2).reshape(2, 6, 1, 2)              # (B, H, 1, X): a decoding step
    s = stack_rows(x, 3)                                              # (B, H / 3, 3, X)
    assert s.shape == (2, 2, 3, 2) and s.data_ptr() == x.data_ptr()   # a view
    for h2 in range(2):
        for j in range(3):
            assert torch.equal(s[:, h2, j], x[:, h2 * 3 + j, 0])
    assert torch.equal(unstack_rows(s, 3), x)
    lse = x[..., 0]                                                   # (B, H, 1): the log-sum-exps
    assert torch.equal(unstack_rows(stack_rows(lse, 3), 3), lse)
    bits = torch.arange(2 * 6 * 4).reshape(2, 6, 1, 4)                # (Bb, H, 1, W)
    spans = torch.tensor([[[[0, 5], [9, 12]]]])                       # (1, 1, K, 2)
    s_spans, s_bits = stack_mask_args(spans, bits, 3, 6)
    assert s_spans.shape == (1, 3, 2, 2) and (s_spans == spans).all()
    assert torch.equal(s_bits, stack_rows(bits, 3))
    _, one = stack_mask_args(None, bits[:, :1], 3, 6)                 # one head's bits for all: repeated
    assert one.shape == (2, 1, 3, 4) and (one == bits[:, :1]).all()


MiB = 1 << 20
STACK_FROM_BYTES = native_stack.STACK_FROM_BYTES       # as the module has it (the fixture below lowers it)


@pytest.mark.parametrize("B, H, Hkv, L, kv_bytes, threads, g", [
    (1, 32, 8, 1, MiB, 2, 4),        # every query head of a group: 8 units on 2 threads
    (1, 8, 1, 1, MiB, 2, 4),         # MQA: half the group, one unit per thread
    (4, 8, 1, 1, MiB, 2, 8),         # four sequences: the whole group
    (1, 32, 8, 1, MiB, 16, 2),       # 16 threads: 16 units
    (1, 32, 8, 2, MiB, 2, 1),        # more than one query: no stacking
    (1, 8, 8, 1, MiB, 2, 1),         # MHA
    (1, 32, 8, 1, MiB - 1, 2, 1),    # K and V in the cache either way
])
def test_stack_factor_leaves_a_unit_per_thread(monkeypatch, B, H, Hkv, L, kv_bytes, threads, g):
    monkeypatch.setattr(native_stack, "_threads", lambda: threads)
    monkeypatch.setattr(native_stack, "STACK_FROM_BYTES", STACK_FROM_BYTES)
    assert STACK_FROM_BYTES == MiB
    assert stack_factor(B, H, Hkv, L, kv_bytes) == g


MASKS = {
    "none": lambda B, H, S: None,
    "padding": lambda B, H, S: masks.padding(torch.tensor([S, S // 3])[:B]),
    "causal": lambda B, H, S: masks.causal(),
    "window & padding": lambda B, H, S: masks.window(5, 0) & masks.padding(torch.tensor([S - 2, S // 2])[:B]),
    "dense per head": lambda B, H, S: masks.dense(torch.rand(B, H, 1, S, generator=torch.Generator().manual_seed(3))
                                                  > 0.5),
    "dense broadcast": lambda B, H, S: masks.dense(torch.rand(1, 1, 1, S, generator=torch.Generator().manual_seed(4))
                                                   > 0.3),
}


@pytest.fixture(autouse=True)
def two_threads(monkeypatch):
    """Stacking as on 2 threads, whatever this machine has (it stacks less where more threads want units), and
    from any size of K and V (the small ones of these tests included)."""
    monkeypatch.setattr(native_stack, "_threads", lambda: 2)
    monkeypatch.setattr(native_stack, "STACK_FROM_BYTES", 0)


def _unstacked(monkeypatch):
    monkeypatch.setattr(native, "stack_factor", lambda *a: 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", [(2, 8, 2, 45, 16), (1, 8, 1, 130, 64)], ids=["gqa", "mqa"])
def test_stacked_decoding_equals_one_head_at_a_time(monkeypatch, dtype, mask, shape):
    B, H, Hkv, S, D = shape
    assert stack_factor(B, H, Hkv, 1, 0) > 1
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, 1, D, generator=g).to(dtype)
    k, v = (torch.randn(B, Hkv, S, D, generator=g).to(dtype) for _ in range(2))
    m = MASKS[mask](B, H, S)
    stacked = []
    monkeypatch.setattr(native, "stack_rows", lambda x, n: stacked.append(n) or stack_rows(x, n))
    out, lse = native.native_forward(q, k, v, mask=m, scale=0.3)
    assert stacked and stacked[0] > 1
    truth = attention(q.double(), k.double(), v.double(), mask=m, scale=0.3, backend="reference")
    _unstacked(monkeypatch)
    want, want_lse = native.native_forward(q, k, v, mask=m, scale=0.3)
    assert len(stacked) == 1
    err, err_before = ((x.double() - truth).abs().max().item() for x in (out, want))
    assert err <= 2 * err_before + {torch.float64: 1e-14, torch.float32: 1e-6}.get(dtype, 4e-3)
    torch.testing.assert_close(lse, want_lse, atol=1e-5, rtol=1e-5)


def test_stacked_decoding_gradients(monkeypatch):
    """A step with gradients runs stacked too (the views carry them back); gradcheck in float64."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 1, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, 2, 11, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    m = masks.padding(torch.tensor([11, 4]))
    stacked = []
    monkeypatch.setattr(native, "stack_rows", lambda x, n: stacked.append(n) or stack_rows(x, n))
    fn = lambda q, k, v: attention(q, k, v, mask=m, backend="native")
    assert torch.autograd.gradcheck(fn, (q, k, v))
    assert stacked and set(stacked) == {2}


def test_stacked_decoding_compiles_as_one_graph():
    q = torch.randn(1, 8, 1, 16)
    k, v = (torch.randn(1, 2, 40, 16) for _ in range(2))
    m = masks.padding(torch.tensor([29]))
    fn = lambda q, k, v: attention(q, k, v, mask=m, backend="native")
    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(q, k, v), fn(q, k, v))
